//! The errno values [`FaultKind::of_errno`](super::FaultKind::of_errno)
//! knows, as Linux numbers them (the crate has no libc; the backends'
//! tests check these against it).

/// Argument list too long.
pub const E2BIG: i32 = 7;
/// Bad address.
pub const EFAULT: i32 = 14;
/// Permission denied (a remote key refused).
pub const EACCES: i32 = 13;
/// Broken pipe.
pub const EPIPE: i32 = 32;
/// Value too large for the type.
pub const EOVERFLOW: i32 = 75;
/// Message too long.
pub const EMSGSIZE: i32 = 90;
/// Address not available.
pub const EADDRNOTAVAIL: i32 = 99;
/// Network is down.
pub const ENETDOWN: i32 = 100;
/// Network is unreachable.
pub const ENETUNREACH: i32 = 101;
/// Connection aborted.
pub const ECONNABORTED: i32 = 103;
/// Connection reset by peer.
pub const ECONNRESET: i32 = 104;
/// Not connected.
pub const ENOTCONN: i32 = 107;
/// Endpoint shut down.
pub const ESHUTDOWN: i32 = 108;
/// Timed out.
pub const ETIMEDOUT: i32 = 110;
/// Connection refused.
pub const ECONNREFUSED: i32 = 111;
/// Host is down.
pub const EHOSTDOWN: i32 = 112;
/// No route to host.
pub const EHOSTUNREACH: i32 = 113;
/// Key rejected (libfabric: a bad memory key).
pub const EKEYREJECTED: i32 = 129;
