//! What RDMA devices this host has and what ferry would choose on each:
//! the listing behind `ferry devices`.

use crate::device::{Device, GidEntry, PortInfo};
use crate::gid::{self, GidChoice};
use crate::VerbsError;

/// A device port as ferry sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortReport {
    /// The port's attributes.
    pub port: PortInfo,
    /// Its GID table.
    pub gids: Vec<GidEntry>,
    /// The GID ferry would use and why, or why none fits.
    pub chosen: Result<(GidEntry, &'static str), String>,
}

/// Describes `device`'s port, choosing its GID as a transport would.
pub fn describe(device: &impl Device, choice: GidChoice) -> PortReport {
    let port = device.port().clone();
    let gids = device.gid_table().to_vec();
    let chosen =
        gid::choose(port.link, &gids, choice).map(|e| (e, gid::why_chosen(port.link, &e, choice)));
    PortReport { port, gids, chosen }
}

/// A device by name, with its port described or the error opening it.
pub type Described = (String, Result<PortReport, VerbsError>);

/// Every device of this host with port `port` described (or the error
/// opening it), or why there can be none: the verb, its errno and what
/// that usually means.
pub fn host(port: u8, choice: GidChoice) -> Result<Vec<Described>, String> {
    let names = crate::device_names().map_err(|e| crate::ibv::why_none(&e))?;
    Ok(names
        .into_iter()
        .map(|name| {
            let report = crate::IbvDevice::open(&name, port).map(|d| describe(&d, choice));
            (name, report)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{GidKind, LinkLayer};
    use crate::sim::SimDevice;

    #[test]
    fn the_stand_in_port_is_described_with_its_table_and_the_ipv4_roce_v2_choice() {
        let dev = SimDevice::new([10, 0, 0, 7], 1 << 20);
        let r = describe(&dev, GidChoice::Auto);
        assert_eq!(r.port.link, LinkLayer::Ethernet);
        assert_eq!(r.gids.len(), 4);
        let (gid, why) = r.chosen.unwrap();
        assert_eq!((gid.index, gid.kind), (3, GidKind::RoceV2));
        assert_eq!(crate::gid::ipv4_of(&gid.gid), Some([10, 0, 0, 7].into()));
        assert!(why.contains("IPv4-mapped"), "{why}");
        let r = describe(&dev, GidChoice::Index(1));
        assert_eq!(r.chosen.unwrap(), (r.gids[1], "configured (--gid-index)"));
        assert!(describe(&dev, GidChoice::Index(9))
            .chosen
            .unwrap_err()
            .contains("not in the table"));
    }
}
