//! The raw baseline of `ferry bench --backend fabric`: the same writes
//! posted straight through the libfabric layer ([`crate::ofi`]), with no
//! handshake, no runtime and no slot accounting, the way `fi_rma_bw`
//! measures a provider. What ferry adds is the difference.
#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tensorferry_fabric_sys as sys;

use crate::error::{FabricError, OpKind};
use crate::mr::MrPolicy;
use crate::ofi::{Av, Cq, Domain, Endpoint, Fabric, Info, MemoryRegion};
use crate::provider::DeliveryMode;
use crate::transport::{find, FabricConfig};
use tensorferry_hostmem::HostPool;

/// One side: its objects, pool and registration.
struct Side {
    // Drop order: region, endpoint, then the rest.
    mr: MemoryRegion,
    endpoint: Arc<Endpoint>,
    cq: Arc<Cq>,
    _av: Arc<Av>,
    _domain: Arc<Domain>,
    pool: HostPool,
}

fn side(info: &Info, pool_len: usize) -> Result<Side, FabricError> {
    let mr_policy = MrPolicy::from_mode(info.mr_mode(), info.mr_key_size()).map_err(|what| {
        FabricError::Unsupported {
            provider: info.provider(),
            what,
        }
    })?;
    let key = mr_policy
        .requested_key()
        .map_err(|source| FabricError::Os {
            what: "draw a memory key",
            source,
        })?;
    let fabric = Fabric::open(info)?;
    let domain = Domain::open(&fabric, info)?;
    let cq = Cq::open(&domain, 1024)?;
    let av = Av::open(&domain)?;
    let endpoint = Endpoint::open(&domain, info, &cq, &av)?;
    let pool = HostPool::new(pool_len).map_err(|source| FabricError::Os {
        what: "map pool",
        source,
    })?;
    let ep = mr_policy.endpoint.then_some(&endpoint);
    // SAFETY: the pool is mapped until `Side` drops, after the region
    // (field order).
    let mr = unsafe { MemoryRegion::register(&domain, ep, pool.ptr(), pool.len(), key, false)? };
    Ok(Side {
        mr,
        endpoint,
        cq,
        _av: av,
        _domain: domain,
        pool,
    })
}

/// A sender and a receiver endpoint in this process.
pub struct RawPair {
    sender: Side,
    receiver: Arc<Side>,
    dest: sys::fi_addr_t,
    delivery: DeliveryMode,
    virt_addr: bool,
    contexts: Box<[UnsafeCell<sys::fi_context2>]>,
    provider: String,
}

/// One measurement.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RawRun {
    /// Writes completed.
    pub writes: u64,
    /// Seconds spent.
    pub seconds: f64,
    /// Bytes per second with `window` writes in flight.
    pub bytes_per_second: f64,
}

impl RawPair {
    /// Opens both sides on the provider `config` names, with pools of
    /// `pool_len` bytes.
    pub fn open(config: &FabricConfig, pool_len: usize) -> Result<Self, FabricError> {
        let (info, delivery) = find(config)?;
        let virt_addr = MrPolicy::from_mode(info.mr_mode(), info.mr_key_size())
            .map(|p| p.virt_addr)
            .unwrap_or(false);
        let sender = side(&info, pool_len)?;
        let receiver = Arc::new(side(&info, pool_len)?);
        let dest = sender
            ._av
            .insert(receiver.endpoint.name(), "baseline receiver")?;
        Ok(Self {
            sender,
            receiver,
            dest,
            delivery,
            virt_addr,
            contexts: (0..1024)
                .map(|_| UnsafeCell::new(sys::fi_context2::default()))
                .collect(),
            provider: info.provider(),
        })
    }

    /// The provider opened.
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// The delivery mode the writes use (as ferry would on this provider).
    pub fn delivery(&self) -> DeliveryMode {
        self.delivery
    }

