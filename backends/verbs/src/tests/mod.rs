//! The transport end to end over the software stand-in: real side-channel
//! sockets (ZeroMQ over loopback TCP), the real connection bookkeeping,
//! chunking and error paths; only the NIC is simulated. One module a
//! topic; the nodes and helpers they share are here.

#![allow(unsafe_code)] // Registering test pools and reading them back.

use std::time::{Duration, Instant};

use tensorferry_core::transport::{Completion, ReadOp, Region, Transport};
use tensorferry_hostmem::HostPool;

use crate::error::VerbsError;
use crate::sim::SimDevice;
use crate::transport::{VerbsConfig, VerbsTransport};
use support::write_op;

#[path = "../../tests/support/mod.rs"]
mod support;

mod cancel;
mod connections;
mod failures;
mod read;
mod write;

struct Node {
    t: VerbsTransport<SimDevice>,
    pool: HostPool,
    region: Region,
}

fn config() -> VerbsConfig {
    let mut c = VerbsConfig::new("sim");
    c.write_timeout = Duration::from_millis(800);
    c.connect_timeout = Duration::from_millis(500);
    c.send_depth = 8;
    c
}

fn node_with(config: &VerbsConfig, max_msg: u32, pool_len: usize) -> Node {
    let device = SimDevice::new([127, 0, 0, 1], max_msg);
    let mut t = VerbsTransport::with_device(device, config).expect("open over the stand-in");
    let pool = HostPool::new(pool_len).expect("map a pool");
    // SAFETY: the pool outlives the transport's registration (dropped
    // after it in every test: `Node` declares `t` first).
    let region = unsafe { t.register(pool.ptr(), pool.len()) }.expect("register");
    Node { t, pool, region }
}

fn node() -> Node {
    node_with(&config(), 4096, 1 << 20)
}

/// Two nodes of the default config: a writer (or reader) and its peer.
fn pair() -> (Node, Node) {
    (node(), node())
}

impl Node {
    fn bytes(&self) -> &[u8] {
        // SAFETY: the test owns the pool and reads it while no write into
        // it is in flight.
        unsafe { std::slice::from_raw_parts(self.pool.ptr(), self.pool.len()) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` keeps other views away.
        unsafe { std::slice::from_raw_parts_mut(self.pool.ptr(), self.pool.len()) }
    }

    fn write(
        &mut self,
        off: u64,
        len: u64,
        to: &Node,
        dest_off: u64,
        cookie: u64,
    ) -> Result<(), VerbsError> {
        let dest_addr = to.region.addr + dest_off;
        let op = write_op(self.region, off, len, to.t.session_id(), dest_addr, cookie);
        self.t.post_write(&op)
    }

    fn read(
        &mut self,
        off: u64,
        len: u64,
        from: &Node,
        src_off: u64,
        cookie: u64,
    ) -> Result<(), VerbsError> {
        self.t.post_read(&ReadOp {
            region: self.region,
            local_offset: off,
            len,
            src_session: from.t.session_id(),
            src_addr: from.region.addr + src_off,
            cookie,
        })
    }

    /// Writes as [`Node::write`] does and waits for the write's
    /// completion, which must be a success.
    fn write_done(&mut self, off: u64, len: u64, to: &Node, dest_off: u64, cookie: u64) {
        self.write(off, len, to, dest_off, cookie)
            .expect("post the write");
        let c = self.wait(1).remove(0);
        assert!(c.result.is_ok(), "write {cookie}: {:?}", c.result);
    }

    /// Reads as [`Node::read`] does and waits for the read's completion,
    /// which must be a success.
    fn read_done(&mut self, off: u64, len: u64, from: &Node, src_off: u64, cookie: u64) {
        self.read(off, len, from, src_off, cookie)
            .expect("post the read");
        let c = self.wait(1).remove(0);
        assert!(c.result.is_ok(), "read {cookie}: {:?}", c.result);
    }

    /// Writes 10 bytes to `to` under its session id with the incarnation
    /// changed: the id of another process at `to`'s address.
    fn write_to_stale_incarnation(&mut self, to: &Node, cookie: u64) -> Result<(), VerbsError> {
        let s = crate::session::Session::parse(to.t.session_id()).expect("a verbs session id");
        let stale = crate::session::Session {
            generation: s.generation,
            incarnation: s.incarnation ^ 1,
            ..s
        }
        .to_string();
        self.t.post_write(&write_op(
            self.region,
            0,
            10,
            &stale,
            to.region.addr,
            cookie,
        ))
    }

    fn wait(&mut self, n: usize) -> Vec<Completion<VerbsError>> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut out = Vec::new();
        while out.len() < n {
            match self.t.poll_completion() {
                Some(c) => out.push(c),
                None if Instant::now() > deadline => {
                    panic!("only {} of {n} completions", out.len())
                }
                None => std::thread::sleep(Duration::from_micros(200)),
            }
        }
        out
    }
}

/// A transfer of 16 work requests (the stand-in's 4 KiB messages): the
/// window of 8 posts half of them, the rest wait in the book.
const LEN: u64 = 64 << 10;

/// Where connecting writes go, away from the transfers under test.
const ASIDE: u64 = 512 << 10;

/// Connects `a` to `to` with a one-byte write.
fn connect(a: &mut Node, to: &Node, cookie: u64) {
    a.write_done(0, 1, to, ASIDE, cookie);
}

/// The peers of `a`'s queue pairs stop (or go on) taking work.
fn stall(a: &Node, on: bool) {
    a.t.with_device_mut(|d| d.stall = on);
}

/// Work requests waiting on `a`'s queue pairs.
fn waiting(a: &Node) -> usize {
    a.t.with_device_mut(|d| d.waiting())
}

/// The peers of `a`'s queue pairs go on after ended transfers: whatever
/// still waited runs now, unless it was flushed, and nothing completes.
fn release(a: &mut Node) {
    stall(a, false);
    for _ in 0..20 {
        // Each poll lets the stand-in run what still waits.
        if let Some(c) = a.t.poll_completion() {
            panic!("a stray completion after the transfers ended: {c:?}");
        }
    }
    assert_eq!(waiting(a), 0);
}

/// Everything the transport has to report now, by cookie.
fn drain(a: &mut Node) -> Vec<Completion<VerbsError>> {
    let mut done: Vec<_> = std::iter::from_fn(|| a.t.poll_completion()).collect();
    done.sort_by_key(|c| c.cookie);
    done
}

fn fill(buf: &mut [u8], seed: u64) {
    let mut x = seed | 1;
    for b in buf {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}
