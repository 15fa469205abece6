//! Who a message came from: the coordinator's table of peers by endpoint,
//! and the judgement of a message's sender on channels that cannot name
//! it. The caller's channel reports endpoints; the machine names them.
//!
//! Peer `n` is the endpoint at place `n - 1`, found by a keyed hash index.
//! Members and strangers (endpoints whose messages were answered or
//! refused) share the table; when it is full, a stranger's place is given
//! to the newcomer, chosen by a clock hand that passes over members, so
//! that a flood of registrations under made-up endpoints costs a bounded
//! table and O(1) amortised work per message. A place's generation moves
//! on when it changes hands, and a message queued for its former holder is
//! dropped rather than sent to the new one.

use super::*;
use crate::transport::Incoming;
use crate::wire::{decode, result_as_done, DecodeError, TRANSFER_MAGIC};

/// What hashes an endpoint in the peer index.
const NS_PEER_ENDPOINT: u64 = 4;

/// One place of the peer table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerSlot {
    endpoint: Name,
    /// Moves on each time the place changes hands.
    generation: u32,
}

impl PeerSlot {
    /// An unused place.
    pub const EMPTY: Self = Self {
        endpoint: Name::EMPTY,
        generation: 0,
    };
}

/// The peer table.
#[derive(Debug)]
pub(super) struct Peers<'s> {
    slots: ManagedSlice<'s, PeerSlot>,
    index: Index<'s>,
    /// Places handed out so far (they are reused once all are).
    used: usize,
    /// The next place considered for reuse.
    hand: usize,
}

impl<'s> Peers<'s> {
    pub(super) fn new(mut slots: ManagedSlice<'s, PeerSlot>, index: ManagedSlice<'s, u64>) -> Self {
        slots.iter_mut().for_each(|s| *s = PeerSlot::EMPTY);
        Self {
            slots,
            index: Index::new(index),
            used: 0,
            hand: 0,
        }
    }

    pub(super) fn probes(&self) -> u64 {
        self.index.probes()
    }

    /// The place of `peer`, if the table named it.
    fn place(&self, peer: PeerId) -> Option<usize> {
        let p = (peer.0 as usize).checked_sub(1)?;
        (p < self.used).then_some(p)
    }

    /// The endpoint of `peer` (`None` for a place left unnamed).
    pub(super) fn endpoint(&self, peer: PeerId) -> Option<&str> {
        self.place(peer)
            .map(|p| self.slots[p].endpoint.as_str())
            .filter(|e| !e.is_empty())
    }

    /// The generation of `peer`'s place (0 for peers the table never
    /// named: callers that name peers themselves).
    pub(super) fn generation(&self, peer: PeerId) -> u32 {
        self.place(peer).map_or(0, |p| self.slots[p].generation)
    }

    /// The peer the table names `endpoint`, if any.
    pub(super) fn find(&self, key: &HashKey, endpoint: &str) -> Option<PeerId> {
        let hash = key.bytes(endpoint.as_bytes(), NS_PEER_ENDPOINT);
        let p = self
            .index
            .find(hash, |p| self.slots[p].endpoint.as_str() == endpoint)?;
        Some(PeerId(p as u32 + 1))
    }

    /// The peer of `endpoint`, named on first sight; with the table full,
    /// a place no member holds (`is_member` says which do) changes hands.
    pub(super) fn intern(
        &mut self,
        key: &HashKey,
        endpoint: &str,
        is_member: impl Fn(PeerId) -> bool,
    ) -> Result<PeerId, Ignored> {
        if let Some(p) = self.find(key, endpoint) {
            return Ok(p);
        }
        let name = Name::new(endpoint).map_err(|_| Ignored::TooLong("sender endpoint"))?;
        let hash = key.bytes(endpoint.as_bytes(), NS_PEER_ENDPOINT);
        let cap = self.slots.len();
        let place = if self.used < cap {
            self.used += 1;
            self.used - 1
        } else {
            // Members hold at most a quarter of the places (the table is
            // sized so), so the hand finds a stranger's within a few steps
            // on average, and within one turn at worst.
            let mut found = None;
            for _ in 0..cap {
                let p = self.hand;
                self.hand = (self.hand + 1) % cap.max(1);
                if !is_member(PeerId(p as u32 + 1)) {
                    found = Some(p);
                    break;
                }
            }
            let p = found.ok_or(Ignored::PeerTableFull)?;
            let old = self.slots[p].endpoint;
            self.index
                .remove(key.bytes(old.as_bytes(), NS_PEER_ENDPOINT), p);
            p
        };
        // The place changes hands: what was queued for its holder is not
        // sent to the next.
        let slot = &mut self.slots[place];
        slot.endpoint = Name::EMPTY;
        slot.generation = slot.generation.wrapping_add(1);
        if self.index.insert(hash, place).is_err() {
            // Unreachable with a secret key; the place stays unnamed.
            return Err(Ignored::PeerTableFull);
        }
        self.slots[place].endpoint = name;
        Ok(PeerId(place as u32 + 1))
    }
}

