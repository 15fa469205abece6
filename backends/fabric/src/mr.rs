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
}

impl MrPolicy {
    /// The rules for the `mr_mode` a provider returned. Modes ferry did not
    /// ask for (and so cannot honour) are an error naming them.
    pub fn from_mode(mr_mode: i32) -> Result<Self, String> {
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
        })
    }

    /// The key to request for the `n`th registration of this process (keys
    /// are per domain; any distinct value works), or 0 where the provider
    /// assigns it.
    pub fn requested_key(&self, n: u64) -> u64 {
        if self.prov_key {
            0
        } else {
            n
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mode_bit_maps_to_its_rule() {
        let none = MrPolicy::from_mode(0).unwrap();
        assert!(!none.prov_key && !none.virt_addr && !none.local && !none.endpoint);
        assert_eq!(none.requested_key(7), 7);

        // What EFA and verbs return: local, virt_addr, allocated, prov_key.
        let efa = MrPolicy::from_mode(
            (sys::FI_MR_LOCAL | sys::FI_MR_VIRT_ADDR | sys::FI_MR_ALLOCATED | sys::FI_MR_PROV_KEY)
                as i32,
        )
        .unwrap();
        assert!(efa.prov_key && efa.virt_addr && efa.local && efa.allocated);
        assert!(!efa.endpoint);
        assert_eq!(efa.requested_key(7), 0);

        let cxi = MrPolicy::from_mode(sys::FI_MR_ENDPOINT as i32).unwrap();
        assert!(cxi.endpoint && !cxi.prov_key);

        let raw = MrPolicy::from_mode((sys::FI_MR_RAW | sys::FI_MR_LOCAL) as i32).unwrap_err();
        assert!(raw.contains("0x8"), "{raw}");
        assert!(MrPolicy::from_mode(sys::FI_MR_HMEM as i32).is_err());
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