    /// Writes of `size` bytes, `window` in flight, for about `time`: the
    /// receiver's queue is driven by a thread of its own, as ferry's is.
    /// A write counts when it is known delivered (its delivery-complete
    /// completion, or its notice at the receiver). Successive writes go
    /// from and to `stride`-spaced places in turn, as ferry's slots do, so
    /// that neither side gains from bytes left in the cache.
    pub fn run(
        &mut self,
        size: usize,
        stride: usize,
        window: usize,
        time: Duration,
    ) -> Result<RawRun, FabricError> {
        let size = size
            .min(self.sender.pool.len())
            .min(self.receiver.pool.len());
        let stride = stride.max(size).max(1);
        // As many places as both pools hold.
        let places = (self.sender.pool.len().min(self.receiver.pool.len()) / stride).max(1);
        let window = window.clamp(1, self.contexts.len());
        let stop = Arc::new(AtomicBool::new(false));
        let notices = Arc::new(AtomicU64::new(0));
        let rx = {
            let (receiver, stop, notices) = (
                Arc::clone(&self.receiver),
                Arc::clone(&stop),
                Arc::clone(&notices),
            );
            std::thread::Builder::new()
                .name("raw-receiver".into())
                .spawn(move || {
                    let mut buf = [sys::fi_cq_data_entry::default(); 64];
                    while !stop.load(Ordering::Relaxed) {
                        match receiver.cq.read(&mut buf) {
                            Ok(0) => std::hint::spin_loop(),
                            Ok(n) => {
                                let k = buf[..n]
                                    .iter()
                                    .filter(|e| e.flags & u64::from(sys::FI_REMOTE_CQ_DATA) != 0)
                                    .count();
                                notices.fetch_add(k as u64, Ordering::Release);
                            }
                            Err(_) => {
                                let _ = receiver.cq.read_err();
                            }
                        }
                    }
                })
                .map_err(|source| FabricError::Os {
                    what: "start the baseline's receiver thread",
                    source,
                })?
        };
        let result = self.drive(size, stride, places, window, time, &notices);
        stop.store(true, Ordering::Relaxed);
        let _ = rx.join();
        result
    }

    fn drive(
        &mut self,
        size: usize,
        stride: usize,
        places: usize,
        window: usize,
        time: Duration,
        notices: &AtomicU64,
    ) -> Result<RawRun, FabricError> {
        let notify = self.delivery == DeliveryMode::Notify;
        let mut flags = u64::from(sys::FI_COMPLETION);
        if notify {
            flags |= u64::from(sys::FI_REMOTE_CQ_DATA);
        } else {
            flags |= u64::from(sys::FI_DELIVERY_COMPLETE);
        }
        let base = self.receiver.pool.ptr() as u64;
        let mut free: Vec<usize> = (0..window).collect();
        let (mut posted, mut sent_done) = (0u64, 0u64);
        let mut buf = [sys::fi_cq_data_entry::default(); 64];
        let start = Instant::now();
        let mut stop_posting = false;
        loop {
            let delivered = if notify {
                notices.load(Ordering::Acquire)
            } else {
                sent_done
            };
            if !stop_posting && start.elapsed() >= time {
                stop_posting = true;
            }
            if stop_posting && delivered >= posted && sent_done >= posted {
                let seconds = start.elapsed().as_secs_f64();
                return Ok(RawRun {
                    writes: posted,
                    seconds,
                    bytes_per_second: posted as f64 * size as f64 / seconds,
                });
            }
            // In flight until delivered (notices may lag completions).
            let in_flight = posted - delivered.min(posted);
            if !stop_posting && in_flight < window as u64 {
                if let Some(ctx) = free.pop() {
                    let off = (posted as usize % places) * stride;
                    let remote = MrPolicy::remote_addr(self.virt_addr, base, base + off as u64);
                    // SAFETY: source and destination lie in the two
                    // registered pools (`places` strides of at least `size`
                    // fit both); the context is reserved until its
                    // completion is read below.
                    let ret = unsafe {
                        self.sender.endpoint.write(
                            self.sender.pool.ptr().add(off),
                            size,
                            self.sender.mr.desc(),
                            self.dest,
                            remote,
                            self.receiver.mr.key(),
                            1,
                            flags,
                            self.contexts[ctx].get().cast(),
                        )
                    };
                    if ret == -(sys::FI_EAGAIN as isize) {
                        free.push(ctx);
                    } else {
                        crate::ofi::check(
                            crate::error::Call::WriteMsg,
                            ret,
                            Some("baseline receiver"),
                        )?;
                        posted += 1;
                        continue;
                    }
                }
            }
            match self.sender.cq.read(&mut buf) {
                Ok(n) => {
                    let base = self.contexts.as_ptr() as usize;
                    let size_of = std::mem::size_of::<sys::fi_context2>();
                    for e in &buf[..n] {
                        if let Some(off) = (e.op_context as usize).checked_sub(base) {
                            free.push(off / size_of);
                            sent_done += 1;
                        }
                    }
                }
                Err(errno) => {
                    let text = self
                        .sender
                        .cq
                        .read_err()
                        .map_or_else(|| crate::ofi::strerror(errno), |(_, t)| t);
                    return Err(FabricError::Completion {
                        op: OpKind::Write,
                        peer: "baseline receiver".into(),
                        errno,
                        prov_errno: 0,
                        text,
                    });
                }
            }
        }
    }
}
