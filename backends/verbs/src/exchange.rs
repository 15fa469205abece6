//! The connection exchange on the side channel: a writer (or reader) sends
//! a [`Request`] with its queue pair's coordinates; the target creates its
//! queue pair, walks it to RTS and answers with an [`Reply`] holding its
//! own coordinates and each registered region's address, length and rkey.
//! Each end's coordinates say how many RDMA READs its queue pair answers
//! at once, which bounds the other's reads in flight.
//!
//! Messages are JSON (one per ZeroMQ frame). Everything that arrives is
//! validated field by field before any of it reaches a verb.

use serde::{Deserialize, Serialize};

use crate::attrs::mtu_enum;
use crate::error::VerbsError;

/// The exchange's version; a message of another version is refused, by
/// name on both sides (a peer of another version answers with a refusal
/// of its own version, which names both).
/// (2: a reply lists every registered region, not one pool; 3: each end's
/// coordinates carry `rd_atom`, for RDMA READ.)
pub const VERSION: u32 = 3;

/// Largest exchange message accepted (a reply listing the most regions
/// fits). The side channel's sockets refuse larger frames before reading
/// them (libzmq's MAXMSGSIZE, with room for CURVE's box), dropping the
/// connection that sent one; decoding checks it again.
pub const MAX_MESSAGE: usize = 16384;

/// Most regions a reply lists (and a transport registers).
pub const MAX_REGIONS: usize = 64;

/// One end's queue-pair coordinates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpInfo {
    /// QP number (24 bits, not 0).
    pub qpn: u32,
    /// The port's LID (0 on Ethernet).
    pub lid: u16,
    /// The GID (network order).
    pub gid: [u8; 16],
    /// The first packet sequence number this end sends (24 bits).
    pub psn: u32,
    /// The port's active MTU in bytes.
    pub mtu: u32,
    /// The RDMA READs this end's queue pair answers at once (its
    /// `max_dest_rd_atomic`, responder resources): the other end keeps no
    /// more outstanding (`attrs::initiator_depth`). 0: it answers none.
    pub rd_atom: u8,
}

/// One of the target's registered regions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionInfo {
    /// Its first byte's address in the target.
    pub addr: u64,
    /// Its length.
    pub len: u64,
    /// The rkey writes and reads must carry.
    pub rkey: u32,
}

/// A writer's request to connect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The writer's own session id.
    pub from: String,
    /// The target incarnation the writer expects (from its session id).
    pub to: u64,
    /// The writer's queue pair.
    pub qp: QpInfo,
}

/// The target's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// Connected: the target's QP is in RTS.
    Accept {
        /// The target's queue pair.
        qp: QpInfo,
        /// The target's registered regions (at least one).
        regions: Vec<RegionInfo>,
    },
    /// Refused, with the reason.
    Refuse {
        /// Why.
        why: String,
    },
}

