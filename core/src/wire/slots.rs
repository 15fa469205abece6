//! `preallocated_slots` of a registration: receive slots an instance set
//! aside in advance, `[{"offset", "size", "slot_id", "addr"}, ...]`.

use super::error::{DecodeError, DecodeErrorKind as K};
use super::value::{for_each_member, read_val, resolve_key, shift, Val};
use crate::json::{JsonErrorKind, JsonType, Lexer, RawJson};

/// One preallocated receive slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PreallocatedSlot {
    /// Offset of the slot in the owner's pool.
    pub offset: u64,
    /// Size of the slot in bytes.
    pub size: u64,
    /// The owner's name for the slot.
    pub slot_id: u64,
    /// Address of the slot in the owner's address space (`pool_ptr + offset`).
    pub addr: u64,
}

/// A list of preallocated slots: typed to encode, or raw JSON as received.
#[derive(Clone, Copy, Debug)]
pub enum SlotList<'a> {
    /// Slots given by the application.
    Slots(&'a [PreallocatedSlot]),
    /// A validated JSON array, as received.
    Raw(RawJson<'a>),
}

impl Default for SlotList<'_> {
    fn default() -> Self {
        SlotList::Slots(&[])
    }
}

eq_by_items!(SlotList<'_>);

impl<'a> SlotList<'a> {
    /// The slots in order, each checked on the way.
    pub fn iter(&self) -> SlotListIter<'a> {
        match *self {
            SlotList::Slots(s) => SlotListIter(SlotInner::Slots(s.iter())),
            SlotList::Raw(raw) => SlotListIter(SlotInner::Raw {
                lx: Lexer::new(raw.as_str()),
                first: true,
                done: false,
            }),
        }
    }

    /// Checks every slot and returns how many there are.
    pub fn validate(&self) -> Result<usize, DecodeError> {
        self.iter().try_fold(0, |n, s| s.map(|_| n + 1))
    }
}

/// Iterator over a [`SlotList`].
pub struct SlotListIter<'a>(SlotInner<'a>);

enum SlotInner<'a> {
    Slots(core::slice::Iter<'a, PreallocatedSlot>),
    Raw {
        lx: Lexer<'a>,
        first: bool,
        done: bool,
    },
}

const FIELD: &str = "preallocated_slots";

impl Iterator for SlotListIter<'_> {
    type Item = Result<PreallocatedSlot, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        let (lx, first, done) = match &mut self.0 {
            SlotInner::Slots(it) => return it.next().copied().map(Ok),
            SlotInner::Raw { lx, first, done } => (lx, first, done),
        };
        if *done {
            return None;
        }
        let r = next_raw(lx, *first);
        *first = false;
        if !matches!(r, Some(Ok(_))) {
            *done = true;
        }
        r
    }
}

fn next_raw(lx: &mut Lexer<'_>, first: bool) -> Option<Result<PreallocatedSlot, DecodeError>> {
    let j = |e| DecodeError::json(e, Some(FIELD));
    if first {
        if let Err(e) = lx.expect(b'[', "'['") {
            return Some(Err(j(e)));
        }
    }
    lx.skip_ws();
    match lx.peek() {
        Some(b']') => return None,
        Some(b',') if !first => lx.bump(),
        _ if first => {}
        _ => return Some(Err(j(lx.err(JsonErrorKind::TrailingBytes)))),
    }
    let v = match read_val(lx) {
        Ok(v) => v,
        Err(e) => return Some(Err(j(e))),
    };
    let Val::Raw(raw, JsonType::Object) = v.val else {
        return Some(Err(DecodeError::new(
            K::WrongType {
                expected: "slot object",
                found: v.json_type(),
            },
            Some(FIELD),
            v.at,
        )));
    };
    Some(parse_slot(raw).map_err(|e| shift(e, v.at)))
}

fn parse_slot(raw: RawJson<'_>) -> Result<PreallocatedSlot, DecodeError> {
    let mut f = [None::<u64>; 4];
    const NAMES: [&str; 4] = ["offset", "size", "slot_id", "addr"];
    const FIELDS: [&str; 4] = [
        "preallocated_slots.offset",
        "preallocated_slots.size",
        "preallocated_slots.slot_id",
        "preallocated_slots.addr",
    ];
    for_each_member(raw, FIELD, |key, v| {
        if let Some(i) = resolve_key(key, &NAMES).and_then(|n| NAMES.iter().position(|&m| m == n)) {
            f[i] = Some(v.u64(FIELDS[i])?);
        }
        Ok(())
    })?;
    let get = |i: usize| f[i].ok_or(DecodeError::new(K::MissingField, Some(FIELDS[i]), 0));
    Ok(PreallocatedSlot {
        offset: get(0)?,
        size: get(1)?,
        slot_id: get(2)?,
        addr: get(3)?,
    })
}
