//! The pipeline example: a coordinator, an encoder, denoisers and a decoder
//! as separate OS processes on the shared-memory loopback, moving requests
//! with realistic tensors; every byte is checked where it arrives.
//!
//! `cargo run --release --example pipeline` and `ferry pipeline` run it;
//! the launcher starts this same program again for each process.

mod data;
mod launcher;
mod roles;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

pub use launcher::{json, launch, table, LaunchArgs, Summary};

/// Runs the pipeline, or one of its processes.
#[derive(Parser, Debug)]
#[command(
    name = "pipeline",
    about = "encoder → denoisers → decoder over ferry, as separate processes"
)]
pub struct PipelineArgs {
    /// Requests to move.
    #[arg(long, default_value_t = 64)]
    pub requests: u64,
    /// Denoiser processes.
    #[arg(long, default_value_t = 2)]
    pub denoisers: usize,
    /// Requests the encoder keeps in flight.
    #[arg(long, default_value_t = 8)]
    pub window: usize,
    /// Kill a denoiser with SIGKILL mid-run: `<number>@<requests delivered>`
    /// (e.g. `1@16`).
    #[arg(long, value_parser = parse_kill)]
    pub kill: Option<(usize, u64)>,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 120)]
    pub timeout_secs: u64,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    /// (internal) Run one process of the pipeline in this role.
    #[arg(long, hide = true)]
    pub role: Option<String>,
    /// (internal) The process's name.
    #[arg(long, hide = true, default_value = "")]
    pub name: String,
    /// (internal) The coordinator's endpoint.
    #[arg(long, hide = true, default_value = "")]
    pub coordinator: String,
    /// (internal) The process's own endpoint.
    #[arg(long, hide = true, default_value = "")]
    pub endpoint: String,
    /// The coordinator's timeout for a sender's write report.
    #[arg(long, default_value_t = 10_000)]
    pub push_timeout_ms: u64,
}

fn parse_kill(s: &str) -> Result<(usize, u64), String> {
    let (d, n) = s
        .split_once('@')
        .ok_or_else(|| format!("{s:?}: expected <denoiser>@<delivered>, e.g. 1@16"))?;
    Ok((
        d.parse()
            .map_err(|_| format!("{d:?} is not a denoiser number"))?,
        n.parse().map_err(|_| format!("{n:?} is not a count"))?,
    ))
}

/// Runs what `args` ask; `prefix` is what precedes the pipeline's own
/// arguments when this program is started again for a process.
pub fn main(args: PipelineArgs, prefix: &[&str]) -> ExitCode {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("FERRY_LOG"))
        .with_writer(std::io::stderr)
        .try_init();
    match args.role.as_deref() {
        Some("coordinator") => {
            return roles::coordinator(&args.endpoint, Duration::from_millis(args.push_timeout_ms))
        }
        Some(role) => {
            return roles::instance(&roles::InstanceArgs {
                role: role.to_owned(),
                name: args.name.clone(),
                coordinator: args.coordinator.clone(),
                endpoint: args.endpoint.clone(),
                requests: args.requests,
                window: args.window.max(1),
            })
        }
        None => {}
    }
    if args.kill.is_some_and(|(d, _)| d >= args.denoisers) || args.denoisers == 0 {
        eprintln!("pipeline: need at least one denoiser, and --kill must name one of them");
        return ExitCode::from(2);
    }
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("pipeline: cannot find this program to start its processes: {e}");
            return ExitCode::FAILURE;
        }
    };
    let launch_args = LaunchArgs {
        requests: args.requests,
        denoisers: args.denoisers,
        window: args.window.max(1),
        kill: args.kill,
        timeout: Duration::from_secs(args.timeout_secs),
        push_timeout: Duration::from_millis(args.push_timeout_ms),
        json: args.json,
        exe,
        prefix: prefix.iter().map(|s| (*s).to_owned()).collect(),
    };
    match launch(launch_args) {
        Ok(s) => {
            if args.json {
                println!("{}", json(&s));
            } else {
                print!("{}", table(&s));
            }
            if s.ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("pipeline: {e}");
            ExitCode::FAILURE
        }
    }
}
