//! `ferry bench`: its subcommands and what each measures, side by side
//! with what it compares against, printed as a table or JSON.
//!
//! Modules: the control plane (`control`), hand-offs over a data plane
//! (`handoff`), and the subcommands measured in one process
//! (`in_process`); this module holds the arguments, what they share, and
//! the choice among them.

mod control;
mod handoff;
mod in_process;

use super::*;
use control::{bench_control, bench_curve};
use handoff::{bench_handoff, bench_raw};
use in_process::{bench_handshake, bench_scale, bench_slots, bench_wire};

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct Bench {
    #[command(subcommand)]
    which: Option<BenchCommand>,
    #[command(flatten)]
    handoff: BenchHandoff,
}

#[derive(Args)]
pub(crate) struct BenchHandoff {
    /// Seconds to spend on each size.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Sizes to measure, in bytes (K, M, G suffixes allowed); default
    /// 4K,64K,1M,4M,16M,64M,256M.
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    sizes: Vec<u64>,
    /// Threads a large write is split across, for a data plane that takes
    /// them (`shm`, `local`): its `threads` option, as `--plane-option
    /// threads=N` gives it (default: up to 4 cores).
    #[arg(long)]
    copy_threads: Option<usize>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Measure the control plane instead: `zmq` times request/reply round
    /// trips and the one-way message rate between two processes over
    /// ipc:// and tcp://127.0.0.1.
    #[arg(long, value_parser = ["zmq"])]
    control: Option<String>,
    /// Measure the control plane over CurveZMQ against plain ZeroMQ, side
    /// by side and in turns: a new instance's handshake (connect, CURVE
    /// both ways, registration), and hand-offs of each size (default
    /// 4K,64M) through a coordinator over tcp://127.0.0.1 and shared
    /// memory; prints each ratio.
    #[arg(long)]
    curve: bool,
    /// The data plane to measure hand-offs over: whichever `--backend`
    /// names, with its options; the nodes talk over Unix sockets, or over
    /// ZeroMQ on tcp://127.0.0.1 for a plane whose nodes need it (fabric,
    /// verbs), and the table's first line names both.
    #[command(flatten)]
    data_plane: tensorferry_cli::pipeline::DataPlaneArgs,
    /// What the hand-offs are compared against, in the same run.
    #[arg(long, value_enum, default_value_t = Against::Memcpy)]
    against: Against,
    /// Transfers in flight at once (`--against raw`).
    #[arg(long, default_value_t = 8)]
    window: usize,
    /// Serve the measured nodes' Prometheus metrics over HTTP at this
    /// address:port while the benchmark runs (port 0 picks a free one).
    #[arg(long, env = "FERRY_METRICS_LISTEN")]
    metrics_listen: Option<String>,
}

/// The benchmark's metrics endpoint, if asked for; says where on stderr.
pub(crate) fn bench_metrics(
    args: &BenchHandoff,
) -> Result<
    (
        tensorferry::runtime::telemetry::Telemetry,
        Option<MetricsServer>,
    ),
    String,
> {
    let telemetry = tensorferry::runtime::telemetry::Telemetry::new();
    let Some(listen) = &args.metrics_listen else {
        return Ok((telemetry, None));
    };
    let server = MetricsServer::start(listen, telemetry.clone())?;
    eprintln!("ferry bench: metrics at {}", server.url());
    Ok((telemetry, Some(server)))
}

pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    let (digits, mult) = match s.as_bytes().last() {
        Some(b'K' | b'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 1 << 20),
        Some(b'G' | b'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("{s:?} is not a size (e.g. 4096, 64K, 16M)"))
}

pub(crate) fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// `x` to `digits` decimals, for JSON figures people read.
pub(crate) fn rounded(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}

/// What `ferry bench` compares hand-offs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Against {
    /// Single-thread memcpy of the same size, right after each hand-off
    /// (one at a time, timed from commit to the receiver holding it: p50,
    /// p99, GB/s); over any data plane, its nodes over Unix sockets, or
    /// over ZeroMQ on tcp://127.0.0.1 where the plane needs it (fabric,
    /// verbs).
    Memcpy,
    /// The same writes posted raw through libfabric (`--backend fabric`
    /// only, a build with the `fabric` feature): `--window` transfers in
    /// flight, ferry's hand-offs and the raw writes in alternating rounds,
    /// GB/s of each.
    Raw,
}

#[derive(Subcommand)]
pub(crate) enum BenchCommand {
    /// Encode+decode rate of `transfer_staged` (4-tensor manifest) and
    /// `transfer_push`; compare with `bench/python/vs_python.sh wire`.
    Wire(BenchWire),
    /// Slot allocator operations per second (1 GiB pool, 1 MiB blocks,
    /// 1..64 MiB requests); compare with `bench/python/vs_python.sh slots`.
    Slots(BenchSlots),
    /// Control-plane hand-offs per second through a coordinator and two
    /// instances in one process (every message encoded and decoded, no
    /// data moved).
    Handshake(BenchSlots),
    /// Control-plane hand-offs per second as the deployment grows: from 1
    /// encoder and 1 denoiser to 1,024 instances with 16,000 transfers live
    /// at the coordinator (default limits; slow and fast path).
    Scale(BenchScale),
}

#[derive(Args)]
pub(crate) struct BenchScale {
    /// Seconds to run each row and path.
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Only the rows with at most this many instances.
    #[arg(long)]
    max_instances: Option<usize>,
}

#[derive(Args)]
pub(crate) struct BenchSlots {
    /// Seconds to run each workload.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

#[derive(Args)]
pub(crate) struct BenchWire {
    /// Seconds to run each workload.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// Print the payloads being measured (one per line) and exit.
    #[arg(long)]
    print_payloads: bool,
}

/// Runs `ferry bench` as `b` asks.
pub(crate) fn run(b: Bench) -> Result<(), String> {
    match b.which {
        None if b.handoff.curve => bench_curve(&b.handoff),
        None if b.handoff.control.is_some() => bench_control(&b.handoff),
        None => match b.handoff.against {
            Against::Memcpy => bench_handoff(&b.handoff),
            Against::Raw => bench_raw(&b.handoff),
        },
        Some(BenchCommand::Wire(args)) => bench_wire(&args),
        Some(BenchCommand::Slots(args)) => bench_slots(&args),
        Some(BenchCommand::Handshake(args)) => bench_handshake(&args),
        Some(BenchCommand::Scale(args)) => bench_scale(&args),
    }
}
