//! The real device layer over `sideway`, which loads libibverbs at run
//! time: one opened port, one protection domain, one completion queue,
//! the memory registrations, and basic RC queue pairs that carry RDMA
//! WRITE and READ.
//!
//! This is the only module that touches verbs. Sideway panics on a few
//! values it does not know (an MTU, a GID type, a work-completion status),
//! so raw values are read here and converted by this crate instead.
#![allow(unsafe_code)]

use std::io;
use std::sync::Arc;

use sideway::ibverbs::address::{AddressHandleAttribute, Gid};
use std::os::fd::AsRawFd;

use rdma_mummy_sys::{ibv_ack_cq_events, ibv_get_cq_event, ibv_req_notify_cq};
use sideway::ibverbs::completion::{
    BasicCompletionQueue, CompletionChannel, CompletionQueue as _, PollCompletionQueueError,
};
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::{DeviceContext, Mtu};
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{
    BasicQueuePair, PostSendGuard, QueuePair, QueuePairAttribute, QueuePairState,
    SetScatterGatherEntry, WorkRequestFlags,
};
use sideway::ibverbs::AccessFlags;

use crate::attrs::{mtu_bytes, QpStep};
use crate::device::{
    Device, DeviceError, GidEntry, GidKind, Keys, LinkLayer, PortInfo, RdmaOp, RdmaWr, Verb, Wc,
};
use crate::error::VerbsError;
use crate::status::WcStatus;

/// Completion-queue entries: more than the work requests of every queue
/// pair can have signaled at once in practice; an overrun moves the CQ to
/// error, which fails the writes loudly rather than silently.
const CQ_ENTRIES: u32 = 8192;

/// `IBV_PORT_ACTIVE`.
const PORT_ACTIVE: u32 = 4;
/// `IBV_LINK_LAYER_ETHERNET`.
const LINK_ETHERNET: u8 = 2;
/// `IBV_GID_TYPE_SYSFS_ROCE_V2` as `ibv_query_gid_type` reports it.
const GID_TYPE_ROCE_V2: u32 = 1;

/// The errno inside a sideway error. Its errors wrap an `io::Error` in
/// `#[error(transparent)]` kinds, which hide it from `source()`, so a level
/// that is not an `io::Error` is read by its text, which is the
/// `io::Error`'s own (`... (os error 38)`).
fn errno_of(e: &(dyn std::error::Error + 'static)) -> i32 {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<io::Error>() {
            return io.raw_os_error().unwrap_or(libc::EIO);
        }
        if let Some(n) = os_error_in(&err.to_string()) {
            return n;
        }
        cur = err.source();
    }
    libc::EIO
}

/// The `N` of a trailing `(os error N)`.
fn os_error_in(text: &str) -> Option<i32> {
    let rest = text.strip_suffix(')')?;
    let at = rest.rfind("(os error ")?;
    rest[at + "(os error ".len()..].parse().ok()
}

