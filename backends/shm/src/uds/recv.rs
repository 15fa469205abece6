//! [`UdsReceiver`]: the listener, the connections peers made, and the
//! wait over them (and a wake descriptor) for the next message or a peer
//! gone.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tensorferry_core::transport::{ChannelEvent, ControlRecv, FaultKind, Incoming};

use super::socket::{pollfd, sys};
use super::{HELLO, MESSAGE, SPIN};
use crate::error::UdsError;

#[derive(Debug)]
pub(super) struct Inbound {
    fd: OwnedFd,
    /// The peer's endpoint, from its hello (empty until then).
    from: String,
}

/// The receiving side: the listener and the connections peers made.
#[derive(Debug)]
pub struct UdsReceiver {
    pub(super) me: String,
    pub(super) path: PathBuf,
    pub(super) listener: OwnedFd,
    pub(super) conns: Vec<Inbound>,
    /// `fds[0]` is the listener, `fds[1 + i]` is `conns[i]`.
    pub(super) fds: Vec<libc::pollfd>,
    /// Where the next scan starts, so that no peer starves the others.
    pub(super) next: usize,
    /// The endpoint of the last peer reported gone.
    pub(super) gone: String,
    /// Until when a wait polls without sleeping: [`SPIN`] past the last
    /// message, when the next of a conversation is likely near.
    pub(super) spin_until: Instant,
}

/// What one ready connection yielded.
enum Step {
    Nothing,
    Hello,
    Message(usize, usize),
    Closed,
}

impl UdsReceiver {
    fn accept_all(&mut self) -> Result<(), UdsError> {
        loop {
            // SAFETY: accept4 on our listener with no address wanted.
            let fd = unsafe {
                libc::accept4(
                    self.listener.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                )
            };
            if fd < 0 {
                let e = io::Error::last_os_error();
                return match e.raw_os_error() {
                    Some(libc::EAGAIN | libc::ECONNABORTED | libc::EINTR) => Ok(()),
                    _ => Err(UdsError::Sys {
                        call: "accept4",
                        endpoint: self.me.clone(),
                        source: e,
                    }),
                };
            }
            // SAFETY: fd was just returned by accept4; we own it.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            self.fds.push(pollfd(fd.as_raw_fd()));
            self.conns.push(Inbound {
                fd,
                from: String::new(),
            });
        }
    }

    fn read(&mut self, i: usize, buf: &mut [u8]) -> Result<Step, UdsError> {
        let fd = self.conns[i].fd.as_raw_fd();
        // SAFETY: buf is writable for its length; MSG_TRUNC makes recv
        // return the packet's real length when it is longer.
        let n = unsafe {
            libc::recv(
                fd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT | libc::MSG_TRUNC,
            )
        };
        let conn = &mut self.conns[i];
        let from = |c: &Inbound| {
            if c.from.is_empty() {
                "(unnamed peer)".to_owned()
            } else {
                c.from.clone()
            }
        };
        if n < 0 {
            return match io::Error::last_os_error().raw_os_error() {
                Some(libc::EAGAIN | libc::EINTR) => Ok(Step::Nothing),
                Some(libc::ECONNRESET) => Ok(Step::Closed),
                _ => Err(sys("recv", &from(conn))),
            };
        }
        let n = n as usize;
        if n == 0 {
            return Ok(Step::Closed);
        }
        if n > buf.len() {
            return Err(UdsError::TooLarge {
                from: from(conn),
                len: n,
                cap: buf.len(),
            });
        }
        let malformed = |c: &Inbound, why| UdsError::Malformed { from: from(c), why };
        if n < 2 || 2 + buf[1] as usize > n {
            return Err(malformed(conn, "shorter than its header"));
        }
        let start = 2 + buf[1] as usize;
        match buf[0] {
            HELLO if conn.from.is_empty() => {
                let Ok(name) = std::str::from_utf8(&buf[start..n]) else {
                    return Err(malformed(conn, "hello endpoint is not UTF-8"));
                };
                conn.from = name.to_owned();
                Ok(Step::Hello)
            }
            MESSAGE if !conn.from.is_empty() => Ok(Step::Message(start, n)),
            MESSAGE => Err(malformed(conn, "message before hello")),
            _ => Err(malformed(conn, "unknown packet kind")),
        }
    }

