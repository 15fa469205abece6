//! The queue pairs a target accepted from writers, each kept under who
//! asked for it ([`Requester`]: what the side-channel connection proves,
//! not what the request claims) and the writer session the request named.
//!
//! A target cannot tell a writer that died from one that is idle (nothing
//! reaches it either way), so it keeps a bounded number and drops the
//! oldest beyond that. The bounds are per requester first: one requester
//! keeps at most `per` queue pairs, its oldest going to make room for its
//! newest; and when all of them together reach `total`, the one dropped is
//! the oldest of the requester holding the most (which holds at least its
//! fair share, `total` over the requesters). A requester that floods the
//! side channel with requests thus only ever drops its own queue pairs.
//! Each request costs a scan of one requester's few entries and a few
//! ordered-map steps, never work in the number of writers.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;

use tensorferry_zmq::CurvePublicKey;

/// Who sent a connection request, as its side-channel connection proves
/// it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Requester {
    /// Under CURVE: the client key the connection authenticated with (the
    /// "User-Id" the side channel's ZAP handler gave it).
    Key(CurvePublicKey),
    /// Without CURVE, over TCP: the peer's IP address ("Peer-Address").
    /// Every process on that host shares it.
    Address(String),
    /// Without CURVE or an address (`ipc://`, where libzmq names every
    /// peer `localhost`): the connection's routing id. A writer opens a
    /// connection per request, so each request is a requester of its own:
    /// a writer that reconnects leaves its old queue pair to be dropped
    /// for room rather than replace it.
    Connection(Vec<u8>),
}

impl fmt::Display for Requester {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Key(k) => write!(f, "with key {k}"),
            Self::Address(a) => write!(f, "at {a}"),
            Self::Connection(id) => {
                f.write_str("on connection ")?;
                id.iter().try_for_each(|b| write!(f, "{b:02x}"))
            }
        }
    }
}

/// One accepted queue pair.
struct Accepted<Q> {
    /// When it was accepted (the book's count of acceptances).
    seq: u64,
    /// The writer session the request named.
    from: String,
    qp: Q,
}

/// A requester's queue pairs, oldest first (at most `per` of them, so
/// scans of it are short).
struct Holder<Q> {
    qps: VecDeque<Accepted<Q>>,
}

impl<Q> Holder<Q> {
    /// Its place in [`Inbound::rank`]: the most entries first, then the
    /// oldest (each entry's `seq` is unique, so the key is too).
    fn rank(&self) -> Option<(Reverse<usize>, u64)> {
        self.qps.front().map(|a| (Reverse(self.qps.len()), a.seq))
    }
}

/// A queue pair dropped (and so destroyed) to make room, for the caller
/// to log.
pub(crate) struct Dropped {
    /// Whose it was.
    pub who: Requester,
    /// The writer session it served.
    pub from: String,
}

/// The accepted queue pairs (see the module documentation).
pub(crate) struct Inbound<Q> {
    holders: HashMap<Requester, Holder<Q>>,
    /// Every requester holding any, by [`Holder::rank`]: the first holds
    /// the most.
    rank: BTreeMap<(Reverse<usize>, u64), Requester>,
    len: usize,
    next_seq: u64,
}

impl<Q> Default for Inbound<Q> {
    fn default() -> Self {
        Self {
            holders: HashMap::new(),
            rank: BTreeMap::new(),
            len: 0,
            next_seq: 0,
        }
    }
}

impl<Q> Inbound<Q> {
    /// Queue pairs kept, of every requester.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Queue pairs kept for `who`.
    pub(crate) fn count(&self, who: &Requester) -> usize {
        self.holders.get(who).map_or(0, |h| h.qps.len())
    }

    /// Changes `who`'s entries with `f`, keeping the rank in step (and
    /// forgetting a requester left with none).
    fn change<R>(&mut self, who: &Requester, f: impl FnOnce(&mut Holder<Q>) -> R) -> Option<R> {
        let holder = self.holders.get_mut(who)?;
        if let Some(k) = holder.rank() {
            self.rank.remove(&k);
        }
        let before = holder.qps.len();
        let out = f(holder);
        let after = holder.qps.len();
        self.len = self.len - before + after;
        match holder.rank() {
            Some(k) => {
                self.rank.insert(k, who.clone());
            }
            None => {
                self.holders.remove(who);
            }
        }
        Some(out)
    }

    /// Takes out `who`'s queue pair for the writer session `from`, if it
    /// has one: another requester's, whatever session it serves, is never
    /// touched.
    pub(crate) fn remove(&mut self, who: &Requester, from: &str) -> Option<Q> {
        self.change(who, |h| {
            let i = h.qps.iter().position(|a| a.from == from)?;
            h.qps.remove(i).map(|a| a.qp)
        })
        .flatten()
    }

    /// Drops `who`'s oldest queue pair.
    fn pop_oldest(&mut self, who: &Requester) -> Option<Dropped> {
        self.change(who, |h| h.qps.pop_front())
            .flatten()
            .map(|a| Dropped {
                who: who.clone(),
                from: a.from,
            })
    }

