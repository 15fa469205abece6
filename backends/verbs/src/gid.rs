//! Choosing the local GID index.
//!
//! On RoCE the GID decides the wire format and the source IP: both ends
//! must use the same kind, and RoCE v2 with an IPv4-mapped address is what
//! routed data-centre fabrics run. On InfiniBand the port GID (index 0)
//! is the one to use. A configured index overrides the choice, as long as
//! the table has it.

use crate::device::{GidEntry, GidKind, LinkLayer};

/// How the GID index is picked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GidChoice {
    /// By the rules above.
    #[default]
    Auto,
    /// This index.
    Index(u8),
}

/// True for `::ffff:a.b.c.d`.
pub fn is_ipv4_mapped(gid: &[u8; 16]) -> bool {
    gid[..10] == [0; 10] && gid[10] == 0xff && gid[11] == 0xff
}

fn is_link_local(gid: &[u8; 16]) -> bool {
    gid[0] == 0xfe && gid[1] & 0xc0 == 0x80
}

/// The IPv4 address of an IPv4-mapped GID.
pub fn ipv4_of(gid: &[u8; 16]) -> Option<std::net::Ipv4Addr> {
    is_ipv4_mapped(gid).then(|| std::net::Ipv4Addr::new(gid[12], gid[13], gid[14], gid[15]))
}

/// Formats a GID the way `show_gids` does (IPv6 text).
pub fn gid_text(gid: &[u8; 16]) -> String {
    std::net::Ipv6Addr::from(*gid).to_string()
}

/// Why [`choose`] picked `entry`, in words for an operator.
pub fn why_chosen(link: LinkLayer, entry: &GidEntry, choice: GidChoice) -> &'static str {
    if let GidChoice::Index(_) = choice {
        return "configured (--gid-index)";
    }
    match (link, entry.kind) {
        (LinkLayer::InfiniBand, _) => "InfiniBand: the port GID, lowest index",
        (LinkLayer::Ethernet, GidKind::RoceV2) if is_ipv4_mapped(&entry.gid) => {
            "RoCE v2 with an IPv4-mapped address: routable, what data-centre fabrics run"
        }
        (LinkLayer::Ethernet, GidKind::RoceV2) if !is_link_local(&entry.gid) => {
            "RoCE v2 with a global IPv6 address: no IPv4-mapped RoCE v2 entry"
        }
        (LinkLayer::Ethernet, GidKind::RoceV2) => {
            "RoCE v2, link-local only: peers must share the L2 segment"
        }
        (LinkLayer::Ethernet, _) => "RoCE v1 only: not routable; peers must share the L2 segment",
    }
}