fn verb_err(verb: Verb, e: &(dyn std::error::Error + 'static)) -> VerbsError {
    to_err(verb, e).into()
}

/// The names of the RDMA devices present, or the error that says why none
/// can be listed (`ENOSYS` on a kernel without RDMA support).
pub fn device_names() -> Result<Vec<String>, VerbsError> {
    let list = DeviceList::new().map_err(|e| verb_err(Verb::GetDeviceList, &e))?;
    Ok(list.iter().map(|d| d.name()).collect())
}

/// The environment variable that names the device the integration tests
/// run on.
pub const TEST_DEVICE_VAR: &str = "FERRY_VERBS_DEVICE";

/// For test harnesses: the device [`TEST_DEVICE_VAR`] names, or why the
/// verbs tests cannot run here (the variable is unset, and what the
/// machine has: its devices, or the errno that says it has none).
pub fn test_device() -> Result<String, String> {
    if let Ok(d) = std::env::var(TEST_DEVICE_VAR) {
        if !d.is_empty() {
            return Ok(d);
        }
    }
    let here = match device_names() {
        Ok(names) if names.is_empty() => "this machine has no RDMA device".to_owned(),
        Ok(names) => format!("devices here: {}", names.join(", ")),
        Err(e) => why_none(&e),
    };
    Err(format!(
        "{TEST_DEVICE_VAR} is not set ({here}); set it to an RDMA device, e.g. {TEST_DEVICE_VAR}=rxe0"
    ))
}

/// For tests that need a device (`#[ignore]`d, run with `--ignored`):
/// the device to test on. Without one it panics with the reason, so that
/// a run that asked for the device tests cannot pass without them.
pub fn require_test_device() -> String {
    test_device().unwrap_or_else(|why| panic!("the verbs device tests cannot run: {why}"))
}

/// Why listing the devices failed: the verb, its errno, and what that
/// usually means.
pub(crate) fn why_none(e: &VerbsError) -> String {
    format!("no RDMA device can exist here: {e}{}", hint(e))
}

fn hint(e: &VerbsError) -> &'static str {
    match e {
        VerbsError::Verb {
            errno: libc::ENOSYS,
            ..
        } => " (the kernel has no RDMA support)",
        VerbsError::Verb {
            errno: libc::EOPNOTSUPP,
            ..
        } => " (libibverbs.so.1 could not be loaded: install libibverbs1 / rdma-core)",
        _ => "",
    }
}

/// An opened port of a real RDMA device.
pub struct IbvDevice {
    port: PortInfo,
    gids: Vec<GidEntry>,
    // Field order is drop order: the registration and CQ go before the PD
    // and the context (sideway also holds parents by `Arc`).
    /// The registrations, with their keys.
    mrs: Vec<(Keys, Arc<MemoryRegion>)>,
    cq: Arc<BasicCompletionQueue>,
    channel: Arc<CompletionChannel>,
    armed: bool,
    pd: Arc<ProtectionDomain>,
    _ctx: Arc<DeviceContext>,
}

impl std::fmt::Debug for IbvDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvDevice")
            .field("port", &self.port)
            .field("gids", &self.gids.len())
            .finish()
    }
}

