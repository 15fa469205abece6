//! The backend's errors: each names the libfabric call, the provider's own
//! text for the error and, where the error concerns one peer, that peer.

use tensorferry_core::transport::{FaultKind, OutsidePeerRegions, RegionError};

/// Which way a transfer goes, for the errors that name one: a write into
/// a peer's memory or a read from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// A one-sided write (`fi_writemsg`).
    Write,
    /// A one-sided read (`fi_readmsg`).
    Read,
}

impl OpKind {
    /// The call that posts it.
    pub const fn call(self) -> Call {
        match self {
            Self::Write => Call::WriteMsg,
            Self::Read => Call::ReadMsg,
        }
    }
}

impl std::fmt::Display for OpKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Write => "write to",
            Self::Read => "read from",
        })
    }
}

/// A libfabric data-plane error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FabricError {
    /// A region of this transport's: unknown, a source outside it, or one
    /// too many.
    #[error(transparent)]
    Region(#[from] RegionError),
    /// A libfabric call returned an error.
    #[error("{call}{}: {text} (errno {errno})", peer_suffix(.peer))]
    Call {
        /// The call.
        call: Call,
        /// The positive `FI_E*` / errno value.
        errno: i32,
        /// `fi_strerror`'s text.
        text: String,
        /// The peer's session id, for calls that concern one peer.
        peer: Option<String>,
    },
    /// No installed provider matches what was asked.
    #[error("no libfabric provider {wanted} offers RDM endpoints with RMA writes{}: {why}", if .delivery.is_empty() { String::new() } else { format!(" and {}", .delivery) })]
    NoProvider {
        /// The provider name asked for (`auto`: every preferred one).
        wanted: String,
        /// The completion semantics asked for, if any.
        delivery: &'static str,
        /// What `fi_getinfo` said.
        why: String,
    },
    /// The provider asks for something ferry does not do.
    #[error("provider {provider}: {what}")]
    Unsupported {
        /// The provider.
        provider: String,
        /// What it asks for.
        what: String,
    },
    /// A session id that is not a libfabric session of this provider.
    #[error("session id {session:?} is not a libfabric session: {why}")]
    BadSession {
        /// The session id.
        session: String,
        /// What is wrong with it.
        why: String,
    },
    /// A write's destination or a read's source lies in none of the
    /// peer's registered regions.
    #[error(transparent)]
    OutsidePeer(#[from] OutsidePeerRegions),
    /// A write is split into more chunks than a completion notice can
    /// count.
    #[error("write of {len} bytes to {peer} needs {chunks} chunks of {chunk} bytes; notices count at most {max}")]
    TooManyChunks {
        /// The peer.
        peer: String,
        /// The write's length.
        len: u64,
        /// The chunk size.
        chunk: u64,
        /// Chunks needed.
        chunks: u64,
        /// Most chunks a notice counts.
        max: u64,
    },
    /// A posted write or read completed with an error (from
    /// `fi_cq_readerr`).
    #[error("{op} {peer} failed: {text} (errno {errno}, provider errno {prov_errno})")]
    Completion {
        /// A write or a read.
        op: OpKind,
        /// The peer's session id.
        peer: String,
        /// The positive error value.
        errno: i32,
        /// The provider's own error number.
        prov_errno: i32,
        /// `fi_cq_strerror`'s text.
        text: String,
    },
    /// A write or read that neither completed nor failed in time (ended
    /// before it was reported where completions are final: none of its
    /// bytes moves any more).
    #[error("{op} {peer} did not complete within {after:?}")]
    Timeout {
        /// A write or a read.
        op: OpKind,
        /// The peer's session id.
        peer: String,
        /// The time allowed.
        after: std::time::Duration,
    },
    /// A write or read ended unfinished because its caller stopped
    /// waiting (`Transport::cancel_transfers`).
    #[error("{op} {peer} ended unfinished: its caller stopped waiting")]
    Cancelled {
        /// A write or a read.
        op: OpKind,
        /// The peer's session id.
        peer: String,
    },
    /// Writes to or reads from a peer that could not be ended: the
    /// progress thread stayed inside a provider call (libfabric 1.17's
    /// shm spins on the lock of a peer that died holding it), so the
    /// endpoint could not be reset under them. They may still move bytes:
    /// their memory stays in use (and registered) until their completions
    /// come.
    #[error("{ops} writes to or reads from {peer} could not be ended after {waited:?}: {why}; their memory stays in use until the provider ends them")]
    NotEnded {
        /// The peer's session id.
        peer: String,
        /// Writes and reads not ended.
        ops: usize,
        /// How long was waited.
        waited: std::time::Duration,
        /// Why they could not be ended.
        why: &'static str,
    },
    /// A write or read was posted to a peer when the endpoint was reset
    /// to end another peer's operations, and (where its receiver counts
    /// each chunk's remote CQ data, so that a chunk cannot be sent twice)
    /// could not be posted again.
    #[error("{op} {peer} ended unfinished: the endpoint was reset to end another peer's operations ({why})")]
    Reset {
        /// A write or a read.
        op: OpKind,
        /// The peer's session id.
        peer: String,
        /// Why the endpoint was reset.
        why: &'static str,
    },
    /// The transport's progress thread could not be started, or memory for
    /// the pool could not be mapped.
    #[error("{what}: {source}")]
    Os {
        /// What was being done.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
}

/// The libfabric calls whose failures ferry reports; what a failure means
/// depends on the call as much as on its errno.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Call {
    /// `fi_allocinfo`.
    AllocInfo,
    /// `fi_getinfo`.
    GetInfo,
    /// `fi_fabric`.
    Fabric,
    /// `fi_domain`.
    Domain,
    /// `fi_cq_open`.
    CqOpen,
    /// `fi_av_open`.
    AvOpen,
    /// `fi_av_insert`: a peer's address.
    AvInsert,
    /// `fi_endpoint`.
    Endpoint,
    /// `fi_ep_bind` of the address vector.
    EpBindAv,
    /// `fi_ep_bind` of the completion queue.
    EpBindCq,
    /// `fi_enable`.
    Enable,
    /// `fi_getname`.
    GetName,
    /// `fi_mr_reg`.
    MrReg,
    /// `fi_mr_bind`.
    MrBind,
    /// `fi_mr_enable`.
    MrEnable,
    /// `fi_writemsg`.
    WriteMsg,
    /// `fi_readmsg`.
    ReadMsg,
}

impl Call {
    /// The call's name, as libfabric spells it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::AllocInfo => "fi_allocinfo",
            Self::GetInfo => "fi_getinfo",
            Self::Fabric => "fi_fabric",
            Self::Domain => "fi_domain",
            Self::CqOpen => "fi_cq_open",
            Self::AvOpen => "fi_av_open",
            Self::AvInsert => "fi_av_insert",
            Self::Endpoint => "fi_endpoint",
            Self::EpBindAv => "fi_ep_bind(av)",
            Self::EpBindCq => "fi_ep_bind(cq)",
            Self::Enable => "fi_enable",
            Self::GetName => "fi_getname",
            Self::MrReg => "fi_mr_reg",
            Self::MrBind => "fi_mr_bind",
            Self::MrEnable => "fi_mr_enable",
            Self::WriteMsg => "fi_writemsg",
            Self::ReadMsg => "fi_readmsg",
        }
    }

    /// What any failure of this call is, whatever its errno.
    const fn fault(self) -> Option<FaultKind> {
        match self {
            Self::MrReg | Self::MrBind | Self::MrEnable => Some(FaultKind::Registration),
            Self::AvInsert => Some(FaultKind::UnknownPeer),
            _ => None,
        }
    }
}

