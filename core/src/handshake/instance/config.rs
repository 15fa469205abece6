//! What an instance is ([`InstanceIdentity`]: names and a pool its
//! channels made) and how it behaves ([`InstanceConfig`]: the settings,
//! with ferry's defaults and the policy for serving under sglang's head).

use core::time::Duration;

use crate::slots::BuddyConfig;

/// Which coordinator an instance serves under. ferry cannot tell from the
/// messages alone before it needs to (a head that never answers a
/// registration looks like a slow one), so it is a setting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Head {
    /// ferry's coordinator (or one that speaks ferry's additions): it
    /// answers registrations (`transfer_register_ack`), reads
    /// `transfer_alloc_reject`, and sends `transfer_abort`.
    #[default]
    Ferry,
    /// sglang 0.5.23's `DiffusionServer`: it never answers a registration
    /// (the instance is usable once it is sent, and sends it once per
    /// connection), knows no reject or abort (an ALLOC without room is
    /// held, then failed with `transfer_done`), and writes
    /// `transfer_staged` in its release's dialect.
    Sglang,
}

impl Head {
    /// The dialect messages to this head are written in.
    pub const fn dialect(self) -> crate::wire::Dialect {
        match self {
            Self::Ferry => crate::wire::Dialect::Seed,
            Self::Sglang => crate::wire::Dialect::Sglang,
        }
    }
}

/// sglang's head's only timeout by default (`--disagg-timeout`).
pub const SGLANG_HEAD_TIMEOUT: Duration = Duration::from_secs(600);

/// Receive slots an instance sets aside at start, for the coordinator's
/// fast path (no allocation round trip).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Prealloc {
    /// How many.
    pub count: usize,
    /// Bytes each (rounded up to the pool allocator's block).
    pub size: u64,
}

impl Prealloc {
    /// No preallocated slot.
    pub const NONE: Self = Self { count: 0, size: 0 };
}

/// What an instance is, as its control channel and data plane made it:
/// its names and its pool. Nothing here is a choice of policy; that is
/// [`InstanceConfig`].
#[derive(Clone, Copy, Debug)]
pub struct InstanceIdentity<'a> {
    /// The role it registers as (`encoder`, `denoiser`, ...).
    pub role: &'a str,
    /// Its data-plane session id (what peers address its pool by).
    pub session_id: &'a str,
    /// Its work endpoint (where the coordinator sends to it).
    pub work_endpoint: &'a str,
    /// Its coordinator's endpoint, as its control channel names the
    /// coordinator: a peer reported gone under this name is the
    /// coordinator ([`Instance::handle_gone`](super::Instance::handle_gone)).
    pub coordinator: &'a str,
    /// The pool's base address in this process.
    pub pool_ptr: u64,
    /// The pool's length in bytes.
    pub pool_size: u64,
    /// True if a write's completion means its bytes arrived (the data
    /// plane's `Capabilities::delivery_complete`); false where the data
    /// plane reports arrivals instead, and a transfer announced ready is
    /// handed to the application only once its write landed
    /// ([`InstanceConfig::landing_timeout`]).
    pub delivery_complete: bool,
    /// How long after it is posted a write into this pool may still land
    /// (the data plane's `Capabilities::write_lifetime`: its write timeout
    /// and the time to end a write). The senders of a deployment share
    /// the data plane and its settings, so this bounds their writes too:
    /// a slot a failed request's write may still land in sits out at
    /// least this plus [`InstanceConfig::message_delay`]
    /// ([`InstanceConfig::quarantine`], checked when the instance starts).
    pub write_lifetime: Duration,
}

