//! The command line of `ferry pipeline`, `ferry coordinator` and `ferry
//! instance`: each flag, its environment variable and its default, read
//! into the library's types (a data plane, an instance's settings).

use super::*;

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
    /// (internal) The process stops when its stdin closes (the launcher
    /// ends its children so).
    #[arg(long, hide = true)]
    pub exit_on_stdin_close: bool,
    /// The coordinator's timeout for a sender's write report.
    #[arg(long, default_value_t = 10_000)]
    pub push_timeout_ms: u64,
    /// The control plane between the processes (the libfabric data plane
    /// pairs with `zmq`).
    #[arg(long, value_enum, default_value_t = Control::Uds)]
    pub control: Control,
    /// Serve each process's Prometheus metrics over HTTP: the coordinator
    /// at this address:port (a port alone: on loopback), the instances at
    /// the ports after it (port 0: each picks a free one); where each is
    /// served is printed as it starts. Plain HTTP, outside --allow-from
    /// and CURVE: keep it on loopback or a monitoring network.
    #[arg(long, env = "FERRY_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// Run the processes' ZeroMQ control plane (and the verbs side
    /// channel) over CurveZMQ, with a key pair for each process generated
    /// in the pipeline's own temporary directory (needs `--control zmq`).
    #[arg(long)]
    pub curve: bool,
    /// (internal) The process's secret certificate.
    #[arg(long, hide = true)]
    pub curve_key: Option<std::path::PathBuf>,
    /// (internal) The public certificates it admits.
    #[arg(long, hide = true)]
    pub curve_peers: Option<std::path::PathBuf>,
    /// The data plane between the processes.
    #[command(flatten)]
    pub data_plane: DataPlaneArgs,
}

/// `ferry coordinator`: the coordinator as a standalone process.
#[derive(clap::Args, Debug)]
pub struct CoordinatorArgs {
    /// The control plane.
    #[arg(long, value_enum, env = "FERRY_CONTROL", default_value_t = Control::Zmq)]
    pub control: Control,
    /// Where instances report: with ZeroMQ one endpoint per role, in
    /// pipeline order (encoder, denoiser, decoder), comma-separated; with
    /// Unix sockets one `ipc://` endpoint.
    #[arg(long, env = "FERRY_LISTEN", value_delimiter = ',', required = true)]
    pub listen: Vec<String>,
    /// Timeout for a sender's write report, ms.
    #[arg(long, env = "FERRY_PUSH_TIMEOUT_MS", default_value_t = 10_000)]
    pub push_timeout_ms: u64,
    /// Timeout for a receiver's answer to `transfer_alloc`, ms.
    #[arg(long, env = "FERRY_ALLOC_TIMEOUT_MS", default_value_t = 2_000)]
    pub alloc_timeout_ms: u64,
    /// Timeout for a receiver's `transfer_done` after `transfer_ready`, ms.
    #[arg(long, env = "FERRY_DONE_TIMEOUT_MS", default_value_t = 60_000)]
    pub done_timeout_ms: u64,
    /// The work endpoints that may register as encoders, comma-separated
    /// (as sglang's head takes them). With any of the three lists, every
    /// registration they do not name is dropped, and logged; without, any
    /// endpoint may register.
    #[arg(long, env = "FERRY_ENCODER_URLS", value_delimiter = ',')]
    pub encoder_urls: Vec<String>,
    /// The work endpoints that may register as denoisers.
    #[arg(long, env = "FERRY_DENOISER_URLS", value_delimiter = ',')]
    pub denoiser_urls: Vec<String>,
    /// The work endpoints that may register as decoders.
    #[arg(long, env = "FERRY_DECODER_URLS", value_delimiter = ',')]
    pub decoder_urls: Vec<String>,
    /// What it offers as a service: who may connect, metrics, how it
    /// stops.
    #[command(flatten)]
    pub service: ServiceArgs,
}

