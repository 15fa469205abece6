//! Encoding a [`Msg`] exactly as the seed's `encode_transfer_msg` does:
//! `json.dumps(asdict(msg), separators=(",", ":"))`.

use super::manifest::{Manifest, Shape, TensorEntry};
use super::msg::*;
use super::slots::SlotList;
use crate::json::{write_canonical, write_u64, BufferTooSmall, JsonStr, RawJson, Sink};

/// How nested raw JSON (`manifest`, `scalar_fields`, `preallocated_slots`
/// as received) is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Style {
    /// Byte for byte as received: what a relay should send.
    #[default]
    Verbatim,
    /// Re-emitted as CPython would after `json.loads`: no whitespace,
    /// `ensure_ascii` escapes, `repr` floats. What the seed would send for
    /// the same values.
    Canonical,
}

/// Whose encoder's bytes to match where the seed and sglang's release
/// differ. Decoding accepts both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Dialect {
    /// The seed's `protocol.py` (and ferry's extensions, written only when
    /// they differ from their defaults).
    #[default]
    Seed,
    /// sglang 0.5.23's `transport/protocol.py`: `transfer_staged` always
    /// carries `scalar_fields` (a `default_factory` field there).
    Sglang,
}

/// `,"name":` as one literal, so that writing a key is one fixed-size copy.
macro_rules! key {
    ($name:literal) => {
        concat!(",\"", $name, "\":").as_bytes()
    };
}

/// `{"msg_type":"<name>"`: the start of every payload of type `ty`, as
/// one literal.
fn head(ty: MsgType) -> &'static [u8] {
    macro_rules! head {
        ($name:literal) => {
            concat!("{\"msg_type\":\"", $name, "\"").as_bytes()
        };
    }
    match ty {
        MsgType::Register => head!("transfer_register"),
        MsgType::RegisterAck => head!("transfer_register_ack"),
        MsgType::Staged => head!("transfer_staged"),
        MsgType::Alloc => head!("transfer_alloc"),
        MsgType::Allocated => head!("transfer_allocated"),
        MsgType::AllocReject => head!("transfer_alloc_reject"),
        MsgType::Push => head!("transfer_push"),
        MsgType::Pushed => head!("transfer_pushed"),
        MsgType::Ready => head!("transfer_ready"),
        MsgType::Done => head!("transfer_done"),
        MsgType::Abort => head!("transfer_abort"),
        MsgType::Deregister => head!("transfer_deregister"),
    }
}

struct Enc<'s, 'b> {
    out: &'s mut Sink<'b>,
    style: Style,
    dialect: Dialect,
}

impl Enc<'_, '_> {
    #[inline]
    fn key(&mut self, key: &'static [u8]) {
        self.out.put(key);
    }

    #[inline]
    fn str(&mut self, name: &'static [u8], v: JsonStr<'_>) {
        self.key(name);
        v.write_json(self.out);
    }

    #[inline]
    fn opt_str(&mut self, name: &'static [u8], v: Option<JsonStr<'_>>) {
        self.key(name);
        match v {
            Some(s) => s.write_json(self.out),
            None => self.out.put(b"null"),
        }
    }

    #[inline]
    fn u64(&mut self, name: &'static [u8], v: u64) {
        self.key(name);
        write_u64(self.out, v);
    }

    #[inline]
    fn bool(&mut self, name: &'static [u8], v: bool) {
        self.key(name);
        self.out.put(if v { b"true" } else { b"false" });
    }

    fn raw(&mut self, v: RawJson<'_>) {
        match self.style {
            Style::Verbatim => self.out.put(v.as_str().as_bytes()),
            Style::Canonical => {
                let mark = self.out.len();
                // A RawJson is validated on construction, so this cannot
                // fail; if it ever did, the verbatim text is still valid.
                if write_canonical(self.out, v).is_err() {
                    self.out.truncate(mark);
                    self.out.put(v.as_str().as_bytes());
                }
            }
        }
    }

    fn manifest(&mut self, m: &Manifest<'_>) {
        self.key(key!("manifest"));
        self.manifest_value(m);
    }

    fn manifest_value(&mut self, m: &Manifest<'_>) {
        match *m {
            Manifest::Raw(raw) => self.raw(raw),
            Manifest::Entries(entries) => self.entries(entries),
        }
    }

