"""The connector's control messages: a receiver claims a payload before it
reads it, and says when it is done.

Why a claim: the receiver reads the sender's region one-sidedly, and the
sender must not reuse that region while a read of it may run. A claim
grants one receiver the region for a window it names; the sender keeps the
region until the receiver says ``done`` or ``release``, or the window ends.
The receiver's read has that window as its deadline (from before it sent
the claim), and a read that did not end by then has failed (ferry's engine
returns it only once no byte of it moves), so a read that succeeded ran
while the region was still the payload's.

``put``'s metadata names the region too (``grant``), so that the receiver
reads while its claim travels; it uses those bytes only if the grant
names the same put. And the put's stamp (``stamp``, see ``_stamp``): a
receiver whose read of the region, and then of the stamp, is final
within the call that posted it (the local plane) and finds the put's
token sends no claim at all, only ``taken`` with the token, which frees
the payload unless a claim holds it; otherwise it claims as above.

Whose claim: the connection's authenticated identity, never a name in a
message. Under CURVE that is the key the claimant connected with (the
"User-Id" libzmq attaches to its messages), else the connection itself.
A claim held by one owner is ``busy`` to any other, whatever claim id it
sends; ``done`` and ``release`` from anyone but the owner are ignored;
the owner asking again for its claim gets the same grant with the same
end (a window is never lengthened). Who may connect at all is ferry's
guard's to say (``_zap``), before a message is read.

What a receiver believes: a grant names an engine and an address to read.
The receiver reads it only if it names the engine and address the put's
metadata named (when it names them), and, under CURVE, an engine whose
key (in its session id) is the sender key it connected to.

Frames over ZeroMQ (the receiver's DEALER to the sender's ROUTER): a verb,
then a msgpack array. Everything that arrives is checked: a frame that
does not decode as its verb's message is dropped."""

from __future__ import annotations

from typing import List, Optional, Tuple, Type, Union

import msgspec

#: The protocol of the metadata ``put`` returns; a receiver refuses others.
METADATA_FORMAT = 1
#: The longest claim window a sender grants, and a receiver asks for (ms).
MAX_WINDOW_MS = 600_000
#: A sender keeps a claimed region this long past the claim's window, for a
#: done that is on its way (s).
CLAIM_GRACE = 1.0

CLAIM = b"claim"
GRANTED = b"granted"
MISSING = b"missing"
BUSY = b"busy"
DONE = b"done"
RELEASE = b"release"
TAKEN = b"taken"


class Claim(msgspec.Struct, array_like=True, frozen=True):
    """Receiver to sender: grant me the payload ``key`` for ``window_ms``."""

    key: str
    claim: int
    window_ms: int


class Granted(msgspec.Struct, array_like=True, frozen=True):
    """Sender to receiver: read ``size`` bytes at ``addr`` of the engine
    ``session`` (a header of ``header`` bytes, leaves from ``data``), the
    payload of the sender's ``gen``-th put."""

    claim: int
    session: str
    addr: int
    size: int
    header: int
    data: int
    gen: int


class Refused(msgspec.Struct, array_like=True, frozen=True):
    """Sender to receiver, as ``missing`` (no payload has that key) or
    ``busy`` (another receiver holds it)."""

    claim: int


class Ended(msgspec.Struct, array_like=True, frozen=True):
    """Receiver to sender, as ``done`` (read: free it) or ``release`` (not
    read: keep it for another claim)."""

    key: str
    claim: int


class Taken(msgspec.Struct, array_like=True, frozen=True):
    """Receiver to sender, without a claim: the put of ``key`` whose token
    is ``token`` was read, and its stamp showed it was the put's: free it
    (unless a claim holds it)."""

    key: str
    token: int


Message = Union[Claim, Granted, Refused, Ended, Taken]

_TYPES: dict = {
    CLAIM: Claim,
    GRANTED: Granted,
    MISSING: Refused,
    BUSY: Refused,
    DONE: Ended,
    RELEASE: Ended,
    TAKEN: Taken,
}
_encoder = msgspec.msgpack.Encoder()


def encode(verb: bytes, message: Message) -> List[bytes]:
    """The frames of ``message`` under ``verb``."""
    return [verb, _encoder.encode(message)]


def decode(frames: List[bytes]) -> Optional[Tuple[bytes, Message]]:
    """``(verb, message)`` of two frames, or None for anything else."""
    if len(frames) != 2:
        return None
    verb, body = frames
    kind: Optional[Type[Message]] = _TYPES.get(bytes(verb))
    if kind is None:
        return None
    try:
        return bytes(verb), msgspec.msgpack.decode(body, type=kind)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def encode_note(verb: bytes, message: Message) -> bytes:
    """``message`` under ``verb`` as one engine notification (the verb, a
    space, the body): ``taken`` travels so, from the receiving thread."""
    return verb + b" " + _encoder.encode(message)


def decode_note(note: bytes) -> Optional[Tuple[bytes, Message]]:
    """``(verb, message)`` of an engine notification ``encode_note`` made,
    or None for anything else."""
    verb, space, body = note.partition(b" ")
    return decode([verb, body]) if space else None
