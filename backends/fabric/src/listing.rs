//! What libfabric offers on this host, and what of it ferry can use: the
//! listing behind `ferry devices`.

use crate::ofi::Info;
use crate::provider::{DeliveryMode, AUTO_ORDER, READ_CAPS};
use crate::transport::probe;
use crate::FabricError;

/// A provider with a fabric and domain libfabric lists here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Offered {
    /// The provider (`tcp;ofi_rxm`, `shm`).
    pub provider: String,
    /// The fabric (a subnet for tcp).
    pub fabric: String,
    /// The domain (an interface or NIC).
    pub domain: String,
}

/// Every (provider, fabric, domain) libfabric offers on this host, each
/// once, in libfabric's order.
pub fn offered() -> Result<Vec<Offered>, FabricError> {
    let mut out: Vec<Offered> = Vec::new();
    for (provider, fabric, domain) in Info::all()?.entries() {
        let o = Offered {
            provider,
            fabric,
            domain,
        };
        if !out.contains(&o) {
            out.push(o);
        }
    }
    Ok(out)
}

/// The providers ferry knows how to use, and whether each gives what ferry
/// asks of it ([`Hints::new`](crate::Hints::new): reliable datagrams,
/// messages and RMA writes both ways (and reads where the provider offers
/// them), thread safety, a handled registration mode).
pub const KNOWN: [&str; 4] = ["efa", "verbs;ofi_rxm", "tcp;ofi_rxm", "shm"];

/// One of [`KNOWN`] as ferry would open it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fit {
    /// The provider.
    pub provider: &'static str,
    /// What ferry would get, or why it gets nothing (the errno of each
    /// delivery mode tried).
    pub result: Result<Usable, String>,
}

/// A provider that gives ferry what it needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Usable {
    /// How writes are known delivered.
    pub delivery: DeliveryMode,
    /// The fabric.
    pub fabric: String,
    /// The domain.
    pub domain: String,
    /// The largest message and RMA write.
    pub max_msg_size: u64,
    /// Bytes of remote CQ data a write may carry.
    pub cq_data_size: usize,
    /// The registration modes the provider requires (`FI_MR_*` bits).
    pub mr_mode: i32,
    /// It offers one-sided reads ([`READ_CAPS`]).
    pub reads: bool,
}

/// Each of [`KNOWN`], tried as `--provider <name> --delivery auto` would.
pub fn fits() -> Vec<Fit> {
    KNOWN
        .iter()
        .map(|&provider| {
            let mut why = Vec::new();
            for &delivery in DeliveryMode::Auto.candidates() {
                match probe(provider, delivery, None) {
                    Ok(info) => {
                        return Fit {
                            provider,
                            result: Ok(Usable {
                                delivery,
                                fabric: info.fabric_name(),
                                domain: info.domain_name(),
                                max_msg_size: info.max_msg_size(),
                                cq_data_size: info.cq_data_size(),
                                mr_mode: info.mr_mode(),
                                reads: info.caps() & READ_CAPS == READ_CAPS,
                            }),
                        }
                    }
                    Err(e) => why.push(format!("{}: {e}", delivery.as_str())),
                }
            }
            Fit {
                provider,
                result: Err(why.join("; ")),
            }
        })
        .collect()
}

/// The provider `--provider auto` picks among `fits`, if any.
pub fn auto_choice(fits: &[Fit]) -> Option<&Fit> {
    AUTO_ORDER.iter().find_map(|name| {
        fits.iter()
            .find(|f| f.provider == *name && f.result.is_ok())
    })
}