    /// `{"field":[entry,...],...}`: a field's entries form one list, fields
    /// in order of first appearance (what Python's `setdefault(...).append`
    /// builds).
    fn entries(&mut self, entries: &[TensorEntry<'_>]) {
        self.out.byte(b'{');
        let mut first_field = true;
        for (i, e) in entries.iter().enumerate() {
            let seen = i > 0
                && (entries[i - 1].field == e.field
                    || entries[..i - 1].iter().any(|p| p.field == e.field));
            if seen {
                continue;
            }
            if !first_field {
                self.out.byte(b',');
            }
            first_field = false;
            e.field.write_json(self.out);
            self.out.put(b":[");
            let mut first = true;
            for t in entries[i..].iter().filter(|t| t.field == e.field) {
                if !first {
                    self.out.byte(b',');
                }
                first = false;
                self.entry(t);
            }
            self.out.byte(b']');
        }
        self.out.byte(b'}');
    }

    fn entry(&mut self, t: &TensorEntry<'_>) {
        self.out.put(b"{\"offset\":");
        write_u64(self.out, t.offset);
        self.out.put(b",\"shape\":[");
        match t.shape {
            Shape::Dims(dims) => self.dims(dims.iter().copied()),
            Shape::Raw(_) => self.dims(t.shape.dims()),
        }
        self.out.put(b"],\"dtype\":");
        t.dtype.write_json(self.out);
        if let Some(li) = t.list_index {
            self.out.put(b",\"list_index\":");
            write_u64(self.out, li);
        }
        self.out.byte(b'}');
    }

    #[inline]
    fn dims(&mut self, dims: impl Iterator<Item = u64>) {
        for (i, d) in dims.enumerate() {
            if i > 0 {
                self.out.byte(b',');
            }
            write_u64(self.out, d);
        }
    }

    fn slots(&mut self, s: &SlotList<'_>) {
        self.key(key!("preallocated_slots"));
        match *s {
            SlotList::Raw(raw) => self.raw(raw),
            SlotList::Slots(slots) => {
                self.out.byte(b'[');
                for (i, s) in slots.iter().enumerate() {
                    if i > 0 {
                        self.out.byte(b',');
                    }
                    self.out.put(b"{\"offset\":");
                    write_u64(self.out, s.offset);
                    self.out.put(b",\"size\":");
                    write_u64(self.out, s.size);
                    self.out.put(b",\"slot_id\":");
                    write_u64(self.out, s.slot_id);
                    self.out.put(b",\"addr\":");
                    write_u64(self.out, s.addr);
                    self.out.byte(b'}');
                }
                self.out.byte(b']');
            }
        }
    }

    #[inline]
    /// `v` with `"_prealloc_slot_id": id` as its last member, as Python's
    /// `d["_prealloc_slot_id"] = id` appends it (a key already there is
    /// shadowed: `json.loads` keeps the last).
    fn object_with_slot_id(&mut self, name: &'static [u8], v: RawJson<'_>, id: u64) {
        let text = v.as_str().trim_ascii().as_bytes();
        if text.first() != Some(&b'{') {
            // Not an object (a caller's value): nothing to add a key to.
            return self.object(name, v);
        }
        self.key(name);
        // A validated object: `{`, members, `}`, with whitespace around.
        let inner = text.get(1..text.len().saturating_sub(1)).unwrap_or(&[]);
        let empty = inner.trim_ascii().is_empty();
        match self.style {
            Style::Verbatim => self.out.put(&text[..text.len().saturating_sub(1)]),
            Style::Canonical => {
                // Canonical output ends in the object's `}`, nothing after.
                self.raw(v);
                let len = self.out.len();
                self.out.truncate(len.saturating_sub(1));
            }
        }
        if !empty {
            self.out.byte(b',');
        }
        self.out.put(b"\"_prealloc_slot_id\":");
        write_u64(self.out, id);
        self.out.byte(b'}');
    }

    fn object(&mut self, name: &'static [u8], v: RawJson<'_>) {
        self.key(name);
        self.raw(v);
    }
}

impl Manifest<'_> {
    /// Writes the manifest alone, as the JSON object it is on the wire.
    pub fn write_json(&self, out: &mut Sink<'_>, style: Style) {
        Enc {
            out,
            style,
            dialect: Dialect::Seed,
        }
        .manifest_value(self);
    }
}

