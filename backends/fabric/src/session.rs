//! The session id a libfabric transport advertises: what a peer needs to
//! write into its registered regions.
//!
//! `ofi:<provider>:<endpoint address, hex>:<regions>:<flags>`
//!
//! `<regions>` lists every registered region as `<key>.<base>.<length>`
//! (hex), joined by `,`; empty when none is registered. A writer finds the
//! region that holds its destination and uses that region's key.
//!
//! Flags: `n` the receiver counts remote CQ data before it accepts
//! `transfer_ready` (so writers must send it), `v` peers address a region
//! by virtual address (otherwise by offset into it), `w` CQ data is 8
//! bytes wide (otherwise 4). The provider name rides along so that a peer
//! on another provider is refused by name instead of failing in
//! `fi_av_insert`.

use std::fmt::Write as _;

/// Longest endpoint address accepted (EFA's is 32 bytes, IPv6 sockaddr 28).
const MAX_ADDR: usize = 256;

/// Most regions a session id may list.
pub const MAX_REGIONS: usize = 64;

/// One registered region of a peer, as its session id lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteRegion {
    /// Its remote key.
    pub key: u64,
    /// Its first byte in the peer's address space.
    pub base: u64,
    /// Its length.
    pub len: u64,
}

impl RemoteRegion {
    /// True if `len` bytes at `addr` (the peer's address space) lie in it.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.base
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.base + self.len)
    }
}

/// A parsed libfabric session id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    /// The provider the peer opened.
    pub provider: String,
    /// Its endpoint's address (`fi_getname`), as `fi_av_insert` takes it.
    pub addr: Vec<u8>,
    /// Its registered regions.
    pub regions: Vec<RemoteRegion>,
    /// The peer counts remote CQ data before accepting `transfer_ready`.
    pub notify: bool,
    /// Peers address a region by virtual address.
    pub virt_addr: bool,
    /// CQ data is 8 bytes wide.
    pub wide_data: bool,
}

impl Session {
    /// The session id text.
    pub fn encode(&self) -> String {
        let mut s = String::with_capacity(32 + 2 * self.addr.len() + 40 * self.regions.len());
        s.push_str("ofi:");
        s.push_str(&self.provider);
        s.push(':');
        for b in &self.addr {
            let _ = write!(s, "{b:02x}");
        }
        s.push(':');
        for (i, r) in self.regions.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            let _ = write!(s, "{sep}{:x}.{:x}.{:x}", r.key, r.base, r.len);
        }
        s.push(':');
        for (on, c) in [
            (self.notify, 'n'),
            (self.virt_addr, 'v'),
            (self.wide_data, 'w'),
        ] {
            if on {
                s.push(c);
            }
        }
        s
    }

    /// Parses a session id; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<Self, String> {
        let rest = text
            .strip_prefix("ofi:")
            .ok_or("does not start with `ofi:`")?;
        let parts: Vec<&str> = rest.split(':').collect();
        let [provider, addr, regions, flags] = parts[..] else {
            return Err(format!(
                "has {} fields after `ofi:`, expected 4 (provider:addr:regions:flags)",
                parts.len()
            ));
        };
        if provider.is_empty() {
            return Err("names no provider".into());
        }
        let addr = parse_hex_bytes(addr)?;
        let regions = if regions.is_empty() {
            Vec::new()
        } else {
            let listed: Vec<&str> = regions.split(',').collect();
            if listed.len() > MAX_REGIONS {
                return Err(format!(
                    "lists {} regions; at most {MAX_REGIONS}",
                    listed.len()
                ));
            }
            listed
                .iter()
                .enumerate()
                .map(|(i, r)| parse_region(i, r))
                .collect::<Result<_, _>>()?
        };
        let mut s = Self {
            provider: provider.to_owned(),
            addr,
            regions,
            notify: false,
            virt_addr: false,
            wide_data: false,
        };
        for c in flags.chars() {
            let flag = match c {
                'n' => &mut s.notify,
                'v' => &mut s.virt_addr,
                'w' => &mut s.wide_data,
                _ => return Err(format!("unknown flag {c:?}")),
            };
            if *flag {
                return Err(format!("flag {c:?} repeated"));
            }
            *flag = true;
        }
        Ok(s)
    }

    /// The region that holds `len` bytes at `addr` (the peer's address
    /// space), if one does.
    pub fn region_for(&self, addr: u64, len: u64) -> Option<&RemoteRegion> {
        self.regions.iter().find(|r| r.contains(addr, len))
    }
}

/// Region `i` of a session id: `<key>.<base>.<length>`, hex.
fn parse_region(i: usize, text: &str) -> Result<RemoteRegion, String> {
    let fields: Vec<&str> = text.split('.').collect();
    let [key, base, len] = fields[..] else {
        return Err(format!(
            "region {i} {text:?} has {} fields, expected key.base.length",
            fields.len()
        ));
    };
    let num = |what: &str, v: &str| {
        u64::from_str_radix(v, 16)
            .map_err(|e| format!("region {i}: {what} {v:?} is not a hex u64: {e}"))
    };
    let r = RemoteRegion {
        key: num("key", key)?,
        base: num("base", base)?,
        len: num("length", len)?,
    };
    if r.base.checked_add(r.len).is_none() {
        return Err(format!(
            "region {i}: {:#x}+{:#x} wraps around",
            r.base, r.len
        ));
    }
    Ok(r)
}

