//! The control plane between two processes over ZeroMQ: round-trip latency
//! of a request and its reply, and the one-way message rate, over ipc://
//! and tcp://127.0.0.1 (`ferry bench --control zmq`).
//!
//! Both sides do what a ferry process does with each message: the client
//! encodes a `transfer_push` and sends it; the echo process decodes it and
//! answers with an encoded `transfer_pushed`, which the client decodes.
//! `bench/python/control_python.py` runs the same exchange with the seed's Python
//! and pyzmq, and `bench/python/vs_python.sh control` prints both side by side.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tensorferry_core::transport::{ChannelEvent, ControlChannel, ControlRecv, ControlSend};
use tensorferry_core::wire::{decode, Msg, Push, Pushed, TRANSFER_MAGIC};
use tensorferry_zmq::{zmq, ZmqChannel, ZmqConfig, ZmqError};

/// The request id that asks the echo process to report how many one-way
/// messages it got.
const FLUSH: &str = "flush";
/// The request id that stops the echo process.
const STOP: &str = "stop";

/// One transport's figures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ControlRow {
    /// `ipc` or `tcp`.
    pub transport: &'static str,
    /// Round trips timed.
    pub round_trips: usize,
    /// Median round trip, µs.
    pub p50_us: f64,
    /// 99th-percentile round trip, µs.
    pub p99_us: f64,
    /// One-way messages per second (sent, received and decoded).
    pub messages_per_second: f64,
}

fn push(id: &str) -> Msg<'_> {
    Msg::Push(Push {
        request_id: id.into(),
        dest_session_id: "shm:/ferry-1234-0@7f3a5c000000+1073741824".into(),
        dest_addr: 0x7f3a_5c00_0000 + (16 << 20),
        transfer_size: 13_871_104,
    })
}

/// The echo process: answers each `transfer_push` at `listen` with a
/// `transfer_pushed` to `reply_to`, counts one-way messages, and answers
/// `flush` with their count.
pub fn echo(listen: &str, reply_to: &str) -> Result<(), ZmqError> {
    let ctx = zmq::Context::new();
    let (mut tx, mut rx) = ZmqChannel::bind(&ctx, &[listen], ZmqConfig::default())?.split();
    let mut buf = vec![0u8; 64 * 1024];
    let mut out = vec![0u8; 4096];
    let mut counted = 0u64;
    loop {
        let Some(ChannelEvent::Message(m)) = rx.recv(&mut buf, Duration::from_secs(60), None)?
        else {
            continue;
        };
        if m.magic != TRANSFER_MAGIC {
            continue;
        }
        let Ok(Msg::Push(p)) = decode(m.payload) else {
            counted += 1;
            continue;
        };
        let id = p.request_id.raw();
        if id == STOP {
            return Ok(());
        }
        let count;
        let reply_id = if id == FLUSH {
            count = counted.to_string();
            counted = 0;
            count.as_str()
        } else {
            id
        };
        let reply = Msg::Pushed(Pushed {
            request_id: reply_id.into(),
            success: true,
            error: None,
        });
        if let Ok(n) = reply.encode(&mut out) {
            tx.send(reply_to, &[TRANSFER_MAGIC, &out[..n]])?;
        }
    }
}

/// The echo process, killed on drop, with the endpoint it bound (its file
/// removed then: a killed process cannot).
struct Echo(Child, String);

impl Drop for Echo {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        tensorferry_zmq::remove_ipc_file(&self.1);
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or(f64::NAN)
}

/// Waits for the reply `id`, decoding it; `None` if it does not come.
fn reply(
    rx: &mut impl ControlRecv<Error = ZmqError>,
    buf: &mut [u8],
    within: Duration,
) -> Result<Option<String>, ZmqError> {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if let Some(ChannelEvent::Message(m)) = rx.recv(buf, Duration::from_millis(100), None)? {
            if let Ok(Msg::Pushed(p)) = decode(m.payload) {
                return Ok(Some(p.request_id.raw().to_owned()));
            }
        }
    }
    Ok(None)
}