impl IbvDevice {
    /// Opens port `port` of the device named `name`.
    pub fn open(name: &str, port: u8) -> Result<Self, VerbsError> {
        let list = DeviceList::new().map_err(|e| verb_err(Verb::GetDeviceList, &e))?;
        let device =
            list.iter()
                .find(|d| d.name() == name)
                .ok_or_else(|| VerbsError::NoDevice {
                    wanted: name.to_owned(),
                    present: list.iter().map(|d| d.name()).collect(),
                })?;
        let ctx = device.open().map_err(|e| verb_err(Verb::OpenDevice, &e))?;
        let dev_attr = ctx
            .query_device()
            .map_err(|e| verb_err(Verb::QueryDevice, &e))?;
        let port_err = |why: String| VerbsError::Port {
            device: name.to_owned(),
            port,
            why,
        };
        if port == 0 || port > dev_attr.phys_port_cnt() {
            return Err(port_err(format!(
                "no such port (the device has {})",
                dev_attr.phys_port_cnt()
            )));
        }
        let attr = ctx
            .query_port(port)
            .map_err(|e| verb_err(Verb::QueryPort, &e))?
            .attr;
        if attr.state != PORT_ACTIVE {
            return Err(port_err(format!(
                "not active (state {}; is the link up?)",
                attr.state
            )));
        }
        let link = if attr.link_layer == LINK_ETHERNET {
            LinkLayer::Ethernet
        } else {
            LinkLayer::InfiniBand
        };
        let active_mtu = mtu_bytes(attr.active_mtu)
            .ok_or_else(|| port_err(format!("active MTU value {} unknown", attr.active_mtu)))?;
        let info = PortInfo {
            device: name.to_owned(),
            port,
            link,
            lid: attr.lid,
            active_mtu,
            max_msg: attr.max_msg_sz.max(1),
            max_qp_wr: u32::try_from(dev_attr.max_qp_wr()).unwrap_or(1).max(1),
            // `ibv_qp_attr` holds them as `uint8_t`; a negative value (a
            // broken driver) reads as none.
            max_qp_rd_atom: rd_atom_limit(dev_attr.max_qp_rd_atom()),
            max_qp_init_rd_atom: rd_atom_limit(dev_attr.max_qp_init_rd_atom()),
        };
        let mut gids = Vec::new();
        for index in 0..u32::try_from(attr.gid_tbl_len).unwrap_or(0).min(256) {
            let Ok(gid) = ctx.query_gid(port, index) else {
                continue;
            };
            if gid.is_zero() {
                continue;
            }
            let kind = match link {
                LinkLayer::InfiniBand => GidKind::InfiniBand,
                LinkLayer::Ethernet => match ctx.query_gid_type(port, index) {
                    Ok(0) => GidKind::RoceV1,
                    Ok(GID_TYPE_ROCE_V2) => GidKind::RoceV2,
                    Ok(other) => GidKind::Other(other),
                    Err(_) => continue,
                },
            };
            gids.push(GidEntry {
                // Bounded by min(256) above.
                index: index as u8,
                gid: gid.raw,
                kind,
            });
        }
        let pd = ctx.alloc_pd().map_err(|e| verb_err(Verb::AllocPd, &e))?;
        let channel =
            CompletionChannel::new(&ctx).map_err(|e| verb_err(Verb::CreateCompChannel, &e))?;
        channel
            .set_nonblocking(true)
            .map_err(|e| verb_err(Verb::NonBlockingChannel, &e))?;
        let cq = ctx
            .create_cq_builder()
            .setup_cqe(CQ_ENTRIES)
            .setup_comp_channel(&channel, 0)
            .build()
            .map_err(|e| verb_err(Verb::CreateCq, &e))?;
        Ok(Self {
            port: info,
            gids,
            mrs: Vec::new(),
            cq,
            channel,
            armed: false,
            pd,
            _ctx: ctx,
        })
    }
}

/// A device's read limit as the `u8` a queue pair's attribute holds.
fn rd_atom_limit(v: i32) -> u8 {
    u8::try_from(v.max(0)).unwrap_or(u8::MAX)
}