    fn remove(&mut self, i: usize) -> String {
        self.fds.remove(1 + i);
        self.conns.remove(i).from
    }
}

impl ControlRecv for UdsReceiver {
    type Error = UdsError;

    fn fault_kind(error: &UdsError) -> FaultKind {
        error.kind()
    }

    fn local_endpoint(&self) -> &str {
        &self.me
    }

    fn recv<'b>(
        &'b mut self,
        buf: &'b mut [u8],
        wait: Duration,
        wake: Option<RawFd>,
    ) -> Result<Option<ChannelEvent<'b>>, UdsError> {
        let deadline = Instant::now() + wait;
        // Indices only inside the loop; the borrowed answer is made after.
        let outcome = loop {
            let now = Instant::now();
            // Polled without sleeping while a message is likely near: a
            // sleeping thread's wake costs more than the polls.
            let spinning = now < self.spin_until && now < deadline;
            let left = if spinning {
                Duration::ZERO
            } else {
                deadline.saturating_duration_since(now)
            };
            let ts = libc::timespec {
                tv_sec: left.as_secs() as libc::time_t,
                tv_nsec: left.subsec_nanos() as libc::c_long,
            };
            // The wake descriptor goes last for this call only, so that
            // the connections keep their indices.
            if let Some(w) = wake {
                self.fds.push(pollfd(w));
            }
            // SAFETY: fds is a valid array of pollfd of that length.
            let r = unsafe {
                libc::ppoll(
                    self.fds.as_mut_ptr(),
                    self.fds.len() as libc::nfds_t,
                    &ts,
                    std::ptr::null(),
                )
            };
            let err = (r < 0).then(io::Error::last_os_error);
            let woke = wake.is_some() && self.fds.pop().is_some_and(|p| p.revents != 0);
            if let Some(e) = err {
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return Err(sys("ppoll", &self.me));
            }
            if r == 0 && spinning {
                if !super::yield_alone() {
                    // Another thread wants this core: polling would take
                    // its turns, so this wait sleeps instead.
                    self.spin_until = now;
                }
                continue;
            }
            if r == 0 || (woke && r == 1) {
                break None;
            }
            if self.fds[0].revents != 0 {
                self.accept_all()?;
            }
            let n = self.conns.len();
            let mut found = None;
            for k in 0..n {
                let i = (self.next + k) % n;
                if self.fds[1 + i].revents == 0 {
                    continue;
                }
                match self.read(i, buf)? {
                    Step::Nothing | Step::Hello => continue,
                    step => {
                        found = Some((i, step));
                        break;
                    }
                }
            }
            match found {
                Some((i, Step::Message(start, end))) => {
                    self.next = i + 1;
                    self.spin_until = Instant::now() + SPIN;
                    break Some(Some((i, start, end)));
                }
                Some((i, _closed)) => {
                    self.gone = self.remove(i);
                    if !self.gone.is_empty() {
                        break Some(None);
                    }
                }
                None => {}
            }
            if woke || Instant::now() >= deadline {
                break None;
            }
        };
        Ok(match outcome {
            None => None,
            Some(None) => Some(ChannelEvent::Gone { from: &self.gone }),
            Some(Some((i, start, end))) => {
                let magic_len = buf[1] as usize;
                let (head, payload) = buf[..end].split_at(start);
                Some(ChannelEvent::Message(Incoming {
                    from: &self.conns[i].from,
                    via: &self.me,
                    // The socket file's permissions guard who connects.
                    user: "",
                    magic: &head[2..2 + magic_len],
                    payload,
                }))
            }
        })
    }
}

impl Drop for UdsReceiver {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
