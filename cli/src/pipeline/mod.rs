//! The pipeline example: a coordinator, an encoder, denoisers and a decoder
//! as separate OS processes on the shared-memory loopback, moving requests
//! with realistic tensors; every byte is checked where it arrives.
//!
//! `cargo run --release --example pipeline` and `ferry pipeline` run it;
//! the launcher starts this same program again for each process.

mod args;
pub mod data;
mod launcher;
mod roles;
pub mod sglang;
mod stopping;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use tensorferry::runtime::{Admission, Head, InstanceNodeConfig, Prealloc};
use tensorferry_zmq::{CurveConfig, Guard};

pub use args::{
    CoordinatorArgs, DataPlaneArgs, HeadKind, InstanceCliArgs, LifetimeArgs, PipelineArgs,
    ServiceArgs, WorkloadKind,
};
pub use launcher::{json, launch, table, LaunchArgs, Summary};
pub use roles::{
    Control, CoordinatorProcessConfig, DataPlane, InstanceProcessConfig, Workload, DRAIN_TIMEOUT,
    PIPELINE,
};

/// A role as it goes on the wire: sglang's `RoleType.from_string` reads
/// names case-blind and `denoising` as `denoiser`, and registers the
/// canonical value; so does ferry.
fn sglang_role_name(role: &str) -> String {
    match role.to_ascii_lowercase().as_str() {
        "denoising" => "denoiser".to_owned(),
        other => other.to_owned(),
    }
}

/// Logs to stderr as `FERRY_LOG` says (e.g. `FERRY_LOG=debug`).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("FERRY_LOG"))
        .with_writer(std::io::stderr)
        .try_init();
}

/// The guard `args` name, refused with exit code 2 (and why) if it cannot
/// be read or does not pair with `control`.
fn service_guard(who: &str, args: &ServiceArgs, control: Control) -> Result<Guard, ExitCode> {
    let refuse = |e: String| {
        eprintln!("ferry {who}: {e}");
        ExitCode::from(2)
    };
    let guard = args.guard().map_err(refuse)?;
    if guard.curve.is_some() && control != Control::Zmq {
        return Err(refuse(
            "--curve-key applies to the ZeroMQ control plane (--control zmq)".into(),
        ));
    }
    Ok(guard)
}

/// Runs `ferry coordinator`.
pub fn coordinator_main(args: &CoordinatorArgs) -> ExitCode {
    init_tracing();
    let guard = match service_guard("coordinator", &args.service, args.control) {
        Ok(g) => g,
        Err(code) => return code,
    };
    let mut process = CoordinatorProcessConfig::new(
        args.listen.clone(),
        args.control,
        Duration::from_millis(args.push_timeout_ms),
    );
    let t = &mut process.node.config.timeouts;
    t.alloc = Duration::from_millis(args.alloc_timeout_ms);
    t.done = Duration::from_millis(args.done_timeout_ms);
    process.node.admitted = [
        ("encoder", &args.encoder_urls),
        ("denoiser", &args.denoiser_urls),
        ("decoder", &args.decoder_urls),
    ]
    .into_iter()
    .flat_map(|(role, urls)| {
        urls.iter()
            .filter(|u| !u.trim().is_empty())
            .map(move |u| Admission {
                role: role.to_owned(),
                endpoint: u.trim().to_owned(),
            })
    })
    .collect();
    process.exit_on_stdin_close = args.service.lifetime.exit_on_stdin_close;
    process.drain_timeout = args.service.lifetime.drain_timeout;
    process.metrics_listen = args.service.metrics_listen.clone();
    process.guard = guard;
    roles::coordinator(&process)
}

