//! The wait for a receiver: per sending role, the transfers that found no
//! receiver with room, oldest first, linked through the transfer table.
//! A transfer in a reject's backoff is not queued; its deadline heap entry
//! brings it back when the backoff ends.

use super::*;

impl<'s> Coordinator<'s> {
    /// Puts transfer `i` at the back of its role's queue (if it is not in
    /// it already).
    pub(super) fn enqueue(&mut self, i: usize) {
        let Some(t) = self.transfers.records.get(i) else {
            return;
        };
        let Some(&(_, tail)) = self
            .transfers
            .queues
            .get(t.sender_role)
            .filter(|_| !t.queued)
        else {
            return;
        };
        let role = t.sender_role;
        if let Some(mut t) = self.transfers.records.get_mut(i) {
            t.queued = true;
            t.prev = tail;
            t.next = NONE;
        }
        match self.transfers.records.get_mut(tail as usize) {
            Some(mut last) => last.next = i as u32,
            None => self.transfers.queues[role].0 = i as u32,
        }
        self.transfers.queues[role].1 = i as u32;
    }

    /// Takes transfer `i` out of its role's queue (if it is in it).
    pub(super) fn unqueue(&mut self, i: usize) {
        let Some(t) = self.transfers.records.get(i).filter(|t| t.queued) else {
            return;
        };
        let (role, prev, next) = (t.sender_role, t.prev, t.next);
        if let Some(mut t) = self.transfers.records.get_mut(i) {
            t.queued = false;
            t.prev = NONE;
            t.next = NONE;
        }
        let Some(q) = self.transfers.queues.get_mut(role) else {
            return;
        };
        if prev == NONE {
            q.0 = next;
        }
        if next == NONE {
            q.1 = prev;
        }
        if let Some(mut p) = self.transfers.records.get_mut(prev as usize) {
            p.next = next;
        }
        if let Some(mut n) = self.transfers.records.get_mut(next as usize) {
            n.prev = prev;
        }
    }

    /// Dispatches the queued transfers of every role, oldest first, as far
    /// as receivers have room.
    pub(super) fn dispatch_queued(&mut self, now: Instant) {
        for role in 0..self.role_count {
            self.dispatch_role(now, role);
        }
    }

    /// Dispatches the queued transfers staged by `role`, oldest first,
    /// until one finds no receiver with room: the rest wait for a release.
    pub(super) fn dispatch_role(&mut self, now: Instant, role: usize) {
        while let Some(&(head, _)) = self.transfers.queues.get(role).filter(|q| q.0 != NONE) {
            self.dispatch(now, head as usize);
            if self.transfers.queues[role].0 == head {
                return;
            }
        }
    }
}
