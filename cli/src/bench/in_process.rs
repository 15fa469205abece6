//! The subcommands that measure one process's own work, no data moved:
//! the wire codec, the slot allocator, the handshake machines, and those
//! machines as the deployment grows.

use super::*;

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
    // The floor beside each: a memcpy of the same bytes, in the same run.
    let floors: Vec<Rate> = results
        .iter()
        .map(|(_, r)| wire_bench::copy_floor(r.payload_len, duration / 4))
        .collect();
    match args.format {
        Format::Json => {
            let report: serde_json::Map<String, serde_json::Value> = results
                .iter()
                .zip(&floors)
                .map(|((name, r), floor)| {
                    let row = json!({
                        "per_second": rounded(r.per_second(), 1),
                        "payload_bytes": r.payload_len,
                        "memcpy_ns": rounded(1e9 / floor.per_second(), 2),
                    });
                    (name.clone(), row)
                })
                .collect();
            println!("{}", serde_json::Value::Object(report));
        }
        Format::Table => {
            println!(
                "{:<22} {:>14} {:>12} {:>14} {:>11} {:>9}",
                "message", "enc+dec/s", "ns/pair", "payload bytes", "memcpy ns", "x memcpy"
            );
            for ((name, r), floor) in results.iter().zip(&floors) {
                let (ns, copy) = (1e9 / r.per_second(), 1e9 / floor.per_second());
                println!(
                    "{name:<22} {:>14.0} {:>12.1} {:>14} {:>11.1} {:>9.1}",
                    r.per_second(),
                    ns,
                    r.payload_len,
                    copy,
                    ns / copy
                );
            }
            println!("(memcpy: a plain copy of the payload's bytes, the floor of a codec pair)");
        }
    }
    Ok(())
}
