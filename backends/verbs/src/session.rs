//! The verbs session id:
//! `verbs:<incarnation>[.<generation>][+<side channel key>]@<side channel endpoint>`.
//!
//! The endpoint is the ZeroMQ address where the transport answers
//! connection exchanges; the incarnation (16 hex digits, random per
//! transport) lets a peer tell a restarted process on the same endpoint
//! from the one it connected to, so a stale queue pair is never reused.
//! The generation (hex, left out while 0) counts the changes of the
//! registered regions: a writer connects once per session id, so a new
//! generation makes it connect again and learn the regions anew.
//! The key (40 characters of Z85, present when the side channel is a CURVE
//! server) is its public key, which a writer must know to connect; the id
//! reaches writers through the coordinator, over CURVE-authenticated
//! control connections when keys are set. Everything else a writer needs
//! (QP number, GID, the regions' rkeys and bounds) travels in the exchange,
//! encrypted under CURVE, not in the id.

use std::fmt;

use tensorferry_zmq::{CurvePublicKey, KEY_TEXT_LEN};

use crate::error::VerbsError;

/// The prefix of every verbs session id.
pub const PREFIX: &str = "verbs:";

/// A parsed verbs session id.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Session {
    /// Random per transport; changes when the process restarts.
    pub incarnation: u64,
    /// How often the registered regions changed.
    pub generation: u32,
    /// The side channel's ZeroMQ endpoint (`tcp://host:port` or `ipc://path`).
    pub endpoint: String,
    /// The side channel's CURVE public key, if it is a CURVE server.
    pub key: Option<CurvePublicKey>,
}

impl Session {
    /// Parses a session id, refusing anything but the exact form.
    pub fn parse(id: &str) -> Result<Self, VerbsError> {
        let bad = |why: &str| VerbsError::BadSession {
            session: id.to_owned(),
            why: why.to_owned(),
        };
        let rest = id
            .strip_prefix(PREFIX)
            .ok_or_else(|| bad("it does not start with `verbs:`"))?;
        // The incarnation and generation are hex digits and a dot; what
        // ends them says whether a key follows (`+`, then exactly 40
        // characters of Z85, which may hold `@` and `.`) or the endpoint.
        let head = rest
            .find(|c: char| !(c.is_ascii_hexdigit() || c == '.'))
            .unwrap_or(rest.len());
        let (inc, tail) = rest.split_at(head);
        let (key, endpoint) = if let Some(k) = tail.strip_prefix('+') {
            let text = k
                .get(..KEY_TEXT_LEN)
                .ok_or_else(|| bad("the side channel's key is not 40 characters of Z85"))?;
            let key = CurvePublicKey::from_z85(text)
                .map_err(|e| bad(&format!("the side channel's key: {e}")))?;
            (Some(key), &k[KEY_TEXT_LEN..])
        } else {
            (None, tail)
        };
        let endpoint = endpoint
            .strip_prefix('@')
            .ok_or_else(|| bad("no `@` between incarnation and endpoint"))?;
        Self::parse_rest(id, inc, endpoint, key)
    }

    /// The incarnation (and generation) and endpoint of `id`, split.
    fn parse_rest(
        id: &str,
        inc: &str,
        endpoint: &str,
        key: Option<CurvePublicKey>,
    ) -> Result<Self, VerbsError> {
        let bad = |why: &str| VerbsError::BadSession {
            session: id.to_owned(),
            why: why.to_owned(),
        };
        let (inc, generation) = match inc.split_once('.') {
            None => (inc, 0),
            Some((inc, g)) => {
                if g.is_empty() || g.len() > 8 || !g.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(bad("the generation is not 1 to 8 hex digits"));
                }
                let g = u32::from_str_radix(g, 16).map_err(|e| bad(&e.to_string()))?;
                (inc, g)
            }
        };
        if inc.len() != 16 || !inc.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad("the incarnation is not 16 hex digits"));
        }
        let incarnation = u64::from_str_radix(inc, 16).map_err(|e| bad(&e.to_string()))?;
        let addr = endpoint
            .strip_prefix("tcp://")
            .or_else(|| endpoint.strip_prefix("ipc://"))
            .ok_or_else(|| bad("the endpoint is neither tcp:// nor ipc://"))?;
        if addr.is_empty() || addr.bytes().any(|b| b.is_ascii_whitespace() || b == b'*') {
            return Err(bad("the endpoint has no usable address"));
        }
        if endpoint.starts_with("tcp://") {
            let port = addr
                .rsplit_once(':')
                .map(|(_, p)| p)
                .ok_or_else(|| bad("the tcp endpoint has no port"))?;
            match port.parse::<u16>() {
                Ok(p) if p != 0 => {}
                _ => return Err(bad("the tcp endpoint's port is not 1-65535")),
            }
        }
        Ok(Self {
            incarnation,
            generation,
            endpoint: endpoint.to_owned(),
            key,
        })
    }
}

