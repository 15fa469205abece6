//! The pools of the peers this transport writes to: each mapped here on
//! first use, checked on every write for having shrunk or gone, and
//! forgotten when it did.

use super::ShmTransport;
use crate::error::ShmError;
use crate::guard::Guard;
use crate::pool::ShmPool;
use crate::session::SessionId;

/// A peer's pool, mapped here.
#[derive(Debug)]
pub(super) struct Peer {
    // Field order is drop order: unguarded before it is unmapped.
    pub(super) guard: Option<Guard>,
    pub(super) map: ShmPool,
    pub(super) base: u64,
    pub(super) len: u64,
}

impl ShmTransport {
    /// Forgets the mapping of a peer (it went away): its memory is released
    /// here now rather than at the next failed write.
    pub fn forget_peer(&mut self, session: &str) {
        self.peers.remove(session);
    }

    /// The peer `session`, mapped on first use; a peer whose object was
    /// unlinked is dropped and reported gone.
    pub(super) fn peer(&mut self, session: &str) -> Result<&Peer, ShmError> {
        let gone = match self.peers.get(session) {
            Some(p) => {
                // Its owner may have shrunk it since: a copy past its new
                // end would fault. Checked on every write (one fstat); a
                // shrink racing the copy is caught by the kernel copy.
                let (unlinked, size) = p.map.object_state()?;
                if size < p.len {
                    let claimed = p.len;
                    self.peers.remove(session);
                    return Err(ShmError::PeerShrank {
                        session: session.to_owned(),
                        claimed,
                        actual: size,
                    });
                }
                unlinked
            }
            None => {
                let id = SessionId::parse(session)?;
                let len = usize::try_from(id.len).map_err(|_| ShmError::BadSession {
                    session: session.to_owned(),
                    why: "length exceeds the address space",
                })?;
                let map = ShmPool::open(id.name, len).map_err(|e| match e {
                    ShmError::Sys { source, .. } if source.raw_os_error() == Some(libc::ENOENT) => {
                        ShmError::PeerGone {
                            session: session.to_owned(),
                        }
                    }
                    other => other,
                })?;
                let guard = Guard::new(map.as_ptr(), map.len());
                if guard.is_none() {
                    tracing::warn!(
                        %session,
                        "writes to this peer are not guarded against it shrinking its pool (no guard slot, or no SIGBUS handler)"
                    );
                }
                let peer = Peer {
                    guard,
                    map,
                    base: id.base,
                    len: id.len,
                };
                self.peers.insert(session.to_owned(), peer);
                false
            }
        };
        if gone {
            self.peers.remove(session);
        }
        self.peers.get(session).ok_or_else(|| ShmError::PeerGone {
            session: session.to_owned(),
        })
    }
}
