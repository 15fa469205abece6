//! The backend's errors: each names the verb that failed with its errno,
//! or the peer and the work-completion status, or the exchange field that
//! was refused.

use std::time::Duration;

use tensorferry_core::transport::{FaultKind, OutsidePeerRegions, RegionError};
use tensorferry_zmq::zmq;

use crate::device::{RdmaOp, Verb};
use crate::status::WcStatus;

/// An ibverbs data-plane error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerbsError {
    /// A region of this transport's: unknown, a source outside it, or one
    /// too many.
    #[error(transparent)]
    Region(#[from] RegionError),
    /// A verb returned an error.
    #[error("{verb}{}: {} (errno {errno})", peer_suffix(.peer), errno_text(*.errno))]
    Verb {
        /// The verb.
        verb: Verb,
        /// The positive errno.
        errno: i32,
        /// The peer's session id, for verbs that concern one connection.
        peer: Option<String>,
    },
    /// No RDMA device of that name (or none at all).
    #[error("no RDMA device {wanted:?}; devices present: {}", list_or_none(.present))]
    NoDevice {
        /// The name asked for.
        wanted: String,
        /// The devices `ibv_get_device_list` returned.
        present: Vec<String>,
    },
    /// The port cannot carry traffic.
    #[error("{device} port {port}: {why}")]
    Port {
        /// The device.
        device: String,
        /// The port number.
        port: u8,
        /// What is wrong (state, link layer, ...).
        why: String,
    },
    /// No GID of the port can be used (or the configured one is absent).
    #[error("{device} port {port}: no usable GID: {why}")]
    NoGid {
        /// The device.
        device: String,
        /// The port number.
        port: u8,
        /// What the table held.
        why: String,
    },
    /// Moving a queue pair to RTR timed out: the address could not be
    /// resolved, which is almost always a wrong GID index or no route.
    #[error("connecting to {peer}: ibv_modify_qp(RTR) timed out resolving GID {dgid} from local GID index {sgid_index}; this is usually a wrong GID index (try another with --gid-index, and use RoCE v2 on both ends) or no IP route between the two NICs")]
    RouteTimeout {
        /// The peer's session id.
        peer: String,
        /// The local GID index used.
        sgid_index: u8,
        /// The peer's GID.
        dgid: String,
    },
    /// A session id that is not a verbs session.
    #[error("session id {session:?} is not a verbs session: {why}")]
    BadSession {
        /// The session id.
        session: String,
        /// What is wrong with it.
        why: String,
    },
    /// A connection exchange message that is malformed or out of range.
    #[error("connection exchange with {peer}: field {field}: {why}")]
    BadExchange {
        /// The peer (session id or side-channel identity).
        peer: String,
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        why: String,
    },
    /// The peer refused the connection.
    #[error("{peer} refused the connection: {why}")]
    Refused {
        /// The peer's session id.
        peer: String,
        /// Its reason.
        why: String,
    },
    /// The peer did not answer the connection exchange in time.
    #[error("{peer} did not answer the connection exchange within {after:?} (is its side channel reachable?)")]
    ConnectTimeout {
        /// The peer's session id.
        peer: String,
        /// The time allowed.
        after: Duration,
    },
    /// A work request completed with an error status.
    #[error(
        "{} {peer} failed: work completion status {status} (vendor error {vendor_err:#x})",
        op.toward()
    )]
    Completion {
        /// A write or a read.
        op: RdmaOp,
        /// The peer's session id.
        peer: String,
        /// The status.
        status: WcStatus,
        /// The vendor's error syndrome.
        vendor_err: u32,
    },
    /// The transfer's connection broke before it completed (another
    /// transfer's error, a timeout, or the transport closing).
    #[error("{} {peer} abandoned: its connection broke ({why})", op.toward())]
    Broken {
        /// A write or a read.
        op: RdmaOp,
        /// The peer's session id.
        peer: String,
        /// Why the connection broke.
        why: String,
    },
    /// A transfer ended unfinished because its caller stopped waiting for
    /// it (`Transport::cancel_transfers`): its queue pair was stopped and
    /// flushed first, so none of its bytes moves any more.
    #[error("{} {peer} cancelled unfinished: its caller stopped waiting, and its queue pair was stopped and flushed", op.toward())]
    Cancelled {
        /// A write or a read.
        op: RdmaOp,
        /// The peer's session id.
        peer: String,
    },
    /// A transfer that neither completed nor failed in time (the write
    /// timeout, which reads keep too).
    #[error("{} {peer} did not complete within {after:?}", op.toward())]
    Timeout {
        /// A write or a read.
        op: RdmaOp,
        /// The peer's session id.
        peer: String,
        /// The time allowed.
        after: Duration,
    },
    /// A write's destination or a read's source lies in none of the
    /// peer's registered regions.
    #[error(transparent)]
    OutsidePeer(#[from] OutsidePeerRegions),
    /// The connection to the peer cannot carry RDMA READs: one of the two
    /// devices allows none outstanding (`max_qp_init_rd_atom` here, or
    /// `max_qp_rd_atom` there, is 0).
    #[error("read from {peer} cannot be posted: {why}")]
    CannotRead {
        /// The peer's session id.
        peer: String,
        /// Which end's limit.
        why: String,
    },
    /// The side channel (ZeroMQ) failed.
    #[error("verbs side channel: {what}{}: {source}", peer_suffix(.peer))]
    SideChannel {
        /// What was being done.
        what: &'static str,
        /// The peer, if one.
        peer: Option<String>,
        /// ZeroMQ's error.
        source: zmq::Error,
    },
    /// The side channel's guard: a peer that requires CURVE while this
    /// transport has no key, or a guard it could not set up.
    #[error("verbs side channel{}: {source}", peer_suffix(.peer))]
    Guard {
        /// The peer's side channel, if one.
        peer: Option<String>,
        /// The guard's error.
        source: tensorferry_zmq::ZmqError,
    },
    /// The OS refused something (a thread, a mapping, an eventfd).
    #[error("{what}: {source}")]
    Os {
        /// What was being done.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
}

impl VerbsError {
    /// The error as it concerns a transfer of kind `op` (a connection's
    /// failure is made before it is known which transfer it fails first).
    pub(crate) fn for_op(mut self, op: RdmaOp) -> Self {
        if let Self::Completion { op: o, .. }
        | Self::Broken { op: o, .. }
        | Self::Cancelled { op: o, .. }
        | Self::Timeout { op: o, .. } = &mut self
        {
            *o = op;
        }
        self
    }
}

impl From<crate::device::DeviceError> for VerbsError {
    /// A device error that concerns no peer.
    fn from(e: crate::device::DeviceError) -> Self {
        Self::Verb {
            verb: e.verb,
            errno: e.errno,
            peer: None,
        }
    }
}

fn peer_suffix(peer: &Option<String>) -> String {
    peer.as_ref()
        .map(|p| format!(" (peer {p})"))
        .unwrap_or_default()
}

fn list_or_none(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// The OS's text for an errno (without std's ` (os error N)`; the errno
/// is printed beside it).
pub(crate) fn errno_text(errno: i32) -> String {
    let text = std::io::Error::from_raw_os_error(errno).to_string();
    match text.rfind(" (os error ") {
        Some(at) => text[..at].to_owned(),
        None => text,
    }
}

impl VerbsError {
    /// What kind of failure this is (what its data plane's or channel's
    /// `fault_kind` says of it).
    pub fn kind(&self) -> FaultKind {
        match self {
            Self::Verb {
                verb: Verb::RegMr, ..
            } => FaultKind::Registration,
            Self::Verb { errno, .. } => FaultKind::of_errno(*errno),
            Self::NoDevice { .. }
            | Self::CannotRead { .. }
            | Self::Port { .. }
            | Self::NoGid { .. }
            | Self::Os { .. }
            | Self::SideChannel { .. } => FaultKind::Io,
            Self::RouteTimeout { .. } | Self::ConnectTimeout { .. } | Self::Refused { .. } => {
                FaultKind::PeerGone
            }
            Self::BadSession { .. } | Self::BadExchange { .. } => FaultKind::UnknownPeer,
            Self::Completion { status, .. } => status.kind(),
            Self::Broken { .. } => FaultKind::PeerGone,
            Self::Timeout { .. } | Self::Cancelled { .. } => FaultKind::Timeout,
            Self::OutsidePeer(e) => e.kind(),
            Self::Region(e) => e.kind(),
            Self::Guard { source, .. } => source.kind(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `e` reads `text` and is of `kind`.
    fn says(e: &VerbsError, text: &str, kind: FaultKind) {
        assert_eq!(e.to_string(), text);
        assert_eq!(e.kind(), kind, "{text}");
    }

    #[test]
    fn errors_name_the_verb_the_errno_and_the_peer() {
        let e = VerbsError::Verb {
            verb: Verb::GetDeviceList,
            errno: libc::ENOSYS,
            peer: None,
        };
        says(
            &e,
            "ibv_get_device_list: Function not implemented (errno 38)",
            FaultKind::Io,
        );
        let e = VerbsError::Verb {
            verb: Verb::RegMr,
            errno: libc::ENOMEM,
            peer: None,
        };
        assert_eq!(e.kind(), FaultKind::Registration);
        let e = VerbsError::Verb {
            verb: Verb::PostSend,
            errno: libc::ENETUNREACH,
            peer: Some("verbs:00000000000000aa@tcp://10.0.0.2:5000".into()),
        };
        assert!(e
            .to_string()
            .contains("(peer verbs:00000000000000aa@tcp://10.0.0.2:5000)"));
        assert_eq!(e.kind(), FaultKind::PeerGone);
    }

    /// The core classifies by Linux's errno numbers; they must be libc's.
    #[test]
    fn the_cores_errno_numbers_are_libcs() {
        use tensorferry_core::transport::errno as e;
        let pairs = [
            (libc::ECONNREFUSED, e::ECONNREFUSED),
            (libc::ECONNRESET, e::ECONNRESET),
            (libc::ECONNABORTED, e::ECONNABORTED),
            (libc::EHOSTUNREACH, e::EHOSTUNREACH),
            (libc::ENETUNREACH, e::ENETUNREACH),
            (libc::EHOSTDOWN, e::EHOSTDOWN),
            (libc::ENETDOWN, e::ENETDOWN),
            (libc::ENOTCONN, e::ENOTCONN),
            (libc::ESHUTDOWN, e::ESHUTDOWN),
            (libc::EADDRNOTAVAIL, e::EADDRNOTAVAIL),
            (libc::EPIPE, e::EPIPE),
            (libc::ETIMEDOUT, e::ETIMEDOUT),
            (libc::EMSGSIZE, e::EMSGSIZE),
            (libc::E2BIG, e::E2BIG),
            (libc::EOVERFLOW, e::EOVERFLOW),
            (libc::EACCES, e::EACCES),
            (libc::EKEYREJECTED, e::EKEYREJECTED),
            (libc::EFAULT, e::EFAULT),
        ];
        for (libc, core) in pairs {
            assert_eq!(libc, core);
        }
    }

    #[test]
    fn a_completion_error_names_the_peer_and_the_status() {
        let e = VerbsError::Completion {
            op: RdmaOp::Write,
            peer: "verbs:1@tcp://h:1".into(),
            status: WcStatus(12),
            vendor_err: 0x81,
        };
        says(
            &e,
            "write to verbs:1@tcp://h:1 failed: work completion status IBV_WC_RETRY_EXC_ERR (12: transport retry counter exceeded) (vendor error 0x81)",
            FaultKind::PeerGone,
        );
        let e = VerbsError::Completion {
            op: RdmaOp::Write,
            peer: "p".into(),
            status: WcStatus(10),
            vendor_err: 0,
        };
        assert_eq!(e.kind(), FaultKind::OutOfBounds);
        // The same failure of a read says so.
        let e = e.for_op(RdmaOp::Read);
        assert!(e.to_string().starts_with("read from p failed"), "{e}");
        let e = VerbsError::Cancelled {
            op: RdmaOp::Write,
            peer: "p".into(),
        }
        .for_op(RdmaOp::Read);
        assert!(e.to_string().starts_with("read from p cancelled"), "{e}");
        assert_eq!(e.kind(), FaultKind::Timeout);
        let e = VerbsError::OutsidePeer(OutsidePeerRegions {
            read: true,
            peer: "p".into(),
            addr: 0x10,
            len: 4,
            regions: 1,
        });
        assert_eq!(e.kind(), FaultKind::OutOfBounds);
    }

    #[test]
    fn an_rtr_timeout_says_what_usually_causes_it() {
        let e = VerbsError::RouteTimeout {
            peer: "p".into(),
            sgid_index: 3,
            dgid: "::ffff:10.0.0.2".into(),
        };
        let s = e.to_string();
        assert!(s.contains("GID index"), "{s}");
        assert!(s.contains("route"), "{s}");
        assert_eq!(e.kind(), FaultKind::PeerGone);
    }

    #[test]
    fn no_device_lists_what_is_present() {
        let e = VerbsError::NoDevice {
            wanted: "mlx5_9".into(),
            present: vec!["mlx5_0".into(), "mlx5_1".into()],
        };
        assert_eq!(
            e.to_string(),
            "no RDMA device \"mlx5_9\"; devices present: mlx5_0, mlx5_1"
        );
        let e = VerbsError::NoDevice {
            wanted: "rxe0".into(),
            present: vec![],
        };
        assert!(e.to_string().ends_with("devices present: none"));
    }
}
