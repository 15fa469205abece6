//! The device layer: the few verbs the transport needs, behind a trait so
//! that the connection logic above it runs against a real NIC
//! ([`crate::ibv::IbvDevice`]) or, in tests, a software stand-in.

#![allow(unsafe_code)] // The trait declares the two calls whose safety rests on the caller.

use crate::attrs::QpStep;
use crate::status::WcStatus;

/// The port's link layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    /// InfiniBand: LID routing within a subnet, GRH optional.
    InfiniBand,
    /// Ethernet (RoCE): every packet carries a GRH built from GIDs.
    Ethernet,
}

/// What the transport needs to know of its port, queried once at open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortInfo {
    /// The device's name (`mlx5_0`, `rxe0`).
    pub device: String,
    /// The port number (from 1).
    pub port: u8,
    /// The link layer.
    pub link: LinkLayer,
    /// The port's LID (0 on Ethernet).
    pub lid: u16,
    /// The active MTU in bytes (256 to 4096).
    pub active_mtu: u32,
    /// The largest message one work request may carry.
    pub max_msg: u32,
    /// The most work requests a send queue may hold.
    pub max_qp_wr: u32,
}

/// The kind of a GID table entry (`ibv_gid_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GidKind {
    /// An InfiniBand GID.
    InfiniBand,
    /// RoCE v1 (Ethernet L2 only, not routable).
    RoceV1,
    /// RoCE v2 (UDP/IP, routable).
    RoceV2,
    /// A value this code does not know.
    Other(u32),
}

/// One entry of a port's GID table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidEntry {
    /// Its index in the table (what QP attributes name).
    pub index: u8,
    /// The GID, in network order.
    pub gid: [u8; 16],
    /// Its kind.
    pub kind: GidKind,
}

/// The keys of the registered pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keys {
    /// For local scatter entries.
    pub lkey: u32,
    /// For peers' RDMA writes.
    pub rkey: u32,
}

/// One RDMA WRITE work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteWr {
    /// Returned in its completion.
    pub wr_id: u64,
    /// Local source address (inside the registered pool).
    pub local_addr: u64,
    /// The pool's lkey.
    pub lkey: u32,
    /// Bytes to write (at most the port's `max_msg`).
    pub len: u32,
    /// The peer's destination address.
    pub remote_addr: u64,
    /// The peer pool's rkey.
    pub rkey: u32,
    /// Ask for a completion.
    pub signaled: bool,
}

/// A work completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wc {
    /// The work request's id.
    pub wr_id: u64,
    /// Its status.
    pub status: WcStatus,
    /// The vendor's error syndrome (when not successful).
    pub vendor_err: u32,
}

/// A device error: the verb and its errno.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceError {
    /// The verb.
    pub verb: &'static str,
    /// The positive errno.
    pub errno: i32,
}

/// An opened device port with one protection domain and one completion
/// queue: what the transport drives.
pub trait Device: Send + 'static {
    /// A queue pair of this device.
    type Qp: Send;

    /// The port, as queried at open.
    fn port(&self) -> &PortInfo;

    /// The port's GID table, as queried at open (empty entries left out).
    fn gid_table(&self) -> &[GidEntry];

    /// Completions the CQ holds.
    fn cq_capacity(&self) -> u32;

    /// Registers `len` bytes at `addr` for local access and remote write.
    ///
    /// # Safety
    /// The memory must stay mapped until [`Device::deregister`] or drop.
    unsafe fn register(&mut self, addr: u64, len: usize) -> Result<Keys, DeviceError>;

    /// Drops the registration.
    fn deregister(&mut self);

    /// Creates an RC queue pair (in RESET) on the device's CQ, able to hold
    /// `send_depth` outstanding send work requests.
    fn create_qp(&mut self, send_depth: u32) -> Result<Self::Qp, DeviceError>;

    /// The queue pair's number.
    fn qp_num(&self, qp: &Self::Qp) -> u32;

    /// Moves a queue pair to the step's state with the step's attributes.
    fn modify(&mut self, qp: &mut Self::Qp, step: &QpStep) -> Result<(), DeviceError>;

    /// Posts RDMA writes, in order, with one doorbell.
    ///
    /// # Safety
    /// Every source range must lie inside the registered pool, and every
    /// destination inside the peer's pool that `rkey` names.
    unsafe fn post_writes(&mut self, qp: &mut Self::Qp, wrs: &[WriteWr])
        -> Result<(), DeviceError>;

    /// Appends up to `max` completions to `out`.
    fn poll(&mut self, out: &mut Vec<Wc>, max: usize) -> Result<(), DeviceError>;

    /// A descriptor that turns readable when a completion arrives on an
    /// armed CQ (`None`: the device can only be polled).
    fn completion_fd(&self) -> Option<i32>;

    /// Consumes the completion events that arrived and asks for one on
    /// the next completion. Poll after arming: a completion that came
    /// before it raises no event.
    fn arm(&mut self) -> Result<(), DeviceError>;
}
