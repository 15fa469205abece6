//! The session id a libfabric transport advertises: what a peer needs to
//! write into its pool.
//!
//! `ofi:<provider>:<endpoint address, hex>:<key, hex>:<pool base, hex>:<pool length, hex>:<flags>`
//!
//! Flags: `n` the receiver counts remote CQ data before it accepts
//! `transfer_ready` (so writers must send it), `v` peers address the pool
//! by virtual address (otherwise by offset), `w` CQ data is 8 bytes wide
//! (otherwise 4). The provider name rides along so that a peer on another
//! provider is refused by name instead of failing in `fi_av_insert`.

use std::fmt::Write as _;

/// Longest endpoint address accepted (EFA's is 32 bytes, IPv6 sockaddr 28).
const MAX_ADDR: usize = 256;

/// A parsed libfabric session id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    /// The provider the peer opened.
    pub provider: String,
    /// Its endpoint's address (`fi_getname`), as `fi_av_insert` takes it.
    pub addr: Vec<u8>,
    /// The remote key of its pool.
    pub key: u64,
    /// The pool's first byte in the peer's address space.
    pub base: u64,
    /// The pool's length.
    pub len: u64,
    /// The peer counts remote CQ data before accepting `transfer_ready`.
    pub notify: bool,
    /// Peers address the pool by virtual address.
    pub virt_addr: bool,
    /// CQ data is 8 bytes wide.
    pub wide_data: bool,
}

impl Session {
    /// The session id text.
    pub fn encode(&self) -> String {
        let mut s = String::with_capacity(32 + 2 * self.addr.len());
        s.push_str("ofi:");
        s.push_str(&self.provider);
        s.push(':');
        for b in &self.addr {
            let _ = write!(s, "{b:02x}");
        }
        let _ = write!(s, ":{:x}:{:x}:{:x}:", self.key, self.base, self.len);
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
        let [provider, addr, key, base, len, flags] = parts[..] else {
            return Err(format!(
                "has {} fields after `ofi:`, expected 6 (provider:addr:key:base:len:flags)",
                parts.len()
            ));
        };
        if provider.is_empty() {
            return Err("names no provider".into());
        }
        let addr = parse_hex_bytes(addr)?;
        let num = |what: &str, v: &str| {
            u64::from_str_radix(v, 16).map_err(|e| format!("{what} {v:?} is not a hex u64: {e}"))
        };
        let (key, base, len) = (num("key", key)?, num("base", base)?, num("length", len)?);
        if base.checked_add(len).is_none() {
            return Err(format!("pool {base:#x}+{len:#x} wraps around"));
        }
        let mut s = Self {
            provider: provider.to_owned(),
            addr,
            key,
            base,
            len,
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

    /// Checks that `len` bytes at `addr` (the peer's address space) lie in
    /// the pool.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.base
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.base + self.len)
    }
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
            key: 0x2a,
            base: 0x7f12_3400_0000,
            len: 64 << 20,
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
            "ofi:tcp;ofi_rxm:02009c407f000001:2a:7f1234000000:4000000:nw"
        );
        assert_eq!(Session::parse(&text), Ok(s));
        let efa = Session {
            provider: "efa".into(),
            addr: vec![0xfe; 32],
            key: u64::MAX,
            base: 0,
            len: 1,
            notify: false,
            virt_addr: true,
            wide_data: false,
        };
        assert_eq!(Session::parse(&efa.encode()), Ok(efa));
    }

    #[test]
    fn bad_session_ids_say_what_is_wrong() {
        let cases = [
            ("shm:/x@0+10", "does not start"),
            ("ofi:tcp:00:1:0", "has 4 fields"),
            ("ofi::00:1:0:10:", "no provider"),
            ("ofi:tcp:0:1:0:10:", "hex digits"),
            ("ofi:tcp:zz:1:0:10:", "not hex at digit 0"),
            ("ofi:tcp:00:g:0:10:", "key \"g\""),
            ("ofi:tcp:00:1:ffffffffffffffff:10:", "wraps around"),
            ("ofi:tcp:00:1:0:10:x", "unknown flag 'x'"),
            ("ofi:tcp:00:1:0:10:nn", "repeated"),
        ];
        for (text, why) in cases {
            let err = Session::parse(text).unwrap_err();
            assert!(err.contains(why), "{text}: {err}");
        }
        let long = format!("ofi:tcp:{}:1:0:10:", "00".repeat(MAX_ADDR + 1));
        assert!(Session::parse(&long).is_err());
    }

    #[test]
    fn bounds_cover_exactly_the_pool() {
        let s = sample();
        assert!(s.contains(s.base, s.len));
        assert!(s.contains(s.base + s.len, 0));
        assert!(!s.contains(s.base - 1, 1));
        assert!(!s.contains(s.base + 1, s.len));
        assert!(!s.contains(u64::MAX, 2));
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
            key in proptest::num::u64::ANY,
            base in proptest::num::u64::ANY,
            len in proptest::num::u64::ANY,
            flags in "[nvwx]{0,4}",
        ) {
            let hex: String = addr.iter().map(|b| format!("{b:02x}")).collect();
            let text = format!("ofi:{provider}:{hex}:{key:x}:{base:x}:{len:x}:{flags}");
            if let Ok(s) = Session::parse(&text) {
                proptest::prop_assert_eq!(Session::parse(&s.encode()), Ok(s.clone()));
                proptest::prop_assert!(s.base.checked_add(s.len).is_some());
                proptest::prop_assert_eq!(&s.addr, &addr);
            }
        }
    }
}
