//! A libfabric transport over `tcp;ofi_rxm` as the peer an engine writes
//! to, whose progress a test can hold (as a stalled process would: the
//! writes then stall in the sockets) and whose pool it reads to see what
//! landed.

use tensorferry::core::transport::{Region, Transport};
use tensorferry_fabric::{DeliveryMode, FabricConfig, FabricTransport, Provider};

/// The receiving transport, its whole pool registered for its life.
pub struct HeldReceiver {
    /// The transport (`hold_progress`, `session_id`).
    pub transport: FabricTransport,
    _region: Region,
}

impl HeldReceiver {
    /// A receiver with a pool of `len` bytes whose writes complete on
    /// delivery.
    pub fn new(len: usize) -> Self {
        let mut config = FabricConfig::new(Provider::Named("tcp;ofi_rxm".into()));
        config.delivery = DeliveryMode::Complete;
        let mut transport = FabricTransport::with_pool(&config, len).unwrap();
        let (base, pool_len) = (transport.pool_ptr(), transport.pool_len());
        // SAFETY: the transport's own pool, registered for its life.
        let region = unsafe { transport.register(base, pool_len) }.unwrap();
        Self {
            transport,
            _region: region,
        }
    }

    /// The pool's first byte, as a write's destination.
    pub fn base(&self) -> u64 {
        self.transport.pool_ptr() as u64
    }

    /// A copy of the pool.
    pub fn placed(&self) -> Vec<u8> {
        let t = &self.transport;
        // SAFETY: read while the receiver does not drive its queue, or
        // after it has placed what it will: the tests compare bytes only.
        unsafe { std::slice::from_raw_parts(t.pool_ptr(), t.pool_len()) }.to_vec()
    }
}
