//! The control plane measured: ZeroMQ round trips and message rates
//! between two processes (`--control zmq`), and CurveZMQ against plain
//! ZeroMQ, in turns (`--curve`).

use super::*;

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
                    "bare_p50_us": rounded(r.bare_p50_us, 2),
                    "bare_p99_us": rounded(r.bare_p99_us, 2),
                    "p50_over_bare": rounded(r.over_bare(), 3),
                });
                (r.transport.to_string(), row)
            })
            .collect();
        println!("{}", serde_json::Value::Object(report));
        return Ok(());
    }
    println!("ZeroMQ control plane between two processes (transfer_push → transfer_pushed, encoded and decoded), against bare libzmq sockets");
    println!(
        "{:>9} {:>10} {:>10} {:>10} {:>14} {:>12} {:>12} {:>9}",
        "transport",
        "n",
        "p50 µs",
        "p99 µs",
        "one-way msg/s",
        "bare p50 µs",
        "bare p99 µs",
        "p50/bare"
    );
    for r in &rows {
        println!(
            "{:>9} {:>10} {:>10.1} {:>10.1} {:>14.0} {:>12.1} {:>12.1} {:>9.2}",
            r.transport,
            r.round_trips,
            r.p50_us,
            r.p99_us,
            r.messages_per_second,
            r.bare_p50_us,
            r.bare_p99_us,
            r.over_bare()
        );
    }
    println!("(a round trip is two messages, one each way; bare: the same bytes over bare PUSH/PULL sockets to a second echo process that neither decodes nor encodes, in turns with the channel's round trips: the two hops' sum measured alone)");
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
    // A row a size, with its size.
    let sized = |pairs: &[(u64, tensorferry_bench::curve::Pair)]| -> Vec<serde_json::Value> {
        pairs
            .iter()
            .map(|(size, p)| {
                let mut r = row(p);
                r["size"] = json!(size);
                r
            })
            .collect()
    };
    if args.json {
        let handoffs = sized(&report.handoffs);
        let writes = sized(&report.engine_writes);
        println!(
            "{}",
            json!({"handshake": row(&report.handshake), "handoffs": handoffs,
                   "engine_notify_round_trip": row(&report.notify_round_trip),
                   "engine_writes": writes})
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
    line("engine notify rtt".into(), &report.notify_round_trip);
    for (size, p) in &report.engine_writes {
        line(format!("engine write {}", human(*size)), p);
    }
    println!(
        "(every guard on against none: CURVE and the allow-list; handshake: a new instance started and registered; engine rows: two transfer engines on the local plane, a notification's round trip and a write with a notification until the peer holds it; ratio: guarded median over plain)"
    );
    Ok(())
}