/// The options `ferry coordinator` and `ferry instance` share as
/// services.
#[derive(clap::Args, Debug, Clone)]
pub struct ServiceArgs {
    /// Accept connections to this process's tcp:// endpoints only from
    /// these IP addresses, comma-separated (ZeroMQ's ZAP refuses the
    /// others before any message of theirs is read, and each refusal is
    /// logged); without, any address may connect.
    #[arg(long, env = "FERRY_ALLOW_FROM", value_delimiter = ',')]
    pub allow_from: Vec<std::net::IpAddr>,
    /// This process's CURVE key pair: a secret certificate
    /// (`NAME.key_secret`, as `ferry keygen` or pyzmq's
    /// `zmq.auth.create_certificates` write it). With `--curve-peers`,
    /// every ZeroMQ endpoint the process binds is a CURVE server that
    /// admits only the peers' keys, and every connection it makes is a
    /// CURVE client: messages are encrypted and authenticated by their
    /// connection. Not under sglang's head, which speaks plain ZeroMQ.
    #[arg(long, env = "FERRY_CURVE_KEY", requires = "curve_peers")]
    pub curve_key: Option<std::path::PathBuf>,
    /// The public keys admitted with `--curve-key`: a directory of `*.key`
    /// certificates, or one. A coordinator's are its instances'; an
    /// instance's is its coordinator's (exactly one key).
    #[arg(long, env = "FERRY_CURVE_PEERS", requires = "curve_key")]
    pub curve_peers: Option<std::path::PathBuf>,
    /// Serve Prometheus metrics over HTTP at this address:port, or at a
    /// port alone on loopback (port 0 picks a free one; the process prints
    /// `{"event":"metrics","url":...}`), with the probes `/healthz` and
    /// `/readyz` beside them. Plain HTTP, outside --allow-from and CURVE:
    /// keep it on loopback or a monitoring network.
    #[arg(long, env = "FERRY_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// How the process stops.
    #[command(flatten)]
    pub lifetime: LifetimeArgs,
}

impl ServiceArgs {
    /// Who may connect, as `--allow-from`, `--curve-key` and
    /// `--curve-peers` say (the certificates read, or why not).
    pub fn guard(&self) -> Result<Guard, String> {
        guard(
            &self.allow_from,
            self.curve_key.as_deref(),
            self.curve_peers.as_deref(),
        )
    }
}

/// A guard of `allow` and, if both are given, the CURVE key pair at `key`
/// admitting the keys at `peers`.
pub(super) fn guard(
    allow: &[std::net::IpAddr],
    key: Option<&std::path::Path>,
    peers: Option<&std::path::Path>,
) -> Result<Guard, String> {
    let curve = match (key, peers) {
        (Some(k), Some(p)) => {
            Some(CurveConfig::load(k, p).map_err(|e| format!("CURVE keys: {e}"))?)
        }
        (None, None) => None,
        _ => return Err("--curve-key and --curve-peers go together".into()),
    };
    Ok(Guard {
        allow: allow.to_vec(),
        curve,
    })
}

/// How `ferry coordinator` and `ferry instance` stop.
#[derive(clap::Args, Debug, Clone)]
pub struct LifetimeArgs {
    /// Stop when stdin closes, as well as on SIGTERM or SIGINT (for a
    /// parent that ends its children by closing their stdin; a service
    /// leaves this off, since service managers start daemons with stdin at
    /// /dev/null).
    #[arg(long, env = "FERRY_EXIT_ON_STDIN_CLOSE")]
    pub exit_on_stdin_close: bool,
    /// On SIGTERM or SIGINT, how long to let what is in flight finish
    /// before failing it, seconds (a second signal cuts it short).
    #[arg(long, env = "FERRY_DRAIN_TIMEOUT", default_value = "5", value_parser = crate::lifetime::parse_drain_timeout)]
    pub drain_timeout: Duration,
}

