//! The guard's enforcer: ZeroMQ's authentication protocol (ZAP, RFC 27).
//! libzmq puts every new connection to a guarded socket to a handler in
//! the same context before it reads a message of it; this handler answers
//! 200 for a connection the [`Guard`](crate::Guard) admits and 400 for any
//! other, so that a refused peer never gets a message through:
//!
//! - with CURVE, the connection's client key must be one of the admitted
//!   keys (the reply's User-Id is that key in Z85, which every message of
//!   the connection then carries as its "User-Id" property);
//! - on sockets bound on `tcp://` with an allow-list, the peer's address
//!   must be on it. `ipc://` sockets have no address to check (ZeroMQ
//!   names none): the file system's permissions guard them, and CURVE when
//!   it is on.
//!
//! A connection without CURVE to a CURVE socket never reaches the handler:
//! libzmq refuses it at the greeting (the mechanisms differ).

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::curve::CurvePublicKey;
use crate::error::{sys, ZmqError};
use crate::zmq;

/// Where libzmq sends its authentication requests, in each context.
const ZAP_ENDPOINT: &str = "inproc://zeromq.zap.01";

/// The domain of guarded sockets bound on `tcp://` (the allow-list
/// applies to them).
pub(crate) const DOMAIN: &str = "ferry";

/// The domain of guarded sockets bound elsewhere (`ipc://`): keys only.
pub(crate) const LOCAL_DOMAIN: &str = "ferry-local";

/// What the handler admits.
#[derive(Clone, Debug, Default)]
pub(crate) struct Policy {
    /// Addresses that may connect to `tcp://` sockets; empty: any.
    pub(crate) allow: Vec<IpAddr>,
    /// With CURVE, the client keys admitted; `None`: CURVE is off.
    pub(crate) keys: Option<Vec<CurvePublicKey>>,
}

/// The handler thread of one ZeroMQ context; stops when dropped. Declare
/// it after the sockets it guards, so that it outlives them.
pub struct ZapHandler {
    stop: Arc<AtomicBool>,
    refused: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ZapHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZapHandler")
            .field("refused", &self.refused())
            .finish_non_exhaustive()
    }
}

