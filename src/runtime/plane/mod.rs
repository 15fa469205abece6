//! Every data plane a node runs on, by one type: [`DataPlane`] names them,
//! reads their options, and starts an instance on one.
//!
//! Each data plane is a module here (its name, its options, how its
//! transport opens; its crate's transport makes the [`PoolOwner`]
//! promise next to its pool) and a
//! variant of [`DataPlane`]; the CLI (`--backend NAME --plane-option
//! KEY=VALUE`), the Python module (`backend=NAME, **options`) and the
//! benchmarks reach every data plane through this type.
//!
//! Adding one, `foo` in a crate `ferry-foo` whose transport implements
//! `tensorferry_core::transport::Transport` and owns its pool: a module
//! `foo.rs` here (`NAME`, `OPTIONS`, `parse`, `open`; the crate's
//! transport implements `PoolOwner` beside its pool), its variant and match arms in this file, and the
//! dependency (with a feature, if it is optional) in the root
//! `Cargo.toml`, forwarded by the `Cargo.toml`s of `cli/`,
//! `python/pyo3/` and `bench/` if they are to build it.

mod any;
#[cfg(feature = "fabric")]
mod fabric;
mod options;
mod shm;
#[cfg(feature = "verbs")]
mod verbs;

use tensorferry_core::transport::{ControlChannel, ControlSend, Transport};
use tensorferry_shm::UdsChannel;

pub use any::{AnyTransport, AnyTransportError};
pub use options::PlaneError;
pub use shm::CopyConfig;

use super::error::NodeError;
use super::instance::{InstanceNode, InstanceNodeConfig};
use options::Options;
use tensorferry_core::transport::PoolOwner;

/// A data plane an instance writes and receives over, with its settings.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum DataPlane {
    /// Pools in POSIX shared memory, for processes on one host.
    Shm(CopyConfig),
    /// A libfabric provider (EFA, verbs, tcp, shm).
    #[cfg(feature = "fabric")]
    Fabric(tensorferry_fabric::FabricConfig),
    /// An RDMA device port (ibverbs RC queue pairs).
    #[cfg(feature = "verbs")]
    Verbs(tensorferry_verbs::VerbsConfig),
}

impl Default for DataPlane {
    /// Shared memory with its default copy settings.
    fn default() -> Self {
        Self::Shm(CopyConfig::default())
    }
}

/// The data planes this build has, by name.
const NAMES: &[&str] = &[
    shm::NAME,
    #[cfg(feature = "fabric")]
    fabric::NAME,
    #[cfg(feature = "verbs")]
    verbs::NAME,
];

