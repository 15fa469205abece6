//! A software stand-in for an RDMA port, for tests on machines without
//! one: queue pairs with the verbs state rules, memory registrations with
//! keys and bounds, and RDMA WRITE and READ as copies between
//! registrations of the same process (a WRITE from the local one into the
//! peer's, a READ from the peer's into the local one), completing with
//! the status a NIC would give (retry exceeded for a peer that is gone,
//! remote access error for a bad key or range or a queue pair that does
//! not allow the access, remote invalid request for a READ the peer
//! answers none of, flush once a queue pair is in error). Its queue pairs
//! keep the read limits a NIC enforces: `max_rd_atomic` and
//! `max_dest_rd_atomic` within the port's `max_qp_init_rd_atom` and
//! `max_qp_rd_atom`, and a READ needs both above 0.
//!
//! Each queue pair keeps its send queue: a work request is executed (its
//! bytes copied) and then acknowledged (its completion raised), in order.
//! A queue pair moved to the error state executes nothing more: every work
//! request it still holds, executed and unacknowledged or not executed at
//! all, completes with a flush error, signaled or not, and so does every
//! one posted to it afterwards. Work requests that completed before stay
//! as they were.
//!
//! Faults are switched on per device: an RTR that fails with an errno, a
//! peer that stops taking work (`stall`: WRITEs and READs wait
//! unexecuted) or stops acknowledging it (`hold`: executed, not
//! completed), the next work request failing with a given status.
//!
//! Modules: the send queues at work (`send_queue`); this module holds the
//! network every device of the process shares (its queue pairs and
//! registrations), the device and its `Device` implementation.
#![allow(unsafe_code)]

mod send_queue;

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, OnceLock};

use tensorferry_hostmem::EventFd;

use crate::attrs::QpStep;
use crate::device::{
    Device, DeviceError, GidEntry, GidKind, Keys, LinkLayer, PortInfo, RdmaOp, RdmaWr, Verb, Wc,
};
use crate::status::WcStatus;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Reset,
    Init,
    Rtr,
    Rts,
    Error,
}

struct QpState {
    dev: u64,
    state: State,
    dest_qpn: u32,
    /// Its access flags (from INIT): what a peer may do through it.
    remote_write: bool,
    remote_read: bool,
    /// READs it answers at once (from RTR).
    max_dest_rd_atomic: u8,
    /// READs it keeps outstanding (from RTS).
    max_rd_atomic: u8,
    /// Posted work requests not yet completed, oldest first, each with
    /// the status it executed with (`None`: not executed yet).
    sq: VecDeque<(RdmaWr, Option<WcStatus>)>,
    /// Send-queue slots: what it was created to hold.
    depth: u32,
    /// The work requests holding a slot, oldest first: a slot is freed
    /// when a completion of it, or of a later one, is polled (a NIC's
    /// send queue moves on as its completions are read).
    slots: VecDeque<u64>,
}

struct Mr {
    dev: u64,
    addr: u64,
    len: u64,
}

#[derive(Default)]
struct Net {
    next_dev: u64,
    next_qpn: u32,
    next_key: u32,
    qps: HashMap<u32, QpState>,
    mrs: HashMap<u32, Mr>,
}

fn net() -> MutexGuard<'static, Net> {
    static NET: OnceLock<Mutex<Net>> = OnceLock::new();
    NET.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A queue pair of a [`SimDevice`].
#[derive(Debug)]
pub struct SimQp {
    qpn: u32,
}

impl Drop for SimQp {
    fn drop(&mut self) {
        net().qps.remove(&self.qpn);
    }
}

/// The stand-in device.
#[derive(Debug)]
pub struct SimDevice {
    id: u64,
    port: PortInfo,
    gids: Vec<GidEntry>,
    /// This device's registrations: key, address, length.
    mrs: Vec<(u32, u64, u64)>,
    /// Completions, with the queue pair each is of.
    cq: VecDeque<(u32, Wc)>,
    /// `ibv_modify_qp(RTR)` fails with this errno.
    pub rtr_errno: Option<i32>,
    /// `ibv_create_qp` fails with this errno.
    pub create_errno: Option<i32>,
    /// The peer stopped taking work: work requests (WRITEs and READs) of
    /// this device's queue pairs wait unexecuted (nothing is copied) until
    /// it is cleared (they run at the next poll) or their queue pair goes
    /// to error (they are flushed, never run).
    pub stall: bool,
    /// The peer stopped acknowledging: work requests are executed (their
    /// bytes land) but do not complete until it is cleared (next poll) or
    /// their queue pair goes to error (they complete flushed).
    pub hold: bool,
    /// The next work request completes with this status (and its QP
    /// errs).
    pub fail_next: Option<WcStatus>,
    /// Posting to a queue pair in error fails with this errno (a provider
    /// that refuses it).
    pub post_in_error_errno: Option<i32>,
    /// `ibv_post_send` calls refused (a full send queue, a queue pair in
    /// the wrong state, `post_in_error_errno`).
    pub posts_refused: u32,
    /// Queue pairs created so far.
    pub qps_created: u32,
    /// Work requests posted with `IBV_SEND_FENCE` so far.
    pub fenced: usize,
    /// The CQ's capacity the transport must respect.
    pub cq_capacity: u32,
    /// Most completions ever waiting in the CQ at once.
    pub cq_peak: usize,
    /// Every transition made: (QP number, step).
    pub log: Vec<(u32, QpStep)>,
    events: EventFd,
    armed: bool,
    /// Some queue pair of this device may hold work that waits (stalled
    /// or held), for `poll` to move on; false keeps the global lock off
    /// the polling path of a device whose work all completed.
    waits: bool,
}

