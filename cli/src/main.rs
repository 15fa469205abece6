//! The `ferry` command-line tool.

use std::io::{self, BufRead, BufWriter, IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::json;
use tensorferry::runtime::DataPlane;
use tensorferry_bench::wire::{self as wire_bench, Rate};
use tensorferry_cli::metrics_http::MetricsServer;
use tensorferry_cli::wire_text::{canon_line, pretty};

mod bench;
use bench::Bench;

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
    /// Run the pipeline example: a coordinator, an encoder, denoisers and a
    /// decoder as separate processes on the shared-memory loopback.
    Pipeline(tensorferry_cli::pipeline::PipelineArgs),
    /// Run a coordinator as a standalone process or service (reports
    /// events as JSON lines on stdout; runs until SIGTERM or SIGINT, then
    /// drains).
    Coordinator(tensorferry_cli::pipeline::CoordinatorArgs),
    /// Run an instance as a standalone process or service, with the
    /// pipeline's workload for its role (runs until SIGTERM or SIGINT,
    /// then drains).
    Instance(tensorferry_cli::pipeline::InstanceCliArgs),
    /// The echo side of `ferry bench --control zmq`.
    #[command(hide = true)]
    BenchEcho {
        /// Where to receive.
        #[arg(long)]
        listen: String,
        /// Where to answer.
        #[arg(long)]
        reply_to: String,
        /// Echo over bare libzmq sockets, with a reply encoded once (the
        /// round trip's floor).
        #[arg(long)]
        bare: bool,
    },
    /// Measure ferry on this machine (no subcommand: hand-offs through
    /// the full handshake over the data plane `--backend` names, default
    /// shm, against memcpy; `--against raw`: libfabric against raw writes).
    Bench(Bench),
    /// Make a CURVE key pair: `DIR/NAME.key` (the public certificate, to
    /// give the peers that admit this process: `--curve-peers`) and
    /// `DIR/NAME.key_secret` (both keys, mode 0600: `--curve-key`), in the
    /// format of czmq and pyzmq's `zmq.auth.create_certificates`.
    Keygen {
        /// The certificates' name.
        name: String,
        /// Where to write them (created if missing).
        #[arg(long, default_value = ".")]
        dir: std::path::PathBuf,
    },
    /// What this host offers the data planes and what ferry would choose:
    /// libfabric providers and their domains, RDMA devices, ports and GID
    /// tables (or why there are none).
    Devices(tensorferry_cli::devices::DevicesArgs),
}

#[derive(Subcommand)]
enum WireCommand {
    /// Read one payload per line on stdin; print, per line, the canonical
    /// encoding the seed's Python would produce for it, or `error: <reason>`.
    Canon,
    /// Read one payload per line on stdin and describe each for a person.
    Decode,
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

/// `ferry keygen`: a key pair written as certificates; their paths and the
/// public key printed.
fn keygen(name: &str, dir: &std::path::Path) -> Result<(), String> {
    let pair = tensorferry_zmq::CurveKeyPair::generate()
        .map_err(|e| format!("keygen: this libzmq cannot make CURVE keys: {e}"))?;
    let (public, secret) = tensorferry_zmq::write_certificates(dir, name, &pair)
        .map_err(|e| format!("keygen: {e}"))?;
    println!(
        "{}",
        json!({
            "public_key": pair.public().to_z85(),
            "public": public.display().to_string(),
            "secret": secret.display().to_string(),
        })
    );
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tensorferry_cli::pipeline::init_tracing();
    let result = match cli.command {
        Command::Pipeline(args) => return tensorferry_cli::pipeline::main(args, &["pipeline"]),
        Command::Coordinator(args) => return tensorferry_cli::pipeline::coordinator_main(&args),
        Command::Instance(args) => return tensorferry_cli::pipeline::instance_main(&args),
        Command::Devices(args) => {
            let report = tensorferry_cli::devices::report(&args);
            if args.json {
                println!("{report}");
            } else {
                print!("{}", tensorferry_cli::devices::text(&report));
            }
            Ok(())
        }
        Command::Keygen { name, dir } => keygen(&name, &dir),
        Command::BenchEcho {
            listen,
            reply_to,
            bare,
        } => if bare {
            tensorferry_bench::control::echo_bare(&listen, &reply_to)
        } else {
            tensorferry_bench::control::echo(&listen, &reply_to)
        }
        .map_err(|e| format!("bench echo: {e}")),
        Command::Wire(WireCommand::Canon) => {
            lines(|_, line, out| canon_line(line, out)).map_err(|e| format!("stdin/stdout: {e}"))
        }
        Command::Wire(WireCommand::Decode) => lines(|n, line, out| match pretty(line) {
            Ok(text) => out.extend_from_slice(text.as_bytes()),
            Err(e) => out.extend_from_slice(format!("line {n}: error: {e}\n").as_bytes()),
        })
        .map_err(|e| format!("stdin/stdout: {e}")),
        Command::Bench(b) => bench::run(b),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferry: {e}");
            ExitCode::FAILURE
        }
    }
}