/// `ferry instance`: an instance as a standalone process, with the
/// pipeline's workload for its role (the encoder sends requests; denoisers
/// check and forward; the decoder checks).
#[derive(clap::Args, Debug)]
pub struct InstanceCliArgs {
    /// Its role.
    #[arg(long, env = "FERRY_ROLE")]
    pub role: String,
    /// Its name in reports.
    #[arg(long, env = "FERRY_NAME", default_value = "instance")]
    pub name: String,
    /// The coordinator's endpoint for this role.
    #[arg(long, env = "FERRY_COORDINATOR")]
    pub coordinator: String,
    /// Its own work endpoint.
    #[arg(long, env = "FERRY_ENDPOINT")]
    pub endpoint: String,
    /// The control plane.
    #[arg(long, value_enum, env = "FERRY_CONTROL", default_value_t = Control::Zmq)]
    pub control: Control,
    /// Pool size, MiB (0: the role's default).
    #[arg(long, env = "FERRY_POOL_MIB", default_value_t = 0)]
    pub pool_mib: usize,
    /// Preallocated receive slots, `<count>:<MiB>`.
    #[arg(long, env = "FERRY_PREALLOC", value_parser = parse_prealloc)]
    pub prealloc: Option<Prealloc>,
    /// Requests to send (encoder).
    #[arg(long, default_value_t = 64)]
    pub requests: u64,
    /// Requests in flight (encoder).
    #[arg(long, default_value_t = 8)]
    pub window: usize,
    /// Pause between requests, ms (encoder).
    #[arg(long, default_value_t = 0)]
    pub pace_ms: u64,
    /// Time spent on each request received, ms (denoiser, decoder).
    #[arg(long, default_value_t = 0)]
    pub hold_ms: u64,
    /// The data plane.
    #[command(flatten)]
    pub data_plane: DataPlaneArgs,
    /// What to send and check: the pipeline's tensors, or one tensor of a
    /// random size per request (receivers check and release).
    #[arg(long, value_enum, default_value_t = WorkloadKind::Pipeline)]
    pub workload: WorkloadKind,
    /// The random workload's largest request, bytes.
    #[arg(long, default_value_t = 256 << 20)]
    pub max_bytes: u64,
    /// The random workload's seed (sender and receivers must agree).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// How long a reserved receive slot waits for `transfer_ready` before
    /// it is freed, ms.
    #[arg(long, env = "FERRY_RESERVED_TIMEOUT_MS", default_value_t = 20_000)]
    pub reserved_timeout_ms: u64,
    /// The coordinator's kind: ferry's, or sglang's `DiffusionServer`
    /// (no registration acks, forwards as `transfer_done`, no rejects;
    /// timeouts follow --head-timeout). `--workload sglang` implies sglang.
    #[arg(long, value_enum, env = "FERRY_HEAD")]
    pub head: Option<HeadKind>,
    /// sglang's head's timeout (its `--disagg-timeout`), seconds: under
    /// that head nothing gives up before it does.
    #[arg(long, env = "FERRY_HEAD_TIMEOUT", default_value_t = 600.0)]
    pub head_timeout: f64,
    /// What it offers as a service: who may connect, metrics, how it
    /// stops.
    #[command(flatten)]
    pub service: ServiceArgs,
}

/// Which coordinator an instance serves under.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HeadKind {
    /// ferry's coordinator.
    Ferry,
    /// sglang 0.5.23's `DiffusionServer`.
    Sglang,
}

impl From<HeadKind> for Head {
    fn from(k: HeadKind) -> Self {
        match k {
            HeadKind::Ferry => Head::Ferry,
            HeadKind::Sglang => Head::Sglang,
        }
    }
}

