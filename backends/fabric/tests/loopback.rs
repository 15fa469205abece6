//! Two transports in one process over real libfabric providers
//! (`tcp;ofi_rxm` on loopback and `shm`): writes land byte-exact, reads
//! bring the peer's bytes, the completion levels mean what they claim,
//! and bad input fails typed. The tests are in `loopback/`, one module a
//! topic; the helpers they share are here.

#[path = "loopback/reads.rs"]
mod reads;
#[path = "loopback/stalled.rs"]
mod stalled;
#[path = "loopback/writes.rs"]
mod writes;

use std::time::{Duration, Instant};

use tensorferry_core::transport::{FaultKind, ReadOp, Region, Transport, WriteOp, WriteTag};
use tensorferry_fabric::{DeliveryMode, FabricConfig, FabricTransport, Provider};

/// The byte-exact cases (provider, completion level, largest chunk, 0 for
/// the provider's): over `tcp;ofi_rxm` both levels, and a chunk small
/// enough that one transfer goes out in several; over `shm` its default
/// level and notices.
const CASES: [(&str, DeliveryMode, u64); 5] = [
    ("tcp;ofi_rxm", DeliveryMode::Complete, 0),
    ("tcp;ofi_rxm", DeliveryMode::Notify, 0),
    ("tcp;ofi_rxm", DeliveryMode::Notify, 256 << 10),
    ("shm", DeliveryMode::Auto, 0),
    ("shm", DeliveryMode::Notify, 300_000),
];

fn config(provider: &str, delivery: DeliveryMode) -> FabricConfig {
    let mut c = FabricConfig::new(Provider::Named(provider.into()));
    c.delivery = delivery;
    if provider.starts_with("tcp") {
        c.source = Some("127.0.0.1".into());
    }
    c
}

fn open(provider: &str, delivery: DeliveryMode, pool: usize) -> (FabricTransport, Region) {
    open_with(&config(provider, delivery), pool)
}

/// A transport of `config` with a pool of `pool` bytes, registered.
fn open_with(config: &FabricConfig, pool: usize) -> (FabricTransport, Region) {
    let mut t = FabricTransport::with_pool(config, pool)
        .unwrap_or_else(|e| panic!("open {:?}: {e}", config.provider));
    let (p, n) = (t.pool_ptr(), t.pool_len());
    // SAFETY: the pool belongs to the transport and outlives its
    // registration.
    #[allow(unsafe_code)]
    let region = unsafe { t.register(p, n) }.expect("register the pool");
    (t, region)
}

fn pool(t: &FabricTransport) -> &[u8] {
    // SAFETY: tests read a pool only while no write into it is in flight.
    #[allow(unsafe_code)]
    unsafe {
        std::slice::from_raw_parts(t.pool_ptr(), t.pool_len())
    }
}

fn pool_mut(t: &mut FabricTransport) -> &mut [u8] {
    // SAFETY: tests fill a pool only while no write from it is in flight,
    // from the one thread that holds the transport mutably.
    #[allow(unsafe_code)]
    unsafe {
        std::slice::from_raw_parts_mut(t.pool_ptr(), t.pool_len())
    }
}

/// A transport whose largest chunk is `max_chunk` (0 for the
/// provider's), with a pool of `pool` bytes registered.
fn open_chunked(
    provider: &str,
    delivery: DeliveryMode,
    max_chunk: u64,
    pool: usize,
) -> (FabricTransport, Region) {
    let mut cfg = config(provider, delivery);
    cfg.max_chunk = max_chunk;
    open_with(&cfg, pool)
}

/// Runs `case` over each of the byte-exact [`CASES`] over `provider`,
/// printing each first so that a failing one names itself.
fn each_case(provider: &str, case: fn(&str, DeliveryMode, u64)) {
    let cases = CASES.into_iter().filter(|c| c.0 == provider);
    let mut ran = 0;
    for (provider, delivery, max_chunk) in cases {
        eprintln!("case: {provider}, {delivery:?}, max_chunk {max_chunk}");
        case(provider, delivery, max_chunk);
        ran += 1;
    }
    assert!(ran > 0, "no byte-exact case over {provider}");
}