    /// Makes room for one more queue pair of `who`'s within `per` per
    /// requester and `total` in all (each at least 1): drops `who`'s own
    /// oldest while it holds `per`, then, while the whole is at `total`,
    /// the oldest of the requester holding the most, counting `who` as
    /// holding its next one already (so that a tie costs `who`, not the
    /// other). Returns what it dropped.
    pub(crate) fn make_room(&mut self, who: &Requester, per: usize, total: usize) -> Vec<Dropped> {
        let mut dropped = Vec::new();
        while self.count(who) >= per.max(1) {
            match self.pop_oldest(who) {
                Some(d) => dropped.push(d),
                None => break,
            }
        }
        while self.len >= total.max(1) {
            let Some((&(Reverse(most), _), first)) = self.rank.iter().next() else {
                break;
            };
            let victim = if self.count(who) >= most {
                who.clone()
            } else {
                first.clone()
            };
            match self.pop_oldest(&victim) {
                Some(d) => dropped.push(d),
                None => break,
            }
        }
        dropped
    }

    /// Keeps `qp`, accepted for `who` and the writer session `from`, as
    /// its newest (call [`remove`](Self::remove) and
    /// [`make_room`](Self::make_room) first).
    pub(crate) fn insert(&mut self, who: &Requester, from: String, qp: Q) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let entry = Accepted { seq, from, qp };
        if !self.holders.contains_key(who) {
            self.holders.insert(
                who.clone(),
                Holder {
                    qps: VecDeque::new(),
                },
            );
        }
        self.change(who, |h| h.qps.push_back(entry));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(a: &str) -> Requester {
        Requester::Address(a.into())
    }

    /// The sessions `who` keeps, oldest first.
    fn sessions(b: &Inbound<u32>, who: &Requester) -> Vec<String> {
        b.holders
            .get(who)
            .map(|h| h.qps.iter().map(|a| a.from.clone()).collect())
            .unwrap_or_default()
    }

    fn check_rank(b: &Inbound<u32>) {
        assert_eq!(b.rank.len(), b.holders.len());
        assert_eq!(
            b.len,
            b.holders.values().map(|h| h.qps.len()).sum::<usize>()
        );
        for (who, h) in &b.holders {
            assert_eq!(b.rank.get(&h.rank().unwrap()), Some(who));
        }
    }

    #[test]
    fn a_session_belongs_to_the_requester_that_asked() {
        let (a, x) = (addr("10.0.0.1"), addr("10.0.0.2"));
        let mut b = Inbound::default();
        b.insert(&a, "s".into(), 1);
        // Another requester naming the same session neither finds nor
        // replaces it.
        assert_eq!(b.remove(&x, "s"), None);
        b.insert(&x, "s".into(), 2);
        assert_eq!((b.count(&a), b.count(&x), b.len()), (1, 1, 2));
        // Its own requester does.
        assert_eq!(b.remove(&a, "s"), Some(1));
        assert_eq!(b.remove(&a, "s"), None);
        assert_eq!(sessions(&b, &x), ["s"]);
        check_rank(&b);
    }

    #[test]
    fn a_requester_at_its_cap_drops_its_own_oldest() {
        let (a, x) = (addr("a"), addr("x"));
        let mut b = Inbound::default();
        b.insert(&a, "a0".into(), 0);
        for i in 0..100u32 {
            let gone = b.make_room(&x, 3, 1000);
            assert!(gone.iter().all(|d| d.who == x), "{i}");
            b.insert(&x, format!("x{i}"), i);
            assert!(b.count(&x) <= 3);
        }
        assert_eq!(sessions(&b, &x), ["x97", "x98", "x99"]);
        assert_eq!(sessions(&b, &a), ["a0"]);
        check_rank(&b);
    }

    #[test]
    fn at_the_total_the_biggest_holder_pays() {
        let (a, c, x) = (addr("a"), addr("c"), addr("x"));
        let mut b = Inbound::default();
        b.insert(&a, "a0".into(), 0);
        b.insert(&c, "c0".into(), 0);
        b.insert(&c, "c1".into(), 1);
        // A flood from `x` under a total of 6 (and no cap of its own that
        // binds): it ends up with what the others leave.
        for i in 0..1000u32 {
            for d in b.make_room(&x, 100, 6) {
                assert_eq!(d.who, x, "{i}: {} dropped", d.from);
            }
            b.insert(&x, format!("x{i}"), i);
            check_rank(&b);
        }
        assert_eq!((b.count(&a), b.count(&c), b.count(&x)), (1, 2, 3));
        // A newcomer takes from the biggest holder, `x`; then `x` and `c`
        // hold 2 each, and the older entry of the two goes (`c`'s).
        let (n, m, o) = (addr("n"), addr("m"), addr("o"));
        let mut newcomer = |who: &Requester| {
            let gone = b.make_room(who, 100, 6);
            b.insert(who, "new".into(), 0);
            check_rank(&b);
            gone.into_iter()
                .map(|d| (d.who, d.from))
                .collect::<Vec<_>>()
        };
        assert_eq!(newcomer(&n), [(x.clone(), "x997".to_owned())]);
        assert_eq!(newcomer(&m), [(c.clone(), "c0".to_owned())]);
        assert_eq!(newcomer(&o), [(x.clone(), "x998".to_owned())]);
        assert_eq!(sessions(&b, &a), ["a0"]);
        // Everyone holds one: a requester that holds as many as the
        // biggest pays itself.
        let gone = b.make_room(&x, 100, 6);
        assert_eq!(
            (gone[0].who.clone(), gone[0].from.as_str()),
            (x.clone(), "x999")
        );
        check_rank(&b);
    }

    #[test]
    fn requesters_print_what_identifies_them() {
        assert_eq!(addr("10.0.0.1").to_string(), "at 10.0.0.1");
        assert_eq!(
            Requester::Connection(vec![0, 0x80, 0xff]).to_string(),
            "on connection 0080ff"
        );
        let k = CurvePublicKey([0; 32]);
        assert_eq!(Requester::Key(k).to_string(), format!("with key {k}"));
    }
}
