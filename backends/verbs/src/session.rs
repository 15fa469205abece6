//! The verbs session id:
//! `verbs:<incarnation>[.<generation>]@<side channel endpoint>`.
//!
//! The endpoint is the ZeroMQ address where the transport answers
//! connection exchanges; the incarnation (16 hex digits, random per
//! transport) lets a peer tell a restarted process on the same endpoint
//! from the one it connected to, so a stale queue pair is never reused.
//! The generation (hex, left out while 0) counts the changes of the
//! registered regions: a writer connects once per session id, so a new
//! generation makes it connect again and learn the regions anew.
//! Everything else a writer needs (QP number, GID, the regions' rkeys and
//! bounds) travels in the exchange, not in the id.

use std::fmt;

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
        let (inc, endpoint) = rest
            .split_once('@')
            .ok_or_else(|| bad("no `@` between incarnation and endpoint"))?;
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
        })
    }
}

impl fmt::Display for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PREFIX}{:016x}", self.incarnation)?;
        if self.generation > 0 {
            write!(f, ".{:x}", self.generation)?;
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
        ] {
            let e = Session::parse(bad).unwrap_err();
            assert!(matches!(e, VerbsError::BadSession { .. }), "{bad}: {e}");
        }
    }

    proptest! {
        #[test]
        fn round_trips(inc in any::<u64>(), generation in any::<u32>(), a in 1u8..255, port in 1u16..) {
            let s = Session { incarnation: inc, generation, endpoint: format!("tcp://10.0.{a}.1:{port}") };
            prop_assert_eq!(Session::parse(&s.to_string()).unwrap(), s);
        }

        #[test]
        fn never_panics(id in "\\PC{0,80}") {
            let _ = Session::parse(&id);
        }
    }
}