impl fmt::Display for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PREFIX}{:016x}", self.incarnation)?;
        if self.generation > 0 {
            write!(f, ".{:x}", self.generation)?;
        }
        if let Some(k) = &self.key {
            write!(f, "+{k}")?;
        }
        write!(f, "@{}", self.endpoint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_the_exact_form() {
        let s = Session::parse("verbs:00000000deadbeef@tcp://10.0.0.2:5555").unwrap();
        assert_eq!(s.incarnation, 0xdead_beef);
        assert_eq!(s.endpoint, "tcp://10.0.0.2:5555");
        assert_eq!(s.to_string(), "verbs:00000000deadbeef@tcp://10.0.0.2:5555");
        let s = Session::parse("verbs:ffffffffffffffff@ipc:///tmp/ferry-verbs-1").unwrap();
        assert_eq!((s.incarnation, s.generation), (u64::MAX, 0));
        let s = Session::parse("verbs:00000000deadbeef.1f@tcp://10.0.0.2:5555").unwrap();
        assert_eq!((s.incarnation, s.generation), (0xdead_beef, 0x1f));
        assert_eq!(
            s.to_string(),
            "verbs:00000000deadbeef.1f@tcp://10.0.0.2:5555"
        );
        // A key in Z85 may hold `@`, `.` and `+`; it is taken by length.
        let key = "5js?Zl-W*S=wDAc1pNLXP3L5b4Ro2B7GK#bla7@+";
        let id = format!("verbs:00000000deadbeef.2+{key}@ipc:///tmp/a+b@c");
        let s = Session::parse(&id).unwrap();
        assert_eq!(s.key.map(|k| k.to_z85()).as_deref(), Some(key));
        assert_eq!((s.generation, s.endpoint.as_str()), (2, "ipc:///tmp/a+b@c"));
        assert_eq!(s.to_string(), id);
        let s = Session::parse("verbs:00000000deadbeef@ipc:///tmp/a+b").unwrap();
        assert_eq!((s.key, s.endpoint.as_str()), (None, "ipc:///tmp/a+b"));
    }

    #[test]
    fn refuses_everything_else() {
        for bad in [
            "shm:/x@0+10",
            "verbs:",
            "verbs:00000000deadbeef",
            "verbs:deadbeef@tcp://h:1",
            "verbs:00000000deadbeeg@tcp://h:1",
            "verbs:00000000deadbeef@udp://h:1",
            "verbs:00000000deadbeef@tcp://",
            "verbs:00000000deadbeef@tcp://h",
            "verbs:00000000deadbeef@tcp://h:0",
            "verbs:00000000deadbeef@tcp://h:70000",
            "verbs:00000000deadbeef@tcp://*:5",
            "verbs:00000000deadbeef@tcp://h :5",
            "verbs:00000000deadbeef.@tcp://h:5",
            "verbs:00000000deadbeef.g@tcp://h:5",
            "verbs:00000000deadbeef.100000000@tcp://h:5",
            "verbs:00000000deadbeef+@tcp://h:5",
            "verbs:00000000deadbeef+5js?Zl-W*S=wDAc1pNLXP3L5b4Ro2B7GK#bla7?@tcp://h:5",
            "verbs:00000000deadbeef+5js?Zl-W*S=wDAc1pNLXP3L5b4Ro2B7GK#bla7?E tcp://h:5",
            "verbs:00000000deadbeef+5js?Zl-W*S=wDAc1pNLXP3L5b4Ro2B7GK#bla7?~@tcp://h:5",
        ] {
            let e = Session::parse(bad).unwrap_err();
            assert!(matches!(e, VerbsError::BadSession { .. }), "{bad}: {e}");
        }
    }

    proptest! {
        #[test]
        fn round_trips(inc in any::<u64>(), generation in any::<u32>(), a in 1u8..255, port in 1u16.., key in proptest::option::of(any::<[u8; 32]>())) {
            let key = key.map(CurvePublicKey);
            let s = Session { incarnation: inc, generation, endpoint: format!("tcp://10.0.{a}.1:{port}"), key };
            prop_assert_eq!(Session::parse(&s.to_string()).unwrap(), s);
        }

        #[test]
        fn never_panics(id in "\\PC{0,80}") {
            let _ = Session::parse(&id);
        }
    }
}
