//! `ferry bench`: its subcommands and what each measures, side by side
//! with what it compares against, printed as a table or JSON.

use super::*;

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
    /// Threads a large write is split across (default: up to 4 cores).
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
    /// The data plane to measure hand-offs over (`fabric`: against the raw
    /// libfabric baseline in the same run).
    #[command(flatten)]
    data_plane: tensorferry_cli::pipeline::DataPlaneArgs,
    /// Transfers in flight at once (fabric).
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

pub(crate) fn bench_control(args: &BenchHandoff) -> Result<(), String> {
    let rows = tensorferry_bench::control::measure(duration(args.seconds)?, &["bench-echo"])?;
    if args.json {
        let report: serde_json::Map<String, serde_json::Value> = rows
            .iter()
            .map(|r| {
                let row = json!({
                    "round_trips": r.round_trips,
                    "p50_us": rounded(r.p50_us, 2),
                    "p99_us": rounded(r.p99_us, 2),
                    "messages_per_second": r.messages_per_second.round(),
                });
                (r.transport.to_string(), row)
            })
            .collect();
        println!("{}", serde_json::Value::Object(report));
        return Ok(());
    }
    println!("ZeroMQ control plane between two processes (transfer_push → transfer_pushed, encoded and decoded)");
    println!(
        "{:>9} {:>10} {:>10} {:>10} {:>14}",
        "transport", "n", "p50 µs", "p99 µs", "one-way msg/s"
    );
    for r in &rows {
        println!(
            "{:>9} {:>10} {:>10.1} {:>10.1} {:>14.0}",
            r.transport, r.round_trips, r.p50_us, r.p99_us, r.messages_per_second
        );
    }
    Ok(())
}

pub(crate) fn bench_curve(args: &BenchHandoff) -> Result<(), String> {
    let sizes = if args.sizes.is_empty() {
        tensorferry_bench::curve::SIZES.to_vec()
    } else {
        args.sizes.clone()
    };
    let tty = io::stderr().is_terminal();
    let report = tensorferry_bench::curve::measure(&sizes, duration(args.seconds)?, |size| {
        if tty {
            eprint!("\r{:>8} ...", human(size));
        }
    })
    .map_err(|e| format!("CURVE benchmark: {e}"))?;
    if tty {
        eprint!("\r{:40}\r", "");
    }
    let row = |p: &tensorferry_bench::curve::Pair| {
        json!({
            "n": p.n,
            "plain_p50_us": rounded(p.plain_p50_us, 2),
            "plain_p99_us": rounded(p.plain_p99_us, 2),
            "curve_p50_us": rounded(p.curve_p50_us, 2),
            "curve_p99_us": rounded(p.curve_p99_us, 2),
            "ratio": rounded(p.ratio(), 3),
        })
    };
    if args.json {
        let handoffs: Vec<serde_json::Value> = report
            .handoffs
            .iter()
            .map(|(size, p)| {
                let mut r = row(p);
                r["size"] = json!(size);
                r
            })
            .collect();
        println!(
            "{}",
            json!({"handshake": row(&report.handshake), "handoffs": handoffs})
        );
        return Ok(());
    }
    println!("the control plane over CurveZMQ against plain ZeroMQ (tcp://127.0.0.1, shared memory), in turns");
    println!(
        "{:>18} {:>6} {:>12} {:>12} {:>12} {:>12} {:>7}",
        "", "n", "plain p50 µs", "plain p99 µs", "CURVE p50 µs", "CURVE p99 µs", "ratio"
    );
    let line = |name: String, p: &tensorferry_bench::curve::Pair| {
        println!(
            "{name:>18} {:>6} {:>12.1} {:>12.1} {:>12.1} {:>12.1} {:>7.2}",
            p.n,
            p.plain_p50_us,
            p.plain_p99_us,
            p.curve_p50_us,
            p.curve_p99_us,
            p.ratio()
        );
    };
    line("handshake".into(), &report.handshake);
    for (size, p) in &report.handoffs {
        line(format!("hand-off {}", human(*size)), p);
    }
    println!(
        "(handshake: a new instance started and registered; ratio: CURVE's median over plain's)"
    );
    Ok(())
}

