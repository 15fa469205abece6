//! An allow-list of peer addresses, enforced by ZeroMQ's authentication
//! protocol (ZAP, RFC 27): every connection made to a `tcp://` socket this
//! channel binds is put to a handler in the same context, which answers
//! 200 for an address on the list and 400 for any other, so that a peer
//! not on it never gets a message through. `ipc://` sockets are left to
//! the file system's permissions (ZeroMQ names no IP address for them).

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::error::{sys, ZmqError};

/// Where libzmq sends its authentication requests, in each context.
const ZAP_ENDPOINT: &str = "inproc://zeromq.zap.01";

/// The domain ferry's sockets ask ZAP about (any non-empty name turns
/// ZAP on for the NULL mechanism).
pub(crate) const DOMAIN: &str = "ferry";

/// The handler thread; stops when dropped.
pub(crate) struct ZapHandler {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ZapHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZapHandler").finish_non_exhaustive()
    }
}

impl ZapHandler {
    /// Answers `ctx`'s authentication requests from a thread of its own.
    pub(crate) fn start(ctx: &zmq::Context, allow: Vec<IpAddr>) -> Result<Self, ZmqError> {
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
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("ferry-zap".into())
            .spawn(move || serve(&socket, &allow, &flag))
            .map_err(|_| ZmqError::Malformed {
                via: ZAP_ENDPOINT.to_owned(),
                why: "cannot start the authentication thread",
            })?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
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

/// The verdict on a connection from `address` (ZAP's text form of the
/// peer's IP): its status code and text.
pub(crate) fn verdict(allow: &[IpAddr], address: &str) -> (&'static str, &'static str) {
    match address.parse::<IpAddr>() {
        Ok(ip) if allow.contains(&ip) => ("200", "OK"),
        Ok(_) => ("400", "address not on the allow-list"),
        Err(_) => ("400", "no IP address to check"),
    }
}

fn serve(socket: &zmq::Socket, allow: &[IpAddr], stop: &AtomicBool) {
    let mut refused = 0u64;
    while !stop.load(Ordering::Relaxed) {
        match socket.poll(zmq::POLLIN, 100) {
            Ok(n) if n > 0 => {}
            _ => continue,
        }
        let Ok(frames) = socket.recv_multipart(0) else {
            continue;
        };
        // version, request id, domain, address, identity, mechanism, ...
        let field = |i: usize| frames.get(i).map_or(&[][..], Vec::as_slice);
        let address = std::str::from_utf8(field(3)).unwrap_or("");
        let (code, text) = if field(0) == b"1.0" {
            verdict(allow, address)
        } else {
            ("400", "unknown ZAP version")
        };
        if code != "200" {
            refused += 1;
            // The first ten, then one in a thousand: a flood of
            // connections costs a counter, not the log.
            if refused <= 10 || refused % 1000 == 0 {
                tracing::warn!(peer = address, why = text, refused, "connection refused");
            }
        }
        let reply: [&[u8]; 6] = [b"1.0", field(1), code.as_bytes(), text.as_bytes(), b"", b""];
        let _ = socket.send_multipart(reply, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_listed_addresses_pass() {
        let allow: Vec<IpAddr> = vec!["127.0.0.2".parse().unwrap(), "::1".parse().unwrap()];
        assert_eq!(verdict(&allow, "127.0.0.2").0, "200");
        assert_eq!(verdict(&allow, "::1").0, "200");
        assert_eq!(verdict(&allow, "127.0.0.1").0, "400");
        assert_eq!(verdict(&allow, "").0, "400");
        assert_eq!(verdict(&[], "127.0.0.1").0, "400");
    }
}
