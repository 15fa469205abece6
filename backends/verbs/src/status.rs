//! Work-completion statuses (`enum ibv_wc_status`), kept as the raw value
//! so that a status this code does not know (a newer rdma-core) is still
//! reported, never a panic.

use std::fmt;

use tensorferry_core::transport::FaultKind;

/// A work completion's status, as `ibv_poll_cq` returned it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WcStatus(pub u32);

/// `IBV_WC_*` names and `ibv_wc_status_str` texts, by value.
const STATUSES: [(&str, &str); 24] = [
    ("IBV_WC_SUCCESS", "success"),
    ("IBV_WC_LOC_LEN_ERR", "local length error"),
    ("IBV_WC_LOC_QP_OP_ERR", "local QP operation error"),
    ("IBV_WC_LOC_EEC_OP_ERR", "local EE context operation error"),
    ("IBV_WC_LOC_PROT_ERR", "local protection error"),
    ("IBV_WC_WR_FLUSH_ERR", "Work Request Flushed Error"),
    ("IBV_WC_MW_BIND_ERR", "memory management operation error"),
    ("IBV_WC_BAD_RESP_ERR", "bad response error"),
    ("IBV_WC_LOC_ACCESS_ERR", "local access error"),
    ("IBV_WC_REM_INV_REQ_ERR", "remote invalid request error"),
    ("IBV_WC_REM_ACCESS_ERR", "remote access error"),
    ("IBV_WC_REM_OP_ERR", "remote operation error"),
    ("IBV_WC_RETRY_EXC_ERR", "transport retry counter exceeded"),
    ("IBV_WC_RNR_RETRY_EXC_ERR", "RNR retry counter exceeded"),
    ("IBV_WC_LOC_RDD_VIOL_ERR", "local RDD violation error"),
    ("IBV_WC_REM_INV_RD_REQ_ERR", "remote invalid RD request"),
    ("IBV_WC_REM_ABORT_ERR", "aborted error"),
    ("IBV_WC_INV_EECN_ERR", "invalid EE context number"),
    ("IBV_WC_INV_EEC_STATE_ERR", "invalid EE context state"),
    ("IBV_WC_FATAL_ERR", "fatal error"),
    ("IBV_WC_RESP_TIMEOUT_ERR", "response timeout error"),
    ("IBV_WC_GENERAL_ERR", "general error"),
    ("IBV_WC_TM_ERR", "TM error"),
    ("IBV_WC_TM_RNDV_INCOMPLETE", "TM software rendezvous"),
];

impl WcStatus {
    /// `IBV_WC_SUCCESS`.
    pub const SUCCESS: Self = Self(0);
    /// `IBV_WC_WR_FLUSH_ERR`: the queue pair was already in error.
    pub const FLUSHED: Self = Self(5);
    /// `IBV_WC_REM_ACCESS_ERR`: the rkey or address was refused.
    pub const REMOTE_ACCESS: Self = Self(10);
    /// `IBV_WC_RETRY_EXC_ERR`: the peer stopped acknowledging.
    pub const RETRY_EXCEEDED: Self = Self(12);

    /// The `IBV_WC_*` name, or `None` for a value this code does not know.
    pub fn name(self) -> Option<&'static str> {
        STATUSES.get(self.0 as usize).map(|s| s.0)
    }

    /// What kind of failure the status is.
    pub fn kind(self) -> FaultKind {
        match self.0 {
            // Retries or RNR retries exhausted, flushed, aborted: the peer
            // (or the path to it) stopped answering.
            5 | 12 | 13 | 16 => FaultKind::PeerGone,
            // The peer refused the rkey or address, or our own lkey.
            4 | 8 | 9 | 10 => FaultKind::OutOfBounds,
            1 => FaultKind::TooLarge,
            20 => FaultKind::Timeout,
            _ => FaultKind::Io,
        }
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match STATUSES.get(self.0 as usize) {
            Some((name, text)) => write!(f, "{name} ({}: {text})", self.0),
            None => write!(f, "unknown status {}", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_print_their_name_value_and_text() {
        assert_eq!(
            WcStatus::REMOTE_ACCESS.to_string(),
            "IBV_WC_REM_ACCESS_ERR (10: remote access error)"
        );
        assert_eq!(WcStatus(23).name(), Some("IBV_WC_TM_RNDV_INCOMPLETE"));
        assert_eq!(WcStatus(99).to_string(), "unknown status 99");
        assert_eq!(WcStatus(99).kind(), FaultKind::Io);
        assert_eq!(WcStatus::FLUSHED.kind(), FaultKind::PeerGone);
        assert_eq!(WcStatus(20).kind(), FaultKind::Timeout);
    }
}
