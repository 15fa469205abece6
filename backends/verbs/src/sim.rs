//! A software stand-in for an RDMA port, for tests on machines without
//! one: queue pairs with the verbs state rules, memory registrations with
//! keys and bounds, and RDMA WRITE as a copy between registrations of the
//! same process, completing with the status a NIC would give (retry
//! exceeded for a peer that is gone, remote access error for a bad key or
//! range, flush once a queue pair is in error).
//!
//! Faults are switched on per device: an RTR that fails with an errno,
//! completions held back (a stalled peer), the next write failing with a
//! given status.
#![allow(unsafe_code)]

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, OnceLock};

use ferry_hostmem::EventFd;

use crate::attrs::QpStep;
use crate::device::{
    Device, DeviceError, GidEntry, GidKind, Keys, LinkLayer, PortInfo, Verb, Wc, WriteWr,
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
    cq: VecDeque<Wc>,
    held: VecDeque<Wc>,
    /// `ibv_modify_qp(RTR)` fails with this errno.
    pub rtr_errno: Option<i32>,
    /// `ibv_create_qp` fails with this errno.
    pub create_errno: Option<i32>,
    /// Completions are held back (the peer stopped acknowledging).
    pub hold: bool,
    /// The next write completes with this status (and its QP errs).
    pub fail_next: Option<WcStatus>,
    /// Queue pairs created so far.
    pub qps_created: u32,
    /// The CQ's capacity the transport must respect.
    pub cq_capacity: u32,
    /// Most completions ever waiting in the CQ at once.
    pub cq_peak: usize,
    /// Every transition made: (QP number, step).
    pub log: Vec<(u32, QpStep)>,
    events: EventFd,
    armed: bool,
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
            port: PortInfo {
                device: format!("sim{id}"),
                port: 1,
                link: LinkLayer::Ethernet,
                lid: 0,
                active_mtu: 1024,
                max_msg,
                max_qp_wr: 64,
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
            held: VecDeque::new(),
            rtr_errno: None,
            create_errno: None,
            hold: false,
            fail_next: None,
            qps_created: 0,
            cq_capacity: 4096,
            cq_peak: 0,
            log: Vec::new(),
        }
    }

    fn complete(&mut self, wc: Wc) {
        if self.hold {
            self.held.push_back(wc);
        } else {
            self.cq.push_back(wc);
        }
        self.cq_peak = self.cq_peak.max(self.cq.len() + self.held.len());
        if self.armed && !self.hold {
            // One event per arming, as a CQ raises.
            self.armed = false;
            self.events.signal();
        }
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
            (State::Reset, QpStep::Init { port, .. }) if *port == self.port.port => State::Init,
            (State::Init, QpStep::Rtr { dest_qpn, .. }) => {
                if let Some(errno) = self.rtr_errno {
                    return Err(err(step.verb(), errno));
                }
                q.dest_qpn = *dest_qpn;
                State::Rtr
            }
            (State::Rtr, QpStep::Rts { .. }) => State::Rts,
            (_, QpStep::Error) => State::Error,
            _ => return Err(err(step.verb(), libc::EINVAL)),
        };
        q.state = next;
        self.log.push((qp.qpn, *step));
        Ok(())
    }

    unsafe fn post_writes(&mut self, qp: &mut SimQp, wrs: &[WriteWr]) -> Result<(), DeviceError> {
        let mut results = Vec::with_capacity(wrs.len());
        {
            let mut n = net();
            let Some(local) = n.qps.get(&qp.qpn) else {
                return Err(err(Verb::PostSend, libc::EINVAL));
            };
            if !matches!(local.state, State::Rts | State::Error) {
                return Err(err(Verb::PostSend, libc::EINVAL));
            }
            let mut errored = local.state == State::Error;
            let dest_qpn = local.dest_qpn;
            for wr in wrs {
                let status = if errored {
                    WcStatus::FLUSHED
                } else if let Some(s) = self.fail_next.take() {
                    s
                } else {
                    let dest_ok = n
                        .qps
                        .get(&dest_qpn)
                        .is_some_and(|d| matches!(d.state, State::Rtr | State::Rts));
                    let dest_dev = n.qps.get(&dest_qpn).map(|d| d.dev);
                    let remote = n.mrs.get(&wr.rkey).filter(|m| {
                        Some(m.dev) == dest_dev
                            && wr.remote_addr >= m.addr
                            && wr.remote_addr + u64::from(wr.len) <= m.addr + m.len
                    });
                    let local_ok = self.mrs.iter().any(|&(key, addr, len)| {
                        key == wr.lkey
                            && wr.local_addr >= addr
                            && wr.local_addr + u64::from(wr.len) <= addr + len
                    });
                    if !dest_ok {
                        WcStatus::RETRY_EXCEEDED
                    } else if !local_ok {
                        WcStatus(4) // IBV_WC_LOC_PROT_ERR
                    } else if remote.is_none() {
                        WcStatus::REMOTE_ACCESS
                    } else {
                        // SAFETY: the source lies inside this device's
                        // registration and the destination inside the
                        // target's (both checked just above, under the
                        // lock that deregistration also takes); both are
                        // mappings of this process that their transports
                        // keep alive while registered.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                wr.local_addr as *const u8,
                                wr.remote_addr as *mut u8,
                                wr.len as usize,
                            );
                        }
                        WcStatus::SUCCESS
                    }
                };
                if status != WcStatus::SUCCESS {
                    errored = true;
                }
                if status != WcStatus::SUCCESS || wr.signaled {
                    results.push(Wc {
                        wr_id: wr.wr_id,
                        status,
                        vendor_err: 0,
                    });
                }
            }
            if errored {
                if let Some(q) = n.qps.get_mut(&qp.qpn) {
                    q.state = State::Error;
                }
            }
        }
        for wc in results {
            self.complete(wc);
        }
        Ok(())
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
        if !self.hold {
            self.cq.extend(self.held.drain(..));
        }
        for _ in 0..max {
            match self.cq.pop_front() {
                Some(wc) => out.push(wc),
                None => break,
            }
        }
        Ok(())
    }
}