impl SimDevice {
    /// A RoCE port whose GID table holds link-local and IPv4-mapped
    /// entries of both RoCE versions for `ip`, with messages of at most
    /// `max_msg` bytes.
    pub fn new(ip: [u8; 4], max_msg: u32) -> Self {
        let mut n = net();
        n.next_dev += 1;
        let id = n.next_dev;
        let mapped = [
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, ip[0], ip[1], ip[2], ip[3],
        ];
        let mut link_local = [0u8; 16];
        link_local[0] = 0xfe;
        link_local[1] = 0x80;
        link_local[15] = ip[3];
        // A failure (no descriptors left) is a broken test machine.
        let events = EventFd::new().unwrap_or_else(|e| panic!("eventfd: {e}"));
        Self {
            id,
            events,
            armed: false,
            waits: false,
            port: PortInfo {
                device: format!("sim{id}"),
                port: 1,
                link: LinkLayer::Ethernet,
                lid: 0,
                active_mtu: 1024,
                max_msg,
                max_qp_wr: 64,
                max_qp_rd_atom: 16,
                max_qp_init_rd_atom: 16,
            },
            gids: vec![
                GidEntry {
                    index: 0,
                    gid: link_local,
                    kind: GidKind::RoceV1,
                },
                GidEntry {
                    index: 1,
                    gid: link_local,
                    kind: GidKind::RoceV2,
                },
                GidEntry {
                    index: 2,
                    gid: mapped,
                    kind: GidKind::RoceV1,
                },
                GidEntry {
                    index: 3,
                    gid: mapped,
                    kind: GidKind::RoceV2,
                },
            ],
            mrs: Vec::new(),
            cq: VecDeque::new(),
            rtr_errno: None,
            create_errno: None,
            stall: false,
            hold: false,
            fail_next: None,
            post_in_error_errno: None,
            posts_refused: 0,
            qps_created: 0,
            fenced: 0,
            cq_capacity: 4096,
            cq_peak: 0,
            log: Vec::new(),
        }
    }

    /// The port, to change what it reports (its read limits) before
    /// connections are made.
    pub fn port_mut(&mut self) -> &mut PortInfo {
        &mut self.port
    }

    /// Work requests posted to this device's queue pairs that have not
    /// completed (stalled, held, or waiting behind those).
    pub fn waiting(&self) -> usize {
        let id = self.id;
        net()
            .qps
            .values()
            .filter(|q| q.dev == id)
            .map(|q| q.sq.len())
            .sum()
    }
}

impl Drop for SimDevice {
    fn drop(&mut self) {
        let mut n = net();
        let id = self.id;
        n.mrs.retain(|_, m| m.dev != id);
        n.qps.retain(|_, q| q.dev != id);
    }
}

fn err(verb: Verb, errno: i32) -> DeviceError {
    DeviceError { verb, errno }
}

impl Device for SimDevice {
    type Qp = SimQp;

    fn port(&self) -> &PortInfo {
        &self.port
    }

    fn gid_table(&self) -> &[GidEntry] {
        &self.gids
    }

    fn cq_capacity(&self) -> u32 {
        self.cq_capacity
    }

    unsafe fn register(&mut self, addr: u64, len: usize) -> Result<Keys, DeviceError> {
        let mut n = net();
        n.next_key += 1;
        let key = n.next_key;
        n.mrs.insert(
            key,
            Mr {
                dev: self.id,
                addr,
                len: len as u64,
            },
        );
        self.mrs.push((key, addr, len as u64));
        Ok(Keys {
            lkey: key,
            rkey: key,
        })
    }

    fn deregister(&mut self, keys: Keys) {
        if let Some(i) = self.mrs.iter().position(|(key, _, _)| *key == keys.lkey) {
            self.mrs.remove(i);
            net().mrs.remove(&keys.lkey);
        }
    }

