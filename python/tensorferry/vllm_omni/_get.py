"""One payload a ``FerryConnector`` is receiving (``Get``), and what the
metadata its ``get`` was given names (``named``): whom to claim it from,
and, with ferry's metadata, the region and its stamp to read at once."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Optional, Tuple, Union

import tensorferry
from tensorferry.vllm_omni import _control as control
from tensorferry.vllm_omni._pool import Pool
from tensorferry.vllm_omni import _stamp as stamp
from tensorferry.vllm_omni._sockets import Link, tcp_endpoint

#: The sender a get whose metadata names none claims from: its host and
#: claim port (the connector's ``sender_host``, ``sender_zmq_port``).
Sender = Tuple[Optional[str], Optional[int]]

logger = logging.getLogger("tensorferry.vllm_omni")


@dataclass
class Named:
    """What a get's metadata names. ``endpoint``: the sender's claim
    socket; ``expected``: the payload's size, if given; ``source_key``:
    the sender's CURVE key, if given; ``ferry``: whether it is ferry's
    metadata; ``early``: the put's region (as the grant it would be);
    ``stamp_at`` and ``token``: its stamp (``_stamp``), if given."""

    endpoint: str
    expected: Optional[int] = None
    source_key: Any = None
    ferry: bool = False
    early: Optional[control.Granted] = None
    stamp_at: int = 0
    token: Optional[int] = None


def named(metadata: Any, raw_key: str, sender: Sender) -> Union[Named, str, None]:
    """What ``metadata`` (``get``'s, for ``raw_key``; vLLM-omni may nest it
    under the key) names: a ``Named``, else why it names nothing usable (a
    sentence), or None when it names no sender and none is configured
    (``sender``): nothing to claim from, nothing there. The grant and
    stamp are taken only when well-formed: without them the claim's answer
    decides."""
    meta = metadata
    if isinstance(meta, dict) and raw_key in meta and isinstance(meta[raw_key], dict):
        meta = meta[raw_key]
    if not (isinstance(meta, dict) and meta.get("source_host") and meta.get("source_port")):
        if sender[0] and sender[1]:
            return Named(tcp_endpoint(sender[0], sender[1]))
        return None
    if "ferry" in meta and meta["ferry"] != control.METADATA_FORMAT:
        return f"metadata of format {meta['ferry']!r}, not {control.METADATA_FORMAT}"
    try:
        found = Named(tcp_endpoint(str(meta["source_host"]), int(meta["source_port"])))
        if meta.get("data_size") is not None:
            found.expected = int(meta["data_size"])
    except (TypeError, ValueError) as e:
        return f"metadata {meta!r} does not name a sender: {e}"
    found.ferry = "ferry" in meta
    found.source_key = meta.get("source_key")
    grant = meta.get("grant")
    if isinstance(grant, list) and len(grant) == 6 and all(isinstance(v, int) for v in grant[1:]):
        # As the claim's answer would name it (the claim id is the get's).
        found.early = control.Granted(0, str(grant[0]), *grant[1:])
        mark = meta.get("stamp")
        if (
            isinstance(mark, list)
            and len(mark) == 2
            and all(isinstance(v, int) for v in mark)
            and mark[0] == stamp.stamp_at(found.early.size)
            and 0 < mark[1] < 1 << 64
        ):
            found.stamp_at, found.token = mark
    return found


@dataclass
class Get:
    """A payload this connector is receiving.

    ``state``: ``claiming`` (the claim is not answered; a read from the
    put's metadata may run already, and, once it is final, the read of its
    stamp), ``reading`` (granted, and the read running is of what was
    granted), ``discarding`` (a read runs whose bytes are not to be used:
    once it is final its region is freed, and ``regrant``, if any, read
    instead)."""

    key: str
    raw_key: str
    endpoint: str
    # Under CURVE, the sender's public key (Z85) the claim goes to: the
    # DEALER is a CURVE client of that key, so every answer comes from it.
    server_key: Optional[str]
    claim: int
    sent: float
    window: float
    expected: Optional[int]
    state: str = "claiming"
    offset: Optional[int] = None
    size: int = 0
    # The bytes of the region at ``offset``: ``size``, or more for the
    # stamp read after the payload.
    span: int = 0
    header: int = 0
    data: int = 0
    transfer: Optional["tensorferry.Transfer"] = None
    read_of: Optional[Tuple[str, int, int]] = None
    regrant: Optional[control.Granted] = None
    touched: float = 0.0
    early_of: Optional[Tuple[str, int]] = None
    # The engine session and address ferry's metadata named: a grant that
    # names another is not used.
    region: Optional[Tuple[str, int]] = None
    # The put's stamp: where it is, the token it says while the payload is
    # the put's, and the read of it (once the payload's read is done).
    stamp_at: int = 0
    token: Optional[int] = None
    stamp_read: Optional["tensorferry.Transfer"] = None
    # Whether this get read the put's region before its claim's answer,
    # and whether its claim went (a read its stamp shows good within the
    # call that posted it needs none).
    read_early: bool = False
    claimed: bool = False

    @property
    def link(self) -> Link:
        """The DEALER the claim went out on: its endpoint and server key."""
        return self.endpoint, self.server_key

    @property
    def running(self) -> bool:
        """Whether a read of it (the payload's or the stamp's) may still
        write into its region."""
        return any(t is not None and t.state == "pending" for t in (self.transfer, self.stamp_read))

    def stamp_says(self, value: int) -> bool:
        """Whether the stamp ``value`` shows the payload read was the
        put's: its token (unclaimed), or this get's claim's."""
        return self.token is not None and value in (self.token, stamp.claimed(self.token, self.claim))


def stamp_verdict(g: Get, engine: "tensorferry.TransferEngine", pool: Pool) -> Optional[bool]:
    """Whether the early read of ``g`` (done) read the put's bytes, by the
    stamp read after it (posted here, through ``engine`` into ``g``'s
    region of ``pool``); None while that is not known."""
    transfer = g.transfer
    if transfer is None or transfer.state != "done" or g.offset is None or g.read_of is None:
        return None
    at = g.offset + g.stamp_at
    if g.stamp_read is None:
        session, addr, _ = g.read_of
        remaining = g.sent + g.window - time.monotonic()
        try:
            g.stamp_read = engine.post_read(
                session, [pool.base + at], [addr + g.stamp_at], [stamp.STAMP_BYTES], timeout=max(remaining, 0.001)
            )
        except Exception:  # a FerryError, or a closed engine: the claim decides
            return False
    state = g.stamp_read.state
    if state == "pending":
        return None
    g.stamp_read = None
    return state == "done" and g.stamp_says(stamp.read(pool.array, at))


def tell_taken(g: Get, engine: Optional["tensorferry.TransferEngine"]) -> bool:
    """Tells ``g``'s sender its put was read (``taken``) as a notification
    to the engine its metadata names, which this thread writes itself (a
    send on the claim's socket wakes ZeroMQ's I/O thread, which would
    take a core from the caller); False where that engine cannot be
    reached."""
    if g.region is None or engine is None:
        return False
    try:
        engine.notify(g.region[0], control.encode_note(control.TAKEN, control.Taken(g.key, g.token or 0)))
        return True
    except tensorferry.FerryError as e:
        logger.debug("FerryConnector: taken of %s by notification failed (%s); sent on the claim socket", g.key, e)
        return False


def failure(transfer: "tensorferry.Transfer") -> str:
    """Why ``transfer``, final, failed."""
    try:
        transfer.wait(0)
    except tensorferry.FerryError as e:
        return str(e)
    return "unknown"