fn to_err(verb: Verb, e: &(dyn std::error::Error + 'static)) -> DeviceError {
    DeviceError {
        verb,
        errno: errno_of(e),
    }
}

impl Device for IbvDevice {
    type Qp = BasicQueuePair;

    fn port(&self) -> &PortInfo {
        &self.port
    }

    fn gid_table(&self) -> &[GidEntry] {
        &self.gids
    }

    fn cq_capacity(&self) -> u32 {
        CQ_ENTRIES
    }

    unsafe fn register(&mut self, addr: u64, len: usize) -> Result<Keys, DeviceError> {
        // SAFETY: the caller keeps `len` bytes at `addr` mapped until
        // `deregister` or drop (the trait's contract). LocalWrite: a READ
        // places its bytes here; RemoteWrite and RemoteRead: for peers'
        // WRITEs and READs (which the QP's access flags allow as well).
        let mr = unsafe {
            self.pd.reg_mr(
                addr as usize,
                len,
                AccessFlags::LocalWrite | AccessFlags::RemoteWrite | AccessFlags::RemoteRead,
            )
        }
        .map_err(|e| to_err(Verb::RegMr, &e))?;
        let keys = Keys {
            lkey: mr.lkey(),
            rkey: mr.rkey(),
        };
        self.mrs.push((keys, mr));
        Ok(keys)
    }

    fn deregister(&mut self, keys: Keys) {
        self.mrs.retain(|(k, _)| *k != keys);
    }

    fn create_qp(&mut self, send_depth: u32) -> Result<Self::Qp, DeviceError> {
        self.pd
            .create_qp_builder()
            .setup_max_send_wr(send_depth)
            .setup_max_recv_wr(1)
            .setup_max_send_sge(1)
            .setup_max_recv_sge(1)
            .setup_send_cq(Arc::clone(&self.cq))
            .setup_recv_cq(Arc::clone(&self.cq))
            .build()
            .map_err(|e| to_err(Verb::CreateQp, &e))
    }

    fn qp_num(&self, qp: &Self::Qp) -> u32 {
        qp.qp_number()
    }

    fn modify(&mut self, qp: &mut Self::Qp, step: &QpStep) -> Result<(), DeviceError> {
        let mut a = QueuePairAttribute::new();
        match *step {
            QpStep::Init {
                port,
                pkey_index,
                remote_write,
                remote_read,
            } => {
                let mut access = AccessFlags::LocalWrite;
                if remote_write {
                    access |= AccessFlags::RemoteWrite;
                }
                if remote_read {
                    access |= AccessFlags::RemoteRead;
                }
                a.setup_state(QueuePairState::Init)
                    .setup_pkey_index(pkey_index)
                    .setup_port(port)
                    .setup_access_flags(access);
            }
            QpStep::Rtr {
                av,
                path_mtu,
                dest_qpn,
                rq_psn,
                max_dest_rd_atomic,
                min_rnr_timer,
            } => {
                let mut ah = AddressHandleAttribute::new();
                ah.setup_dest_lid(av.dlid)
                    .setup_service_level(av.sl)
                    .setup_port(av.port);
                if let Some(grh) = av.grh {
                    ah.setup_grh(
                        &Gid { raw: grh.dgid },
                        0,
                        grh.sgid_index,
                        grh.hop_limit,
                        grh.traffic_class,
                    );
                }
                let mtu = match path_mtu {
                    1 => Mtu::Mtu256,
                    2 => Mtu::Mtu512,
                    3 => Mtu::Mtu1024,
                    4 => Mtu::Mtu2048,
                    _ => Mtu::Mtu4096,
                };
                a.setup_state(QueuePairState::ReadyToReceive)
                    .setup_address_vector(&ah)
                    .setup_path_mtu(mtu)
                    .setup_dest_qp_num(dest_qpn)
                    .setup_rq_psn(rq_psn)
                    .setup_max_dest_read_atomic(max_dest_rd_atomic)
                    .setup_min_rnr_timer(min_rnr_timer);
            }
            QpStep::Rts {
                timeout,
                retry_cnt,
                rnr_retry,
                sq_psn,
                max_rd_atomic,
            } => {
                a.setup_state(QueuePairState::ReadyToSend)
                    .setup_timeout(timeout)
                    .setup_retry_cnt(retry_cnt)
                    .setup_rnr_retry(rnr_retry)
                    .setup_sq_psn(sq_psn)
                    .setup_max_read_atomic(max_rd_atomic);
            }
            QpStep::Error => {
                a.setup_state(QueuePairState::Error);
            }
        }
        qp.modify(&a).map_err(|e| to_err(step.verb(), &e))
    }

    unsafe fn post_rdma(&mut self, qp: &mut Self::Qp, wrs: &[RdmaWr]) -> Result<(), DeviceError> {
        let mut guard = qp.start_post_send();
        for wr in wrs {
            let mut flags = WorkRequestFlags::none();
            if wr.signaled {
                flags |= WorkRequestFlags::Signaled;
            }
            if wr.fence {
                flags |= WorkRequestFlags::Fence;
            }
            let wr_handle = guard.construct_wr(wr.wr_id, flags);
            let handle = match wr.op {
                RdmaOp::Write => wr_handle.setup_write(wr.rkey, wr.remote_addr),
                RdmaOp::Read => wr_handle.setup_read(wr.rkey, wr.remote_addr),
            };
            // SAFETY: the caller guarantees the local range lies inside
            // the region registered with `lkey` (the trait's contract);
            // the NIC reads it (WRITE) or fills it (READ), nothing here
            // dereferences it.
            unsafe { handle.setup_sge(wr.lkey, wr.local_addr, wr.len) };
        }
        guard.post().map_err(|e| to_err(Verb::PostSend, &e))
    }

    fn post_marker(&mut self, qp: &mut Self::Qp, wr_id: u64) -> Result<(), DeviceError> {
        let mut guard = qp.start_post_send();
        // No scatter entry: the write names no local memory, and a write
        // of no bytes needs no remote key.
        let _ = guard
            .construct_wr(wr_id, WorkRequestFlags::Signaled)
            .setup_write(0, 0);
        guard.post().map_err(|e| to_err(Verb::PostSend, &e))
    }

    fn poll(&mut self, out: &mut Vec<Wc>, max: usize) -> Result<(), DeviceError> {
        let poller = match self.cq.start_poll() {
            Ok(p) => p,
            Err(PollCompletionQueueError::CompletionQueueEmpty) => return Ok(()),
            Err(e) => return Err(to_err(Verb::PollCq, &e)),
        };
        for wc in poller.take(max) {
            out.push(Wc {
                wr_id: wc.wr_id(),
                status: WcStatus(wc.status()),
                vendor_err: wc.vendor_err(),
            });
        }
        Ok(())
    }

    fn completion_fd(&self) -> Option<i32> {
        Some(self.channel.as_raw_fd())
    }

    fn arm(&mut self) -> Result<(), DeviceError> {
        // SAFETY: the channel and CQ are alive (held by `self`); the
        // out-parameters are locals; the channel is nonblocking, so the
        // loop ends at EAGAIN.
        let cq = unsafe { self.cq.cq() }.as_ptr();
        let mut events = 0u32;
        loop {
            let mut ev_cq = std::ptr::null_mut();
            let mut ev_ctx = std::ptr::null_mut();
            // SAFETY: see above.
            let r = unsafe {
                ibv_get_cq_event(
                    self.channel.comp_channel().as_ptr(),
                    &mut ev_cq,
                    &mut ev_ctx,
                )
            };
            if r == 0 {
                events += 1;
                continue;
            }
            let errno = io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO);
            if errno == libc::EAGAIN || errno == libc::EWOULDBLOCK {
                break;
            }
            return Err(DeviceError {
                verb: Verb::GetCqEvent,
                errno,
            });
        }
        if events > 0 {
            // SAFETY: acknowledges exactly the events taken above, on the
            // CQ they came from (the only CQ on this channel).
            unsafe { ibv_ack_cq_events(cq, events) };
            self.armed = false;
        }
        if !self.armed {
            // SAFETY: a live CQ created on a device context with its ops.
            let r = unsafe { ibv_req_notify_cq(cq, 0) };
            if r != 0 {
                return Err(DeviceError {
                    verb: Verb::ReqNotifyCq,
                    errno: r,
                });
            }
            self.armed = true;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_errno_is_found_behind_transparent_wrappers() {
        #[derive(Debug, thiserror::Error)]
        #[error(transparent)]
        struct Kind(io::Error);
        #[derive(Debug, thiserror::Error)]
        #[error("failed to get device list")]
        struct Outer(#[source] Kind);
        let e = Outer(Kind(io::Error::from_raw_os_error(libc::ENOSYS)));
        assert_eq!(errno_of(&e), libc::ENOSYS);
        assert_eq!(errno_of(&io::Error::from_raw_os_error(2)), 2);
        assert_eq!(errno_of(&io::Error::other("no errno")), libc::EIO);
        assert_eq!(os_error_in("x (os error 110)"), Some(110));
        assert_eq!(os_error_in("x (os error )"), None);
        assert_eq!(os_error_in("nothing"), None);
    }

    #[test]
    fn listing_devices_gives_names_or_the_errno() {
        // Whatever this machine has, the answer is a list or a typed error
        // with the errno (ENOSYS on a kernel without RDMA support).
        match device_names() {
            Ok(names) => assert!(names.iter().all(|n| !n.is_empty())),
            Err(VerbsError::Verb { verb, errno, .. }) => {
                assert_eq!(verb, Verb::GetDeviceList);
                assert_ne!(errno, libc::EIO, "the real errno, not a placeholder");
            }
            Err(other) => panic!("{other}"),
        }
    }
}
