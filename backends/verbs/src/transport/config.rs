//! What a verbs transport opens and how it behaves ([`VerbsConfig`]):
//! the device port and GID, where its side channel listens and whom it
//! admits, the work requests' size and window, the timeouts, and the
//! bounds on the queue pairs it keeps for writers.

use std::time::Duration;

use tensorferry_zmq::{CurveConfig, CurveKeyPair, CurvePublicKey, Guard};

use crate::error::VerbsError;
use crate::gid::GidChoice;

/// What a verbs transport opens and how it behaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerbsConfig {
    /// The RDMA device (`mlx5_0`, `rxe0`).
    pub device: String,
    /// Its port (from 1).
    pub port: u8,
    /// The local GID index.
    pub gid: GidChoice,
    /// Where the side channel listens: a host address of this machine
    /// (`10.0.0.2`, port picked by the OS) or a full ZeroMQ endpoint
    /// (`tcp://10.0.0.2:7000`). Default: the IPv4 address of the chosen
    /// GID (RoCE), which peers reach over the same network.
    pub listen: Option<String>,
    /// Largest work request (default and ceiling: the port's maximum
    /// message).
    pub max_chunk: Option<u32>,
    /// Outstanding work requests per queue pair (at most one less than
    /// the device's `max_qp_wr`: the send queue keeps a slot for the
    /// marker that ends it).
    pub send_depth: u32,
    /// A write (or read) not completed after this fails (keep it below
    /// the coordinator's push timeout).
    pub write_timeout: Duration,
    /// A connection exchange not answered after this fails its transfers.
    pub connect_timeout: Duration,
    /// Queue pairs a target keeps for writers, of every requester
    /// together (one per writer session and requester; a requester is
    /// what the side-channel connection proves: the writer's CURVE key, or
    /// without CURVE its IP address). Beyond this the oldest of the
    /// requester holding the most is dropped, so a requester holding less
    /// than its fair share never loses one to another's requests. Also the
    /// connections this transport keeps as a writer (the idle one longest
    /// unused is closed beyond it).
    pub max_writers: usize,
    /// Queue pairs a target keeps for one requester (one CURVE key, or
    /// without CURVE one IP address, which every writer on that host
    /// shares; over `ipc://` one connection): beyond this that
    /// requester's own oldest is dropped. Large enough for every writer
    /// transport behind one key or host that writes to this one (a
    /// writer's queue pair dropped while in use fails its next write,
    /// which then reconnects, dropping the next oldest).
    pub max_per_writer: usize,
    /// Addresses that may connect to the side channel over `tcp://` (the
    /// node's `--allow-from`); empty: any.
    pub allow_from: Vec<std::net::IpAddr>,
    /// The node's CURVE key pair: with it the side channel is a CURVE
    /// server that admits only `writers`, its public key travels in the
    /// session id, and this transport connects to CURVE side channels as a
    /// client. Without it, the side channel is plain.
    pub curve_key: Option<CurveKeyPair>,
    /// The public keys of the transports that may connect to write into
    /// this one, or read from it: a connected peer may do both (with
    /// `curve_key`).
    pub writers: Vec<CurvePublicKey>,
}

impl VerbsConfig {
    /// Defaults for `device`: port 1, automatic GID, 128 outstanding work
    /// requests, 5 s write timeout, 2 s connect timeout, 4096 writers, 64
    /// per requester.
    pub fn new(device: impl Into<String>) -> Self {
        Self {
            device: device.into(),
            port: 1,
            gid: GidChoice::Auto,
            listen: None,
            max_chunk: None,
            send_depth: 128,
            write_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
            max_writers: 4096,
            max_per_writer: 64,
            allow_from: Vec::new(),
            curve_key: None,
            writers: Vec::new(),
        }
    }

    /// Takes a transfer engine's guard for the side channel: its
    /// allow-list, and with CURVE its key pair, admitting the same peers
    /// as its other endpoints (every engine that may write into this one
    /// or read from it). A node's writers are a plane option instead.
    pub fn take_engine_guard(&mut self, guard: &Guard) {
        self.allow_from.clone_from(&guard.allow);
        if let Some(c) = &guard.curve {
            self.curve_key = Some(c.key.clone());
            self.writers.clone_from(&c.peers);
        }
    }

    /// What the side channel enforces, as [`Guard`] says it.
    pub(super) fn guard(&self) -> Result<Guard, VerbsError> {
        if self.curve_key.is_none() && !self.writers.is_empty() {
            return Err(VerbsError::Port {
                device: self.device.clone(),
                port: self.port,
                why: "writers' CURVE keys are given, but no key of this node's (--curve-key) for its side channel to serve with".into(),
            });
        }
        Ok(Guard {
            allow: self.allow_from.clone(),
            curve: self.curve_key.clone().map(|key| CurveConfig {
                key,
                peers: self.writers.clone(),
            }),
        })
    }
}
