//! Hand-offs through the full handshake, measured over a data plane: over
//! any plane against memcpy (the default), and over libfabric against the
//! same writes posted raw (`--against raw`).

use super::*;
use tensorferry_bench::rig::Control;

/// The data plane the arguments name, `--copy-threads` given to it as its
/// `threads` option (where it takes one).
fn plane(args: &BenchHandoff) -> Result<(DataPlane, Vec<(String, String)>), String> {
    let mut given = args.data_plane.clone();
    if let Some(t) = args.copy_threads {
        let name = DataPlane::resolve(&given.backend);
        // A plane this build lacks is named by the parse below.
        let takes = DataPlane::options_of(name).unwrap_or(&["threads"]);
        if !takes.contains(&"threads") {
            return Err(format!(
                "--copy-threads: the {name} data plane takes no copy threads (its options: {})",
                if takes.is_empty() {
                    "none".to_owned()
                } else {
                    takes.join(", ")
                }
            ));
        }
        if given.plane_options.iter().any(|(k, _)| k == "threads") {
            return Err("--copy-threads and --plane-option threads=N: give one".into());
        }
        given
            .plane_options
            .push(("threads".into(), t.max(1).to_string()));
    }
    Ok((given.data_plane()?, given.plane_options))
}

pub(crate) fn bench_handoff(args: &BenchHandoff) -> Result<(), String> {
    let per_size = duration(args.seconds)?;
    let (plane, options) = plane(args)?;
    let control = Control::of(&plane);
    let sizes = if args.sizes.is_empty() {
        tensorferry_bench::handoff::SIZES.to_vec()
    } else {
        args.sizes.clone()
    };
    let mut last = (0, 0);
    let tty = io::stderr().is_terminal();
    let (telemetry, _metrics) = bench_metrics(args)?;
    let rows =
        tensorferry_bench::handoff::measure(&plane, &sizes, per_size, &telemetry, |size, done| {
            if tty && (size, done / 10) != last {
                last = (size, done / 10);
                eprint!("\r{:>8}: {done:>5} hand-offs", human(size));
            }
        })
        .map_err(|e| format!("hand-off benchmark over {}: {e}", plane.name()))?;
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
                    "hop_sum_us": r.hop_sum_us.map(|h| rounded(h, 2)),
                    "path_messages": r.path_messages,
                    "p50_over_hops": r.over_hops().map(|x| rounded(x, 3)),
                })
            })
            .collect();
        let options: serde_json::Map<String, serde_json::Value> =
            options.into_iter().map(|(k, v)| (k, json!(v))).collect();
        println!(
            "{}",
            json!({"plane": plane.name(), "control": control.name(), "options": options, "rows": rows})
        );
        return Ok(());
    }
    let options: Vec<String> = options.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!(
        "hand-offs through coordinator + sender + receiver over the {} data plane{}, control over {}; against single-thread memcpy{}",
        plane.name(),
        if options.is_empty() {
            String::new()
        } else {
            format!(" ({})", options.join(", "))
        },
        control.describe(),
        match rows.first() {
            Some(r) if r.hop_sum_us.is_some() => format!(
                " and the sum of the {} hops of the fast path (each message alone over a bare Unix socket pair, median one-way times; p50/hops: the hand-off's p50 over it)",
                r.path_messages
            ),
            _ => String::new(),
        }
    );
    println!(
        "{:>8} {:>7} {:>10} {:>10} {:>10} {:>12} {:>7} {:>11} {:>9}",
        "size", "n", "p50 µs", "p99 µs", "GB/s", "memcpy GB/s", "ratio", "hop sum µs", "p50/hops"
    );
    let or_dash =
        |x: Option<f64>, digits: usize| x.map_or("-".to_owned(), |x| format!("{x:.digits$}"));
    for r in &rows {
        println!(
            "{:>8} {:>7} {:>10.1} {:>10.1} {:>10.2} {:>12.2} {:>7.2} {:>11} {:>9}",
            human(r.size),
            r.iterations,
            r.p50_us,
            r.p99_us,
            r.gbps,
            r.memcpy_gbps,
            r.ratio(),
            or_dash(r.hop_sum_us, 1),
            or_dash(r.over_hops(), 2)
        );
    }
    Ok(())
}

/// `--against raw`: the libfabric baseline is libfabric's own writes, so
/// only the fabric data plane has one.
#[cfg(not(feature = "fabric"))]
pub(crate) fn bench_raw(_: &BenchHandoff) -> Result<(), String> {
    Err(
        "--against raw compares with libfabric's raw writes: build ferry with the `fabric` feature"
            .into(),
    )
}

/// `--against raw`: the libfabric baseline is libfabric's own writes, so
/// only the fabric data plane has one.
#[cfg(feature = "fabric")]
pub(crate) fn bench_raw(args: &BenchHandoff) -> Result<(), String> {
    let (plane, _) = plane(args)?;
    let control = Control::of(&plane);
    let DataPlane::Fabric(config) = plane else {
        return Err(format!(
            "--against raw compares with libfabric's raw writes: it needs --backend fabric, not {}",
            plane.name()
        ));
    };
    let sizes = if args.sizes.is_empty() {
        tensorferry_bench::fabric::SIZES.to_vec()
    } else {
        args.sizes.clone()
    };
    let tty = io::stderr().is_terminal();
    let (telemetry, _metrics) = bench_metrics(args)?;
    let report = tensorferry_bench::fabric::measure(
        &config,
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
            json!({"provider": report.provider, "delivery": report.delivery,
                   "control": control.name(), "rows": rows})
        );
        return Ok(());
    }
    println!(
        "hand-offs through coordinator + sender + receiver over libfabric {} ({}), control over {}, against the same writes posted raw",
        report.provider,
        report.delivery,
        control.describe()
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
