//! The control plane between two processes over ZeroMQ: round-trip latency
//! of a request and its reply, and the one-way message rate, over ipc://
//! and tcp://127.0.0.1 (`ferry bench --control zmq`).
//!
//! Both sides do what a ferry process does with each message: the client
//! encodes a `transfer_push` and sends it; the echo process decodes it and
//! answers with an encoded `transfer_pushed`, which the client decodes.
//! `bench/python/control_python.py` runs the same exchange with the seed's Python
//! and pyzmq, and `bench/python/vs_python.sh control` prints both side by side.
//!
//! Its floor, in the same run and in turns with it: the same bytes over
//! bare libzmq sockets (a PUSH and a PULL on each side, as the channel
//! uses), echoed by a second process that neither decodes nor encodes
//! (`bench-echo --bare`): the round trip's two hops with nothing of ferry
//! around them.

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
    /// The round trip's floor: the same bytes over bare libzmq sockets,
    /// in turns with the channel's round trips; median, µs.
    pub bare_p50_us: f64,
    /// Its 99th percentile, µs.
    pub bare_p99_us: f64,
}

impl ControlRow {
    /// The channel's median round trip over the bare one (1: at the
    /// floor).
    pub fn over_bare(&self) -> f64 {
        self.p50_us / self.bare_p50_us
    }
}

/// The bare echo process: answers each message at `listen` with a
/// `transfer_pushed` encoded once at start, over bare PULL and PUSH
/// sockets, until a message whose payload is `stop`.
pub fn echo_bare(listen: &str, reply_to: &str) -> Result<(), ZmqError> {
    let ctx = zmq::Context::new();
    let pull = ctx
        .socket(zmq::PULL)
        .map_err(sys_err("socket(PULL)", listen))?;
    pull.bind(listen).map_err(sys_err("bind", listen))?;
    let push = ctx
        .socket(zmq::PUSH)
        .map_err(sys_err("socket(PUSH)", reply_to))?;
    push.set_linger(0)
        .map_err(sys_err("setsockopt(LINGER)", reply_to))?;
    push.connect(reply_to)
        .map_err(sys_err("connect", reply_to))?;
    let mut out = vec![0u8; 256];
    let n = Msg::Pushed(Pushed {
        request_id: "req-0".into(),
        success: true,
        error: None,
    })
    .encode(&mut out)
    .map_err(|_| ZmqError::Malformed {
        via: listen.to_owned(),
        why: "a transfer_pushed longer than its buffer",
    })?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let mut len = pull
            .recv_into(&mut buf, 0)
            .map_err(sys_err("recv", listen))?;
        while pull.get_rcvmore().map_err(sys_err("recv", listen))? {
            len = pull
                .recv_into(&mut buf, 0)
                .map_err(sys_err("recv", listen))?;
        }
        if buf.get(..len) == Some(STOP.as_bytes()) {
            return Ok(());
        }
        push.send_multipart([TRANSFER_MAGIC, &out[..n]], 0)
            .map_err(sys_err("send", reply_to))?;
    }
}

/// A libzmq failure of the bare echo's `call` at `endpoint`.
fn sys_err<'e>(call: &'static str, endpoint: &'e str) -> impl Fn(zmq::Error) -> ZmqError + 'e {
    move |source| ZmqError::Sys {
        call,
        endpoint: endpoint.to_owned(),
        source,
    }
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
    // Free ports: bind to 0, read, release.
    let port = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| format!("finding a free port: {e}"))
    };
    let endpoint = |name: &str| -> Result<String, String> {
        Ok(match transport {
            "ipc" => format!("ipc://{}/ferry-cbench-{pid}-{name}.sock", tmp.display()),
            _ => format!("tcp://127.0.0.1:{}", port()?),
        })
    };
    let (mine, theirs) = (endpoint("client")?, endpoint("echo")?);
    let (mine_bare, theirs_bare) = (endpoint("bare-client")?, endpoint("bare-echo")?);
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
    let bare_child = Command::new(exe)
        .args(prefix)
        .args(["--bare", "--listen", &theirs_bare, "--reply-to", &mine_bare])
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting the bare echo process: {e}"))?;
    let _bare_echo = Echo(bare_child, theirs_bare.clone());
    let mut bare = Bare::connect(&ctx, &mine_bare, &theirs_bare)?;
    let mut out_push = vec![0u8; 4096];
    let n = push("req-0")
        .encode(&mut out_push)
        .map_err(|e| e.to_string())?;
    out_push.truncate(n);
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
    bare.wait_up()?;
    // Round trips, one at a time, each followed by one over the bare
    // sockets.
    let (mut rtts, mut bare_rtts) = (Vec::new(), Vec::new());
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
        bare_rtts.push(bare.round_trip(&out_push)?.as_nanos() as f64);
    }
    rtts.sort_by(f64::total_cmp);
    bare_rtts.sort_by(f64::total_cmp);
    bare.stop();
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
        bare_p50_us: percentile(&bare_rtts, 0.5) / 1e3,
        bare_p99_us: percentile(&bare_rtts, 0.99) / 1e3,
    })
}

