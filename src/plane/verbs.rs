//! The ibverbs data plane ([`tensorferry_verbs::VerbsTransport`]): a pool in
//! anonymous host memory, registered with the NIC, written into by peers
//! with RDMA WRITE over RC queue pairs (InfiniBand, RoCE). (The plane also
//! reads, for the transfer engine; a node never does.)

use tensorferry_verbs::{GidChoice, VerbsConfig, VerbsError, VerbsTransport};
use tensorferry_zmq::Guard;

use super::options::{Options, PlaneError};
use super::Spec;
use crate::engine::EngineError;
use crate::runtime::NodeError;

/// The ibverbs plane's spec.
pub(super) struct Verbs;

impl Spec for Verbs {
    const NAME: &'static str = "verbs";
    const OPTIONS: &'static [&'static str] = &[
        "device",
        "port",
        "gid_index",
        "listen",
        "max_chunk",
        "write_timeout",
        "writers",
    ];
    type Config = VerbsConfig;
    type Node = VerbsTransport;
    type NodeError = VerbsError;
    type Engine = VerbsTransport;

    /// Reads `device` (needed), `port`, `gid_index` (default: chosen by the
    /// link), `listen` (the side channel's address), `max_chunk` (bytes; 0:
    /// the port's largest message), `write_timeout` and `writers` (the CURVE
    /// certificates, a directory of `*.key` files or one, of the instances
    /// that may write into this one: with the node's CURVE key, its side
    /// channel admits those alone).
    fn parse(mut o: Options) -> Result<VerbsConfig, PlaneError> {
        let device = o.text("device").ok_or(PlaneError::Missing {
            plane: Verbs::NAME,
            key: "device",
            what: "the RDMA device, such as mlx5_0 or rxe0; see `ibv_devices`",
        })?;
        let mut c = VerbsConfig::new(device);
        if let Some(p) = o.parsed::<u8>("port")? {
            c.port = p;
        }
        if let Some(g) = o.parsed::<u8>("gid_index")? {
            c.gid = GidChoice::Index(g);
        }
        c.listen = o.text("listen");
        if let Some(m) = o.parsed::<u64>("max_chunk")? {
            c.max_chunk = (m > 0).then(|| u32::try_from(m).unwrap_or(u32::MAX));
        }
        if let Some(t) = o.duration("write_timeout")? {
            c.write_timeout = t;
        }
        if let Some(path) = o.text("writers") {
            c.writers = tensorferry_zmq::read_public_keys(std::path::Path::new(&path))
                .map_err(|e| o.bad("writers", &path, e.to_string()))?;
        }
        o.finish()?;
        Ok(c)
    }

    /// A transport with a new pool of `pool_len` bytes on the device port
    /// `config` names.
    fn open_node(config: &VerbsConfig, pool_len: usize) -> Result<VerbsTransport, NodeError> {
        VerbsTransport::with_pool(config, pool_len)
            .map_err(|e| NodeError::transport("open verbs transport", e.kind(), e))
    }

    /// The side channel takes the engine's guard.
    fn open_engine(mut config: VerbsConfig, guard: &Guard) -> Result<VerbsTransport, EngineError> {
        if !config.writers.is_empty() {
            return Err(EngineError::Unsuitable {
                plane: Self::NAME.into(),
                why: "its option writers is a node's: an engine admits the peers its guard names (curve_peers)".into(),
            });
        }
        config.take_engine_guard(guard);
        VerbsTransport::open(&config)
            .map_err(|e| EngineError::transport("open the verbs transport", e.kind(), &e))
    }

    /// The node's guard on the side channel: its allow-list, and its
    /// CURVE key (the keys admitted there are the plane's own `writers`).
    fn guard(c: &mut VerbsConfig, guard: &Guard) {
        c.allow_from.clone_from(&guard.allow);
        c.curve_key = guard.curve.as_ref().map(|k| k.key.clone());
    }

    fn reaches_other_hosts(_: &VerbsConfig) -> bool {
        true
    }
}
