//! What a provider's memory-registration mode means for ferry: who picks
//! the key, how a peer addresses the pool, whether local buffers need a
//! descriptor and whether a region must be bound to the endpoint.

use tensorferry_fabric_sys as sys;

use crate::provider::MR_MODES;

/// The registration rules of the opened provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MrPolicy {
    /// `FI_MR_PROV_KEY`: the provider assigns keys (read with `fi_mr_key`);
    /// otherwise ferry requests one.
    pub prov_key: bool,
    /// `FI_MR_VIRT_ADDR`: peers address the region by virtual address;
    /// otherwise by offset from its start.
    pub virt_addr: bool,
    /// `FI_MR_LOCAL`: local buffers of an operation must be registered and
    /// their descriptor passed.
    pub local: bool,
    /// `FI_MR_ENDPOINT`: a region is bound to the endpoint and enabled
    /// before use.
    pub endpoint: bool,
    /// `FI_MR_ALLOCATED`: only allocated (mapped) memory can be registered;
    /// pools always are.
    pub allocated: bool,
    /// Bytes of a key the provider takes (its domain's `mr_key_size`).
    pub key_size: usize,
}

impl MrPolicy {
    /// The rules for the `mr_mode` a provider returned. Modes ferry did not
    /// ask for (and so cannot honour) are an error naming them.
    pub fn from_mode(mr_mode: i32, key_size: usize) -> Result<Self, String> {
        let bits = mr_mode as u32;
        let unknown = bits & !MR_MODES;
        if unknown != 0 {
            return Err(format!(
                "requires memory-registration modes {unknown:#x} that ferry does not handle"
            ));
        }
        Ok(Self {
            prov_key: bits & sys::FI_MR_PROV_KEY != 0,
            virt_addr: bits & sys::FI_MR_VIRT_ADDR != 0,
            local: bits & sys::FI_MR_LOCAL != 0,
            endpoint: bits & sys::FI_MR_ENDPOINT != 0,
            allocated: bits & sys::FI_MR_ALLOCATED != 0,
            key_size,
        })
    }

    /// The key to request for a new registration, or 0 where the provider
    /// assigns it: random, as wide as the provider takes (64 bits on `tcp`
    /// and `shm`), never 0. Over `tcp` a key is all a host that reaches the
    /// provider's port needs to write into or read from the region it
    /// names (the provider's listener answers anyone, and regions are
    /// addressed by offset), so it must not be guessable; it travels only
    /// in the session id. A key already taken is refused by the provider
    /// (`FI_ENOKEY`), and the caller asks again.
    pub fn requested_key(&self) -> Result<u64, std::io::Error> {
        if self.prov_key {
            return Ok(0);
        }
        let bits = (self.key_size.clamp(1, 8) * 8) as u32;
        let mask = u64::MAX >> (64 - bits);
        loop {
            let key = random_u64()? & mask;
            if key != 0 {
                return Ok(key);
            }
        }
    }

    /// The address a peer puts in its RMA descriptor to reach `dest_addr`
    /// (an address in the owner's space) of a pool based at `base`.
    pub fn remote_addr(virt_addr: bool, base: u64, dest_addr: u64) -> u64 {
        if virt_addr {
            dest_addr
        } else {
            dest_addr - base
        }
    }
}

/// Eight bytes from the kernel's random source.
#[allow(unsafe_code)]
fn random_u64() -> Result<u64, std::io::Error> {
    let mut b = [0u8; 8];
    let mut got = 0;
    while got < b.len() {
        // SAFETY: getrandom writes at most the given length into the
        // buffer we own, from `got` on.
        let n = unsafe { libc::getrandom(b[got..].as_mut_ptr().cast(), b.len() - got, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        got += n as usize;
    }
    Ok(u64::from_ne_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mode_bit_maps_to_its_rule() {
        let none = MrPolicy::from_mode(0, 8).unwrap();
        assert!(!none.prov_key && !none.virt_addr && !none.local && !none.endpoint);

        // What EFA and verbs return: local, virt_addr, allocated, prov_key.
        let efa = MrPolicy::from_mode(
            (sys::FI_MR_LOCAL | sys::FI_MR_VIRT_ADDR | sys::FI_MR_ALLOCATED | sys::FI_MR_PROV_KEY)
                as i32,
            8,
        )
        .unwrap();
        assert!(efa.prov_key && efa.virt_addr && efa.local && efa.allocated);
        assert!(!efa.endpoint);
        assert_eq!(efa.requested_key().unwrap(), 0);

        let cxi = MrPolicy::from_mode(sys::FI_MR_ENDPOINT as i32, 8).unwrap();
        assert!(cxi.endpoint && !cxi.prov_key);

        let raw = MrPolicy::from_mode((sys::FI_MR_RAW | sys::FI_MR_LOCAL) as i32, 8).unwrap_err();
        assert!(raw.contains("0x8"), "{raw}");
        assert!(MrPolicy::from_mode(sys::FI_MR_HMEM as i32, 8).is_err());
    }

    #[test]
    fn requested_keys_are_random_nonzero_and_as_wide_as_the_provider_takes() {
        let wide = MrPolicy::from_mode(0, 8).unwrap();
        let keys: std::collections::HashSet<u64> =
            (0..1000).map(|_| wide.requested_key().unwrap()).collect();
        assert_eq!(keys.len(), 1000, "no two alike");
        assert!(!keys.contains(&0));
        // Most use the upper half of the 64 bits.
        assert!(keys.iter().filter(|&&k| k > u64::MAX / 2).count() > 400);
        let narrow = MrPolicy::from_mode(0, 4).unwrap();
        assert!((0..1000).all(|_| {
            let k = narrow.requested_key().unwrap();
            k != 0 && k <= u64::from(u32::MAX)
        }));
    }

    #[test]
    fn peers_address_by_virtual_address_or_by_offset() {
        assert_eq!(
            MrPolicy::remote_addr(true, 0x7f00_0000, 0x7f00_1000),
            0x7f00_1000
        );
        assert_eq!(
            MrPolicy::remote_addr(false, 0x7f00_0000, 0x7f00_1000),
            0x1000
        );
    }
}
