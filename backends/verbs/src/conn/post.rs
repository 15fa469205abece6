//! Writes going out: a write queued on its peer's connection (made on
//! first use), and the pump that posts what the connection's window and
//! the CQ have room for.

use std::collections::VecDeque;

use ferry_core::transport::Completion;

use super::{forget, verb, Conn, ConnBook, ConnState, Signal, Write};
use crate::chunk::{chunk_len, Window};
use crate::device::{Device, WriteWr};
use crate::error::VerbsError;
use crate::exchange::RegionInfo;
use crate::session::Session;

impl<D: Device> ConnBook<D> {
    /// Queues a write of `len` bytes from `local_addr` (inside the
    /// registered region `lkey` names) to `dest_addr` in the peer `dest`.
    /// Returns whether the side channel must be woken (a new connection
    /// was made).
    pub fn post(
        &mut self,
        dest: &str,
        (local_addr, lkey): (u64, u32),
        len: u64,
        dest_addr: u64,
        cookie: u64,
    ) -> Result<bool, VerbsError> {
        self.tick += 1;
        let (conn_id, fresh) = match self.by_peer.get(dest) {
            Some(&id) => (id, false),
            None => {
                let session = Session::parse(dest)?;
                self.make_room(dest);
                let id = self.next_conn;
                self.next_conn = self.next_conn.wrapping_add(1).max(1);
                self.conns.insert(
                    id,
                    Conn {
                        id,
                        peer: dest.to_owned(),
                        session,
                        state: ConnState::Wanted,
                        since: None,
                        last_used: self.tick,
                        qp: None,
                        local: None,
                        regions: None,
                        window: Window::new(self.limits.send_depth),
                        next_seq: 0,
                        queue: VecDeque::new(),
                        writes: VecDeque::new(),
                        posted: false,
                        ending: None,
                    },
                );
                self.by_peer.insert(dest.to_owned(), id);
                (id, true)
            }
        };
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return Err(VerbsError::Broken {
                peer: dest.to_owned(),
                why: "connection vanished".into(),
            });
        };
        conn.last_used = self.tick;
        if let Some(regions) = &conn.regions {
            check_dest(&conn.peer, regions, dest_addr, len)?;
        }
        if len == 0 {
            // Nothing moves; an RDMA WRITE with a zero-length scatter entry
            // means 2 GiB on some NICs, so none is posted.
            self.finish(Completion {
                cookie,
                result: Ok(()),
            });
            return Ok(fresh);
        }
        let id = self.next_write;
        self.next_write += 1;
        self.writes.insert(
            id,
            Write {
                cookie,
                local_addr,
                lkey,
                rkey: 0,
                remote_addr: dest_addr,
                len,
                posted: 0,
                deadline: None,
            },
        );
        conn.queue.push_back(id);
        conn.writes.push_back(id);
        if conn.state == ConnState::Ready {
            self.pump(conn_id);
        }
        Ok(fresh)
    }

    /// Posts what the connection's window has room for (nothing once it
    /// is ending).
    pub(super) fn pump(&mut self, conn_id: u32) {
        let Some(conn) = self.conns.get_mut(&conn_id).filter(|c| c.ending.is_none()) else {
            return;
        };
        let Some(regions) = conn.regions.as_ref() else {
            return;
        };
        let mut wrs = std::mem::take(&mut self.wrs);
        wrs.clear();
        let mut refused = Vec::new();
        while conn.window.has_room() {
            if self.in_flight + self.markers_waiting >= self.cq_capacity {
                self.cq_blocked = true;
                break;
            }
            let Some(&wid) = conn.queue.front() else {
                break;
            };
            let Some(w) = self.writes.get_mut(&wid) else {
                conn.queue.pop_front();
                continue;
            };
            if w.posted == 0 {
                match check_dest(&conn.peer, regions, w.remote_addr, w.len) {
                    Ok(rkey) => w.rkey = rkey,
                    Err(e) => {
                        conn.queue.pop_front();
                        refused.push((wid, e));
                        continue;
                    }
                }
            }
            let n = chunk_len(w.len, w.posted, self.limits.max_chunk);
            let last = w.posted + u64::from(n) == w.len;
            let wr_id = (u64::from(conn.id) << 32) | u64::from(conn.next_seq);
            conn.next_seq = conn.next_seq.wrapping_add(1);
            // The last chunk of a write is signaled, and so is one that
            // fills the CQ's share: the completion that frees room must
            // come.
            let fills_cq = self.in_flight + 1 >= self.cq_capacity;
            let signaled = conn.window.take(last || fills_cq);
            self.in_flight += 1;
            if let Some(covered) = signaled {
                self.signals.insert(
                    wr_id,
                    Signal {
                        conn: conn.id,
                        covered,
                        completes: last.then_some(wid),
                    },
                );
            }
            wrs.push(WriteWr {
                wr_id,
                local_addr: w.local_addr + w.posted,
                lkey: w.lkey,
                len: n,
                remote_addr: w.remote_addr + w.posted,
                rkey: w.rkey,
                signaled: signaled.is_some(),
            });
            w.posted += u64::from(n);
            if last {
                conn.queue.pop_front();
            }
        }
        for (wid, e) in refused {
            forget(&mut conn.writes, wid);
            if let Some(w) = self.writes.remove(&wid) {
                // `finish`, spelled out: `conn` still borrows the table.
                self.done.push_back(Completion {
                    cookie: w.cookie,
                    result: Err(e),
                });
                self.news = true;
            }
        }
        let Some(qp) = conn.qp.as_mut().filter(|_| !wrs.is_empty()) else {
            self.wrs = wrs;
            return;
        };
        // Set before the post: a post that fails may have posted some.
        conn.posted = true;
        // SAFETY: every source range was checked against its registered
        // region when the write was accepted, and every destination
        // against the region the peer announced with this rkey.
        #[allow(unsafe_code)]
        let posted = unsafe { self.device.post_writes(qp, &wrs) };
        self.wrs = wrs;
        if let Err(e) = posted {
            let peer = conn.peer.clone();
            self.fail_conn(conn_id, verb(e, &peer));
        }
    }
}

/// The rkey of the peer's region that holds `len` bytes at `addr`.
fn check_dest(peer: &str, regions: &[RegionInfo], addr: u64, len: u64) -> Result<u32, VerbsError> {
    let inside = |r: &&RegionInfo| {
        addr >= r.addr
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= r.addr + r.len)
    };
    match regions.iter().find(inside) {
        Some(r) => Ok(r.rkey),
        None => Err(VerbsError::DestOutOfBounds {
            peer: peer.to_owned(),
            addr,
            len,
            regions: regions.len(),
        }),
    }
}