impl ZapHandler {
    /// Answers `ctx`'s authentication requests from a thread of its own.
    pub(crate) fn start(ctx: &zmq::Context, policy: Policy) -> Result<Self, ZmqError> {
        let socket = ctx
            .socket(zmq::REP)
            .map_err(sys("socket(REP)", ZAP_ENDPOINT))?;
        socket.bind(ZAP_ENDPOINT).map_err(|e| match e {
            zmq::Error::EADDRINUSE => ZmqError::Malformed {
                via: ZAP_ENDPOINT.to_owned(),
                why: "another authentication handler already serves this ZeroMQ context",
            },
            e => sys("bind", ZAP_ENDPOINT)(e),
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        let refused = Arc::new(AtomicU64::new(0));
        let (flag, count) = (Arc::clone(&stop), Arc::clone(&refused));
        let thread = std::thread::Builder::new()
            .name("ferry-zap".into())
            .spawn(move || serve(&socket, &policy, &flag, &count))
            .map_err(|_| ZmqError::Malformed {
                via: ZAP_ENDPOINT.to_owned(),
                why: "cannot start the authentication thread",
            })?;
        Ok(Self {
            stop,
            refused,
            thread: Some(thread),
        })
    }

    /// Connections refused so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

impl Drop for ZapHandler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The handler's answer to one request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// `200` or `400`.
    pub(crate) code: &'static str,
    /// Why.
    pub(crate) text: &'static str,
    /// The User-Id the connection's messages carry: its key in Z85.
    pub(crate) user: String,
}

impl Verdict {
    fn no(text: &'static str) -> Self {
        Self {
            code: "400",
            text,
            user: String::new(),
        }
    }
}

/// The verdict on a connection to a socket of `domain` from `address`
/// (ZAP's text form of the peer's IP) with `mechanism` and its
/// `credentials` (CURVE: the client's public key).
pub(crate) fn verdict(
    policy: &Policy,
    domain: &[u8],
    address: &str,
    mechanism: &[u8],
    credentials: &[u8],
) -> Verdict {
    let tcp = match domain {
        d if d == DOMAIN.as_bytes() => true,
        d if d == LOCAL_DOMAIN.as_bytes() => false,
        _ => return Verdict::no("a socket ferry does not guard"),
    };
    let mut user = String::new();
    if let Some(keys) = &policy.keys {
        if mechanism != b"CURVE" {
            return Verdict::no("not a CURVE connection");
        }
        let Ok(key) = <[u8; 32]>::try_from(credentials).map(CurvePublicKey) else {
            return Verdict::no("no CURVE key");
        };
        if !keys.contains(&key) {
            return Verdict::no("key not admitted");
        }
        user = key.to_z85();
    }
    if tcp && !policy.allow.is_empty() {
        // A dual-stack socket reports an IPv4 peer as `::ffff:a.b.c.d`:
        // that is the IPv4 address the list names.
        match address.parse::<IpAddr>().map(|ip| ip.to_canonical()) {
            Ok(ip) if policy.allow.iter().any(|a| a.to_canonical() == ip) => {}
            Ok(_) => return Verdict::no("address not on the allow-list"),
            Err(_) => return Verdict::no("no IP address to check"),
        }
    }
    Verdict {
        code: "200",
        text: "OK",
        user,
    }
}

fn serve(socket: &zmq::Socket, policy: &Policy, stop: &AtomicBool, refused: &AtomicU64) {
    while !stop.load(Ordering::Relaxed) {
        match socket.poll(zmq::POLLIN, 100) {
            Ok(n) if n > 0 => {}
            _ => continue,
        }
        let Ok(frames) = socket.recv_multipart(0) else {
            continue;
        };
        // version, request id, domain, address, identity, mechanism,
        // credentials...
        let field = |i: usize| frames.get(i).map_or(&[][..], Vec::as_slice);
        let address = std::str::from_utf8(field(3)).unwrap_or("");
        let v = if field(0) == b"1.0" {
            verdict(policy, field(2), address, field(5), field(6))
        } else {
            Verdict::no("unknown ZAP version")
        };
        if v.code != "200" {
            let n = refused.fetch_add(1, Ordering::Relaxed) + 1;
            // The first ten, then one in a thousand: a flood of
            // connections costs a counter, not the log.
            if n <= 10 || n % 1000 == 0 {
                let key = <[u8; 32]>::try_from(field(6))
                    .map(|k| CurvePublicKey(k).to_z85())
                    .unwrap_or_default();
                tracing::warn!(
                    peer = address,
                    key,
                    why = v.text,
                    refused = n,
                    "connection refused"
                );
            }
        }
        let reply: [&[u8]; 6] = [
            b"1.0",
            field(1),
            v.code.as_bytes(),
            v.text.as_bytes(),
            v.user.as_bytes(),
            b"",
        ];
        let _ = socket.send_multipart(reply, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(list: &[&str]) -> Policy {
        Policy {
            allow: list.iter().map(|a| a.parse().unwrap()).collect(),
            keys: None,
        }
    }

    #[test]
    fn only_listed_addresses_pass() {
        let p = allow(&["127.0.0.2", "::1"]);
        let v = |a: &str| verdict(&p, DOMAIN.as_bytes(), a, b"NULL", b"").code;
        assert_eq!(v("127.0.0.2"), "200");
        assert_eq!(v("::1"), "200");
        assert_eq!(v("127.0.0.1"), "400");
        assert_eq!(v(""), "400");
        // An IPv4 peer on a dual-stack socket is its IPv4 address.
        assert_eq!(v("::ffff:127.0.0.2"), "200");
        assert_eq!(v("::ffff:127.0.0.1"), "400");
        let none = allow(&[]);
        assert_eq!(
            verdict(&none, DOMAIN.as_bytes(), "127.0.0.1", b"NULL", b"").code,
            "200"
        );
        // A domain ferry did not set is not ferry's to admit.
        assert_eq!(verdict(&p, b"", "127.0.0.2", b"NULL", b"").code, "400");
    }

    #[test]
    fn with_curve_only_admitted_keys_pass_and_are_named() {
        let admitted = CurvePublicKey([7; 32]);
        let p = Policy {
            allow: vec!["127.0.0.1".parse().unwrap()],
            keys: Some(vec![admitted]),
        };
        let ok = verdict(&p, DOMAIN.as_bytes(), "127.0.0.1", b"CURVE", &[7; 32]);
        assert_eq!((ok.code, ok.user), ("200", admitted.to_z85()));
        let v = |d: &str, a: &str, m: &[u8], k: &[u8]| verdict(&p, d.as_bytes(), a, m, k).text;
        assert_eq!(
            v(DOMAIN, "127.0.0.1", b"CURVE", &[8; 32]),
            "key not admitted"
        );
        assert_eq!(
            v(DOMAIN, "127.0.0.1", b"NULL", b""),
            "not a CURVE connection"
        );
        assert_eq!(v(DOMAIN, "127.0.0.1", b"CURVE", &[7; 3]), "no CURVE key");
        // Both must hold on tcp; ipc has only the key to check.
        assert_eq!(
            v(DOMAIN, "10.0.0.1", b"CURVE", &[7; 32]),
            "address not on the allow-list"
        );
        assert_eq!(v(LOCAL_DOMAIN, "", b"CURVE", &[7; 32]), "OK");
    }
}
