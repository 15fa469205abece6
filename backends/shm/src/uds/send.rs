//! [`UdsSender`]: one connection per destination, made on first use and
//! made again once if the peer behind it restarted.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::time::Duration;

use tensorferry_core::transport::{ControlSend, FaultKind};

use super::socket::{connect, path_of, send_packet};
use super::{HELLO, MESSAGE};
use crate::error::UdsError;

/// The sending side: one connection per destination, made on first use.
#[derive(Debug)]
pub struct UdsSender {
    pub(super) me: String,
    pub(super) conns: HashMap<String, OwnedFd>,
    pub(super) timeout: Duration,
}

impl UdsSender {
    fn connection(&mut self, to: &str) -> Result<&OwnedFd, UdsError> {
        if !self.conns.contains_key(to) {
            let fd = connect(to, path_of(to)?)?;
            send_packet(&fd, to, self.timeout, HELLO, b"", self.me.as_bytes())?;
            self.conns.insert(to.to_owned(), fd);
        }
        self.conns.get(to).ok_or_else(|| UdsError::BadEndpoint {
            endpoint: to.to_owned(),
            why: "connection lost",
        })
    }
}

impl ControlSend for UdsSender {
    type Error = UdsError;

    fn fault_kind(error: &UdsError) -> FaultKind {
        error.kind()
    }

    fn send(&mut self, to: &str, parts: &[&[u8]]) -> Result<(), UdsError> {
        let &[magic, payload] = parts else {
            return Err(UdsError::Frames {
                to: to.to_owned(),
                count: parts.len(),
            });
        };
        let timeout = self.timeout;
        let cached = self.conns.contains_key(to);
        let r = send_packet(self.connection(to)?, to, timeout, MESSAGE, magic, payload);
        match r {
            Err(UdsError::PeerGone { .. }) if cached => {
                // The process we were connected to is gone; whoever listens
                // at the endpoint now (a restarted peer) gets a new
                // connection, once.
                self.conns.remove(to);
                let r = send_packet(self.connection(to)?, to, timeout, MESSAGE, magic, payload);
                if r.is_err() {
                    self.conns.remove(to);
                }
                r
            }
            Err(e) => {
                if matches!(e, UdsError::PeerGone { .. }) {
                    self.conns.remove(to);
                }
                Err(e)
            }
            Ok(()) => Ok(()),
        }
    }
}