/// Picks the entry to use, or says why none fits.
pub fn choose(link: LinkLayer, table: &[GidEntry], choice: GidChoice) -> Result<GidEntry, String> {
    let listing = || {
        if table.is_empty() {
            "the table is empty (no address on the port's netdev?)".to_owned()
        } else {
            let entries: Vec<String> = table
                .iter()
                .map(|e| format!("{}={} {:?}", e.index, gid_text(&e.gid), e.kind))
                .collect();
            format!("table: {}", entries.join(", "))
        }
    };
    if let GidChoice::Index(i) = choice {
        return table
            .iter()
            .find(|e| e.index == i)
            .copied()
            .ok_or_else(|| format!("GID index {i} is not in the table; {}", listing()));
    }
    let usable = table.iter().filter(|e| e.gid != [0; 16]);
    let best = match link {
        LinkLayer::InfiniBand => usable
            .filter(|e| matches!(e.kind, GidKind::InfiniBand))
            .min_by_key(|e| e.index)
            .copied(),
        LinkLayer::Ethernet => usable
            .filter_map(|e| {
                let rank = match e.kind {
                    GidKind::RoceV2 if is_ipv4_mapped(&e.gid) => 0,
                    GidKind::RoceV2 if !is_link_local(&e.gid) => 1,
                    GidKind::RoceV2 => 2,
                    GidKind::RoceV1 => 3,
                    _ => return None,
                };
                Some((rank, e.index, *e))
            })
            .min_by_key(|&(rank, index, _)| (rank, index))
            .map(|(_, _, e)| e),
    };
    best.ok_or_else(|| {
        format!(
            "no {} GID; {}",
            match link {
                LinkLayer::InfiniBand => "InfiniBand",
                LinkLayer::Ethernet => "RoCE",
            },
            listing()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(index: u8, gid: &str, kind: GidKind) -> GidEntry {
        let ip: std::net::Ipv6Addr = gid.parse().unwrap();
        GidEntry {
            index,
            gid: ip.octets(),
            kind,
        }
    }

    /// The index `GidChoice::Auto` picks from `t` on `link`.
    fn auto_index(link: LinkLayer, t: &[GidEntry]) -> u8 {
        choose(link, t, GidChoice::Auto)
            .expect("a usable GID")
            .index
    }

    /// A typical RoCE port: link-local v1/v2 pair, then IPv4 v1/v2 pair,
    /// then a global IPv6 pair.
    fn roce_table() -> Vec<GidEntry> {
        vec![
            e(0, "fe80::9a03:9bff:fe01:2", GidKind::RoceV1),
            e(1, "fe80::9a03:9bff:fe01:2", GidKind::RoceV2),
            e(2, "::ffff:10.0.0.2", GidKind::RoceV1),
            e(3, "::ffff:10.0.0.2", GidKind::RoceV2),
            e(4, "2001:db8::2", GidKind::RoceV1),
            e(5, "2001:db8::2", GidKind::RoceV2),
        ]
    }

    #[test]
    fn roce_prefers_v2_ipv4_mapped() {
        let g = choose(LinkLayer::Ethernet, &roce_table(), GidChoice::Auto).unwrap();
        assert_eq!(g.index, 3);
        assert_eq!(ipv4_of(&g.gid), Some(std::net::Ipv4Addr::new(10, 0, 0, 2)));
    }

    #[test]
    fn roce_falls_back_to_global_then_link_local_v2_then_v1() {
        let t: Vec<_> = roce_table().into_iter().filter(|g| g.index != 3).collect();
        assert_eq!(auto_index(LinkLayer::Ethernet, &t), 5);
        let t: Vec<_> = t.into_iter().filter(|g| g.index != 5).collect();
        assert_eq!(auto_index(LinkLayer::Ethernet, &t), 1);
        let t: Vec<_> = t
            .into_iter()
            .filter(|g| g.kind == GidKind::RoceV1)
            .collect();
        assert_eq!(auto_index(LinkLayer::Ethernet, &t), 0);
    }

    #[test]
    fn zero_and_unknown_entries_are_skipped() {
        let t = vec![
            e(0, "::", GidKind::RoceV2),
            e(1, "::ffff:10.0.0.9", GidKind::Other(9)),
            e(7, "::ffff:10.0.0.3", GidKind::RoceV2),
        ];
        assert_eq!(auto_index(LinkLayer::Ethernet, &t), 7);
    }

    #[test]
    fn infiniband_takes_the_lowest_ib_gid() {
        let t = vec![
            e(1, "fe80::2", GidKind::InfiniBand),
            e(0, "fe80::1", GidKind::InfiniBand),
        ];
        assert_eq!(auto_index(LinkLayer::InfiniBand, &t), 0);
    }

    #[test]
    fn a_configured_index_wins_if_present() {
        assert_eq!(
            choose(LinkLayer::Ethernet, &roce_table(), GidChoice::Index(1))
                .unwrap()
                .index,
            1
        );
        let why = choose(LinkLayer::Ethernet, &roce_table(), GidChoice::Index(9)).unwrap_err();
        assert!(why.contains("GID index 9 is not in the table"), "{why}");
        assert!(why.contains("3=::ffff:10.0.0.2 RoceV2"), "{why}");
    }

    #[test]
    fn an_empty_table_says_so() {
        let why = choose(LinkLayer::Ethernet, &[], GidChoice::Auto).unwrap_err();
        assert!(why.contains("table is empty"), "{why}");
        let why = choose(
            LinkLayer::Ethernet,
            &[e(0, "fe80::1", GidKind::InfiniBand)],
            GidChoice::Auto,
        )
        .unwrap_err();
        assert!(why.starts_with("no RoCE GID"), "{why}");
    }
}