/// Any message's version, read before the rest so that a message of
/// another version is refused by it, whatever else it holds.
#[derive(Deserialize)]
struct WireVersion {
    v: u32,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireQp {
    qpn: u32,
    lid: u16,
    gid: String,
    psn: u32,
    mtu: u32,
    rd_atom: u8,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireRequest {
    v: u32,
    from: String,
    to: String,
    qp: WireQp,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireRegion {
    addr: u64,
    len: u64,
    rkey: u32,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireReply {
    v: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    qp: Option<WireQp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    regions: Option<Vec<WireRegion>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    refuse: Option<String>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl From<&QpInfo> for WireQp {
    fn from(q: &QpInfo) -> Self {
        Self {
            qpn: q.qpn,
            lid: q.lid,
            gid: hex(&q.gid),
            psn: q.psn,
            mtu: q.mtu,
            rd_atom: q.rd_atom,
        }
    }
}

struct Check<'a> {
    peer: &'a str,
}

impl Check<'_> {
    fn bad(&self, field: &'static str, why: impl Into<String>) -> VerbsError {
        VerbsError::BadExchange {
            peer: self.peer.to_owned(),
            field,
            why: why.into(),
        }
    }

    fn qp(&self, w: &WireQp) -> Result<QpInfo, VerbsError> {
        if w.qpn == 0 || w.qpn > 0xff_ffff {
            return Err(self.bad("qp.qpn", format!("{} is not a 24-bit QP number", w.qpn)));
        }
        if w.psn > 0xff_ffff {
            return Err(self.bad("qp.psn", format!("{} is not a 24-bit PSN", w.psn)));
        }
        if mtu_enum(w.mtu).is_none() {
            return Err(self.bad(
                "qp.mtu",
                format!("{} is not 256, 512, 1024, 2048 or 4096", w.mtu),
            ));
        }
        let raw = w.gid.as_bytes();
        if raw.len() != 32 || !raw.iter().all(u8::is_ascii_hexdigit) {
            return Err(self.bad("qp.gid", "not 32 hex digits"));
        }
        let mut gid = [0u8; 16];
        for (i, pair) in raw.chunks_exact(2).enumerate() {
            // Both bytes are ASCII hex digits (checked above).
            let s = std::str::from_utf8(pair).map_err(|_| self.bad("qp.gid", "not ASCII"))?;
            gid[i] = u8::from_str_radix(s, 16).map_err(|_| self.bad("qp.gid", "not hex"))?;
        }
        if w.lid == 0 && gid == [0; 16] {
            return Err(self.bad("qp.gid", "neither a LID nor a GID to reach it by"));
        }
        Ok(QpInfo {
            qpn: w.qpn,
            lid: w.lid,
            gid,
            psn: w.psn,
            mtu: w.mtu,
            // Any value is valid: it only caps the other end's reads.
            rd_atom: w.rd_atom,
        })
    }

    fn version(&self, v: u32) -> Result<(), VerbsError> {
        if v == VERSION {
            Ok(())
        } else {
            Err(self.bad("v", format!("version {v}, this ferry speaks {VERSION}")))
        }
    }

    /// The message, once its version is this ferry's.
    fn json<'de, T: Deserialize<'de>>(&self, bytes: &'de [u8]) -> Result<T, VerbsError> {
        if bytes.len() > MAX_MESSAGE {
            return Err(self.bad(
                "message",
                format!("{} bytes, at most {MAX_MESSAGE}", bytes.len()),
            ));
        }
        let parse = |e: serde_json::Error| self.bad("message", e.to_string());
        let version: WireVersion = serde_json::from_slice(bytes).map_err(parse)?;
        self.version(version.v)?;
        serde_json::from_slice(bytes).map_err(parse)
    }
}

impl Request {
    /// The message bytes.
    pub fn encode(&self) -> Vec<u8> {
        let w = WireRequest {
            v: VERSION,
            from: self.from.clone(),
            to: format!("{:016x}", self.to),
            qp: (&self.qp).into(),
        };
        serde_json::to_vec(&w).unwrap_or_default()
    }

    /// Parses and validates a request that arrived from `peer` (the side
    /// channel's name for the sender, for errors).
    pub fn decode(bytes: &[u8], peer: &str) -> Result<Self, VerbsError> {
        let c = Check { peer };
        let w: WireRequest = c.json(bytes)?;
        crate::session::Session::parse(&w.from).map_err(|e| c.bad("from", e.to_string()))?;
        if w.to.len() != 16 {
            return Err(c.bad("to", "not 16 hex digits"));
        }
        let to = u64::from_str_radix(&w.to, 16).map_err(|_| c.bad("to", "not 16 hex digits"))?;
        Ok(Self {
            qp: c.qp(&w.qp)?,
            from: w.from,
            to,
        })
    }
}

impl Reply {
    /// The message bytes.
    pub fn encode(&self) -> Vec<u8> {
        let w = match self {
            Self::Accept { qp, regions } => WireReply {
                v: VERSION,
                qp: Some(qp.into()),
                regions: Some(
                    regions
                        .iter()
                        .map(|r| WireRegion {
                            addr: r.addr,
                            len: r.len,
                            rkey: r.rkey,
                        })
                        .collect(),
                ),
                refuse: None,
            },
            Self::Refuse { why } => WireReply {
                v: VERSION,
                qp: None,
                regions: None,
                refuse: Some(why.clone()),
            },
        };
        serde_json::to_vec(&w).unwrap_or_default()
    }

    /// Parses and validates a reply from `peer`.
    pub fn decode(bytes: &[u8], peer: &str) -> Result<Self, VerbsError> {
        let c = Check { peer };
        let w: WireReply = c.json(bytes)?;
        match (w.qp, w.regions, w.refuse) {
            (None, None, Some(why)) => Ok(Self::Refuse { why }),
            (Some(qp), Some(regions), None) => {
                let qp = c.qp(&qp)?;
                if regions.is_empty() || regions.len() > MAX_REGIONS {
                    return Err(c.bad(
                        "regions",
                        format!("{} regions, expected 1 to {MAX_REGIONS}", regions.len()),
                    ));
                }
                let regions = regions
                    .iter()
                    .map(|r| {
                        if r.len == 0 {
                            return Err(c.bad("regions.len", "zero"));
                        }
                        if r.addr.checked_add(r.len).is_none() {
                            return Err(c.bad("regions.len", "a region wraps the address space"));
                        }
                        Ok(RegionInfo {
                            addr: r.addr,
                            len: r.len,
                            rkey: r.rkey,
                        })
                    })
                    .collect::<Result<_, _>>()?;
                Ok(Self::Accept { qp, regions })
            }
            _ => Err(c.bad(
                "message",
                "a reply holds either `qp` and `regions`, or `refuse`",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const FROM: &str = "verbs:0000000000000001@tcp://10.0.0.1:4000";

    fn qp() -> QpInfo {
        QpInfo {
            qpn: 0x11,
            lid: 0,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1],
            psn: 0x77,
            mtu: 4096,
            rd_atom: 16,
        }
    }

    #[test]
    fn messages_round_trip() {
        let r = Request {
            from: FROM.into(),
            to: 0xfeed,
            qp: qp(),
        };
        let bytes = r.encode();
        assert_eq!(
            std::str::from_utf8(&bytes).unwrap(),
            r#"{"v":3,"from":"verbs:0000000000000001@tcp://10.0.0.1:4000","to":"000000000000feed","qp":{"qpn":17,"lid":0,"gid":"00000000000000000000ffff0a000001","psn":119,"mtu":4096,"rd_atom":16}}"#
        );
        assert_eq!(Request::decode(&bytes, "p").unwrap(), r);
        let a = Reply::Accept {
            qp: qp(),
            regions: vec![
                RegionInfo {
                    addr: 0x7f00_0000_0000,
                    len: 1 << 30,
                    rkey: 0x1234,
                },
                RegionInfo {
                    addr: 0x5500_0000_1000,
                    len: 4096,
                    rkey: 0x1235,
                },
            ],
        };
        assert_eq!(Reply::decode(&a.encode(), "p").unwrap(), a);
        // The most regions fit in a message.
        let most = Reply::Accept {
            qp: qp(),
            regions: vec![
                RegionInfo {
                    addr: u64::MAX / 2,
                    len: u64::MAX / 4,
                    rkey: u32::MAX,
                };
                MAX_REGIONS
            ],
        };
        let bytes = most.encode();
        assert!(bytes.len() <= MAX_MESSAGE, "{} bytes", bytes.len());
        assert_eq!(Reply::decode(&bytes, "p").unwrap(), most);
        let f = Reply::Refuse {
            why: "no pool registered".into(),
        };
        assert_eq!(Reply::decode(&f.encode(), "p").unwrap(), f);
    }

    fn field_of(bytes: &[u8]) -> &'static str {
        match Request::decode(bytes, "p") {
            Err(VerbsError::BadExchange { field, .. }) => field,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn requests_are_validated_field_by_field() {
        let with = |qp: &str| {
            format!(r#"{{"v":3,"from":"{FROM}","to":"000000000000feed","qp":{qp}}}"#).into_bytes()
        };
        let gid = "00000000000000000000ffff0a000001";
        let zero = "00000000000000000000000000000000";
        let qp = |qpn: u64, lid: u32, gid: &str, psn: u64, mtu: u32| {
            format!(
                r#"{{"qpn":{qpn},"lid":{lid},"gid":"{gid}","psn":{psn},"mtu":{mtu},"rd_atom":1}}"#
            )
        };
        // Each queue pair is refused naming the field out of range.
        for (bad, field) in [
            (qp(0, 0, gid, 1, 1024), "qp.qpn"),
            (qp(16777216, 0, gid, 1, 1024), "qp.qpn"),
            (qp(1, 0, gid, 16777216, 1024), "qp.psn"),
            (qp(1, 0, gid, 1, 1500), "qp.mtu"),
            (qp(1, 0, "zz", 1, 1024), "qp.gid"),
            (qp(1, 0, zero, 1, 1024), "qp.gid"),
        ] {
            assert_eq!(field_of(&with(&bad)), field, "{bad}");
        }
        // An InfiniBand peer may have a zero GID prefix but a LID.
        assert!(Request::decode(&with(&qp(1, 5, zero, 1, 1024)), "p").is_ok());
        let ok_qp = qp(1, 0, gid, 1, 1024);
        // A writer of version 2 (no `rd_atom`) is refused by its version.
        let v2_qp = format!(r#"{{"qpn":1,"lid":0,"gid":"{gid}","psn":1,"mtu":1024}}"#);
        assert_eq!(
            field_of(
                format!(r#"{{"v":2,"from":"{FROM}","to":"000000000000feed","qp":{v2_qp}}}"#)
                    .as_bytes()
            ),
            "v"
        );
        // Version 3 needs it.
        assert_eq!(
            field_of(
                format!(r#"{{"v":3,"from":"{FROM}","to":"000000000000feed","qp":{v2_qp}}}"#)
                    .as_bytes()
            ),
            "message"
        );
        assert_eq!(
            field_of(
                format!(r#"{{"v":3,"from":"shm:x","to":"000000000000feed","qp":{ok_qp}}}"#)
                    .as_bytes()
            ),
            "from"
        );
        assert_eq!(
            field_of(format!(r#"{{"v":3,"from":"{FROM}","to":"feed","qp":{ok_qp}}}"#).as_bytes()),
            "to"
        );
        assert_eq!(field_of(b"{"), "message");
        assert_eq!(
            field_of(
                format!(r#"{{"v":3,"from":"{FROM}","to":"000000000000feed","qp":{ok_qp},"x":1}}"#)
                    .as_bytes()
            ),
            "message"
        );
        assert_eq!(field_of(&vec![b' '; MAX_MESSAGE + 1]), "message");
    }

    #[test]
    fn replies_are_validated() {
        let gid = "00000000000000000000ffff0a000001";
        let qp = format!(r#"{{"qpn":1,"lid":0,"gid":"{gid}","psn":1,"mtu":1024,"rd_atom":1}}"#);
        let field = |s: String| match Reply::decode(s.as_bytes(), "p") {
            Err(VerbsError::BadExchange { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            field(format!(
                r#"{{"v":3,"qp":{qp},"regions":[{{"addr":0,"len":1,"rkey":1}},{{"addr":0,"len":0,"rkey":1}}]}}"#
            )),
            "regions.len"
        );
        assert_eq!(
            field(format!(
                r#"{{"v":3,"qp":{qp},"regions":[{{"addr":18446744073709551615,"len":2,"rkey":1}}]}}"#
            )),
            "regions.len"
        );
        assert_eq!(
            field(format!(r#"{{"v":3,"qp":{qp},"regions":[]}}"#)),
            "regions"
        );
        let many = vec![r#"{"addr":0,"len":1,"rkey":1}"#; MAX_REGIONS + 1].join(",");
        assert_eq!(
            field(format!(r#"{{"v":3,"qp":{qp},"regions":[{many}]}}"#)),
            "regions"
        );
        assert_eq!(field(format!(r#"{{"v":3,"qp":{qp}}}"#)), "message");
        // A reply of another version is refused by its version, whatever
        // its shape: version 1's (one `pool`), version 2's (no `rd_atom`),
        // or a refusal.
        assert_eq!(
            field(format!(
                r#"{{"v":1,"qp":{qp},"pool":{{"addr":0,"len":1,"rkey":1}}}}"#
            )),
            "v"
        );
        let v2_qp = format!(r#"{{"qpn":1,"lid":0,"gid":"{gid}","psn":1,"mtu":1024}}"#);
        assert_eq!(
            field(format!(
                r#"{{"v":2,"qp":{v2_qp},"regions":[{{"addr":0,"len":1,"rkey":1}}]}}"#
            )),
            "v"
        );
        assert_eq!(field(r#"{"v":2,"refuse":"field qp.rd_atom"}"#.into()), "v");
        assert_eq!(field(r#"{"refuse":"x"}"#.into()), "message");
        assert_eq!(
            field(format!(
                r#"{{"v":3,"qp":{qp},"regions":[{{"addr":0,"len":1,"rkey":1}}],"refuse":"x"}}"#
            )),
            "message"
        );
    }

    proptest! {
        #[test]
        fn decoding_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = Request::decode(&bytes, "p");
            let _ = Reply::decode(&bytes, "p");
        }

        #[test]
        fn valid_coordinates_round_trip(qpn in 1u32..=0xff_ffff, psn in 0u32..=0xff_ffff,
                                        lid in 1u16.., gid in any::<[u8; 16]>(), m in 0usize..5,
                                        rd_atom in any::<u8>()) {
            let q = QpInfo { qpn, lid, gid, psn, mtu: 256 << m, rd_atom };
            let r = Request { from: FROM.into(), to: 7, qp: q };
            prop_assert_eq!(Request::decode(&r.encode(), "p").unwrap(), r);
        }
    }
}
