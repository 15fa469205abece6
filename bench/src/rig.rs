//! The nodes a hand-off benchmark runs: a coordinator, a sender and a
//! receiver in this process, on any data plane, each talking over the
//! control channel its plane pairs with ([`Control::of`]): Unix sockets
//! for the planes of one host, ZeroMQ on `tcp://127.0.0.1` for those whose
//! nodes must use it ([`DataPlane::needs_zmq`]), as separate processes
//! would. Every benchmark that times hand-offs starts its nodes here
//! (`handoff`, `fabric`, `curve`), so none names a data plane to do so.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tensorferry::runtime::telemetry::Telemetry;
use tensorferry::runtime::{
    CoordinatorNode, CoordinatorNodeConfig, DataPlane, InstanceNode, InstanceNodeConfig, NodeError,
    Prealloc,
};
use tensorferry_shm::UdsChannel;
use tensorferry_zmq::{zmq, Guard, ZmqChannel, ZmqConfig};

/// The roles of a rig, in hand-off order.
pub(crate) const ROLES: [&str; 2] = ["sender", "receiver"];

/// Where a ZeroMQ node binds: a free port on loopback.
const LOOPBACK: &str = "tcp://127.0.0.1:*";

/// The control channel a benchmark's nodes talk over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    /// Unix sockets at fresh `ipc://` endpoints (processes on one host).
    Unix,
    /// ZeroMQ on `tcp://127.0.0.1` (what nodes on other hosts talk over).
    Zmq,
}

impl Control {
    /// The channel the nodes of `plane` talk over: ZeroMQ if the plane
    /// needs it, else Unix sockets.
    pub fn of(plane: &DataPlane) -> Self {
        if plane.needs_zmq() {
            Self::Zmq
        } else {
            Self::Unix
        }
    }

    /// Its name, for JSON: `unix` or `zmq`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Unix => "unix",
            Self::Zmq => "zmq",
        }
    }

    /// Its name, for people.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Unix => "Unix sockets",
            Self::Zmq => "ZeroMQ on tcp://127.0.0.1",
        }
    }
}

/// A fresh `ipc://` endpoint for a benchmark's node.
pub(crate) fn endpoint(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!(
        "ipc://{}/ferry-bench-{}-{n}-{tag}.sock",
        std::env::temp_dir().display(),
        std::process::id()
    )
}

/// A ZeroMQ control channel bound at `endpoints`, behind `guard`.
fn zmq_channel(guard: &Guard, endpoints: &[&str]) -> Result<ZmqChannel, NodeError> {
    ZmqChannel::bind_guarded(&zmq::Context::new(), endpoints, ZmqConfig::default(), guard)
        .map_err(|e| NodeError::transport("bind a benchmark node's endpoints", e.kind(), e))
}

/// What each node's ZeroMQ endpoints are bound behind (none by default;
/// Unix sockets take no guard).
#[derive(Clone, Debug, Default)]
pub(crate) struct Guards {
    /// The coordinator's.
    pub coordinator: Guard,
    /// The sender's.
    pub sender: Guard,
    /// The receiver's.
    pub receiver: Guard,
}

/// The instances' pools.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pools {
    /// The sender's pool, bytes.
    pub sender: usize,
    /// The receiver's pool, bytes.
    pub receiver: usize,
    /// The receive slots the receiver sets aside.
    pub prealloc: Prealloc,
}

impl Pools {
    /// Pools of two slots of `slot` bytes each, and the receiver's two
    /// set aside: every hand-off takes the fast path.
    pub fn fast_path(slot: u64) -> Self {
        let pool = usize::try_from(2 * slot).unwrap_or(usize::MAX);
        Self {
            sender: pool,
            receiver: pool,
            prealloc: Prealloc {
                count: 2,
                size: slot,
            },
        }
    }
}