pub(crate) fn bench_handoff(args: &BenchHandoff) -> Result<(), String> {
    let per_size = duration(args.seconds)?;
    let sizes = if args.sizes.is_empty() {
        tensorferry_bench::handoff::SIZES.to_vec()
    } else {
        args.sizes.clone()
    };
    let mut copy = tensorferry::runtime::CopyConfig::default();
    if let Some(t) = args.copy_threads {
        copy.threads = t.max(1);
    }
    let mut last = (0, 0);
    let tty = io::stderr().is_terminal();
    let (telemetry, _metrics) = bench_metrics(args)?;
    let rows =
        tensorferry_bench::handoff::measure(&sizes, per_size, copy, &telemetry, |size, done| {
            if tty && (size, done / 10) != last {
                last = (size, done / 10);
                eprint!("\r{:>8}: {done:>5} hand-offs", human(size));
            }
        })
        .map_err(|e| format!("hand-off benchmark: {e}"))?;
    if tty {
        eprint!("\r{:40}\r", "");
    }
    if args.json {
        let rows: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                json!({
                    "size": r.size,
                    "iterations": r.iterations,
                    "p50_us": rounded(r.p50_us, 2),
                    "p99_us": rounded(r.p99_us, 2),
                    "gbps": rounded(r.gbps, 3),
                    "memcpy_gbps": rounded(r.memcpy_gbps, 3),
                    "ratio": rounded(r.ratio(), 3),
                })
            })
            .collect();
        println!("{}", json!({"copy_threads": copy.threads, "rows": rows}));
        return Ok(());
    }
    println!(
        "hand-offs through coordinator + sender + receiver (shared memory, Unix sockets), {} copy thread(s)",
        copy.threads
    );
    println!(
        "{:>8} {:>7} {:>10} {:>10} {:>10} {:>12} {:>7}",
        "size", "n", "p50 µs", "p99 µs", "GB/s", "memcpy GB/s", "ratio"
    );
    for r in &rows {
        println!(
            "{:>8} {:>7} {:>10.1} {:>10.1} {:>10.2} {:>12.2} {:>7.2}",
            human(r.size),
            r.iterations,
            r.p50_us,
            r.p99_us,
            r.gbps,
            r.memcpy_gbps,
            r.ratio()
        );
    }
    Ok(())
}

