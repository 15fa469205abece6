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
    /// The most RDMA READs a queue pair of the device answers at once as
    /// the responder (`max_qp_rd_atom`, the ceiling of its
    /// `max_dest_rd_atomic`), clamped to the attribute's `u8`.
    pub max_qp_rd_atom: u8,
    /// The most RDMA READs a queue pair of the device has outstanding as
    /// the initiator (`max_qp_init_rd_atom`, the ceiling of its
    /// `max_rd_atomic`), clamped to the attribute's `u8`.
    pub max_qp_init_rd_atom: u8,
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

/// The keys of one registered region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keys {
    /// For local scatter entries.
    pub lkey: u32,
    /// For peers' RDMA WRITEs and READs.
    pub rkey: u32,
}

/// Which way a one-sided transfer moves bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RdmaOp {
    /// RDMA WRITE: from local memory into the peer's.
    Write,
    /// RDMA READ: from the peer's memory into local memory.
    Read,
}

impl RdmaOp {
    /// The transfer and its relation to the peer, as errors name it
    /// ("write to", "read from").
    pub const fn toward(self) -> &'static str {
        match self {
            Self::Write => "write to",
            Self::Read => "read from",
        }
    }
}

/// One RDMA WRITE or READ work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RdmaWr {
    /// Returned in its completion.
    pub wr_id: u64,
    /// WRITE or READ.
    pub op: RdmaOp,
    /// The local address (inside a registered region): a WRITE's source,
    /// a READ's destination.
    pub local_addr: u64,
    /// That region's lkey.
    pub lkey: u32,
    /// Bytes to move (at most the port's `max_msg`).
    pub len: u32,
    /// The peer's address: a WRITE's destination, a READ's source.
    pub remote_addr: u64,
    /// The rkey of the peer's region that holds it.
    pub rkey: u32,
    /// Ask for a completion.
    pub signaled: bool,
    /// `IBV_SEND_FENCE`: not started before every earlier RDMA READ of
    /// the queue pair has completed.
    pub fence: bool,
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

/// The verbs (and the one system call on a verbs object) whose failures
/// ferry reports; what a failure means depends on the verb as much as on
/// its errno.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Verb {
    /// `ibv_get_device_list`.
    GetDeviceList,
    /// `ibv_open_device`.
    OpenDevice,
    /// `ibv_query_device`.
    QueryDevice,
    /// `ibv_query_port`.
    QueryPort,
    /// `ibv_alloc_pd`.
    AllocPd,
    /// `ibv_create_comp_channel`.
    CreateCompChannel,
    /// `fcntl(O_NONBLOCK)` on the completion channel.
    NonBlockingChannel,
    /// `ibv_create_cq`.
    CreateCq,
    /// `ibv_req_notify_cq`.
    ReqNotifyCq,
    /// `ibv_get_cq_event`.
    GetCqEvent,
    /// `ibv_poll_cq`.
    PollCq,
    /// `ibv_reg_mr`.
    RegMr,
    /// `ibv_create_qp`.
    CreateQp,
    /// `ibv_modify_qp` to INIT.
    ModifyQpInit,
    /// `ibv_modify_qp` to RTR.
    ModifyQpRtr,
    /// `ibv_modify_qp` to RTS.
    ModifyQpRts,
    /// `ibv_modify_qp` to ERR.
    ModifyQpErr,
    /// `ibv_post_send`.
    PostSend,
}

impl Verb {
    /// The verb's name, as libibverbs spells it (with the target state of
    /// a modify).
    pub const fn name(self) -> &'static str {
        match self {
            Self::GetDeviceList => "ibv_get_device_list",
            Self::OpenDevice => "ibv_open_device",
            Self::QueryDevice => "ibv_query_device",
            Self::QueryPort => "ibv_query_port",
            Self::AllocPd => "ibv_alloc_pd",
            Self::CreateCompChannel => "ibv_create_comp_channel",
            Self::NonBlockingChannel => "fcntl(completion channel, O_NONBLOCK)",
            Self::CreateCq => "ibv_create_cq",
            Self::ReqNotifyCq => "ibv_req_notify_cq",
            Self::GetCqEvent => "ibv_get_cq_event",
            Self::PollCq => "ibv_poll_cq",
            Self::RegMr => "ibv_reg_mr",
            Self::CreateQp => "ibv_create_qp",
            Self::ModifyQpInit => "ibv_modify_qp(INIT)",
            Self::ModifyQpRtr => "ibv_modify_qp(RTR)",
            Self::ModifyQpRts => "ibv_modify_qp(RTS)",
            Self::ModifyQpErr => "ibv_modify_qp(ERR)",
            Self::PostSend => "ibv_post_send",
        }
    }
}

impl std::fmt::Display for Verb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A device error: the verb and its errno.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceError {
    /// The verb.
    pub verb: Verb,
    /// The positive errno.
    pub errno: i32,
}

impl std::fmt::Display for DeviceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} (errno {})",
            self.verb,
            crate::error::errno_text(self.errno),
            self.errno
        )
    }
}

impl std::error::Error for DeviceError {}

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

    /// Registers `len` bytes at `addr` for local access, remote write and
    /// remote read (any number of regions).
    ///
    /// # Safety
    /// The memory must stay mapped until [`Device::deregister`] of these
    /// keys or drop.
    unsafe fn register(&mut self, addr: u64, len: usize) -> Result<Keys, DeviceError>;

    /// Drops the registration `keys` names (nothing if none does).
    fn deregister(&mut self, keys: Keys);

    /// Creates an RC queue pair (in RESET) on the device's CQ, able to hold
    /// `send_depth` outstanding send work requests.
    fn create_qp(&mut self, send_depth: u32) -> Result<Self::Qp, DeviceError>;

    /// The queue pair's number.
    fn qp_num(&self, qp: &Self::Qp) -> u32;

    /// Moves a queue pair to the step's state with the step's attributes.
    fn modify(&mut self, qp: &mut Self::Qp, step: &QpStep) -> Result<(), DeviceError>;

    /// Posts RDMA WRITEs and READs, in order, with one doorbell.
    ///
    /// # Safety
    /// Every local range must lie inside the registered region `lkey`
    /// names (a READ writes into it), and every remote range inside the
    /// peer's region that `rkey` names.
    unsafe fn post_rdma(&mut self, qp: &mut Self::Qp, wrs: &[RdmaWr]) -> Result<(), DeviceError>;

    /// Posts the marker that ends a queue pair's work: a signaled RDMA
    /// WRITE of no bytes (no scatter entry), with id `wr_id`, posted after
    /// the queue pair was moved to the error state. A queue pair in error
    /// executes nothing more and completes every work request it holds
    /// with a flush error, in order, so the marker's completion comes
    /// after every earlier work request's: once it is polled, nothing
    /// posted before it reads or writes memory any more (the marker the
    /// kernel's `ib_drain_sq` posts).
    fn post_marker(&mut self, qp: &mut Self::Qp, wr_id: u64) -> Result<(), DeviceError>;

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