impl Msg<'_> {
    /// Writes the JSON payload (frame 1) into `out`.
    pub fn write(&self, out: &mut Sink<'_>, style: Style) {
        self.write_dialect(out, style, Dialect::Seed);
    }

    /// Writes the JSON payload (frame 1) into `out` as `dialect`'s encoder
    /// would.
    pub fn write_dialect(&self, out: &mut Sink<'_>, style: Style, dialect: Dialect) {
        out.put(head(self.msg_type()));
        let mut e = Enc {
            out,
            style,
            dialect,
        };
        match self {
            Msg::Register(m) => {
                e.str(key!("role"), m.role);
                e.str(key!("session_id"), m.session_id);
                e.u64(key!("pool_ptr"), m.pool_ptr);
                e.u64(key!("pool_size"), m.pool_size);
                e.str(key!("work_endpoint"), m.work_endpoint);
                e.slots(&m.preallocated_slots);
                if e.dialect == Dialect::Seed && m.write_lifetime_ms != 0 {
                    e.u64(key!("write_lifetime_ms"), m.write_lifetime_ms);
                }
            }
            Msg::RegisterAck(m) => {
                e.str(key!("session_id"), m.session_id);
                e.str(key!("role"), m.role);
                e.bool(key!("accepted"), m.accepted);
                e.opt_str(key!("error"), m.error);
            }
            Msg::Staged(m) => {
                e.str(key!("request_id"), m.request_id);
                e.u64(key!("data_size"), m.data_size);
                e.manifest(&m.manifest);
                e.str(key!("session_id"), m.session_id);
                e.u64(key!("pool_ptr"), m.pool_ptr);
                e.u64(key!("slot_offset"), m.slot_offset);
                if e.dialect == Dialect::Sglang || !m.scalar_fields.is_empty_container() {
                    e.object(key!("scalar_fields"), m.scalar_fields);
                }
            }
            Msg::Alloc(m) => {
                e.str(key!("request_id"), m.request_id);
                e.u64(key!("data_size"), m.data_size);
                e.str(key!("source_role"), m.source_role);
                if !m.receiver_session_id.is_empty() {
                    e.str(key!("receiver_session_id"), m.receiver_session_id);
                }
            }
            Msg::Allocated(m) => {
                e.str(key!("request_id"), m.request_id);
                e.str(key!("session_id"), m.session_id);
                e.u64(key!("pool_ptr"), m.pool_ptr);
                e.u64(key!("slot_offset"), m.slot_offset);
                e.u64(key!("slot_size"), m.slot_size);
            }
            Msg::AllocReject(m) => {
                e.str(key!("request_id"), m.request_id);
                e.str(key!("session_id"), m.session_id);
                e.bool(key!("retryable"), m.retryable);
                e.str(key!("reason"), m.reason);
            }
            Msg::Push(m) => {
                e.str(key!("request_id"), m.request_id);
                e.str(key!("dest_session_id"), m.dest_session_id);
                e.u64(key!("dest_addr"), m.dest_addr);
                e.u64(key!("transfer_size"), m.transfer_size);
            }
            Msg::Pushed(m) => {
                e.str(key!("request_id"), m.request_id);
                if !m.success {
                    e.bool(key!("success"), m.success);
                }
                if m.error.is_some() {
                    e.opt_str(key!("error"), m.error);
                }
            }
            Msg::Ready(m) => {
                e.str(key!("request_id"), m.request_id);
                e.manifest(&m.manifest);
                e.u64(key!("slot_offset"), m.slot_offset);
                match m.prealloc_slot_id {
                    None => e.object(key!("scalar_fields"), m.scalar_fields),
                    Some(id) => e.object_with_slot_id(key!("scalar_fields"), m.scalar_fields, id),
                }
                if !m.dest_session_id.is_empty() {
                    e.str(key!("dest_session_id"), m.dest_session_id);
                }
            }
            Msg::Done(m) if m.staged_for_decoder => {
                // sglang's forward, in the order its denoiser writes it; it
                // has no `error` (a failed forward is a plain done).
                e.str(key!("request_id"), m.request_id);
                if m.error.is_some() {
                    e.opt_str(key!("error"), m.error);
                }
                e.bool(key!("staged_for_decoder"), true);
                e.str(key!("session_id"), m.session_id);
                e.u64(key!("pool_ptr"), m.pool_ptr);
                e.u64(key!("slot_offset"), m.slot_offset);
                e.u64(key!("data_size"), m.data_size);
                e.manifest(&m.manifest);
                e.object(key!("scalar_fields"), m.scalar_fields);
            }
            Msg::Done(m) => {
                e.str(key!("request_id"), m.request_id);
                e.opt_str(key!("error"), m.error);
            }
            Msg::Abort(m) => {
                e.str(key!("request_id"), m.request_id);
                e.str(key!("reason"), m.reason);
                if !m.source_role.is_empty() {
                    e.str(key!("source_role"), m.source_role);
                }
            }
            Msg::Deregister(m) => {
                e.str(key!("session_id"), m.session_id);
                e.bool(key!("draining"), m.draining);
                e.str(key!("reason"), m.reason);
            }
        }
        e.out.byte(b'}');
    }

    /// Encodes the payload into `buf` with nested raw JSON passed through
    /// unchanged; returns its length, or the size needed.
    pub fn encode(&self, buf: &mut [u8]) -> Result<usize, BufferTooSmall> {
        let mut out = Sink::new(buf);
        self.write(&mut out, Style::Verbatim);
        out.finish()
    }

    /// Encodes the payload as the seed's Python would, nested values
    /// included (see [`Style::Canonical`]).
    pub fn encode_canonical(&self, buf: &mut [u8]) -> Result<usize, BufferTooSmall> {
        let mut out = Sink::new(buf);
        self.write(&mut out, Style::Canonical);
        out.finish()
    }

    /// The payload size [`encode`](Self::encode) (or, with
    /// [`Style::Canonical`], [`encode_canonical`](Self::encode_canonical)) needs.
    pub fn encoded_len(&self, style: Style) -> usize {
        let mut out = Sink::new(&mut []);
        self.write(&mut out, style);
        out.len()
    }
}