#[cfg(feature = "fabric")]
pub(crate) fn bench_fabric(
    args: &BenchHandoff,
    config: &tensorferry_fabric::FabricConfig,
) -> Result<(), String> {
    let sizes = if args.sizes.is_empty() {
        tensorferry_bench::fabric::SIZES.to_vec()
    } else {
        args.sizes.clone()
    };
    let tty = io::stderr().is_terminal();
    let (telemetry, _metrics) = bench_metrics(args)?;
    let report = tensorferry_bench::fabric::measure(
        config,
        &sizes,
        args.window,
        duration(args.seconds)?,
        &telemetry,
        |size| {
            if tty {
                eprint!("\r{:>8} ...", human(size));
            }
        },
    )?;
    if tty {
        eprint!("\r{:40}\r", "");
    }
    if args.json {
        let rows: Vec<serde_json::Value> = report
            .rows
            .iter()
            .map(|r| {
                json!({
                    "size": r.size,
                    "window": r.window,
                    "transfers": r.transfers,
                    "gbps": rounded(r.gbps, 3),
                    "raw_writes": r.raw_writes,
                    "raw_gbps": rounded(r.raw_gbps, 3),
                    "ratio": rounded(r.ratio(), 3),
                })
            })
            .collect();
        println!(
            "{}",
            json!({"provider": report.provider, "delivery": report.delivery, "rows": rows})
        );
        return Ok(());
    }
    println!(
        "hand-offs through coordinator + sender + receiver over libfabric {} ({}), against the same writes posted raw",
        report.provider, report.delivery
    );
    println!(
        "{:>8} {:>6} {:>9} {:>10} {:>10} {:>10} {:>7}",
        "size", "window", "ferry n", "ferry GB/s", "raw n", "raw GB/s", "ratio"
    );
    for r in &report.rows {
        println!(
            "{:>8} {:>6} {:>9} {:>10.2} {:>10} {:>10.2} {:>7.2}",
            human(r.size),
            r.window,
            r.transfers,
            r.gbps,
            r.raw_writes,
            r.raw_gbps,
            r.ratio()
        );
    }
    Ok(())
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

/// Prints named rates as a table (`unit` per second, and the time each
/// takes) or as JSON.
pub(crate) fn print_rates(format: Format, rates: &[(&str, f64)], unit: &str, per: &str) {
    match format {
        Format::Json => {
            let report: serde_json::Map<String, serde_json::Value> = rates
                .iter()
                .map(|(name, r)| ((*name).to_owned(), json!({"per_second": rounded(*r, 1)})))
                .collect();
            println!("{}", serde_json::Value::Object(report));
        }
        Format::Table => {
            println!("{:<10} {:>14} {:>12}", "workload", format!("{unit}/s"), per);
            for (name, r) in rates {
                println!("{name:<10} {r:>14.0} {:>12.1}", 1e9 / r);
            }
        }
    }
}

pub(crate) fn bench_slots(args: &BenchSlots) -> Result<(), String> {
    let rates = tensorferry_bench::slots::measure(duration(args.seconds)?)
        .map_err(|e| format!("slot allocator: {e}"))?;
    print_rates(args.format, &rates, "ops", "ns/op");
    Ok(())
}

pub(crate) fn bench_handshake(args: &BenchSlots) -> Result<(), String> {
    let d = duration(args.seconds)?;
    let rates = [
        ("fast_path", tensorferry_bench::handshake::measure(d, true)?),
        (
            "slow_path",
            tensorferry_bench::handshake::measure(d, false)?,
        ),
    ];
    print_rates(args.format, &rates, "hand-offs", "ns/hand-off");
    Ok(())
}

pub(crate) fn bench_scale(args: &BenchScale) -> Result<(), String> {
    use tensorferry_bench::scale::{measure, ROWS};
    let d = duration(args.seconds)?;
    let rows = ROWS
        .iter()
        .filter(|r| args.max_instances.is_none_or(|m| r.instances() <= m));
    let mut results = Vec::new();
    for &row in rows {
        let slow = measure(row, false, d)?;
        let fast = measure(row, true, d)?;
        results.push((slow, fast));
    }
    let Some(&(base_slow, base_fast)) = results.first() else {
        return Err("no row has that few instances".into());
    };
    let ratio = |r: f64, base: f64| if base > 0.0 { r / base } else { 0.0 };
    if args.json {
        let rows: Vec<serde_json::Value> = results
            .iter()
            .map(|(s, f)| {
                json!({
                    "encoders": s.shape.encoders,
                    "denoisers": s.shape.denoisers,
                    "held_each": s.shape.held,
                    "live": s.shape.live(),
                    "slow_path_per_second": rounded(s.per_second, 0),
                    "slow_path_vs_first_row": rounded(ratio(s.per_second, base_slow.per_second), 3),
                    "slow_path_probes_per_handoff": rounded(s.probes_per_handoff, 1),
                    "fast_path_per_second": rounded(f.per_second, 0),
                    "fast_path_vs_first_row": rounded(ratio(f.per_second, base_fast.per_second), 3),
                    "fast_path_probes_per_handoff": rounded(f.probes_per_handoff, 1),
                })
            })
            .collect();
        let limits = tensorferry_core::handshake::Limits::default();
        let report = json!({
            "limits": {
                "requests": limits.requests,
                "tombstones": limits.tombstones,
                "members": limits.members,
                "nested_per_request": limits.nested_per_request,
            },
            "rows": rows,
        });
        println!("{report}");
        return Ok(());
    }
    println!(
        "{:>8} {:>9} {:>6} {:>7} {:>11} {:>7} {:>7} {:>11} {:>7} {:>7}",
        "encoders",
        "denoisers",
        "held",
        "live",
        "slow/s",
        "ratio",
        "probes",
        "fast/s",
        "ratio",
        "probes"
    );
    for (s, f) in &results {
        println!(
            "{:>8} {:>9} {:>6} {:>7} {:>11.0} {:>7.2} {:>7.1} {:>11.0} {:>7.2} {:>7.1}",
            s.shape.encoders,
            s.shape.denoisers,
            s.shape.held,
            s.shape.live(),
            s.per_second,
            ratio(s.per_second, base_slow.per_second),
            s.probes_per_handoff,
            f.per_second,
            ratio(f.per_second, base_fast.per_second),
            f.probes_per_handoff,
        );
    }
    println!("(hand-offs per second, each path's ratio to its first row, and hash-index places read per hand-off)");
    Ok(())
}

pub(crate) fn bench_wire(args: &BenchWire) -> Result<(), String> {
    let workloads = [
        ("transfer_staged", wire_bench::staged_msg()),
        ("transfer_push", wire_bench::push_msg()),
    ];
    if args.print_payloads {
        for (_, msg) in &workloads {
            let mut buf = vec![0u8; msg.encoded_len(Default::default())];
            let n = msg.encode(&mut buf).map_err(|e| e.to_string())?;
            println!("{}", String::from_utf8_lossy(&buf[..n]));
        }
        return Ok(());
    }
    if !(args.seconds.is_finite() && args.seconds > 0.0) {
        return Err(format!(
            "--seconds must be a positive number, got {}",
            args.seconds
        ));
    }
    let duration = Duration::from_secs_f64(args.seconds);
    let mut results: Vec<(String, Rate)> = Vec::new();
    for (name, msg) in &workloads {
        let rate = wire_bench::measure(msg, wire_bench::encode_decode, duration)
            .map_err(|e| format!("{name}: {e}"))?;
        results.push((name.to_string(), rate));
    }
    // Beyond what the seed's decode does: the manifest walked and checked.
    let (name, msg) = &workloads[0];
    let rate = wire_bench::measure(msg, wire_bench::encode_decode_walk, duration)
        .map_err(|e| format!("{name}: {e}"))?;
    results.push((format!("{name}+walk"), rate));
    match args.format {
        Format::Json => {
            let report: serde_json::Map<String, serde_json::Value> = results
                .iter()
                .map(|(name, r)| {
                    let row = json!({
                        "per_second": rounded(r.per_second(), 1),
                        "payload_bytes": r.payload_len,
                    });
                    (name.clone(), row)
                })
                .collect();
            println!("{}", serde_json::Value::Object(report));
        }
        Format::Table => {
            println!(
                "{:<18} {:>14} {:>12} {:>14}",
                "message", "enc+dec/s", "ns/pair", "payload bytes"
            );
            for (name, r) in &results {
                println!(
                    "{name:<22} {:>14.0} {:>12.1} {:>14}",
                    r.per_second(),
                    1e9 / r.per_second(),
                    r.payload_len
                );
            }
        }
    }
    Ok(())
}

/// Runs `ferry bench` as `b` asks.
pub(crate) fn run(b: Bench) -> Result<(), String> {
    match b.which {
        None if b.handoff.curve => bench_curve(&b.handoff),
        None if b.handoff.control.is_some() => bench_control(&b.handoff),
        None => match b.handoff.data_plane.data_plane() {
            Err(e) => Err(e),
            Ok(DataPlane::Shm(_)) => bench_handoff(&b.handoff),
            #[cfg(feature = "fabric")]
            Ok(DataPlane::Fabric(config)) => bench_fabric(&b.handoff, &config),
            Ok(other) if other.name() == "verbs" => Err(
                "ferry bench does not measure the verbs data plane yet (no NIC to calibrate it on); \
                 time `ferry pipeline --control zmq --backend verbs --device <dev>` instead, and \
                 `cargo bench -p tensorferry-bench --bench bookkeeping` for its CPU cost"
                    .into(),
            ),
            Ok(other) => Err(format!(
                "ferry bench does not measure the {} data plane",
                other.name()
            )),
        },
        Some(BenchCommand::Wire(args)) => bench_wire(&args),
        Some(BenchCommand::Slots(args)) => bench_slots(&args),
        Some(BenchCommand::Handshake(args)) => bench_handshake(&args),
        Some(BenchCommand::Scale(args)) => bench_scale(&args),
    }
}
