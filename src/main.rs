//! The `ferry` command-line tool.

use std::io::{self, BufRead, BufWriter, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use ferry::wire_bench::{self, Rate};
use ferry::wire_text::{canon_line, pretty};

/// ferry: tensor transfer for disaggregated diffusion serving.
#[derive(Parser)]
#[command(name = "ferry", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Work with control-plane messages (frame-1 JSON payloads).
    #[command(subcommand)]
    Wire(WireCommand),
    /// Measure ferry on this machine.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Subcommand)]
enum WireCommand {
    /// Read one payload per line on stdin; print, per line, the canonical
    /// encoding the seed's Python would produce for it, or `error: <reason>`.
    Canon,
    /// Read one payload per line on stdin and describe each for a person.
    Decode,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Encode+decode rate of `transfer_staged` (4-tensor manifest) and
    /// `transfer_push`; compare with `bench/vs_python.sh wire`.
    Wire(BenchWire),
    /// Slot allocator operations per second (1 GiB pool, 1 MiB blocks,
    /// 1..64 MiB requests); compare with `bench/vs_python.sh slots`.
    Slots(BenchSlots),
    /// Control-plane hand-offs per second through a coordinator and two
    /// instances in one process (every message encoded and decoded, no
    /// data moved).
    Handshake(BenchSlots),
}

#[derive(Args)]
struct BenchSlots {
    /// Seconds to run each workload.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

#[derive(Args)]
struct BenchWire {
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

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Table,
    Json,
}

fn lines(mut each: impl FnMut(usize, &[u8], &mut Vec<u8>)) -> io::Result<()> {
    let stdin = io::stdin().lock();
    let mut out = BufWriter::new(io::stdout().lock());
    let mut buf = Vec::new();
    for (i, line) in stdin.split(b'\n').enumerate() {
        let line = line?;
        buf.clear();
        each(i + 1, &line, &mut buf);
        buf.push(b'\n');
        out.write_all(&buf)?;
    }
    out.flush()
}

fn duration(seconds: f64) -> Result<Duration, String> {
    if !(seconds.is_finite() && seconds > 0.0) {
        return Err(format!(
            "--seconds must be a positive number, got {seconds}"
        ));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Prints named rates as a table (`unit` per second, and the time each
/// takes) or as JSON.
fn print_rates(format: Format, rates: &[(&str, f64)], unit: &str, per: &str) {
    match format {
        Format::Json => {
            let parts: Vec<String> = rates
                .iter()
                .map(|(name, r)| format!("\"{name}\":{{\"per_second\":{r:.1}}}"))
                .collect();
            println!("{{{}}}", parts.join(","));
        }
        Format::Table => {
            println!("{:<10} {:>14} {:>12}", "workload", format!("{unit}/s"), per);
            for (name, r) in rates {
                println!("{name:<10} {r:>14.0} {:>12.1}", 1e9 / r);
            }
        }
    }
}

fn bench_slots(args: &BenchSlots) -> Result<(), String> {
    let rates = ferry::slots_bench::measure(duration(args.seconds)?)
        .map_err(|e| format!("slot allocator: {e}"))?;
    print_rates(args.format, &rates, "ops", "ns/op");
    Ok(())
}

fn bench_handshake(args: &BenchSlots) -> Result<(), String> {
    let d = duration(args.seconds)?;
    let rates = [
        ("fast_path", ferry::handshake_bench::measure(d, true)),
        ("slow_path", ferry::handshake_bench::measure(d, false)),
    ];
    print_rates(args.format, &rates, "hand-offs", "ns/hand-off");
    Ok(())
}

fn bench_wire(args: &BenchWire) -> Result<(), String> {
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
            let parts: Vec<String> = results
                .iter()
                .map(|(name, r)| {
                    format!(
                        "\"{name}\":{{\"per_second\":{:.1},\"payload_bytes\":{}}}",
                        r.per_second(),
                        r.payload_len
                    )
                })
                .collect();
            println!("{{{}}}", parts.join(","));
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Wire(WireCommand::Canon) => {
            lines(|_, line, out| canon_line(line, out)).map_err(|e| format!("stdin/stdout: {e}"))
        }
        Command::Wire(WireCommand::Decode) => lines(|n, line, out| match pretty(line) {
            Ok(text) => out.extend_from_slice(text.as_bytes()),
            Err(e) => out.extend_from_slice(format!("line {n}: error: {e}\n").as_bytes()),
        })
        .map_err(|e| format!("stdin/stdout: {e}")),
        Command::Bench(BenchCommand::Wire(args)) => bench_wire(&args),
        Command::Bench(BenchCommand::Slots(args)) => bench_slots(&args),
        Command::Bench(BenchCommand::Handshake(args)) => bench_handshake(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferry: {e}");
            ExitCode::FAILURE
        }
    }
}