/// A sender over tcp (write timeout 3 s), with a pool of 1 MiB; a peer
/// that was opened and is gone (its session id and pool address); and
/// another peer, there.
fn with_a_gone_peer() -> (FabricTransport, Region, (String, u64), FabricTransport) {
    let mut cfg = config("tcp;ofi_rxm", DeliveryMode::Auto);
    cfg.write_timeout = Duration::from_secs(3);
    let (a, ra) = open_with(&cfg, 1 << 20);
    let (b, _) = open("tcp;ofi_rxm", DeliveryMode::Auto, 1 << 20);
    let (c, _) = open("tcp;ofi_rxm", DeliveryMode::Auto, 1 << 20);
    let gone = (b.session_id().to_owned(), b.pool_ptr() as u64);
    drop(b);
    (a, ra, gone, c)
}

/// An op to the peer `gone`, which is gone, posted as `cookie` (`posted`:
/// what posting it returned) fails, at once or at its completion, as the
/// peer gone or timed out, and names the peer.
fn fails_as_gone(
    t: &mut FabricTransport,
    posted: Result<(), tensorferry_fabric::FabricError>,
    cookie: u64,
    gone: &str,
) {
    let r = match posted {
        Err(e) => Err(e),
        Ok(()) => wait_completion(t, cookie, Duration::from_secs(30)).expect("an outcome in time"),
    };
    let e = r.expect_err("the peer is gone");
    // rxm answers "try again" while it cannot connect, so an unreachable
    // peer shows as an op that never completes.
    assert!(
        matches!(e.kind(), FaultKind::PeerGone | FaultKind::Timeout),
        "{e}"
    );
    assert!(e.to_string().contains(gone), "{e}");
}

fn wait_completion(
    t: &mut FabricTransport,
    cookie: u64,
    within: Duration,
) -> Option<Result<(), tensorferry_fabric::FabricError>> {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if let Some(c) = t.poll_completion() {
            assert_eq!(c.cookie, cookie);
            return Some(c.result);
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    None
}

/// Posts with `post` and waits for its completion, again while it times
/// out (five tries at most): the tests of timed-out transfers keep the
/// write timeout short, and a busy host may take longer than that to
/// connect to the peer.
fn reach(
    t: &mut FabricTransport,
    cookie: u64,
    post: impl Fn(&mut FabricTransport) -> Result<(), tensorferry_fabric::FabricError>,
) {
    for attempt in 1.. {
        post(t).expect("post");
        match wait_completion(t, cookie, Duration::from_secs(10)).expect("an outcome in time") {
            Ok(()) => return,
            Err(e) if e.kind() == FaultKind::Timeout && attempt < 5 => continue,
            Err(e) => panic!("the peer is not reached: {e}"),
        }
    }
}

/// Waits for the receiver to report the write tagged `tag` landed (at
/// once where completions mean delivery: nothing is reported there). The
/// tests have one write in flight, so any other report is a fault.
fn wait_landed(t: &mut FabricTransport, tag: WriteTag, within: Duration) -> bool {
    if t.capabilities().delivery_complete {
        return true;
    }
    let end = Instant::now() + within;
    while Instant::now() < end {
        if let Some(landed) = t.poll_landed() {
            assert!(landed.matches(tag), "{landed:?} reported, {tag:?} awaited");
            return true;
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    false
}

/// xorshift, so that failures replay.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Fills `buf` with a pattern of `seed`: two different seeds differ at
/// nearly every byte, so bytes from the wrong operation show.
fn fill(buf: &mut [u8], seed: u64) {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    for chunk in buf.chunks_mut(8) {
        let v = rng.next().to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
}

fn read_op(
    region: Region,
    local_offset: u64,
    len: u64,
    from: &str,
    src_addr: u64,
    cookie: u64,
) -> ReadOp<'_> {
    ReadOp {
        region,
        local_offset,
        len,
        src_session: from,
        src_addr,
        cookie,
    }
}

/// The write of `len` bytes from the start of `region` to `dest_addr` at
/// `to`, tagged with its cookie.
fn write_op(region: Region, to: &str, dest_addr: u64, cookie: u64, len: u64) -> WriteOp<'_> {
    WriteOp {
        region,
        local_offset: 0,
        len,
        dest_session: to,
        dest_addr,
        tag: WriteTag(cookie),
        cookie,
    }
}