    fn create_qp(&mut self, send_depth: u32) -> Result<SimQp, DeviceError> {
        if send_depth == 0 || send_depth > self.port.max_qp_wr {
            return Err(err(Verb::CreateQp, libc::EINVAL));
        }
        if let Some(errno) = self.create_errno {
            return Err(err(Verb::CreateQp, errno));
        }
        let mut n = net();
        n.next_qpn = (n.next_qpn + 1) & 0xff_ffff;
        let qpn = n.next_qpn.max(1);
        n.qps.insert(
            qpn,
            QpState {
                dev: self.id,
                state: State::Reset,
                dest_qpn: 0,
                remote_write: false,
                remote_read: false,
                max_dest_rd_atomic: 0,
                max_rd_atomic: 0,
                sq: VecDeque::new(),
                depth: send_depth,
                slots: VecDeque::new(),
            },
        );
        self.qps_created += 1;
        Ok(SimQp { qpn })
    }

    fn qp_num(&self, qp: &SimQp) -> u32 {
        qp.qpn
    }

    fn modify(&mut self, qp: &mut SimQp, step: &QpStep) -> Result<(), DeviceError> {
        let mut n = net();
        let q = n
            .qps
            .get_mut(&qp.qpn)
            .ok_or_else(|| err(step.verb(), libc::EINVAL))?;
        let next = match (q.state, step) {
            (
                State::Reset,
                QpStep::Init {
                    port,
                    remote_write,
                    remote_read,
                    ..
                },
            ) if *port == self.port.port => {
                q.remote_write = *remote_write;
                q.remote_read = *remote_read;
                State::Init
            }
            (
                State::Init,
                QpStep::Rtr {
                    dest_qpn,
                    max_dest_rd_atomic,
                    ..
                },
            ) if *max_dest_rd_atomic <= self.port.max_qp_rd_atom => {
                if let Some(errno) = self.rtr_errno {
                    return Err(err(step.verb(), errno));
                }
                q.dest_qpn = *dest_qpn;
                q.max_dest_rd_atomic = *max_dest_rd_atomic;
                State::Rtr
            }
            (State::Rtr, QpStep::Rts { max_rd_atomic, .. })
                if *max_rd_atomic <= self.port.max_qp_init_rd_atom =>
            {
                q.max_rd_atomic = *max_rd_atomic;
                State::Rts
            }
            (_, QpStep::Error) => State::Error,
            _ => return Err(err(step.verb(), libc::EINVAL)),
        };
        q.state = next;
        self.log.push((qp.qpn, *step));
        // In error, what the send queue holds is flushed.
        let flushed = self.progress(&mut n, qp.qpn);
        drop(n);
        for wc in flushed {
            self.complete(qp.qpn, wc);
        }
        Ok(())
    }

    unsafe fn post_rdma(&mut self, qp: &mut SimQp, wrs: &[RdmaWr]) -> Result<(), DeviceError> {
        self.post(qp.qpn, wrs)
    }

    fn post_marker(&mut self, qp: &mut SimQp, wr_id: u64) -> Result<(), DeviceError> {
        let marker = RdmaWr {
            wr_id,
            op: RdmaOp::Write,
            local_addr: 0,
            lkey: 0,
            len: 0,
            remote_addr: 0,
            rkey: 0,
            signaled: true,
            fence: false,
        };
        self.post(qp.qpn, &[marker])
    }

    fn completion_fd(&self) -> Option<i32> {
        Some(self.events.fd())
    }

    fn arm(&mut self) -> Result<(), DeviceError> {
        self.events.clear();
        self.armed = true;
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Wc>, max: usize) -> Result<(), DeviceError> {
        // A fault cleared since: what waited moves on now.
        if std::mem::take(&mut self.waits) {
            let done = {
                let mut n = net();
                let id = self.id;
                let mine: Vec<u32> = n
                    .qps
                    .iter()
                    .filter(|(_, q)| q.dev == id && !q.sq.is_empty())
                    .map(|(&qpn, _)| qpn)
                    .collect();
                let mut done = Vec::new();
                for qpn in mine {
                    done.extend(self.progress(&mut n, qpn).into_iter().map(|wc| (qpn, wc)));
                }
                done
            };
            for (qpn, wc) in done {
                self.complete(qpn, wc);
            }
        }
        let take = max.min(self.cq.len());
        if take > 0 {
            let mut n = net();
            for (qpn, wc) in self.cq.drain(..take) {
                // Its slot, and those of the unsignaled work before it,
                // are free again.
                if let Some(q) = n.qps.get_mut(&qpn) {
                    while q.slots.pop_front().is_some_and(|id| id != wc.wr_id) {}
                }
                out.push(wc);
            }
        }
        Ok(())
    }
}