/// Why a message from the control channel was not acted on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unhandled {
    /// A transfer message that does not decode.
    Malformed(DecodeError),
    /// Neither a transfer message nor a role's result: an application's
    /// own message.
    Foreign,
    /// The channel did not name the sender, and nothing in the message or
    /// the endpoint it arrived at tells who sent it.
    UnknownSender,
    /// From `peer`, and ignored for `why`; nothing changed.
    Ignored {
        /// The sender (`PeerId(0)` if it could not be named).
        peer: PeerId,
        /// Why.
        why: Ignored,
    },
}

impl fmt::Display for Unhandled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Malformed(e) => write!(f, "undecodable transfer message: {e}"),
            Self::Foreign => f.write_str("neither a transfer message nor a result"),
            Self::UnknownSender => f.write_str("from no sender this coordinator can name"),
            Self::Ignored { why, .. } => write!(f, "ignored: {why}"),
        }
    }
}

impl core::error::Error for Unhandled {}

impl Coordinator<'_> {
    /// Says that messages arriving at the local `endpoint` come from
    /// instances of `role`: for channels that cannot name a message's
    /// sender (a ZeroMQ PULL socket cannot), where each role reports to an
    /// endpoint of its own, as under sglang's head.
    pub fn set_role_endpoint(&mut self, role: &str, endpoint: &str) -> Result<(), ConfigError> {
        let role = self.role_named(role)?;
        self.role_endpoints[role] =
            Some(Name::new(endpoint).map_err(|_| ConfigError::EndpointTooLong)?);
        Ok(())
    }

    /// The endpoint of `peer`, as the control channel named it (or as its
    /// registration did, on channels that name no sender): where a
    /// [`Transmit`] to it goes. `None` for peers the caller named itself
    /// ([`handle`](Self::handle)).
    pub fn endpoint_of(&self, peer: PeerId) -> Option<&str> {
        self.peers.endpoint(peer)
    }

    /// The peer the coordinator names `endpoint`, if it named it.
    pub fn peer_at(&self, endpoint: &str) -> Option<PeerId> {
        self.peers.find(self.registry.members.key(), endpoint)
    }

    /// Handles a message as the control channel delivered it: decodes it,
    /// reads a role's result (sglang's decoder ends a request with its
    /// output, a tensor multipart, not with `transfer_done`) as the
    /// `transfer_done` it amounts to, names its sender (by the endpoint
    /// the channel reports, or, where it reports none, by a registration's
    /// work endpoint, the message's content and the endpoint it arrived at
    /// ([`set_role_endpoint`](Self::set_role_endpoint))), and handles it.
    /// `Ok`: the sender. `Err` says why nothing was done.
    pub fn handle_incoming(
        &mut self,
        now: Instant,
        msg: &Incoming<'_>,
    ) -> Result<PeerId, Unhandled> {
        let decoded = if msg.magic == TRANSFER_MAGIC {
            decode(msg.payload).map_err(Unhandled::Malformed)?
        } else {
            Msg::Done(result_as_done(msg.magic).ok_or(Unhandled::Foreign)?)
        };
        let peer = self
            .sender(msg, &decoded)
            .map_err(|why| Unhandled::Ignored {
                peer: PeerId(0),
                why,
            })?
            .ok_or(Unhandled::UnknownSender)?;
        if msg.user.len() > crate::handshake::NAME_LEN {
            return Err(Unhandled::Ignored {
                peer,
                why: Ignored::TooLong("user"),
            });
        }
        self.handle_as(Arrived { now, from: peer }, msg.user, &decoded)
            .map_err(|why| Unhandled::Ignored { peer, why })?;
        Ok(peer)
    }

    /// A peer's connection closed (the channel reports the endpoint): its
    /// transfers fail at once, everyone involved told. True if it was a
    /// member.
    pub fn handle_gone(&mut self, now: Instant, endpoint: &str) -> bool {
        let Some(peer) = self.peer_at(endpoint) else {
            return false;
        };
        let member = self.member_of_peer(peer).is_some();
        self.peer_lost(now, peer);
        member
    }

    /// Who sent `msg`.
    fn sender(&mut self, msg: &Incoming<'_>, decoded: &Msg<'_>) -> Result<Option<PeerId>, Ignored> {
        let mut name = [0u8; NAME_LEN];
        let endpoint = match (decoded, msg.from.is_empty()) {
            (_, false) => msg.from,
            // A channel that cannot name senders: a registration names
            // the endpoint to answer at, and the rest is judged by content
            // and the endpoint it arrived at.
            (Msg::Register(r), true) => r
                .work_endpoint
                .unescape_into(&mut name)
                .map_err(|_| Ignored::TooLong("work_endpoint"))?,
            (_, true) => {
                let role = self
                    .role_endpoints
                    .iter()
                    .position(|e| e.as_ref().is_some_and(|e| e.as_str() == msg.via));
                return Ok(self.sender_among(decoded, role, msg.user));
            }
        };
        let Self {
            peers, registry, ..
        } = self;
        let members = &registry.members;
        let key = *members.key();
        let is_member = |p: PeerId| member_of(members, p).is_some();
        peers.intern(&key, endpoint, is_member).map(Some)
    }
}
