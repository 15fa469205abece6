//! A peer's (or a stranger's) ZeroMQ socket, made as a test needs it.

use tensorferry_zmq::{zmq, CurveConfig, CurveKeyPair, CurvePublicKey, Guard};

/// A socket of `kind` in `ctx` (lingering `linger_ms` at close) connected
/// to `endpoint`: a CURVE client with the key pair of `key` that knows the
/// server's public key (the second of `key`) if given, plain ZeroMQ if not.
pub fn connect(
    ctx: &zmq::Context,
    kind: zmq::SocketType,
    endpoint: &str,
    key: Option<(CurveKeyPair, CurvePublicKey)>,
    linger_ms: i32,
) -> zmq::Socket {
    let s = ctx.socket(kind).unwrap();
    s.set_linger(linger_ms).unwrap();
    if let Some((mine, server)) = key {
        let g = Guard {
            allow: Vec::new(),
            curve: Some(CurveConfig {
                key: mine,
                peers: Vec::new(),
            }),
        };
        g.client(&s, endpoint, Some(&server)).unwrap();
    }
    s.connect(endpoint).unwrap();
    s
}

/// A guard admitting 127.0.0.1 and, under CURVE with `key`, the keys of
/// `peers`.
pub fn guard(key: &CurveKeyPair, peers: &[&CurveKeyPair]) -> Guard {
    Guard {
        allow: vec!["127.0.0.1".parse().unwrap()],
        curve: Some(CurveConfig {
            key: key.clone(),
            peers: peers.iter().map(|p| *p.public()).collect(),
        }),
    }
}
