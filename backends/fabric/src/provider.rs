//! Which provider to open and what to ask it for: the `fi_getinfo` hints as
//! plain data, so that they can be checked without a device.

use std::fmt;
use std::str::FromStr;

use tensorferry_fabric_sys as sys;

/// Providers `auto` tries, fastest first. `shm` is left out: it reaches only
/// processes on the same host, so picking it silently would break the first
/// peer on another host. Name it to use it.
pub const AUTO_ORDER: [&str; 3] = ["efa", "verbs;ofi_rxm", "tcp;ofi_rxm"];

/// A provider to open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Provider {
    /// The fastest present of [`AUTO_ORDER`].
    Auto,
    /// One provider (or core;utility stack) by its libfabric name:
    /// `efa`, `verbs;ofi_rxm`, `tcp;ofi_rxm`, `shm`.
    Named(String),
}

impl Provider {
    /// The names to try, in order.
    pub fn candidates(&self) -> Vec<&str> {
        match self {
            Self::Auto => AUTO_ORDER.to_vec(),
            Self::Named(n) => vec![n.as_str()],
        }
    }
}

impl FromStr for Provider {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() {
            return Err("empty provider name".into());
        }
        if s.contains(':') || s.contains(char::is_whitespace) {
            return Err(format!("provider name {s:?} may not hold ':' or spaces"));
        }
        Ok(if s == "auto" {
            Self::Auto
        } else {
            Self::Named(s.to_owned())
        })
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Named(n) => f.write_str(n),
        }
    }
}

/// How a write is known to have reached the target's memory before the
/// receiver is told it is ready. (A mode, named so as not to be read as the
/// runtime's `Delivery`, a received transfer.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeliveryMode {
    /// `FI_DELIVERY_COMPLETE` where the provider offers it, remote CQ data
    /// otherwise.
    Auto,
    /// Every write is posted with `FI_DELIVERY_COMPLETE`: its completion
    /// means the bytes are visible at the target.
    Complete,
    /// Every chunk carries remote CQ data, which the receiver counts before
    /// it accepts `transfer_ready`.
    Notify,
}

impl DeliveryMode {
    /// The modes to try, in order.
    pub fn candidates(self) -> &'static [DeliveryMode] {
        match self {
            Self::Auto => &[Self::Complete, Self::Notify],
            Self::Complete => &[Self::Complete],
            Self::Notify => &[Self::Notify],
        }
    }

    /// Its name, as the CLI takes it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Complete => "delivery-complete",
            Self::Notify => "remote-cq-data",
        }
    }
}

impl FromStr for DeliveryMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "delivery-complete" | "complete" => Ok(Self::Complete),
            "remote-cq-data" | "notify" => Ok(Self::Notify),
            _ => Err(format!(
                "unknown delivery mode {s:?} (auto, delivery-complete, remote-cq-data)"
            )),
        }
    }
}

/// The memory-registration modes ferry handles; a provider may require any
/// subset of them.
pub const MR_MODES: u32 = sys::FI_MR_LOCAL
    | sys::FI_MR_VIRT_ADDR
    | sys::FI_MR_ALLOCATED
    | sys::FI_MR_PROV_KEY
    | sys::FI_MR_ENDPOINT;

/// The capabilities one-sided reads need: `FI_READ` to post them,
/// `FI_REMOTE_READ` to be read from. Asked for with the write
/// capabilities; a provider that lacks them is opened for writes alone
/// ([`Hints::without_reads`]).
pub const READ_CAPS: u64 = (sys::FI_READ | sys::FI_REMOTE_READ) as u64;

/// The `fi_getinfo` hints for one provider and delivery mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hints {
    /// `info->caps`.
    pub caps: u64,
    /// `info->mode`: the modes ferry supports (a context per operation).
    pub mode: u64,
    /// `ep_attr->type`.
    pub ep_type: sys::fi_ep_type,
    /// `domain_attr->mr_mode`.
    pub mr_mode: i32,
    /// `domain_attr->threading`.
    pub threading: sys::fi_threading,
    /// `domain_attr->av_type`.
    pub av_type: sys::fi_av_type,
    /// `tx_attr->op_flags`.
    pub tx_op_flags: u64,
    /// `fabric_attr->prov_name`.
    pub provider: String,
}

