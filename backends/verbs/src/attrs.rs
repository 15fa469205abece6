//! The queue-pair state walk RESET → INIT → RTR → RTS, as plain values
//! built from the local port and the peer's exchange message, so that what
//! reaches `ibv_modify_qp` is decided (and tested) here rather than at the
//! FFI seam.

use crate::device::{LinkLayer, PortInfo, Verb};
use crate::exchange::QpInfo;

/// ACK timeout exponent: 4.096 µs × 2^14 ≈ 67 ms per try, the value
/// production RDMA stacks use.
pub const ACK_TIMEOUT: u8 = 14;
/// Transport retries before a write fails with `IBV_WC_RETRY_EXC_ERR`.
pub const RETRY_COUNT: u8 = 7;
/// RNR retries (7: retry forever; writes never need a posted receive, so
/// RNR cannot happen for them, and 7 is what production stacks set).
pub const RNR_RETRY: u8 = 7;
/// Minimal RNR NAK timer (12: 0.64 ms).
pub const MIN_RNR_TIMER: u8 = 12;
/// Hop limit of the GRH.
pub const HOP_LIMIT: u8 = 64;
/// RDMA READs a queue pair has outstanding, and answers, at once, at most:
/// a read's chunks are in flight together up to this many (NICs queue the
/// rest). 16 is what ConnectX ports offer; each end clamps it to its
/// device's limits, and an initiator to what its peer answers
/// ([`initiator_depth`]).
pub const RD_ATOMIC: u8 = 16;

/// The global route header of the address vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grh {
    /// The peer's GID.
    pub dgid: [u8; 16],
    /// The local GID index.
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
}

/// The address vector toward the peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddressVector {
    /// The peer's LID (InfiniBand).
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// The local port.
    pub port: u8,
    /// The GRH (always on Ethernet; on InfiniBand when the peer has no LID).
    pub grh: Option<Grh>,
}

/// One state transition with its attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpStep {
    /// RESET → INIT: `STATE | PKEY_INDEX | PORT | ACCESS_FLAGS`.
    Init {
        /// The local port.
        port: u8,
        /// The P_Key index.
        pkey_index: u16,
        /// Whether the peer may write into our regions through this QP
        /// (`IBV_ACCESS_REMOTE_WRITE`).
        remote_write: bool,
        /// Whether the peer may read our regions through this QP
        /// (`IBV_ACCESS_REMOTE_READ`).
        remote_read: bool,
    },
    /// INIT → RTR: `STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN |
    /// MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER`.
    Rtr {
        /// How to reach the peer.
        av: AddressVector,
        /// The path MTU as an `ibv_mtu` value (1 = 256 ... 5 = 4096).
        path_mtu: u32,
        /// The peer's QP number.
        dest_qpn: u32,
        /// The peer's first PSN.
        rq_psn: u32,
        /// Incoming RDMA READs answered at once (responder resources).
        max_dest_rd_atomic: u8,
        /// RNR NAK timer.
        min_rnr_timer: u8,
    },
    /// RTR → RTS: `STATE | TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN |
    /// MAX_QP_RD_ATOMIC`.
    Rts {
        /// ACK timeout exponent.
        timeout: u8,
        /// Transport retries.
        retry_cnt: u8,
        /// RNR retries.
        rnr_retry: u8,
        /// Our first PSN.
        sq_psn: u32,
        /// Outgoing RDMA READs outstanding at once (initiator depth).
        max_rd_atomic: u8,
    },
    /// Any → ERR: flushes outstanding work and stops the QP.
    Error,
}

impl QpStep {
    /// The modify to this step's target state, for errors.
    pub fn verb(&self) -> Verb {
        match self {
            Self::Init { .. } => Verb::ModifyQpInit,
            Self::Rtr { .. } => Verb::ModifyQpRtr,
            Self::Rts { .. } => Verb::ModifyQpRts,
            Self::Error => Verb::ModifyQpErr,
        }
    }
}

