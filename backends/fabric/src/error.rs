//! The backend's errors: each names the libfabric call, the provider's own
//! text for the error and, where the error concerns one peer, that peer.

use ferry_core::transport::{Fault, FaultKind};

/// A libfabric data-plane error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FabricError {
    /// A libfabric call returned an error.
    #[error("{call}{}: {text} (errno {errno})", peer_suffix(.peer))]
    Call {
        /// The call (`fi_getinfo`, `fi_mr_reg`, `fi_writemsg`, ...).
        call: &'static str,
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
    /// A write's destination lies outside the peer's registered pool.
    #[error("write of {len} bytes to {addr:#x} falls outside peer {peer}'s pool ({base:#x}, {pool_len} bytes)")]
    DestOutOfBounds {
        /// The peer's session id.
        peer: String,
        /// The destination address.
        addr: u64,
        /// The write's length.
        len: u64,
        /// The pool's base address in the peer.
        base: u64,
        /// The pool's length.
        pool_len: u64,
    },
    /// A write's source lies outside the registered region.
    #[error("write of {len} bytes at offset {offset} falls outside region {region} ({region_len} bytes)")]
    SourceOutOfBounds {
        /// The region.
        region: u32,
        /// The offset in it.
        offset: u64,
        /// The write's length.
        len: u64,
        /// The region's length.
        region_len: u64,
    },
    /// A region that is not (or no longer) registered.
    #[error("region {0} is not registered")]
    UnknownRegion(u32),
    /// A second region: the session id advertises one pool per transport.
    #[error(
        "this transport already registered its pool (region {0}); register one pool per transport"
    )]
    AlreadyRegistered(u32),
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
    /// A posted write completed with an error (from `fi_cq_readerr`).
    #[error("write to {peer} failed: {text} (errno {errno}, provider errno {prov_errno})")]
    Completion {
        /// The peer's session id.
        peer: String,
        /// The positive error value.
        errno: i32,
        /// The provider's own error number.
        prov_errno: i32,
        /// `fi_cq_strerror`'s text.
        text: String,
    },
    /// A write that neither completed nor failed in time.
    #[error("write to {peer} did not complete within {after:?}")]
    Timeout {
        /// The peer's session id.
        peer: String,
        /// The time allowed.
        after: std::time::Duration,
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

fn peer_suffix(peer: &Option<String>) -> String {
    peer.as_ref()
        .map(|p| format!(" (peer {p})"))
        .unwrap_or_default()
}

/// What kind of failure an errno is, for errors that concern a peer.
pub(crate) fn errno_kind(errno: i32) -> FaultKind {
    use ferry_fabric_sys as sys;
    match u32::try_from(errno).unwrap_or(0) {
        sys::FI_ECONNREFUSED
        | sys::FI_ECONNRESET
        | sys::FI_ECONNABORTED
        | sys::FI_EHOSTUNREACH
        | sys::FI_ENETUNREACH
        | sys::FI_EHOSTDOWN
        | sys::FI_ENETDOWN
        | sys::FI_ENOTCONN
        | sys::FI_ESHUTDOWN
        | sys::FI_EADDRNOTAVAIL => FaultKind::PeerGone,
        sys::FI_ETIMEDOUT => FaultKind::Timeout,
        sys::FI_EMSGSIZE | sys::FI_E2BIG | sys::FI_EOVERFLOW => FaultKind::TooLarge,
        sys::FI_EACCES | sys::FI_EKEYREJECTED | sys::FI_EFAULT => FaultKind::OutOfBounds,
        _ => FaultKind::Io,
    }
}

impl Fault for FabricError {
    fn kind(&self) -> FaultKind {
        match self {
            Self::Call { call, errno, .. } => match *call {
                "fi_mr_reg" | "fi_mr_bind" | "fi_mr_enable" => FaultKind::Registration,
                "fi_av_insert" => FaultKind::UnknownPeer,
                _ => errno_kind(*errno),
            },
            Self::NoProvider { .. } | Self::Unsupported { .. } | Self::Os { .. } => FaultKind::Io,
            Self::BadSession { .. } => FaultKind::UnknownPeer,
            Self::DestOutOfBounds { .. }
            | Self::SourceOutOfBounds { .. }
            | Self::UnknownRegion(_) => FaultKind::OutOfBounds,
            Self::AlreadyRegistered(_) => FaultKind::Registration,
            Self::TooManyChunks { .. } => FaultKind::TooLarge,
            Self::Completion { errno, .. } => errno_kind(*errno),
            Self::Timeout { .. } => FaultKind::Timeout,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_call_the_peer_and_the_kind() {
        let e = FabricError::Call {
            call: "fi_writemsg",
            errno: 111,
            text: "Connection refused".into(),
            peer: Some("ofi:tcp;ofi_rxm:00:1:0:10:nv".into()),
        };
        assert_eq!(
            e.to_string(),
            "fi_writemsg (peer ofi:tcp;ofi_rxm:00:1:0:10:nv): Connection refused (errno 111)"
        );
        assert_eq!(e.kind(), FaultKind::PeerGone);
        let e = FabricError::Call {
            call: "fi_mr_reg",
            errno: 12,
            text: "Cannot allocate memory".into(),
            peer: None,
        };
        assert_eq!(
            e.to_string(),
            "fi_mr_reg: Cannot allocate memory (errno 12)"
        );
        assert_eq!(e.kind(), FaultKind::Registration);
        let e = FabricError::Completion {
            peer: "p".into(),
            errno: 110,
            prov_errno: 0,
            text: "timed out".into(),
        };
        assert_eq!(e.kind(), FaultKind::Timeout);
        assert_eq!(errno_kind(13), FaultKind::OutOfBounds);
        assert_eq!(errno_kind(5), FaultKind::Io);
        assert_eq!(errno_kind(-1), FaultKind::Io);
    }
}