/// Runs `ferry instance`.
pub fn instance_main(args: &InstanceCliArgs) -> ExitCode {
    init_tracing();
    let guard = match service_guard("instance", &args.service, args.control) {
        Ok(g) => g,
        Err(code) => return code,
    };
    let mut data_plane = match args.data_plane.data_plane() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("ferry instance: {e}");
            return ExitCode::from(2);
        }
    };
    let head = match (args.head, args.workload) {
        (Some(h), _) => h,
        (None, WorkloadKind::Sglang) => HeadKind::Sglang,
        (None, _) => HeadKind::Ferry,
    };
    let head_timeout = match Duration::try_from_secs_f64(args.head_timeout) {
        Ok(t) if !t.is_zero() => t,
        _ => {
            eprintln!(
                "ferry instance: --head-timeout {} is not a positive number of seconds",
                args.head_timeout
            );
            return ExitCode::from(2);
        }
    };
    let mut settings = InstanceNodeConfig::new(&sglang_role_name(&args.role), &args.coordinator);
    settings.config.reserved_timeout = Duration::from_millis(args.reserved_timeout_ms);
    if Head::from(head) == Head::Sglang {
        settings = settings.under_sglang(head_timeout);
    }
    if let Some(p) = args
        .prealloc
        .or_else(|| roles::role_prealloc(&settings.role))
    {
        settings.config.prealloc = p;
    }
    if let Err(e) = settings.check_guard(&guard) {
        eprintln!("ferry instance: {e}");
        return ExitCode::from(2);
    }
    data_plane.guard(&guard);
    roles::instance(&InstanceProcessConfig {
        node: settings,
        data_plane,
        workload: match args.workload {
            WorkloadKind::Pipeline => Workload::Pipeline,
            WorkloadKind::Random => Workload::Random {
                seed: args.seed,
                max_bytes: args.max_bytes.max(1),
            },
            WorkloadKind::Sglang => Workload::Sglang,
        },
        name: args.name.clone(),
        endpoint: args.endpoint.clone(),
        requests: args.requests,
        window: args.window.max(1),
        control: args.control,
        pool_mib: args.pool_mib,
        pace: Duration::from_millis(args.pace_ms),
        hold: Duration::from_millis(args.hold_ms),
        metrics_listen: args.service.metrics_listen.clone(),
        guard,
        exit_on_stdin_close: args.service.lifetime.exit_on_stdin_close,
        drain_timeout: args.service.lifetime.drain_timeout,
    })
}

/// Runs what `args` ask; `prefix` is what precedes the pipeline's own
/// arguments when this program is started again for a process.
pub fn main(args: PipelineArgs, prefix: &[&str]) -> ExitCode {
    init_tracing();
    let guard = match args::guard(&[], args.curve_key.as_deref(), args.curve_peers.as_deref()) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("pipeline: {e}");
            return ExitCode::from(2);
        }
    };
    match args.role.as_deref() {
        Some("coordinator") => {
            let mut process = CoordinatorProcessConfig::new(
                args.endpoint.split(',').map(str::to_owned).collect(),
                args.control,
                Duration::from_millis(args.push_timeout_ms),
            );
            process.exit_on_stdin_close = args.exit_on_stdin_close;
            process.metrics_listen = args.metrics_listen.clone();
            process.guard = guard;
            return roles::coordinator(&process);
        }
        Some(role) => {
            let mut data_plane = match args.data_plane.data_plane() {
                Ok(d) => d,
                Err(e) => {
                    eprintln!("pipeline: {e}");
                    return ExitCode::from(2);
                }
            };
            data_plane.guard(&guard);
            let mut settings = InstanceNodeConfig::new(role, &args.coordinator);
            if let Some(p) = roles::role_prealloc(role) {
                settings.config.prealloc = p;
            }
            return roles::instance(&roles::InstanceProcessConfig {
                node: settings,
                name: args.name.clone(),
                endpoint: args.endpoint.clone(),
                requests: args.requests,
                window: args.window.max(1),
                control: args.control,
                pool_mib: 0,
                pace: Duration::ZERO,
                hold: Duration::ZERO,
                data_plane,
                workload: Workload::Pipeline,
                metrics_listen: args.metrics_listen.clone(),
                guard,
                exit_on_stdin_close: args.exit_on_stdin_close,
                drain_timeout: DRAIN_TIMEOUT,
            });
        }
        None => {}
    }
    match args.data_plane.data_plane() {
        Err(e) => {
            eprintln!("pipeline: {e}");
            return ExitCode::from(2);
        }
        Ok(_) if args.curve && args.control != Control::Zmq => {
            eprintln!("pipeline: --curve runs over the ZeroMQ control plane (--control zmq)");
            return ExitCode::from(2);
        }
        Ok(plane) if plane.needs_zmq() && args.control != Control::Zmq => {
            eprintln!(
                "pipeline: the {} data plane pairs with the ZeroMQ control plane (--control zmq)",
                plane.name()
            );
            return ExitCode::from(2);
        }
        Ok(_) => {}
    }
    if let Some(Err(e)) = args
        .metrics_listen
        .as_deref()
        .map(launcher::metrics_address)
    {
        eprintln!("pipeline: {e}");
        return ExitCode::from(2);
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
        control: args.control,
        data_plane: args.data_plane.to_args(),
        metrics_listen: args.metrics_listen.clone(),
        curve: args.curve,
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