/// `ibv_mtu` for a byte count, if it is one of the five RDMA MTUs.
pub fn mtu_enum(bytes: u32) -> Option<u32> {
    match bytes {
        256 => Some(1),
        512 => Some(2),
        1024 => Some(3),
        2048 => Some(4),
        4096 => Some(5),
        _ => None,
    }
}

/// Bytes for an `ibv_mtu` value.
pub fn mtu_bytes(value: u32) -> Option<u32> {
    (1..=5).contains(&value).then(|| 128u32 << value)
}

/// RESET → INIT. Both ends allow remote write and read: only the queue
/// pair a target accepted is written or read through, but a symmetric QP
/// costs nothing and keeps one path.
pub fn init(port: &PortInfo) -> QpStep {
    QpStep::Init {
        port: port.port,
        pkey_index: 0,
        remote_write: true,
        remote_read: true,
    }
}

/// The RDMA READs a queue pair of this port answers at once (its
/// `max_dest_rd_atomic`): [`RD_ATOMIC`] within the device's
/// `max_qp_rd_atom`. Each end tells the other in the exchange
/// ([`QpInfo::rd_atom`]).
pub fn responder_resources(port: &PortInfo) -> u8 {
    RD_ATOMIC.min(port.max_qp_rd_atom)
}

/// The RDMA READs a queue pair of this port keeps outstanding toward a
/// peer that answers `peer_resources` at once (its `max_rd_atomic`):
/// [`RD_ATOMIC`] within the device's `max_qp_init_rd_atom` and the peer's
/// responder resources, since a responder refuses reads beyond its own
/// (as `rdma_cm` pairs initiator depth with responder resources). 0: this
/// connection cannot read.
pub fn initiator_depth(port: &PortInfo, peer_resources: u8) -> u8 {
    RD_ATOMIC.min(port.max_qp_init_rd_atom).min(peer_resources)
}

/// INIT → RTR toward `peer`, using local GID index `sgid_index`; the
/// queue pair answers [`responder_resources`] reads at once.
pub fn rtr(port: &PortInfo, sgid_index: u8, peer: &QpInfo) -> QpStep {
    let needs_grh = port.link == LinkLayer::Ethernet || peer.lid == 0;
    let path = port.active_mtu.min(peer.mtu);
    QpStep::Rtr {
        av: AddressVector {
            dlid: if port.link == LinkLayer::InfiniBand {
                peer.lid
            } else {
                0
            },
            sl: 0,
            port: port.port,
            grh: needs_grh.then_some(Grh {
                dgid: peer.gid,
                sgid_index,
                hop_limit: HOP_LIMIT,
                traffic_class: 0,
            }),
        },
        // Both MTUs were validated as one of the five; 1024 is a floor
        // that every RDMA port supports should that ever not hold.
        path_mtu: mtu_enum(path).unwrap_or(3),
        dest_qpn: peer.qpn,
        rq_psn: peer.psn,
        max_dest_rd_atomic: responder_resources(port),
        min_rnr_timer: MIN_RNR_TIMER,
    }
}

