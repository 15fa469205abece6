//! tensorferry-core's `ControlChannel` for processes on one host: Unix
//! `SOCK_SEQPACKET` sockets.
//!
//! The layout mirrors sglang's ZeroMQ one: every process listens on its own
//! endpoint (`ipc://<path>`) and connects to the endpoints it sends to. A
//! packet keeps message boundaries, a connection's first packet names the
//! sender's endpoint (so the receiver knows who spoke, which a ZeroMQ PULL
//! socket cannot tell), and a connection that closes tells the receiver
//! that the peer's process is gone: its kernel closed the socket.
//!
//! Packet: `[kind: u8][magic length: u8][magic][payload]`, kind 1 = hello
//! (payload: the sender's endpoint), kind 2 = message.
//!
//! Modules: the socket calls and the packet format (`socket`), the sending
//! side (`send`) and the receiving side (`recv`).

mod recv;
mod send;
mod socket;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tensorferry_core::transport::ControlChannel;

pub use recv::UdsReceiver;
pub use send::UdsSender;

use crate::error::UdsError;
use socket::{at_path, connect, path_of, pollfd, socket, sys, AddrCall};

/// Packet kind: a connection's first packet, naming the sender.
const HELLO: u8 = 1;

/// Packet kind: a message.
const MESSAGE: u8 = 2;

/// How long after a message a wait for the next polls without sleeping:
/// about a round trip of a few messages between processes of one host,
/// so that the answer to what a node just sent is read without the
/// sleep and wake around it (a context switch each, and an idle core's
/// way out of its idle state); past it, a wait sleeps.
const SPIN: Duration = Duration::from_micros(100);

/// Yields the core between two polls; true if no other thread took it
/// meanwhile (the yield came straight back). A poll that shares its core
/// with other runnable threads takes their turns rather than saving a
/// wake, and stops.
pub(crate) fn yield_alone() -> bool {
    let t0 = std::time::Instant::now();
    std::thread::yield_now();
    t0.elapsed() < SHARED_CORE
}

/// A yield that takes this long ran another thread on the core.
const SHARED_CORE: Duration = Duration::from_micros(5);

/// How long a send waits for a peer whose queue is full.
const SEND_TIMEOUT: Duration = Duration::from_secs(2);

/// A control channel bound to one endpoint.
#[derive(Debug)]
pub struct UdsChannel {
    sender: UdsSender,
    receiver: UdsReceiver,
}

impl UdsChannel {
    /// Listens on `endpoint` (`ipc://<path>`). A socket file left by a
    /// process that died is replaced; one in use is an error.
    pub fn bind(endpoint: &str) -> Result<Self, UdsError> {
        let path = path_of(endpoint)?;
        if Path::new(path).exists() {
            // A listener answers a connect; a stale file refuses it.
            match connect(endpoint, path) {
                Ok(_) => {
                    return Err(UdsError::Sys {
                        call: "bind",
                        endpoint: endpoint.to_owned(),
                        source: io::Error::from(io::ErrorKind::AddrInUse),
                    })
                }
                Err(_) => {
                    let _ = std::fs::remove_file(path);
                }
            }
        }
        let listener = socket(endpoint, true)?;
        if at_path(&listener, path, AddrCall::Bind) != 0 {
            return Err(sys("bind", endpoint));
        }
        // SAFETY: a bound socket.
        if unsafe { libc::listen(listener.as_raw_fd(), 256) } != 0 {
            return Err(sys("listen", endpoint));
        }
        let me = format!("ipc://{path}");
        let fds = vec![pollfd(listener.as_raw_fd())];
        Ok(Self {
            sender: UdsSender {
                me: me.clone(),
                conns: HashMap::new(),
                timeout: SEND_TIMEOUT,
            },
            receiver: UdsReceiver {
                me,
                path: PathBuf::from(path),
                listener,
                conns: Vec::new(),
                fds,
                next: 0,
                gone: String::new(),
                spin_until: std::time::Instant::now(),
            },
        })
    }

    /// The endpoint it listens on.
    pub fn endpoint(&self) -> &str {
        &self.receiver.me
    }
}

impl ControlChannel for UdsChannel {
    type Sender = UdsSender;
    type Receiver = UdsReceiver;

    fn split(self) -> (UdsSender, UdsReceiver) {
        (self.sender, self.receiver)
    }
}