/// The data-plane options shared by `ferry instance` and `ferry bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct DataPlaneArgs {
    /// The data plane: `shm` (pools in POSIX shared memory, one host),
    /// `local` (cross-memory attach into each node's own pool, one
    /// host), `fabric` (libfabric: EFA, verbs, tcp, shm providers; needs
    /// the `fabric` feature), `verbs` (ibverbs RC queue pairs on an
    /// InfiniBand or RoCE NIC; needs the `verbs` feature) or `auto`
    /// (verbs on the host's first RDMA device, else `local`).
    #[arg(long, env = "FERRY_BACKEND", default_value = "shm")]
    pub backend: String,
    /// The libfabric provider: `auto` (efa, verbs;ofi_rxm, tcp;ofi_rxm,
    /// the first present), or a name such as `tcp;ofi_rxm` or `shm`.
    #[arg(long, env = "FERRY_PROVIDER", default_value = "auto")]
    pub provider: String,
    /// How a write is known to have landed before the receiver reads:
    /// `auto`, `delivery-complete` or `remote-cq-data`.
    #[arg(long, env = "FERRY_DELIVERY", default_value = "auto")]
    pub delivery: String,
    /// An address of this host to bind the libfabric endpoint to (picks
    /// the interface; for tcp on loopback use 127.0.0.1).
    #[arg(long, env = "FERRY_FABRIC_SOURCE")]
    pub fabric_source: Option<String>,
    /// Split libfabric writes into chunks of at most this many KiB (0: the
    /// provider's largest message).
    #[arg(long, default_value_t = 0)]
    pub max_chunk_kib: u64,
    /// A libfabric or verbs write that has not completed after this many
    /// ms fails, and its peer's connection is closed (keep it below the
    /// coordinator's push timeout).
    #[arg(long, env = "FERRY_WRITE_TIMEOUT_MS", default_value_t = 5000)]
    pub write_timeout_ms: u64,
    /// The RDMA device of the verbs data plane (`mlx5_0`, `rxe0`).
    #[arg(long, env = "FERRY_VERBS_DEVICE")]
    pub device: Option<String>,
    /// Its port.
    #[arg(long, env = "FERRY_VERBS_PORT", default_value_t = 1)]
    pub ib_port: u8,
    /// The local GID index (default: RoCE v2 with an IPv4 address, or the
    /// port GID on InfiniBand; see `show_gids`).
    #[arg(long, env = "FERRY_GID_INDEX")]
    pub gid_index: Option<u8>,
    /// Where the verbs side channel listens (an address of this host, or
    /// a ZeroMQ endpoint); default: the chosen GID's IPv4 address.
    #[arg(long, env = "FERRY_VERBS_LISTEN")]
    pub verbs_listen: Option<String>,
    /// Any option of the chosen data plane, `KEY=VALUE` (repeatable; over
    /// the flags above): what a data plane takes that no flag names
    /// (see `tensorferry::plane::DataPlane::parse`).
    #[arg(long = "plane-option", value_name = "KEY=VALUE", value_parser = parse_plane_option)]
    pub plane_options: Vec<(String, String)>,
}

/// `KEY=VALUE`, split.
fn parse_plane_option(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected KEY=VALUE, e.g. threads=2"))?;
    Ok((k.trim().to_owned(), v.trim().to_owned()))
}

impl DataPlaneArgs {
    /// The same options as command-line arguments, for a child process.
    pub fn to_args(&self) -> Vec<String> {
        let mut a = vec![
            "--backend".to_owned(),
            self.backend.clone(),
            "--provider".to_owned(),
            self.provider.clone(),
            "--delivery".to_owned(),
            self.delivery.clone(),
            "--max-chunk-kib".to_owned(),
            self.max_chunk_kib.to_string(),
            "--write-timeout-ms".to_owned(),
            self.write_timeout_ms.to_string(),
        ];
        if let Some(src) = &self.fabric_source {
            a.extend(["--fabric-source".to_owned(), src.clone()]);
        }
        if let Some(d) = &self.device {
            a.extend(["--device".to_owned(), d.clone()]);
        }
        a.extend(["--ib-port".to_owned(), self.ib_port.to_string()]);
        if let Some(i) = self.gid_index {
            a.extend(["--gid-index".to_owned(), i.to_string()]);
        }
        if let Some(l) = &self.verbs_listen {
            a.extend(["--verbs-listen".to_owned(), l.clone()]);
        }
        for (k, v) in &self.plane_options {
            a.extend(["--plane-option".to_owned(), format!("{k}={v}")]);
        }
        a
    }

