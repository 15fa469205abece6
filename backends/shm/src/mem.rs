//! An in-process control channel, for tests that run every role as threads
//! of one process: endpoints are names in a shared hub.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_int;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tensorferry_core::transport::{
    ChannelEvent, ControlChannel, ControlRecv, ControlSend, FaultKind, Incoming, WAKE_POLL,
};

use crate::error::MemError;

/// One queued message: sender, frame 0, frame 1.
type Queued = (String, Vec<u8>, Vec<u8>);

/// Each endpoint's queue.
type Queues = HashMap<String, VecDeque<Queued>>;

/// Where in-process channels find each other.
#[derive(Debug, Default, Clone)]
pub struct MemHub {
    inner: Arc<(Mutex<Queues>, Condvar)>,
}

impl MemHub {
    /// An empty hub.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Queues> {
        self.inner.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// An in-process channel bound to an endpoint of a hub.
#[derive(Debug)]
pub struct MemChannel {
    hub: MemHub,
    me: String,
}

impl MemChannel {
    /// Binds `endpoint` in `hub`.
    pub fn bind(hub: &MemHub, endpoint: &str) -> Result<Self, MemError> {
        let mut queues = hub.lock();
        if queues.contains_key(endpoint) {
            return Err(MemError::InUse {
                endpoint: endpoint.to_owned(),
            });
        }
        queues.insert(endpoint.to_owned(), VecDeque::new());
        Ok(Self {
            hub: hub.clone(),
            me: endpoint.to_owned(),
        })
    }
}

impl ControlChannel for MemChannel {
    type Sender = MemSender;
    type Receiver = MemReceiver;

    fn split(self) -> (MemSender, MemReceiver) {
        (
            MemSender {
                hub: self.hub.clone(),
                me: self.me.clone(),
            },
            MemReceiver {
                hub: self.hub,
                me: self.me,
                from: String::new(),
            },
        )
    }
}

/// The sending side of a [`MemChannel`].
#[derive(Debug)]
pub struct MemSender {
    hub: MemHub,
    me: String,
}

impl ControlSend for MemSender {
    type Error = MemError;

    fn fault_kind(error: &MemError) -> FaultKind {
        error.kind()
    }

    fn send(&mut self, to: &str, parts: &[&[u8]]) -> Result<(), MemError> {
        let &[magic, payload] = parts else {
            return Err(MemError::Frames {
                to: to.to_owned(),
                count: parts.len(),
            });
        };
        let mut queues = self.hub.lock();
        let q = queues.get_mut(to).ok_or_else(|| MemError::PeerGone {
            endpoint: to.to_owned(),
        })?;
        q.push_back((self.me.clone(), magic.to_vec(), payload.to_vec()));
        drop(queues);
        self.hub.inner.1.notify_all();
        Ok(())
    }
}

/// The receiving side of a [`MemChannel`]; dropping it unbinds the
/// endpoint.
#[derive(Debug)]
pub struct MemReceiver {
    hub: MemHub,
    me: String,
    from: String,
}

impl ControlRecv for MemReceiver {
    type Error = MemError;

    fn fault_kind(error: &MemError) -> FaultKind {
        error.kind()
    }

    fn local_endpoint(&self) -> &str {
        &self.me
    }

    fn recv<'b>(
        &'b mut self,
        buf: &'b mut [u8],
        wait: Duration,
        wake: Option<c_int>,
    ) -> Result<Option<ChannelEvent<'b>>, MemError> {
        // A condition variable cannot watch a descriptor.
        let wait = if wake.is_some() {
            wait.min(WAKE_POLL)
        } else {
            wait
        };
        let deadline = Instant::now() + wait;
        let mut queues = self.hub.lock();
        let (from, magic, payload) = loop {
            if let Some(m) = queues.get_mut(&self.me).and_then(VecDeque::pop_front) {
                break m;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            queues = self
                .hub
                .inner
                .1
                .wait_timeout(queues, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        };
        drop(queues);
        let len = magic.len() + payload.len();
        if len > buf.len() {
            return Err(MemError::TooLarge {
                from,
                len,
                cap: buf.len(),
            });
        }
        buf[..magic.len()].copy_from_slice(&magic);
        buf[magic.len()..len].copy_from_slice(&payload);
        self.from = from;
        let (m, p) = buf[..len].split_at(magic.len());
        Ok(Some(ChannelEvent::Message(Incoming {
            from: &self.from,
            via: &self.me,
            // In-process: no one to authenticate.
            user: "",
            magic: m,
            payload: p,
        })))
    }
}

impl Drop for MemReceiver {
    fn drop(&mut self) {
        self.hub.lock().remove(&self.me);
    }
}
