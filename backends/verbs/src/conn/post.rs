//! Transfers going out: a write or read queued on its peer's connection
//! (made on first use), and the pump that posts what the connection's
//! window and the CQ have room for.
//!
//! Ordering: a queue pair's work requests are executed in order at the
//! responder, so a READ sees every WRITE posted before it on the same
//! connection. The other way round it is not so: a WRITE may be executed
//! while an earlier READ's response is still being fetched (the read
//! could then see the later write's bytes, and a write from memory an
//! earlier read fills could send it before it is filled). The first
//! WRITE work request after a READ therefore carries `IBV_SEND_FENCE`,
//! which holds it (and the queue behind it) until every earlier READ has
//! completed: the transfers of one connection act in the order they were
//! posted. Only a write that follows a read waits; a run of writes, or of
//! reads, is not fenced.

use std::collections::VecDeque;

use tensorferry_core::transport::{Completion, OutsidePeerRegions};

use super::{forget, verb, Conn, ConnBook, ConnState, Signal, Transfer};
use crate::chunk::{chunk_len, Window};
use crate::device::{Device, RdmaOp, RdmaWr};
use crate::error::VerbsError;
use crate::exchange::RegionInfo;
use crate::session::Session;

impl<D: Device> ConnBook<D> {
    /// Queues a transfer of `len` bytes between `local_addr` (inside the
    /// registered region `lkey` names) and `remote_addr` in the peer
    /// `dest`: a write from the first to the second, or a read from the
    /// second into the first. Returns whether the side channel must be
    /// woken (a new connection was made).
    pub fn post(
        &mut self,
        op: RdmaOp,
        dest: &str,
        (local_addr, lkey): (u64, u32),
        len: u64,
        remote_addr: u64,
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
                        read_depth: 0,
                        read_unfenced: false,
                        window: Window::new(self.limits.send_depth),
                        next_seq: 0,
                        queue: VecDeque::new(),
                        transfers: VecDeque::new(),
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
                op,
                peer: dest.to_owned(),
                why: "connection vanished".into(),
            });
        };
        conn.last_used = self.tick;
        if let Some(regions) = &conn.regions {
            check_remote(op, &conn.peer, conn.read_depth, regions, remote_addr, len)?;
        }
        if len == 0 {
            // Nothing moves; an RDMA WRITE or READ with a zero-length
            // scatter entry means 2 GiB on some NICs, so none is posted.
            self.finish(Completion {
                cookie,
                result: Ok(()),
            });
            return Ok(fresh);
        }
        let id = self.next_transfer;
        self.next_transfer += 1;
        self.transfers.insert(
            id,
            Transfer {
                op,
                cookie,
                local_addr,
                lkey,
                rkey: 0,
                remote_addr,
                len,
                posted: 0,
                deadline: None,
            },
        );
        conn.queue.push_back(id);
        conn.transfers.push_back(id);
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
            let Some(w) = self.transfers.get_mut(&wid) else {
                conn.queue.pop_front();
                continue;
            };
            if w.posted == 0 {
                let remote = check_remote(
                    w.op,
                    &conn.peer,
                    conn.read_depth,
                    regions,
                    w.remote_addr,
                    w.len,
                );
                match remote {
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
            let fence = match w.op {
                RdmaOp::Read => {
                    conn.read_unfenced = true;
                    false
                }
                RdmaOp::Write => std::mem::take(&mut conn.read_unfenced),
            };
            wrs.push(RdmaWr {
                wr_id,
                op: w.op,
                local_addr: w.local_addr + w.posted,
                lkey: w.lkey,
                len: n,
                remote_addr: w.remote_addr + w.posted,
                rkey: w.rkey,
                signaled: signaled.is_some(),
                fence,
            });
            w.posted += u64::from(n);
            if last {
                conn.queue.pop_front();
            }
        }
        for (wid, e) in refused {
            forget(&mut conn.transfers, wid);
            if let Some(w) = self.transfers.remove(&wid) {
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
        // SAFETY: every local range was checked against its registered
        // region when the transfer was accepted, and every remote range
        // against the region the peer announced with this rkey.
        #[allow(unsafe_code)]
        let posted = unsafe { self.device.post_rdma(qp, &wrs) };
        self.wrs = wrs;
        if let Err(e) = posted {
            let peer = conn.peer.clone();
            self.fail_conn(conn_id, verb(e, &peer));
        }
    }
}

/// The rkey of the peer's region that holds `len` bytes at `addr` (a
/// write's destination, a read's source); a read also needs a connection
/// that reads (`read_depth`, once it is ready).
fn check_remote(
    op: RdmaOp,
    peer: &str,
    read_depth: u8,
    regions: &[RegionInfo],
    addr: u64,
    len: u64,
) -> Result<u32, VerbsError> {
    let inside = |r: &&RegionInfo| {
        addr >= r.addr
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= r.addr + r.len)
    };
    match (op, regions.iter().find(inside)) {
        (RdmaOp::Write, Some(r)) => Ok(r.rkey),
        (RdmaOp::Read, Some(r)) if read_depth > 0 => Ok(r.rkey),
        (op, None) => Err(VerbsError::OutsidePeer(OutsidePeerRegions {
            read: op == RdmaOp::Read,
            peer: peer.to_owned(),
            addr,
            len,
            regions: regions.len(),
        })),
        (RdmaOp::Read, Some(_)) => Err(VerbsError::CannotRead {
            peer: peer.to_owned(),
            why: "the two devices allow no RDMA READ outstanding on its queue pair (max_qp_init_rd_atom here, or max_qp_rd_atom at the peer, is 0)".into(),
        }),
    }
}