impl Hints {
    /// What production systems ask for: a reliable datagram endpoint with
    /// messages and RMA writes and reads both ways, every registration mode ferry
    /// handles, thread safety (the progress thread reads the queue while
    /// the runtime posts), and for [`DeliveryMode::Complete`] delivery-complete
    /// as the default completion level.
    pub fn new(provider: &str, delivery: DeliveryMode) -> Self {
        Self {
            caps: u64::from(sys::FI_MSG | sys::FI_RMA | sys::FI_WRITE | sys::FI_REMOTE_WRITE)
                | READ_CAPS,
            mode: sys::FI_CONTEXT | sys::FI_CONTEXT2,
            ep_type: sys::fi_ep_type_FI_EP_RDM,
            mr_mode: MR_MODES as i32,
            threading: sys::fi_threading_FI_THREAD_SAFE,
            av_type: sys::fi_av_type_FI_AV_TABLE,
            tx_op_flags: match delivery {
                DeliveryMode::Complete => u64::from(sys::FI_DELIVERY_COMPLETE),
                DeliveryMode::Auto | DeliveryMode::Notify => 0,
            },
            provider: provider.to_owned(),
        }
    }

    /// The same hints without [`READ_CAPS`]: what is asked of a provider
    /// that offers no reads, so that its writes still work.
    pub fn without_reads(mut self) -> Self {
        self.caps &= !READ_CAPS;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_names_parse_and_auto_prefers_fast_fabrics() {
        assert_eq!("auto".parse::<Provider>(), Ok(Provider::Auto));
        assert_eq!(
            "tcp;ofi_rxm".parse::<Provider>(),
            Ok(Provider::Named("tcp;ofi_rxm".into()))
        );
        assert!("".parse::<Provider>().is_err());
        assert!("tcp:x".parse::<Provider>().is_err());
        assert_eq!(
            Provider::Auto.candidates(),
            ["efa", "verbs;ofi_rxm", "tcp;ofi_rxm"]
        );
        assert_eq!(Provider::Named("shm".into()).candidates(), ["shm"]);
        assert_eq!(Provider::Named("shm".into()).to_string(), "shm");
    }

    #[test]
    fn delivery_modes_parse_and_auto_tries_delivery_complete_first() {
        assert_eq!("auto".parse(), Ok(DeliveryMode::Auto));
        assert_eq!("notify".parse(), Ok(DeliveryMode::Notify));
        assert_eq!("delivery-complete".parse(), Ok(DeliveryMode::Complete));
        assert!("x".parse::<DeliveryMode>().is_err());
        assert_eq!(
            DeliveryMode::Auto.candidates(),
            [DeliveryMode::Complete, DeliveryMode::Notify]
        );
    }

    #[test]
    fn hints_ask_for_rdm_rma_thread_safety_and_every_handled_mr_mode() {
        let h = Hints::new("efa", DeliveryMode::Complete);
        assert_eq!(h.ep_type, sys::fi_ep_type_FI_EP_RDM);
        assert_ne!(h.caps & u64::from(sys::FI_RMA), 0);
        assert_ne!(h.caps & u64::from(sys::FI_MSG), 0);
        assert_ne!(h.caps & u64::from(sys::FI_REMOTE_WRITE), 0);
        assert_eq!(h.caps & READ_CAPS, READ_CAPS);
        let w = h.clone().without_reads();
        assert_eq!(w.caps & READ_CAPS, 0);
        assert_eq!(w.caps | READ_CAPS, h.caps);
        assert_eq!(h.threading, sys::fi_threading_FI_THREAD_SAFE);
        assert_eq!(h.tx_op_flags, u64::from(sys::FI_DELIVERY_COMPLETE));
        for bit in [
            sys::FI_MR_LOCAL,
            sys::FI_MR_VIRT_ADDR,
            sys::FI_MR_ALLOCATED,
            sys::FI_MR_PROV_KEY,
            sys::FI_MR_ENDPOINT,
        ] {
            assert_ne!(h.mr_mode & bit as i32, 0, "mr_mode bit {bit:#x}");
        }
        // Raw keys (FI_MR_RAW) need fi_mr_raw_attr exchange; not offered.
        assert_eq!(h.mr_mode & sys::FI_MR_RAW as i32, 0);
        assert_ne!(h.mode & sys::FI_CONTEXT2, 0);
        assert_eq!(Hints::new("shm", DeliveryMode::Notify).tx_op_flags, 0);
    }
}