    /// The data plane these options name: each flag goes to
    /// [`DataPlane::parse`] as the option of that name, if the chosen data
    /// plane takes it (the flags of the others are left out).
    pub fn data_plane(&self) -> Result<DataPlane, String> {
        let mut given: Vec<(&str, String)> = vec![
            ("provider", self.provider.clone()),
            ("delivery", self.delivery.clone()),
            (
                "max_chunk",
                self.max_chunk_kib.saturating_mul(1024).to_string(),
            ),
            ("write_timeout", format!("{}ms", self.write_timeout_ms)),
            ("port", self.ib_port.to_string()),
        ];
        let optional = [
            ("source", self.fabric_source.clone()),
            ("device", self.device.clone()),
            ("gid_index", self.gid_index.map(|i| i.to_string())),
            ("listen", self.verbs_listen.clone()),
        ];
        given.extend(optional.into_iter().filter_map(|(k, v)| Some((k, v?))));
        // `auto`'s flags are those of the plane it picks.
        let takes = DataPlane::options_of(DataPlane::resolve(&self.backend)).unwrap_or(&[]);
        given.retain(|(k, _)| takes.contains(k));
        // Given by name, an option is the data plane's to take or refuse.
        let mut given: Vec<(&str, String)> = given
            .into_iter()
            .filter(|(k, _)| !self.plane_options.iter().any(|(o, _)| o == k))
            .collect();
        given.extend(
            self.plane_options
                .iter()
                .map(|(k, v)| (k.as_str(), v.clone())),
        );
        DataPlane::parse(&self.backend, given).map_err(|e| match e {
            tensorferry::runtime::PlaneError::Missing { key: "device", .. } => {
                "the verbs data plane needs an RDMA device: --device <name> (see `ibv_devices`)"
                    .to_owned()
            }
            e => e.to_string(),
        })
    }
}

/// What an instance sends and checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum WorkloadKind {
    /// Prompt embeddings and latents, forwarded by denoisers.
    Pipeline,
    /// One tensor of a random size (1 byte to --max-bytes) per request.
    Random,
    /// sglang's roles under sglang's head: the encoder stages a payload
    /// derived from each request id the head dispatches, denoisers check
    /// and forward, the decoder checks and returns an `output` tensor.
    Sglang,
}

pub(super) fn parse_prealloc(s: &str) -> Result<Prealloc, String> {
    let (n, m) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?}: expected <count>:<MiB>, e.g. 4:16"))?;
    let mib: u64 = m
        .parse()
        .map_err(|_| format!("{m:?} is not a size in MiB"))?;
    Ok(Prealloc {
        count: n.parse().map_err(|_| format!("{n:?} is not a count"))?,
        size: mib
            .checked_mul(1 << 20)
            .ok_or_else(|| format!("{m:?} MiB is more bytes than a u64 holds"))?,
    })
}

pub(super) fn parse_kill(s: &str) -> Result<(usize, u64), String> {
    let (d, n) = s
        .split_once('@')
        .ok_or_else(|| format!("{s:?}: expected <denoiser>@<delivered>, e.g. 1@16"))?;
    Ok((
        d.parse()
            .map_err(|_| format!("{d:?} is not a denoiser number"))?,
        n.parse().map_err(|_| format!("{n:?} is not a count"))?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plane(args: &[&str]) -> Result<DataPlane, String> {
        let argv = ["pipeline"].iter().chain(args);
        PipelineArgs::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .data_plane
            .data_plane()
    }

    #[test]
    fn a_data_planes_options_pass_through_by_name() {
        match plane(&[
            "--plane-option",
            "threads=3",
            "--plane-option",
            "split_at=65536",
        ]) {
            Ok(DataPlane::Shm(c)) => assert_eq!((c.threads, c.split_at), (3, 65536)),
            other => panic!("{other:?}"),
        }
        // A child process is given the same options.
        let argv = ["pipeline", "--plane-option", "threads=3"];
        let args = PipelineArgs::try_parse_from(argv).unwrap().data_plane;
        let child = args.to_args();
        let again = PipelineArgs::try_parse_from(
            std::iter::once("pipeline").chain(child.iter().map(String::as_str)),
        )
        .unwrap()
        .data_plane;
        assert_eq!(again.plane_options, args.plane_options);
        let e = plane(&["--plane-option", "colour=red"]).unwrap_err();
        assert!(e.contains("colour"), "{e}");
        let e = plane(&["--plane-option", "threads"]).unwrap_err();
        assert!(e.contains("KEY=VALUE"), "{e}");
    }
}