/// A coordinator, a sender and a receiver on one data plane, registered.
/// Field order is drop order: the instances stop before their
/// coordinator, which a healthy run's instances must not see go.
pub(crate) struct Rig {
    /// The sender.
    pub sender: InstanceNode,
    /// The receiver.
    pub receiver: InstanceNode,
    plane: DataPlane,
    control: Control,
    /// Where each role reports, in [`ROLES`] order.
    reports_to: [String; 2],
    _coordinator: CoordinatorNode,
}

impl Rig {
    /// Starts the nodes on `plane` over `control`, and waits for both
    /// instances' registration; adds them to `telemetry`, if any.
    pub fn start(
        plane: &DataPlane,
        control: Control,
        guards: &Guards,
        pools: Pools,
        telemetry: Option<&Telemetry>,
    ) -> Result<Self, NodeError> {
        let (coordinator, reports_to) = match control {
            Control::Unix => {
                let channel = UdsChannel::bind(&endpoint("coord"))
                    .map_err(|e| NodeError::transport("bind control endpoint", e.kind(), e))?;
                let node =
                    CoordinatorNode::start(&CoordinatorNodeConfig::new(&ROLES), channel, |_| {})?;
                let at = node.endpoint().to_owned();
                (node, [at.clone(), at])
            }
            Control::Zmq => {
                // One endpoint per role: ZeroMQ does not name a message's
                // sender, the endpoint it arrives at tells its role.
                let channel = zmq_channel(&guards.coordinator, &[LOOPBACK, LOOPBACK])?;
                let mut settings = CoordinatorNodeConfig::new(&ROLES);
                settings.result_endpoints = channel.endpoints();
                let at = &settings.result_endpoints;
                let reports_to = [0, 1].map(|i| at.get(i).cloned().unwrap_or_default());
                (
                    CoordinatorNode::start(&settings, channel, |_| {})?,
                    reports_to,
                )
            }
        };
        let rig = Self {
            sender: start(
                plane,
                control,
                &guards.sender,
                ROLES[0],
                &reports_to[0],
                pools.sender,
                Prealloc::NONE,
            )?,
            receiver: start(
                plane,
                control,
                &guards.receiver,
                ROLES[1],
                &reports_to[1],
                pools.receiver,
                pools.prealloc,
            )?,
            plane: plane.clone(),
            control,
            reports_to,
            _coordinator: coordinator,
        };
        rig.sender.wait_registered(Duration::from_secs(10))?;
        rig.receiver.wait_registered(Duration::from_secs(10))?;
        if let Some(telemetry) = telemetry {
            telemetry.add_coordinator(rig._coordinator.probe(), "coordinator");
            telemetry.add_instance(rig.sender.probe(), "sender");
            telemetry.add_instance(rig.receiver.probe(), "receiver");
        }
        Ok(rig)
    }

    /// A new receiver on the rig's plane and control channel, behind
    /// `guard`, reporting to its coordinator, registered.
    pub fn new_receiver(
        &self,
        guard: &Guard,
        pool: usize,
        prealloc: Prealloc,
    ) -> Result<InstanceNode, NodeError> {
        let node = start(
            &self.plane,
            self.control,
            guard,
            ROLES[1],
            &self.reports_to[1],
            pool,
            prealloc,
        )?;
        node.wait_registered(Duration::from_secs(10))?;
        Ok(node)
    }
}

/// An instance of `role` on `plane`, with a pool of `pool` bytes, over
/// `control` (behind `guard` on ZeroMQ), reporting to `coordinator`.
fn start(
    plane: &DataPlane,
    control: Control,
    guard: &Guard,
    role: &str,
    coordinator: &str,
    pool: usize,
    prealloc: Prealloc,
) -> Result<InstanceNode, NodeError> {
    let mut settings = InstanceNodeConfig::new(role, coordinator);
    settings.config.prealloc = prealloc;
    match control {
        Control::Unix => plane.start_instance_at(&settings, pool, &endpoint(role)),
        Control::Zmq => {
            // What the plane binds for its peers goes behind the node's
            // guard, as its control endpoint does.
            let mut plane = plane.clone();
            plane.guard(guard);
            plane.start_instance(&settings, pool, zmq_channel(guard, &[LOOPBACK])?)
        }
    }
}