impl std::fmt::Display for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

fn peer_suffix(peer: &Option<String>) -> String {
    peer.as_ref()
        .map(|p| format!(" (peer {p})"))
        .unwrap_or_default()
}

impl FabricError {
    /// What kind of failure this is (what its data plane's or channel's
    /// `fault_kind` says of it).
    pub fn kind(&self) -> FaultKind {
        match self {
            Self::Call { call, errno, .. } => match call.fault() {
                Some(kind) => kind,
                None => FaultKind::of_errno(*errno),
            },
            Self::NoProvider { .. } | Self::Unsupported { .. } | Self::Os { .. } => FaultKind::Io,
            Self::BadSession { .. } => FaultKind::UnknownPeer,
            Self::OutsidePeer(e) => e.kind(),
            Self::Region(e) => e.kind(),
            Self::TooManyChunks { .. } => FaultKind::TooLarge,
            Self::Completion { errno, .. } => FaultKind::of_errno(*errno),
            Self::Timeout { .. } | Self::Cancelled { .. } | Self::NotEnded { .. } => {
                FaultKind::Timeout
            }
            Self::Reset { .. } => FaultKind::Io,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_call_the_peer_and_the_kind() {
        use Call::{MrReg, WriteMsg};
        let call = |call, errno, text: &str, peer: Option<&str>| FabricError::Call {
            call,
            errno,
            text: text.into(),
            peer: peer.map(Into::into),
        };
        for (e, text, kind) in [
            (
                call(
                    WriteMsg,
                    111,
                    "Connection refused",
                    Some("ofi:tcp;ofi_rxm:00:1:0:10:nv"),
                ),
                "fi_writemsg (peer ofi:tcp;ofi_rxm:00:1:0:10:nv): Connection refused (errno 111)",
                FaultKind::PeerGone,
            ),
            (
                call(MrReg, 12, "Cannot allocate memory", None),
                "fi_mr_reg: Cannot allocate memory (errno 12)",
                FaultKind::Registration,
            ),
        ] {
            assert_eq!(e.to_string(), text);
            assert_eq!(e.kind(), kind, "{text}");
        }
        let e = FabricError::Completion {
            op: OpKind::Read,
            peer: "p".into(),
            errno: 110,
            prov_errno: 0,
            text: "timed out".into(),
        };
        assert_eq!(e.kind(), FaultKind::Timeout);
        assert!(e.to_string().starts_with("read from p failed"), "{e}");
        let e = FabricError::OutsidePeer(OutsidePeerRegions {
            read: true,
            peer: "p".into(),
            addr: 0x1000,
            len: 8,
            regions: 1,
        });
        assert_eq!(e.kind(), FaultKind::OutOfBounds);
        assert_eq!(FaultKind::of_errno(13), FaultKind::OutOfBounds);
        assert_eq!(FaultKind::of_errno(5), FaultKind::Io);
        assert_eq!(FaultKind::of_errno(-1), FaultKind::Io);
    }

    /// The core classifies by Linux's errno numbers; libfabric's `FI_E*`
    /// must be the same numbers for that to hold.
    #[test]
    fn libfabric_errnos_are_the_ones_the_core_classifies() {
        use tensorferry_core::transport::errno as e;
        use tensorferry_fabric_sys as sys;
        let pairs = [
            (sys::FI_ECONNREFUSED, e::ECONNREFUSED),
            (sys::FI_ECONNRESET, e::ECONNRESET),
            (sys::FI_ECONNABORTED, e::ECONNABORTED),
            (sys::FI_EHOSTUNREACH, e::EHOSTUNREACH),
            (sys::FI_ENETUNREACH, e::ENETUNREACH),
            (sys::FI_EHOSTDOWN, e::EHOSTDOWN),
            (sys::FI_ENETDOWN, e::ENETDOWN),
            (sys::FI_ENOTCONN, e::ENOTCONN),
            (sys::FI_ESHUTDOWN, e::ESHUTDOWN),
            (sys::FI_EADDRNOTAVAIL, e::EADDRNOTAVAIL),
            (sys::FI_ETIMEDOUT, e::ETIMEDOUT),
            (sys::FI_EMSGSIZE, e::EMSGSIZE),
            (sys::FI_E2BIG, e::E2BIG),
            (sys::FI_EOVERFLOW, e::EOVERFLOW),
            (sys::FI_EACCES, e::EACCES),
            (sys::FI_EKEYREJECTED, e::EKEYREJECTED),
            (sys::FI_EFAULT, e::EFAULT),
        ];
        for (fi, core) in pairs {
            assert_eq!(fi as i32, core);
        }
        assert_eq!(
            FaultKind::of_errno(sys::FI_EKEYREJECTED as i32),
            FaultKind::OutOfBounds
        );
    }
}
