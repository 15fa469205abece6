//! Finding what a message names: a member by its peer or by a reference
//! that outlives its replacement, a transfer by request id and the side
//! its sender is on, and the checks a reply's sender and phase must pass
//! before it changes anything.

use super::*;

impl<'s> Coordinator<'s> {
    /// True unless `from` is a member registered as someone other than
    /// `user`.
    pub(super) fn spoken_for_by(&self, from: PeerId, user: &str) -> bool {
        self.member_of_peer(from)
            .and_then(|i| self.registry.members.get(i))
            .is_none_or(|m| m.user.as_str() == user)
    }

    pub(super) fn member_of_peer(&self, peer: PeerId) -> Option<usize> {
        member_of(&self.registry.members, peer)
    }

    /// The member `from` is, if it speaks for `session`: a message from no
    /// member is [`Ignored::NotRegistered`], one naming another session
    /// [`Ignored::WrongPeer`].
    pub(super) fn member_in_session(
        &self,
        from: PeerId,
        session: JsonStr<'_>,
    ) -> Result<(MemberRef, &Member), Ignored> {
        let index = self.member_of_peer(from).ok_or(Ignored::NotRegistered)?;
        let member = self
            .registry
            .members
            .get(index)
            .ok_or(Ignored::NotRegistered)?;
        if !member.session.eq_json(session) {
            return Err(Ignored::WrongPeer);
        }
        let r = MemberRef {
            index,
            epoch: member.epoch,
        };
        Ok((r, member))
    }

    pub(super) fn member(&self, r: MemberRef) -> Option<&Member> {
        self.registry
            .members
            .get(r.index)
            .filter(|m| m.epoch == r.epoch)
    }

    pub(super) fn member_mut(
        &mut self,
        r: MemberRef,
    ) -> Option<crate::handshake::tables::table::RecordMut<'_, 's, Member>> {
        self.registry
            .members
            .get_mut(r.index)
            .filter(|m| m.epoch == r.epoch)
    }

    /// The hash a request id is indexed by, if it can be held at all.
    pub(super) fn id_hash(&self, id: JsonStr<'_>) -> Option<u64> {
        self.transfers
            .records
            .key()
            .json::<{ crate::handshake::ID_LEN }>(id, NS_ID)
    }

    /// The transfer of request `id` whose sender or receiver (as
    /// `from_sender` says) is `from`. One request has a transfer per leg,
    /// and an instance takes part in a leg on one side only, so at most one
    /// matches; failing that, any transfer of `id` (to say why it is not
    /// `from`'s).
    pub(super) fn transfer_of(
        &self,
        id: JsonStr<'_>,
        from: PeerId,
        from_sender: bool,
    ) -> Option<usize> {
        let hash = self.id_hash(id)?;
        let from_peer = |t: &Transfer| {
            let who = if from_sender {
                Some(t.sender)
            } else {
                t.receiver
            };
            who.and_then(|r| self.member(r))
                .is_some_and(|m| m.peer == from)
        };
        self.transfers
            .records
            .find(hash, |t| t.id.eq_json(id) && from_peer(t))
            .or_else(|| self.transfers.records.find(hash, |t| t.id.eq_json(id)))
    }

    /// True if request `id` is one the coordinator carries through the
    /// pipeline: its leg before `role`'s is live or just ended, so a leg
    /// staged by `role` is its next (a forward). A draining coordinator
    /// still takes those, so that what is in flight reaches its end.
    pub(super) fn carries(&self, id: JsonStr<'_>, role: usize) -> bool {
        let Some(prev) = role.checked_sub(1) else {
            return false;
        };
        let live = self.id_hash(id).is_some_and(|h| {
            self.transfers
                .records
                .find(h, |t| t.id.eq_json(id) && t.sender_role == prev)
                .is_some()
        });
        live || self.remains.finished.contains(id, Leg::FromRole(prev))
    }

    /// The transfer `id` if it is in `phase` and `from` is its receiver (or
    /// sender, if `from_sender`).
    pub(super) fn expect(
        &self,
        id: JsonStr<'_>,
        from: PeerId,
        from_sender: bool,
        phase: fn(&Phase) -> bool,
    ) -> Result<usize, Ignored> {
        let i = self
            .transfer_of(id, from, from_sender)
            .ok_or(Ignored::UnknownRequest)?;
        let t = self
            .transfers
            .records
            .get(i)
            .ok_or(Ignored::UnknownRequest)?;
        let who = if from_sender {
            Some(t.sender)
        } else {
            t.receiver
        };
        let member = who.and_then(|r| self.member(r)).ok_or(Ignored::WrongPeer)?;
        if member.peer != from {
            return Err(Ignored::WrongPeer);
        }
        if !phase(&t.phase) {
            return Err(Ignored::WrongState);
        }
        Ok(i)
    }
}

/// The place of `peer`'s member record, if it is a member: a free function
/// over the table, so that a caller holding another of the machine's
/// tables mutably can ask too.
pub(super) fn member_of(members: &Table<'_, Member>, peer: PeerId) -> Option<usize> {
    let hash = members.key().number(u64::from(peer.0), NS_PEER);
    members.find(hash, |m| m.peer == peer)
}