/// Measures one transport: `exe echo-args…` is started as the echo process.
fn measure_one(
    transport: &'static str,
    exe: &std::path::Path,
    prefix: &[&str],
    per_phase: Duration,
) -> Result<ControlRow, String> {
    let pid = std::process::id();
    let tmp = std::env::temp_dir();
    let (mine, theirs) = match transport {
        "ipc" => (
            format!("ipc://{}/ferry-cbench-{pid}-client.sock", tmp.display()),
            format!("ipc://{}/ferry-cbench-{pid}-echo.sock", tmp.display()),
        ),
        _ => {
            // Free ports: bind to 0, read, release.
            let port = |_| {
                std::net::TcpListener::bind("127.0.0.1:0")
                    .and_then(|l| l.local_addr())
                    .map(|a| a.port())
                    .map_err(|e| format!("finding a free port: {e}"))
            };
            (
                format!("tcp://127.0.0.1:{}", port(0)?),
                format!("tcp://127.0.0.1:{}", port(1)?),
            )
        }
    };
    let ctx = zmq::Context::new();
    let (mut tx, mut rx) = ZmqChannel::bind(&ctx, &[&mine], ZmqConfig::default())
        .map_err(|e| e.to_string())?
        .split();
    let child = Command::new(exe)
        .args(prefix)
        .args(["--listen", &theirs, "--reply-to", &mine])
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting the echo process: {e}"))?;
    let _echo = Echo(child, theirs.clone());
    let mut out = vec![0u8; 4096];
    let mut buf = vec![0u8; 64 * 1024];
    let mut send = |tx: &mut tensorferry_zmq::ZmqSender, id: &str| -> Result<(), String> {
        let n = push(id).encode(&mut out).map_err(|e| e.to_string())?;
        tx.send(&theirs, &[TRANSFER_MAGIC, &out[..n]])
            .map_err(|e| e.to_string())
    };
    // Until the echo process is up, round trips go unanswered.
    let up = Instant::now();
    loop {
        send(&mut tx, "hello")?;
        if reply(&mut rx, &mut buf, Duration::from_millis(200))
            .map_err(|e| e.to_string())?
            .is_some()
        {
            break;
        }
        if up.elapsed() > Duration::from_secs(10) {
            return Err("the echo process did not answer".into());
        }
    }
    // Round trips, one at a time.
    let mut rtts = Vec::new();
    let mut ids: Vec<String> = (0..1000).map(|i| format!("req-{i}")).collect();
    ids.shrink_to_fit();
    let start = Instant::now();
    let mut i = 0;
    while start.elapsed() < per_phase && rtts.len() < 200_000 {
        let id = &ids[i % ids.len()];
        i += 1;
        let t0 = Instant::now();
        send(&mut tx, id)?;
        // Greetings sent while the echo process started may still be
        // answered; they are not round trips.
        let got = loop {
            let got =
                reply(&mut rx, &mut buf, Duration::from_secs(5)).map_err(|e| e.to_string())?;
            if got.as_deref() != Some("hello") {
                break got;
            }
        };
        if got.as_deref() != Some(id.as_str()) {
            return Err(format!("round trip {id}: got {got:?}"));
        }
        rtts.push(t0.elapsed().as_nanos() as f64);
    }
    rtts.sort_by(f64::total_cmp);
    // One-way rate: a burst of messages the echo process decodes and
    // counts, then a flush that reports the count.
    let mut one_way = vec![0u8; 256];
    let n = Msg::Done(tensorferry_core::wire::Done {
        request_id: "one-way".into(),
        error: None,
        ..Default::default()
    })
    .encode(&mut one_way)
    .map_err(|e| e.to_string())?;
    one_way.truncate(n);
    let t0 = Instant::now();
    let mut sent = 0u64;
    while t0.elapsed() < per_phase {
        for _ in 0..1000 {
            match tx.send(&theirs, &[TRANSFER_MAGIC, &one_way]) {
                Ok(()) => sent += 1,
                // A full queue: the receiver sets the pace.
                Err(ZmqError::Timeout { .. }) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
    }
    send(&mut tx, FLUSH)?;
    let counted = reply(&mut rx, &mut buf, Duration::from_secs(30))
        .map_err(|e| e.to_string())?
        .and_then(|c| c.parse::<u64>().ok())
        .ok_or("the echo process did not report its count")?;
    let elapsed = t0.elapsed().as_secs_f64();
    if counted != sent {
        return Err(format!("{sent} one-way messages sent, {counted} counted"));
    }
    let _ = send(&mut tx, STOP);
    Ok(ControlRow {
        transport,
        round_trips: rtts.len(),
        p50_us: percentile(&rtts, 0.5) / 1e3,
        p99_us: percentile(&rtts, 0.99) / 1e3,
        messages_per_second: counted as f64 / elapsed,
    })
}

/// Measures ipc:// and tcp://127.0.0.1; the echo process is this program
/// started again with `prefix` (the hidden `bench-echo` command).
pub fn measure(per_phase: Duration, prefix: &[&str]) -> Result<Vec<ControlRow>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("finding this program: {e}"))?;
    ["ipc", "tcp"]
        .into_iter()
        .map(|t| measure_one(t, &exe, prefix, per_phase))
        .collect()
}