/// RTR → RTS with our first PSN and `max_rd_atomic` outstanding reads
/// (from [`initiator_depth`]).
pub fn rts(sq_psn: u32, max_rd_atomic: u8) -> QpStep {
    QpStep::Rts {
        timeout: ACK_TIMEOUT,
        retry_cnt: RETRY_COUNT,
        rnr_retry: RNR_RETRY,
        sq_psn,
        max_rd_atomic,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(link: LinkLayer, mtu: u32) -> PortInfo {
        PortInfo {
            device: "mlx5_0".into(),
            port: 1,
            link,
            lid: if link == LinkLayer::InfiniBand { 7 } else { 0 },
            active_mtu: mtu,
            max_msg: 1 << 30,
            max_qp_wr: 32768,
            max_qp_rd_atom: 16,
            max_qp_init_rd_atom: 16,
        }
    }

    fn peer(lid: u16, mtu: u32) -> QpInfo {
        QpInfo {
            qpn: 0x1234,
            lid,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2],
            psn: 0xabcdef,
            mtu,
            rd_atom: 16,
        }
    }

    #[test]
    fn roce_rtr_carries_a_grh_and_the_smaller_mtu() {
        let step = rtr(&port(LinkLayer::Ethernet, 4096), 3, &peer(0, 1024));
        let QpStep::Rtr {
            av,
            path_mtu,
            dest_qpn,
            rq_psn,
            max_dest_rd_atomic,
            min_rnr_timer,
        } = step
        else {
            panic!("{step:?}")
        };
        assert_eq!(av.dlid, 0);
        assert_eq!(av.port, 1);
        let grh = av.grh.expect("RoCE needs a GRH");
        assert_eq!(grh.sgid_index, 3);
        assert_eq!(grh.dgid[10..], [0xff, 0xff, 10, 0, 0, 2]);
        assert_eq!(grh.hop_limit, 64);
        assert_eq!(path_mtu, 3, "min(4096, 1024) = 1024 = IBV_MTU_1024");
        assert_eq!(dest_qpn, 0x1234);
        assert_eq!(rq_psn, 0xabcdef);
        assert_eq!(max_dest_rd_atomic, 16);
        assert_eq!(min_rnr_timer, 12);
        assert_eq!(step.verb().name(), "ibv_modify_qp(RTR)");
    }

    #[test]
    fn infiniband_rtr_routes_by_lid_without_a_grh() {
        let QpStep::Rtr { av, path_mtu, .. } =
            rtr(&port(LinkLayer::InfiniBand, 4096), 0, &peer(9, 4096))
        else {
            panic!()
        };
        assert_eq!(av.dlid, 9);
        assert_eq!(av.grh, None);
        assert_eq!(path_mtu, 5);
        // A peer without a LID is reached through its GID.
        let QpStep::Rtr { av, .. } = rtr(&port(LinkLayer::InfiniBand, 2048), 0, &peer(0, 4096))
        else {
            panic!()
        };
        assert!(av.grh.is_some());
    }

    #[test]
    fn rts_uses_the_production_retry_values_and_our_psn() {
        assert_eq!(
            rts(0x42, 4),
            QpStep::Rts {
                timeout: 14,
                retry_cnt: 7,
                rnr_retry: 7,
                sq_psn: 0x42,
                max_rd_atomic: 4,
            }
        );
        assert_eq!(
            init(&port(LinkLayer::Ethernet, 1024)),
            QpStep::Init {
                port: 1,
                pkey_index: 0,
                remote_write: true,
                remote_read: true,
            }
        );
    }

    #[test]
    fn read_depths_keep_within_both_devices_and_the_peers_resources() {
        let mut p = port(LinkLayer::Ethernet, 1024);
        assert_eq!(responder_resources(&p), RD_ATOMIC);
        assert_eq!(initiator_depth(&p, 16), RD_ATOMIC);
        // The peer answers fewer at once: never more are outstanding.
        assert_eq!(initiator_depth(&p, 4), 4);
        // The device's own limits, each on its side.
        p.max_qp_rd_atom = 2;
        p.max_qp_init_rd_atom = 8;
        assert_eq!(responder_resources(&p), 2);
        assert_eq!(initiator_depth(&p, 255), 8);
        let QpStep::Rtr {
            max_dest_rd_atomic, ..
        } = rtr(&p, 0, &peer(0, 1024))
        else {
            panic!()
        };
        assert_eq!(max_dest_rd_atomic, 2);
        // A device (or peer) that reads nothing: a depth of 0.
        p.max_qp_init_rd_atom = 0;
        assert_eq!(initiator_depth(&p, 16), 0);
        assert_eq!(initiator_depth(&port(LinkLayer::Ethernet, 1024), 0), 0);
    }

    #[test]
    fn mtu_values_map_both_ways() {
        for (bytes, v) in [(256, 1), (512, 2), (1024, 3), (2048, 4), (4096, 5)] {
            assert_eq!(mtu_enum(bytes), Some(v));
            assert_eq!(mtu_bytes(v), Some(bytes));
        }
        assert_eq!(mtu_enum(1500), None);
        assert_eq!(mtu_bytes(0), None);
        assert_eq!(mtu_bytes(6), None);
    }
}