/// How an instance behaves: its pool's grain, its preallocated slots, its
/// timeouts, and the coordinator it serves under. One value describes an
/// instance for every layer: the runtime, the command line and Python
/// extend it (with a role, an endpoint, table sizes), never copy it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InstanceConfig {
    /// The smallest slot of the pool allocator (a power of two).
    pub min_block: u64,
    /// Receive slots set aside at start.
    pub prealloc: Prealloc,
    /// Resend `transfer_register` this often until acknowledged.
    pub register_retry: Duration,
    /// Staged, waiting for `transfer_push`, before the slot is freed; must
    /// exceed the coordinator's queue plus alloc timeouts.
    pub staged_timeout: Duration,
    /// Slot reserved, waiting for `transfer_ready`, before it is freed;
    /// must exceed the coordinator's push timeout.
    pub reserved_timeout: Duration,
    /// How long a slot a write may still be landing in stays out of use.
    /// It must cover the data plane's write lifetime plus
    /// [`message_delay`](Self::message_delay)
    /// ([`quarantine_for`](Self::quarantine_for) sets it so, and the
    /// instance refuses to start where it does not).
    pub quarantine: Duration,
    /// The longest a control message may take to arrive. A
    /// `transfer_push` delivered this late is written this late, after its
    /// request may have failed; the quarantine covers it.
    pub message_delay: Duration,
    /// Where the data plane's completions do not mean delivery
    /// ([`InstanceIdentity::delivery_complete`] false): how long a transfer
    /// announced ready may wait for its write's arrival before it is
    /// refused (`transfer_done` with an error; its slot quarantined first,
    /// since the bytes may still come). Unused elsewhere.
    pub landing_timeout: Duration,
    /// What the coordinator is: its flow differs ([`Head`]).
    pub head: Head,
    /// Under [`Head::Sglang`]: how long a `transfer_alloc` that finds no
    /// room is held (and retried whenever room frees) before
    /// `transfer_done` with an error tells the head it failed. That head
    /// reads no `transfer_alloc_reject`.
    pub alloc_hold: Duration,
}

impl Default for InstanceConfig {
    fn default() -> Self {
        Self::FERRY
    }
}

impl InstanceConfig {
    /// ferry's defaults, under ferry's coordinator.
    pub const FERRY: Self = Self {
        min_block: 1 << 20,
        prealloc: Prealloc::NONE,
        register_retry: Duration::from_millis(200),
        staged_timeout: Duration::from_secs(60),
        reserved_timeout: Duration::from_secs(20),
        quarantine: Duration::from_secs(1),
        message_delay: Duration::from_secs(1),
        landing_timeout: Duration::from_secs(10),
        head: Head::Ferry,
        alloc_hold: Duration::from_secs(20),
    };

    /// This configuration for serving under sglang's head, whose only
    /// timeout (`--disagg-timeout`) is `head_timeout`
    /// ([`SGLANG_HEAD_TIMEOUT`] by default). That head tells no instance
    /// when it gives up, so nothing here gives up first: a staged slot
    /// waits for its push, a reserved one for its ready, and an ALLOC
    /// without room for room, as long as the head may still use them, and
    /// a little longer (a tenth, and a second, for the messages' delay).
    pub fn under_sglang(self, head_timeout: Duration) -> Self {
        let beyond = head_timeout
            .saturating_add(head_timeout / 10)
            .saturating_add(Duration::from_secs(1));
        Self {
            head: Head::Sglang,
            staged_timeout: beyond,
            reserved_timeout: beyond,
            alloc_hold: head_timeout,
            ..self
        }
    }

    /// The quarantine a data plane whose writes may land up to
    /// `write_lifetime` after they are posted needs: that, plus
    /// [`message_delay`](Self::message_delay).
    pub fn quarantine_needed(&self, write_lifetime: Duration) -> Duration {
        write_lifetime.saturating_add(self.message_delay)
    }

    /// This configuration with its quarantine raised, where it is shorter,
    /// to what a data plane whose writes may land up to `write_lifetime`
    /// after they are posted needs ([`quarantine_needed`](Self::quarantine_needed)):
    /// the runtime derives it so from the data plane it opened.
    pub fn quarantine_for(self, write_lifetime: Duration) -> Self {
        Self {
            quarantine: self.quarantine.max(self.quarantine_needed(write_lifetime)),
            ..self
        }
    }

    /// The shape of a pool of `pool_size` bytes under this configuration.
    pub const fn pool(&self, pool_size: u64) -> BuddyConfig {
        BuddyConfig {
            pool_size,
            min_block: self.min_block,
            pool_id: 0,
        }
    }
}