fn parse_hex_bytes(hex: &str) -> Result<Vec<u8>, String> {
    if hex.is_empty() || hex.len() % 2 != 0 || hex.len() > 2 * MAX_ADDR {
        return Err(format!(
            "endpoint address has {} hex digits; expected an even number from 2 to {}",
            hex.len(),
            2 * MAX_ADDR
        ));
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| {
            hex.get(i..i + 2)
                .and_then(|d| u8::from_str_radix(d, 16).ok())
                .ok_or_else(|| format!("endpoint address is not hex at digit {i}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Session {
        Session {
            provider: "tcp;ofi_rxm".into(),
            addr: vec![0x02, 0x00, 0x9c, 0x40, 127, 0, 0, 1],
            regions: vec![
                RemoteRegion {
                    key: 0x2a,
                    base: 0x7f12_3400_0000,
                    len: 64 << 20,
                },
                RemoteRegion {
                    key: 0x2b,
                    base: 0x7f20_0000_0000,
                    len: 0x1000,
                },
            ],
            notify: true,
            virt_addr: false,
            wide_data: true,
        }
    }

    #[test]
    fn round_trips_and_reads_as_documented() {
        let s = sample();
        let text = s.encode();
        assert_eq!(
            text,
            "ofi:tcp;ofi_rxm:02009c407f000001:2a.7f1234000000.4000000,2b.7f2000000000.1000:nw"
        );
        assert_eq!(Session::parse(&text), Ok(s));
        let efa = Session {
            provider: "efa".into(),
            addr: vec![0xfe; 32],
            regions: vec![RemoteRegion {
                key: u64::MAX,
                base: 0,
                len: 1,
            }],
            notify: false,
            virt_addr: true,
            wide_data: false,
        };
        assert_eq!(Session::parse(&efa.encode()), Ok(efa));
        let none = Session {
            regions: Vec::new(),
            ..sample()
        };
        assert_eq!(none.encode(), "ofi:tcp;ofi_rxm:02009c407f000001::nw");
        assert_eq!(Session::parse(&none.encode()), Ok(none));
    }

    #[test]
    fn bad_session_ids_say_what_is_wrong() {
        let cases = [
            ("shm:/x@0+10", "does not start"),
            ("ofi:tcp:00:1.0", "has 3 fields"),
            // The one-pool form of earlier versions is refused by name.
            ("ofi:tcp:00:1:0:10:", "has 6 fields"),
            ("ofi::00:1.0.10:", "no provider"),
            ("ofi:tcp:0:1.0.10:", "hex digits"),
            ("ofi:tcp:zz:1.0.10:", "not hex at digit 0"),
            ("ofi:tcp:00:g.0.10:", "region 0: key \"g\""),
            ("ofi:tcp:00:1.0.10,1.0:", "region 1 \"1.0\" has 2 fields"),
            ("ofi:tcp:00:1.ffffffffffffffff.10:", "wraps around"),
            ("ofi:tcp:00:1.0.10:x", "unknown flag 'x'"),
            ("ofi:tcp:00:1.0.10:nn", "repeated"),
        ];
        for (text, why) in cases {
            let err = Session::parse(text).unwrap_err();
            assert!(err.contains(why), "{text}: {err}");
        }
        let long = format!("ofi:tcp:{}:1.0.10:", "00".repeat(MAX_ADDR + 1));
        assert!(Session::parse(&long).is_err());
        let many = vec!["1.0.10"; MAX_REGIONS + 1].join(",");
        let err = Session::parse(&format!("ofi:tcp:00:{many}:")).unwrap_err();
        assert!(err.contains("at most 64"), "{err}");
    }

    #[test]
    fn a_destination_is_found_in_exactly_the_region_that_holds_it() {
        let s = sample();
        let [a, b] = [s.regions[0], s.regions[1]];
        assert_eq!(s.region_for(a.base, a.len), Some(&a));
        assert_eq!(s.region_for(a.base + a.len, 0), Some(&a));
        assert_eq!(s.region_for(b.base + 8, 8), Some(&b));
        assert_eq!(s.region_for(a.base - 1, 1), None);
        assert_eq!(s.region_for(a.base + 1, a.len), None);
        assert_eq!(s.region_for(b.base + b.len - 4, 8), None, "past b's end");
        assert_eq!(s.region_for(u64::MAX, 2), None);
    }

    proptest::proptest! {
        #[test]
        fn any_text_parses_or_is_refused_without_panic(text in "\\PC{0,80}") {
            let _ = Session::parse(&text);
        }

        #[test]
        fn near_misses_are_refused_or_round_trip(
            provider in "[a-z;_]{1,12}",
            addr in proptest::collection::vec(proptest::num::u8::ANY, 1..40),
            regions in proptest::collection::vec(
                (proptest::num::u64::ANY, proptest::num::u64::ANY, proptest::num::u64::ANY),
                0..4,
            ),
            flags in "[nvwx]{0,4}",
        ) {
            let hex: String = addr.iter().map(|b| format!("{b:02x}")).collect();
            let listed: Vec<String> = regions
                .iter()
                .map(|(k, b, l)| format!("{k:x}.{b:x}.{l:x}"))
                .collect();
            let text = format!("ofi:{provider}:{hex}:{}:{flags}", listed.join(","));
            if let Ok(s) = Session::parse(&text) {
                proptest::prop_assert_eq!(Session::parse(&s.encode()), Ok(s.clone()));
                proptest::prop_assert!(s.regions.iter().all(|r| r.base.checked_add(r.len).is_some()));
                proptest::prop_assert_eq!(s.regions.len(), regions.len());
                proptest::prop_assert_eq!(&s.addr, &addr);
            }
        }
    }
}
