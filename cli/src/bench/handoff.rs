//! Hand-offs through the full handshake, measured over a data plane: the
//! shared-memory loopback against memcpy (the default), and libfabric
//! against the same writes posted raw.

use super::*;

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