impl DataPlane {
    /// The names of the data planes this build has.
    pub fn names() -> &'static [&'static str] {
        NAMES
    }

    /// The options the data plane `name` takes, if this build has it.
    pub fn options_of(name: &str) -> Option<&'static [&'static str]> {
        match name {
            shm::NAME => Some(shm::OPTIONS),
            #[cfg(feature = "fabric")]
            fabric::NAME => Some(fabric::OPTIONS),
            #[cfg(feature = "verbs")]
            verbs::NAME => Some(verbs::OPTIONS),
            _ => None,
        }
    }

    /// The data plane `name` with `options` (key, value) applied, each
    /// read once; an option it does not take, or a value it cannot, is an
    /// error naming it. Durations read as `250ms`, `5s`, `100us` or bare
    /// seconds; sizes in bytes.
    ///
    /// * `shm`: `threads` (copy threads for a large write), `split_at`.
    /// * `fabric`: `provider` (`auto`, or a libfabric name such as
    ///   `tcp;ofi_rxm`), `delivery` (`auto`, `delivery-complete`,
    ///   `remote-cq-data`), `source` (an address of this host),
    ///   `max_chunk`, `write_timeout`.
    /// * `verbs`: `device` (needed), `port`, `gid_index`, `listen` (the
    ///   side channel's address), `max_chunk`, `write_timeout`, `writers`
    ///   (the CURVE certificates of the instances that may write into this
    ///   one: a directory of `*.key` files, or one).
    pub fn parse<K, V>(
        name: &str,
        options: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Self, PlaneError>
    where
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let takes = Self::options_of(name).ok_or_else(|| unknown(name))?;
        let given = Options::new(static_name(name), takes, options);
        match name {
            #[cfg(feature = "fabric")]
            fabric::NAME => fabric::parse(given).map(Self::Fabric),
            #[cfg(feature = "verbs")]
            verbs::NAME => verbs::parse(given).map(Self::Verbs),
            _ => shm::parse(given).map(Self::Shm),
        }
    }

    /// Its name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Shm(_) => shm::NAME,
            #[cfg(feature = "fabric")]
            Self::Fabric(_) => fabric::NAME,
            #[cfg(feature = "verbs")]
            Self::Verbs(_) => verbs::NAME,
        }
    }

    /// True if its peers may be on other hosts.
    pub fn reaches_other_hosts(&self) -> bool {
        match self {
            Self::Shm(_) => false,
            #[cfg(feature = "fabric")]
            Self::Fabric(c) => fabric::reaches_other_hosts(c),
            #[cfg(feature = "verbs")]
            Self::Verbs(_) => true,
        }
    }

    /// Puts what this data plane binds for its peers behind the node's
    /// `guard`, as the node's control endpoints are: the verbs side channel
    /// takes its allow-list and, with CURVE, its key (and admits the
    /// plane's `writers`). Shared memory binds nothing, and libfabric's
    /// providers listen on their own, which ZeroMQ's guard cannot reach.
    pub fn guard(&mut self, guard: &tensorferry_zmq::Guard) {
        match self {
            #[cfg(feature = "verbs")]
            Self::Verbs(c) => verbs::guard(c, guard),
            // Nothing of theirs for the guard to reach.
            _ => {
                let _ = guard;
            }
        }
    }

    /// True if it pairs with the ZeroMQ control plane only: every data
    /// plane but shared memory, which keeps to one host and so to Unix
    /// sockets as well.
    pub fn needs_zmq(&self) -> bool {
        !matches!(self, Self::Shm(_))
    }

    /// Opens its transport with a new pool of `pool_len` bytes, behind one
    /// type (for a caller that wraps it: see
    /// [`start_instance_with`](Self::start_instance_with)).
    pub fn open(&self, pool_len: usize) -> Result<AnyTransport, NodeError> {
        Ok(match self {
            Self::Shm(c) => AnyTransport::new(shm::open(c, pool_len)?),
            #[cfg(feature = "fabric")]
            Self::Fabric(c) => AnyTransport::new(fabric::open(c, pool_len)?),
            #[cfg(feature = "verbs")]
            Self::Verbs(c) => AnyTransport::new(verbs::open(c, pool_len)?),
        })
    }

    /// Starts an instance on this data plane with a new pool of `pool_len`
    /// bytes, talking over `channel`.
    pub fn start_instance<C>(
        &self,
        settings: &InstanceNodeConfig,
        pool_len: usize,
        channel: C,
    ) -> Result<InstanceNode, NodeError>
    where
        C: ControlChannel,
        C::Sender: 'static,
        <C::Sender as ControlSend>::Error: Send + Sync + 'static,
        C::Receiver: 'static,
    {
        // Each transport by its own type, so that the progress loop calls
        // it directly.
        match self {
            Self::Shm(c) => InstanceNode::start(settings, shm::open(c, pool_len)?, channel),
            #[cfg(feature = "fabric")]
            Self::Fabric(c) => InstanceNode::start(settings, fabric::open(c, pool_len)?, channel),
            #[cfg(feature = "verbs")]
            Self::Verbs(c) => InstanceNode::start(settings, verbs::open(c, pool_len)?, channel),
        }
    }

    /// Starts an instance on this data plane with a new pool of `pool_len`
    /// bytes, listening on a Unix-socket control channel at `endpoint`
    /// (`ipc://<path>`): the default for processes on one host.
    pub fn start_instance_at(
        &self,
        settings: &InstanceNodeConfig,
        pool_len: usize,
        endpoint: &str,
    ) -> Result<InstanceNode, NodeError> {
        let channel = UdsChannel::bind(endpoint)
            .map_err(|e| NodeError::transport("bind control endpoint", e))?;
        self.start_instance(settings, pool_len, channel)
    }

    /// Like [`start_instance`](Self::start_instance), with the transport
    /// handed to `wrap` first (a fault injector, say). What `wrap` returns
    /// must own the transport it was given (it is a [`PoolOwner`], as
    /// [`AnyTransport`] is), so the node's pool lives as long as the node.
    pub fn start_instance_with<C, W>(
        &self,
        settings: &InstanceNodeConfig,
        pool_len: usize,
        channel: C,
        wrap: impl FnOnce(AnyTransport) -> W,
    ) -> Result<InstanceNode, NodeError>
    where
        C: ControlChannel,
        C::Sender: 'static,
        <C::Sender as ControlSend>::Error: Send + Sync + 'static,
        C::Receiver: 'static,
        W: Transport + PoolOwner + Send + 'static,
        W::Error: Send + Sync + 'static,
    {
        InstanceNode::start(settings, wrap(self.open(pool_len)?), channel)
    }
}

/// The error for a name this build does not have.
fn unknown(name: &str) -> PlaneError {
    // Named here, not in their modules, so that a build without them can
    // say how to get them.
    match name {
        "fabric" => PlaneError::NotBuilt {
            name: "fabric",
            feature: "fabric",
        },
        "verbs" => PlaneError::NotBuilt {
            name: "verbs",
            feature: "verbs",
        },
        _ => PlaneError::Unknown {
            name: name.to_owned(),
            available: NAMES,
        },
    }
}

/// `name` as the static name of the data plane it is (one of [`NAMES`]).
fn static_name(name: &str) -> &'static str {
    NAMES
        .iter()
        .copied()
        .find(|n| *n == name)
        .unwrap_or(shm::NAME)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_parses_to_itself() {
        for name in DataPlane::names() {
            let options: &[(&str, &str)] = if *name == "verbs" {
                &[("device", "rxe0")]
            } else {
                &[]
            };
            let plane = DataPlane::parse(name, options.iter().copied()).unwrap();
            assert_eq!(plane.name(), *name);
            assert!(DataPlane::options_of(name).is_some());
        }
    }

    #[test]
    fn bad_names_and_options_are_named() {
        let none: [(&str, &str); 0] = [];
        let e = DataPlane::parse("carrier-pigeon", none).unwrap_err();
        assert!(e.to_string().contains("\"carrier-pigeon\""), "{e}");
        let e = DataPlane::parse("shm", [("provider", "tcp")]).unwrap_err();
        assert!(
            e.to_string().contains("takes no option \"provider\""),
            "{e}"
        );
        let e = DataPlane::parse("shm", [("threads", "many")]).unwrap_err();
        assert!(e.to_string().contains("option threads: \"many\""), "{e}");
        let plane = DataPlane::parse("shm", [("threads", "3"), ("split_at", "65536")]).unwrap();
        // Irrefutable in a build with no other data plane.
        #[allow(irrefutable_let_patterns)]
        let DataPlane::Shm(copy) = plane
        else {
            panic!("not shm: {plane:?}");
        };
        assert_eq!((copy.threads, copy.split_at), (3, 65536));
        assert!(!DataPlane::default().needs_zmq());
        assert!(!DataPlane::default().reaches_other_hosts());
    }
}
