//! The send queues at work: posting work requests, executing them (the
//! copy, or the status a NIC would give), and completing them in order as
//! the device's faults allow.

use super::{err, net, Net, SimDevice, State};
use crate::device::{DeviceError, RdmaOp, RdmaWr, Verb, Wc};
use crate::status::WcStatus;

impl SimDevice {
    pub(super) fn complete(&mut self, qpn: u32, wc: Wc) {
        self.cq.push_back((qpn, wc));
        self.cq_peak = self.cq_peak.max(self.cq.len());
        if self.armed {
            // One event per arming, as a CQ raises.
            self.armed = false;
            self.events.signal();
        }
    }

    /// Moves queue pair `qpn`'s send queue on as far as the device's
    /// faults let it: executes what waits (in order, unless stalled, and
    /// nothing once the queue pair is in error), then completes from the
    /// front what is executed and acknowledged (unless held), an error at
    /// once, and everything left with a flush once in error.
    pub(super) fn progress(&mut self, n: &mut Net, qpn: u32) -> Vec<Wc> {
        let Some(q) = n.qps.get_mut(&qpn) else {
            return Vec::new();
        };
        let mut sq = std::mem::take(&mut q.sq);
        let mut state = q.state;
        let (dest_qpn, max_rd_atomic) = (q.dest_qpn, q.max_rd_atomic);
        if state != State::Error && !self.stall {
            for (wr, status) in sq.iter_mut().filter(|(_, s)| s.is_none()) {
                if state == State::Error {
                    break;
                }
                let s = self.execute(n, (dest_qpn, max_rd_atomic), wr);
                if s != WcStatus::SUCCESS {
                    state = State::Error;
                }
                *status = Some(s);
            }
        }
        let mut out = Vec::new();
        while let Some(&(wr, status)) = sq.front() {
            let wc = match status {
                // The peer's refusal (or the retries running out) is
                // reported as it happens.
                Some(s) if s != WcStatus::SUCCESS => Some(s),
                Some(_) if !self.hold => wr.signaled.then_some(WcStatus::SUCCESS),
                _ if state == State::Error => Some(WcStatus::FLUSHED),
                _ => break,
            };
            sq.pop_front();
            if let Some(status) = wc {
                out.push(Wc {
                    wr_id: wr.wr_id,
                    status,
                    vendor_err: 0,
                });
            }
        }
        self.waits |= !sq.is_empty();
        if let Some(q) = n.qps.get_mut(&qpn) {
            q.sq = sq;
            q.state = state;
        }
        out
    }

    /// Executes one work request of a queue pair connected to
    /// `dest_qpn` that keeps `max_rd_atomic` READs outstanding: the copy,
    /// or the status a NIC would complete it with.
    fn execute(&mut self, n: &Net, (dest_qpn, max_rd_atomic): (u32, u8), wr: &RdmaWr) -> WcStatus {
        if let Some(s) = self.fail_next.take() {
            return s;
        }
        let dest = n
            .qps
            .get(&dest_qpn)
            .filter(|d| matches!(d.state, State::Rtr | State::Rts));
        let Some(dest) = dest else {
            return WcStatus::RETRY_EXCEEDED;
        };
        if wr.op == RdmaOp::Read && max_rd_atomic == 0 {
            // A READ on a queue pair allowed none outstanding.
            return WcStatus(2); // IBV_WC_LOC_QP_OP_ERR
        }
        if wr.len == 0 {
            // A transfer of no bytes touches no memory and checks no key.
            return WcStatus::SUCCESS;
        }
        let allowed = match wr.op {
            RdmaOp::Write => dest.remote_write,
            RdmaOp::Read if dest.max_dest_rd_atomic == 0 => {
                return WcStatus(9); // IBV_WC_REM_INV_REQ_ERR
            }
            RdmaOp::Read => dest.remote_read,
        };
        let remote = n.mrs.get(&wr.rkey).filter(|m| {
            m.dev == dest.dev
                && wr.remote_addr >= m.addr
                && wr.remote_addr + u64::from(wr.len) <= m.addr + m.len
        });
        let local_ok = self.mrs.iter().any(|&(key, addr, len)| {
            key == wr.lkey
                && wr.local_addr >= addr
                && wr.local_addr + u64::from(wr.len) <= addr + len
        });
        if !local_ok {
            WcStatus(4) // IBV_WC_LOC_PROT_ERR
        } else if remote.is_none() || !allowed {
            WcStatus::REMOTE_ACCESS
        } else {
            let (from, to) = match wr.op {
                RdmaOp::Write => (wr.local_addr, wr.remote_addr),
                RdmaOp::Read => (wr.remote_addr, wr.local_addr),
            };
            // SAFETY: the local range lies inside this device's
            // registration and the remote one inside the peer's (both
            // checked just above, under the lock that deregistration also
            // takes); both are mappings of this process that their
            // transports keep alive while registered.
            unsafe {
                std::ptr::copy_nonoverlapping(from as *const u8, to as *mut u8, wr.len as usize);
            }
            WcStatus::SUCCESS
        }
    }

    /// Queues `wrs` on queue pair `qpn` (which must be in RTS or in
    /// error, with a free slot for each) and moves it on.
    pub(super) fn post(&mut self, qpn: u32, wrs: &[RdmaWr]) -> Result<(), DeviceError> {
        let done = {
            let mut n = net();
            let refused = match n.qps.get(&qpn) {
                None => Some(libc::EINVAL),
                Some(q) if !matches!(q.state, State::Rts | State::Error) => Some(libc::EINVAL),
                Some(q) if q.slots.len() + wrs.len() > q.depth as usize => Some(libc::ENOMEM),
                Some(q) if q.state == State::Error => self.post_in_error_errno,
                Some(_) => None,
            };
            if let Some(errno) = refused {
                self.posts_refused += 1;
                return Err(err(Verb::PostSend, errno));
            }
            self.fenced += wrs.iter().filter(|wr| wr.fence).count();
            if let Some(q) = n.qps.get_mut(&qpn) {
                q.slots.extend(wrs.iter().map(|wr| wr.wr_id));
                q.sq.extend(wrs.iter().map(|&wr| (wr, None)));
            }
            self.progress(&mut n, qpn)
        };
        for wc in done {
            self.complete(qpn, wc);
        }
        Ok(())
    }
}