/// The client's bare sockets: a PULL it receives the echo at, a PUSH to
/// the bare echo process.
struct Bare {
    pull: zmq::Socket,
    push: zmq::Socket,
    buf: Vec<u8>,
    mine: String,
    theirs: String,
}

impl Drop for Bare {
    fn drop(&mut self) {
        tensorferry_zmq::remove_ipc_file(&self.mine);
    }
}

impl Bare {
    fn connect(ctx: &zmq::Context, mine: &str, theirs: &str) -> Result<Self, String> {
        let fail = |what: &str, e: zmq::Error| format!("bare sockets: {what}: {e}");
        let pull = ctx.socket(zmq::PULL).map_err(|e| fail("socket", e))?;
        pull.bind(mine).map_err(|e| fail("bind", e))?;
        let push = ctx.socket(zmq::PUSH).map_err(|e| fail("socket", e))?;
        push.set_linger(0).map_err(|e| fail("linger", e))?;
        push.connect(theirs).map_err(|e| fail("connect", e))?;
        Ok(Self {
            pull,
            push,
            buf: vec![0u8; 64 * 1024],
            mine: mine.to_owned(),
            theirs: theirs.to_owned(),
        })
    }

    /// Receives one message, waiting at most `ms`; false if none came.
    fn recv(&mut self, ms: i64) -> Result<bool, String> {
        let fail = |e: zmq::Error| format!("bare sockets: recv: {e}");
        if self.pull.poll(zmq::POLLIN, ms).map_err(fail)? == 0 {
            return Ok(false);
        }
        self.pull.recv_into(&mut self.buf, 0).map_err(fail)?;
        while self.pull.get_rcvmore().map_err(fail)? {
            self.pull.recv_into(&mut self.buf, 0).map_err(fail)?;
        }
        Ok(true)
    }

    /// Until the bare echo process answers.
    fn wait_up(&mut self) -> Result<(), String> {
        let up = Instant::now();
        loop {
            self.push
                .send_multipart([TRANSFER_MAGIC, b"hello"], zmq::DONTWAIT)
                .or_else(|e| {
                    if e == zmq::Error::EAGAIN {
                        Ok(())
                    } else {
                        Err(e)
                    }
                })
                .map_err(|e| format!("bare sockets: send: {e}"))?;
            if self.recv(200)? {
                // Greetings sent before it was up may be answered late.
                while self.recv(20)? {}
                return Ok(());
            }
            if up.elapsed() > Duration::from_secs(10) {
                return Err(format!(
                    "the bare echo process at {} did not answer",
                    self.theirs
                ));
            }
        }
    }

    /// One round trip of `payload` (after the transfer magic).
    fn round_trip(&mut self, payload: &[u8]) -> Result<Duration, String> {
        let t0 = Instant::now();
        self.push
            .send_multipart([TRANSFER_MAGIC, payload], 0)
            .map_err(|e| format!("bare sockets: send: {e}"))?;
        if !self.recv(5000)? {
            return Err("the bare echo process did not answer within 5 s".into());
        }
        Ok(t0.elapsed())
    }

    /// Ends the bare echo process.
    fn stop(&mut self) {
        let _ = self.push.send(STOP, zmq::DONTWAIT);
    }
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
