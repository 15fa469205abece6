//! Connection set-up, both sides of the exchange: a writer's (or
//! reader's) connections from wanted to ready (queue pair, request,
//! reply), a target's answer to a writer's request (its queue pair kept
//! under the requester the side channel's connection proves, see
//! `inbound`), and the closing of a connection (for room, or once it
//! ended). Each end's queue pair answers
//! as many RDMA READs at once as its device allows (up to
//! `attrs::RD_ATOMIC`), says so in the exchange, and keeps no more
//! outstanding than the other end answers.

use super::{verb, Conn, ConnBook, ConnState, Ending, Outgoing, Requester};
use crate::attrs;
use crate::device::{Device, DeviceError};
use crate::error::VerbsError;
use crate::exchange::{QpInfo, RegionInfo, Reply, Request};
use crate::gid::gid_text;
use crate::session::Session;

impl<D: Device> ConnBook<D> {
    /// A fresh 24-bit PSN (per connection, never the same twice in a row).
    pub(super) fn psn(&mut self) -> u32 {
        // splitmix64 over a per-transport random seed.
        self.psn_seed = self.psn_seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.psn_seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) & 0xff_ffff) as u32
    }

    pub(super) fn local_info(&self, qpn: u32, psn: u32) -> QpInfo {
        let port = self.device.port();
        QpInfo {
            qpn,
            lid: port.lid,
            gid: self.gid.1,
            psn,
            mtu: port.active_mtu,
            rd_atom: attrs::responder_resources(port),
        }
    }

    /// Keeps at most `max_writers` connections: peers come and go (a
    /// restarted peer has a new session), so beyond that the connection
    /// idle the longest is closed. One with writes in flight (or ending)
    /// is never closed for room; an idle one has no work left on its
    /// queue pair (the completion of its last write covered all of it).
    pub(super) fn make_room(&mut self, for_peer: &str) {
        if self.conns.len() < self.limits.max_writers.max(1) {
            return;
        }
        let idle = self
            .conns
            .values()
            .filter(|c| c.transfers.is_empty() && c.ending.is_none())
            .min_by_key(|c| c.last_used)
            .map(|c| (c.id, c.peer.clone()));
        if let Some((id, peer)) = idle {
            tracing::info!(peer = %peer, new_peer = %for_peer, "verbs: idle connection closed to make room");
            self.close_conn(id);
        }
    }

    /// Takes a connection out of the book: its queue pair goes to ERR
    /// (which stops it, should it still run anything) and is destroyed
    /// with the returned value; its work requests leave the CQ's count.
    /// Its writes are the caller's to settle.
    pub(super) fn close_conn(&mut self, conn_id: u32) -> Option<Conn<D::Qp>> {
        let mut conn = self.conns.remove(&conn_id)?;
        if self.by_peer.get(&conn.peer) == Some(&conn_id) {
            self.by_peer.remove(&conn.peer);
        }
        if let Some(qp) = conn.qp.as_mut() {
            // A failure here changes nothing: the QP is destroyed next.
            let _ = self.device.modify(qp, &attrs::QpStep::Error);
        }
        self.signals.retain(|_, s| s.conn != conn_id);
        let mut released = conn.window.in_flight();
        match conn.ending.as_ref() {
            // A marker that never completed (the last resort).
            Some(Ending {
                marker: Some(_), ..
            }) => released += 1,
            Some(Ending { marker: None, .. }) => {
                // Its marker was still waiting for room.
                self.markers_waiting = self.markers_waiting.saturating_sub(1);
            }
            _ => {}
        }
        self.in_flight = self.in_flight.saturating_sub(released);
        Some(conn)
    }

    /// Connections the side channel must start: each gets its queue pair
    /// (RESET → INIT) and an encoded request.
    pub fn start_wanted(&mut self) -> Vec<Outgoing> {
        let wanted: Vec<u32> = self
            .conns
            .values()
            .filter(|c| c.state == ConnState::Wanted)
            .map(|c| c.id)
            .collect();
        let mut out = Vec::new();
        for id in wanted {
            match self.make_qp() {
                Ok((qp, info)) => {
                    let Some(conn) = self.conns.get_mut(&id) else {
                        continue;
                    };
                    conn.qp = Some(qp);
                    conn.local = Some(info);
                    conn.state = ConnState::Requested;
                    let req = Request {
                        from: self.me.clone(),
                        to: conn.session.incarnation,
                        qp: info,
                    };
                    out.push(Outgoing {
                        conn: id,
                        endpoint: conn.session.endpoint.clone(),
                        bytes: req.encode(),
                    });
                }
                Err(e) => {
                    let peer = self
                        .conns
                        .get(&id)
                        .map(|c| c.peer.clone())
                        .unwrap_or_default();
                    self.fail_conn(id, verb(e, &peer));
                }
            }
        }
        out
    }

    pub(super) fn make_qp(&mut self) -> Result<(D::Qp, QpInfo), DeviceError> {
        // The window's work requests, and the marker that ends them.
        let depth = self
            .limits
            .send_depth
            .saturating_add(1)
            .min(self.device.port().max_qp_wr);
        let mut qp = self.device.create_qp(depth)?;
        let init = attrs::init(self.device.port());
        self.device.modify(&mut qp, &init)?;
        let psn = self.psn();
        let info = self.local_info(self.device.qp_num(&qp), psn);
        Ok((qp, info))
    }

    /// True while the connection waits for its reply (the side channel
    /// drops its request socket otherwise).
    pub fn awaiting(&self, conn: u32) -> bool {
        self.conns
            .get(&conn)
            .is_some_and(|c| c.state == ConnState::Requested)
    }

    /// Walks a requested connection to RTS with the peer's reply.
    pub fn on_reply(&mut self, conn_id: u32, bytes: &[u8]) {
        let Some(conn) = self.conns.get(&conn_id) else {
            return;
        };
        if conn.state != ConnState::Requested {
            return;
        }
        let peer = conn.peer.clone();
        let reply = match Reply::decode(bytes, &peer) {
            Ok(r) => r,
            Err(e) => return self.fail_conn(conn_id, e),
        };
        let (remote, regions) = match reply {
            Reply::Accept { qp, regions } => (qp, regions),
            Reply::Refuse { why } => {
                return self.fail_conn(conn_id, VerbsError::Refused { peer, why })
            }
        };
        let rtr = attrs::rtr(self.device.port(), self.gid.0, &remote);
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        let sq_psn = conn.local.map_or(0, |l| l.psn);
        let Some(qp) = conn.qp.as_mut() else {
            return;
        };
        if let Err(e) = self.device.modify(qp, &rtr) {
            let err = rtr_error(e, &peer, self.gid.0, &remote);
            return self.fail_conn(conn_id, err);
        }
        let read_depth = attrs::initiator_depth(self.device.port(), remote.rd_atom);
        if let Err(e) = self.device.modify(qp, &attrs::rts(sq_psn, read_depth)) {
            return self.fail_conn(conn_id, verb(e, &peer));
        }
        conn.regions = Some(regions);
        conn.read_depth = read_depth;
        conn.state = ConnState::Ready;
        tracing::debug!(peer = %peer, remote_qpn = remote.qpn, "verbs connection ready");
        self.pump(conn_id);
    }

    /// The side channel could not send a connection's request.
    pub fn on_send_failed(&mut self, conn_id: u32, e: VerbsError) {
        self.fail_conn(conn_id, e);
    }

    /// Answers a writer's request, which came from `who` (as its
    /// side-channel connection proves): a queue pair walked to RTS toward
    /// it, and our registered regions.
    ///
    /// The queue pair is kept under `who` and the writer session the
    /// request names (`from`): a request from another requester never
    /// replaces or drops it, whatever session it names; one from the same
    /// requester naming the same session replaces it (a writer
    /// reconnecting). Under CURVE a request must name a session of the
    /// key its connection authenticated with (a writer's session id
    /// carries its key), or it is refused.
    pub fn on_request(&mut self, bytes: &[u8], who: &Requester) -> Reply {
        let peer = format!("side-channel peer {who}");
        let req = match Request::decode(bytes, &peer) {
            Ok(r) => r,
            Err(e) => return Reply::Refuse { why: e.to_string() },
        };
        if let Requester::Key(key) = who {
            // `decode` checked that `from` parses; a session that does not
            // is refused all the same.
            let named = Session::parse(&req.from).ok().and_then(|s| s.key);
            if named != Some(*key) {
                self.forged += 1;
                let n = self.forged;
                // The first ten, then one in a thousand: a flood of them
                // costs a counter, not the log.
                if n <= 10 || n % 1000 == 0 {
                    tracing::warn!(
                        peer = %peer,
                        from = %req.from,
                        refused = n,
                        "verbs side channel: a request named a writer session of another key; refused"
                    );
                }
                return Reply::Refuse {
                    why: format!(
                        "the request names the writer session {}, which does not carry the CURVE key its connection authenticated with ({key})",
                        req.from
                    ),
                };
            }
        }
        if req.to != self.incarnation {
            return Reply::Refuse {
                why: format!(
                    "stale session: this endpoint is now {} (incarnation {:016x}, not {:016x})",
                    self.me, self.incarnation, req.to
                ),
            };
        }
        if self.regions.is_empty() {
            return Reply::Refuse {
                why: "no memory is registered yet".into(),
            };
        }
        // A writer that reconnects replaces its old queue pair (only its
        // own requester's entry is looked at).
        drop(self.inbound.remove(who, &req.from));
        let per = self.limits.max_per_writer;
        for d in self.inbound.make_room(who, per, self.limits.max_writers) {
            // Dropping a requester's own for its newest is routine (and a
            // flood of requests makes many): only another's is news.
            if d.who == *who {
                tracing::debug!(writer = %d.from, requester = %d.who, "verbs: the requester's oldest accepted connection dropped for its newest");
            } else {
                tracing::info!(writer = %d.from, requester = %d.who, "verbs: accepted connection of the requester holding the most dropped to make room");
            }
        }
        match self.accept(&req) {
            Ok((qp, info)) => {
                self.inbound.insert(who, req.from.clone(), qp);
                tracing::debug!(writer = %req.from, requester = %who, "verbs connection accepted");
                Reply::Accept {
                    qp: info,
                    regions: self
                        .regions
                        .iter()
                        .map(|(r, keys)| RegionInfo {
                            addr: r.addr,
                            len: r.len,
                            rkey: keys.rkey,
                        })
                        .collect(),
                }
            }
            Err(e) => {
                tracing::warn!(writer = %req.from, requester = %who, error = %e, "verbs connection refused");
                Reply::Refuse { why: e.to_string() }
            }
        }
    }

    /// Requests refused because they named a writer session whose key is
    /// not the one their connection authenticated with (under CURVE).
    pub fn forged_requests(&self) -> u64 {
        self.forged
    }

    /// Queue pairs accepted from writers and kept.
    pub fn accepted(&self) -> usize {
        self.inbound.len()
    }

    /// Queue pairs accepted from `who` and kept.
    #[cfg(test)]
    pub fn accepted_from(&self, who: &Requester) -> usize {
        self.inbound.count(who)
    }

    pub(super) fn accept(&mut self, req: &Request) -> Result<(D::Qp, QpInfo), VerbsError> {
        let (mut qp, info) = self.make_qp().map_err(|e| verb(e, &req.from))?;
        let rtr = attrs::rtr(self.device.port(), self.gid.0, &req.qp);
        self.device
            .modify(&mut qp, &rtr)
            .map_err(|e| rtr_error(e, &req.from, self.gid.0, &req.qp))?;
        let read_depth = attrs::initiator_depth(self.device.port(), req.qp.rd_atom);
        self.device
            .modify(&mut qp, &attrs::rts(info.psn, read_depth))
            .map_err(|e| verb(e, &req.from))?;
        Ok((qp, info))
    }
}

/// An RTR failure: a timeout (or unreachable network) resolving the
/// peer's address is named as the GID/route problem it usually is.
fn rtr_error(e: DeviceError, peer: &str, sgid_index: u8, remote: &QpInfo) -> VerbsError {
    if e.errno == libc::ETIMEDOUT || e.errno == libc::ENETUNREACH {
        VerbsError::RouteTimeout {
            peer: peer.to_owned(),
            sgid_index,
            dgid: gid_text(&remote.gid),
        }
    } else {
        verb(e, peer)
    }
}
