//! The ibverbs data plane ([`tensorferry_verbs::VerbsTransport`]): a pool in
//! anonymous host memory, registered with the NIC, written into by peers
//! with RDMA WRITE over RC queue pairs (InfiniBand, RoCE). (The plane also
//! reads, for the transfer engine; a node never does.)

use tensorferry_verbs::{GidChoice, VerbsConfig, VerbsTransport};

use super::options::{Options, PlaneError};
use crate::runtime::error::NodeError;

/// Its name.
pub(super) const NAME: &str = "verbs";

/// The options it takes.
pub(super) const OPTIONS: &[&str] = &[
    "device",
    "port",
    "gid_index",
    "listen",
    "max_chunk",
    "write_timeout",
    "writers",
];

/// Reads `device` (needed), `port`, `gid_index` (default: chosen by the
/// link), `listen` (the side channel's address), `max_chunk` (bytes; 0:
/// the port's largest message), `write_timeout` and `writers` (the CURVE
/// certificates, a directory of `*.key` files or one, of the instances
/// that may write into this one: with the node's CURVE key, its side
/// channel admits those alone).
pub(super) fn parse(mut o: Options) -> Result<VerbsConfig, PlaneError> {
    let device = o.text("device").ok_or(PlaneError::Missing {
        plane: NAME,
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

/// The node's guard on the side channel: its allow-list, and its CURVE key
/// (the keys admitted there are the plane's own `writers`).
pub(super) fn guard(c: &mut VerbsConfig, guard: &tensorferry_zmq::Guard) {
    c.allow_from.clone_from(&guard.allow);
    c.curve_key = guard.curve.as_ref().map(|k| k.key.clone());
}

/// A transport with a new pool of `pool_len` bytes on the device port
/// `config` names.
pub(super) fn open(config: &VerbsConfig, pool_len: usize) -> Result<VerbsTransport, NodeError> {
    VerbsTransport::with_pool(config, pool_len)
        .map_err(|e| NodeError::transport("open verbs transport", e))
}
