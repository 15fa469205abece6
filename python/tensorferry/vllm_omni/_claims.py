"""The sender's side of the claim protocol (``_control``): the payloads a
``FerryConnector`` holds for receivers, the claims on them, and the claim
socket's thread that answers them.

``Sends`` keeps the books: each payload ``put`` placed (``Held``), by
key, until the receiver that claimed it says ``done``, it is not claimed
within its lease, or a cleanup retires it (a retired payload a receiver
holds a claim on stays until that claim ends); and who holds each claim
(``owner_of``: the connection's authenticated identity), until when.
``serve`` runs the claim socket (``_sockets.claim_router``): it answers
every message with ``Sends.answer``, and expires what ran out."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Set, Tuple

import zmq

import tensorferry
from tensorferry.vllm_omni import _control as control
from tensorferry.vllm_omni import _stamp as stamp
from tensorferry.vllm_omni._metrics import Metrics
from tensorferry.vllm_omni._pool import Pool
from tensorferry.vllm_omni._sockets import send_quiet

logger = logging.getLogger("tensorferry.vllm_omni")

# Claims ended by a connection that does not own them are logged this many
# times, then only counted.
_FOREIGN_LOGGED = 10


@dataclass
class Held:
    """A payload ``put`` placed in a region, until a receiver read it."""

    key: str
    raw_key: str
    offset: int
    plan_size: int
    header: int
    data: int
    expires: float
    # The put's stamp (``_stamp``): its token, and the region's bytes (the
    # payload's and the stamp's).
    token: int = 0
    span: int = 0
    gen: int = 0
    claim: Optional[int] = None
    claim_expires: float = 0.0
    # Who holds the claim: b"key:" and the CURVE key (Z85) it came with
    # under CURVE, else b"conn:" and the ROUTER's routing id of the
    # connection. Never a name the message itself carries.
    owner: bytes = b""


class Sends:
    """The payloads a sender holds, by key, and the claims on them: added
    by ``put``, claimed and ended through ``answer`` (from the claim
    socket's thread), freed into ``pool``. Thread-safe (one lock).

    ``buffer_ttl``: seconds a payload no receiver claimed is kept."""

    def __init__(self, pool: Pool, engine: "tensorferry.TransferEngine", metrics: Metrics, buffer_ttl: float) -> None:
        self._pool: Optional[Pool] = pool
        self._engine: Optional[tensorferry.TransferEngine] = engine
        self._metrics = metrics
        self.buffer_ttl = buffer_ttl
        self._lock = threading.Lock()
        self._held: Dict[str, Held] = {}
        self._keys: Dict[str, Set[str]] = {}
        # Payloads replaced or cleaned up while a receiver held a claim on
        # them, by (owner, claim, key): freed when it ends.
        self._retired: Dict[Tuple[bytes, int, str], List[Held]] = {}
        # The same, by (claim, key) alone, counted: whether an end of a
        # claim names a retired payload, whoever sent it.
        self._retired_claims: Dict[Tuple[int, str], int] = {}
        # Puts so far: each payload's generation, which a grant names.
        self._puts = 0
        # The claims granted, by (owner, claim id): the key each holds. By
        # owner too, so that another connection reusing a claim id cannot
        # redirect the owner's ``release`` of it.
        self._claim_keys: Dict[Tuple[bytes, int], str] = {}

    def add(self, held: Held) -> None:
        """Holds ``held`` as its key's payload (numbering it: its ``gen``);
        one held under that key before is retired."""
        with self._lock:
            self._puts += 1
            held.gen = self._puts
            old = self._held.pop(held.key, None)
            if old is not None:
                self._retire(old)
            self._held[held.key] = held
            self._keys.setdefault(held.raw_key, set()).add(held.key)
            self._metrics.count("puts", 1)
            self._metrics.count("bytes_transferred", held.plan_size)

    def keys_of(self, request_id: str) -> Set[str]:
        """The keys of the payloads held for ``request_id`` (``put``'s key),
        and ``request_id`` itself."""
        with self._lock:
            return set(self._keys.get(request_id, ())) | {request_id}

    def drop(self, keys: Set[str]) -> None:
        """Retires the payloads held under ``keys``."""
        with self._lock:
            for key in keys:
                held = self._held.pop(key, None)
                if held is not None:
                    self._retire(held)

    def counts(self) -> Tuple[int, int]:
        """How many payloads are held, and how many of them claimed."""
        with self._lock:
            return len(self._held), sum(1 for h in self._held.values() if h.claim is not None)

    def close(self) -> None:
        """Lets go of the pool and the engine (the connector closes them):
        what is freed from now on is only forgotten."""
        with self._lock:
            self._pool = None
            self._engine = None

    def answer(self, frames: List[bytes], owner: bytes) -> Optional[List[bytes]]:
        """The answer to one control message from the connection ``owner``
        names (see ``owner_of``), or None."""
        decoded = control.decode(frames)
        if decoded is None:
            logger.debug("FerryConnector: dropped a malformed control message")
            return None
        verb, message = decoded
        now = time.monotonic()
        with self._lock:
            if verb == control.CLAIM and isinstance(message, control.Claim):
                held = self._held.get(message.key)
                if held is not None:
                    # A claim that ran out ends now, not at the next sweep:
                    # else a claim arriving just then would be granted a
                    # payload whose lease is over, and a claimant racing
                    # the sweep could hold it forever.
                    self._expire_held(message.key, held, now)
                    held = self._held.get(message.key)
                if held is None:
                    return control.encode(control.MISSING, control.Refused(message.claim))
                if held.claim is not None:
                    if held.owner != owner or held.claim != message.claim:
                        # Another's (even with the same claim id), or the
                        # owner's other claim.
                        return control.encode(control.BUSY, control.Refused(message.claim))
                    # The owner asking again for its claim: the same grant,
                    # its window unchanged (asking again never lengthens
                    # it).
                else:
                    window = min(max(message.window_ms, 0), control.MAX_WINDOW_MS) / 1000.0
                    held.claim = message.claim
                    held.owner = owner
                    held.claim_expires = now + window + control.CLAIM_GRACE
                    self._claim_keys[(owner, message.claim)] = message.key
                    # Readers of the put's metadata see it is another's.
                    self._stamp(held, stamp.claimed(held.token, message.claim))
                pool = self._pool
                engine = self._engine
                if pool is None or engine is None:
                    return None
                return control.encode(
                    control.GRANTED,
                    control.Granted(
                        message.claim,
                        engine.session_id,
                        pool.base + held.offset,
                        held.plan_size,
                        held.header,
                        held.data,
                        held.gen,
                    ),
                )
            if verb == control.TAKEN and isinstance(message, control.Taken):
                self._taken(message)
                return None
            if isinstance(message, control.Ended):
                # Only the claim's owner ends it: a done or release from
                # any other connection (a stranger who learned the key and
                # the claim id) is ignored, or it would free a payload
                # another receiver reads, or hand it to a third.
                key = message.key or self._claim_keys.get((owner, message.claim), "")
                retired = self._unretire((owner, message.claim, key))
                if retired is not None:
                    self._claim_keys.pop((owner, message.claim), None)
                    for held in retired:
                        self._free_held(held)
                    return None
                held = self._held.get(key)
                if held is not None and held.claim == message.claim and held.owner == owner:
                    self._claim_keys.pop((owner, message.claim), None)
                    if verb == control.DONE:
                        del self._held[key]
                        self._forget_key(held)
                        self._free_held(held)
                    else:
                        held.claim = None
                        held.owner = b""
                        self._stamp(held, held.token)
                    return None
                if (held is not None and held.claim == message.claim) or (
                    message.claim,
                    key,
                ) in self._retired_claims:
                    self._foreign_end(verb, key, owner)
        return None

    def _taken(self, message: control.Taken) -> None:
        """A put read without a claim (``_stamp``), whoever says so: its
        token is the proof of having the put's metadata. A claim on it is
        another receiver's, which its own end settles. Under the lock."""
        held = self._held.get(message.key)
        if held is not None and held.token and held.token == message.token and held.claim is None:
            del self._held[message.key]
            self._forget_key(held)
            self._free_held(held)

    def take_notes(self) -> None:
        """Handles the ``taken`` notifications the engine received (from
        receivers that reach the engine; ``_receives``); any other
        notification is not a connector's and is dropped."""
        engine = self._engine
        if engine is None:
            return
        try:
            notes = engine.notifications()
        except tensorferry.FerryError as e:  # closed meanwhile, say
            logger.debug("FerryConnector: no notifications taken: %s", e)
            return
        for sender, note in notes:
            decoded = control.decode_note(note)
            if decoded is None or not isinstance(decoded[1], control.Taken):
                logger.debug("FerryConnector: dropped a notification from %s that is not a taken", sender)
                continue
            with self._lock:
                self._taken(decoded[1])

    def _foreign_end(self, verb: bytes, key: str, owner: bytes) -> None:
        n = self._metrics.count("foreign_ends", 1)
        if n <= _FOREIGN_LOGGED:
            logger.warning(
                "FerryConnector: ignored a %s of %s from %s, which does not own its claim",
                verb.decode(),
                key,
                _owner_text(owner),
            )

    def expire(self, now: float) -> None:
        """Ends the claims whose window is over, and frees the payloads
        unclaimed past their lease and the retired ones whose claims ran
        out."""
        with self._lock:
            for key, held in list(self._held.items()):
                self._expire_held(key, held, now)
            for both, helds in list(self._retired.items()):
                if all(held.claim_expires <= now for held in helds):
                    self._unretire(both)
                    self._claim_keys.pop(both[:2], None)
                    for held in helds:
                        self._metrics.count("expired_claims", 1)
                        logger.warning(
                            "FerryConnector: the receiver that claimed %s (since cleaned up) did not finish "
                            "within its window; its %d bytes are freed",
                            held.key,
                            held.plan_size,
                        )
                        self._free_held(held)

    def _expire_held(self, key: str, held: Held, now: float) -> None:
        """Ends ``held``'s claim if its window is over, and frees it if
        unclaimed past its lease (under ``_lock``)."""
        if held.claim is not None and held.claim_expires <= now:
            self._claim_keys.pop((held.owner, held.claim), None)
            held.claim = None
            held.owner = b""
            self._stamp(held, held.token)
            self._metrics.count("expired_claims", 1)
            logger.warning(
                "FerryConnector: the receiver that claimed %s did not finish within its window; the claim ended",
                key,
            )
        if held.claim is None and held.expires <= now:
            del self._held[key]
            self._forget_key(held)
            self._metrics.count("expired_payloads", 1)
            logger.warning(
                "FerryConnector: %s was not received within %.0f s; its %d bytes are freed",
                key,
                self.buffer_ttl,
                held.plan_size,
            )
            self._free_held(held)

    def _retire(self, held: Held) -> None:
        """Frees ``held`` now if no receiver holds it, else once its claim
        ends (under ``_lock``)."""
        self._forget_key(held)
        if held.claim is None:
            self._free_held(held)
        else:
            both = (held.owner, held.claim, held.key)
            if both not in self._retired:
                self._retired[both] = []
                pair = (held.claim, held.key)
                self._retired_claims[pair] = self._retired_claims.get(pair, 0) + 1
            self._retired[both].append(held)

    def _unretire(self, both: Tuple[bytes, int, str]) -> Optional[List[Held]]:
        """Takes the payloads retired under ``both`` (owner, claim, key) out
        of the books (under ``_lock``)."""
        helds = self._retired.pop(both, None)
        if helds is not None:
            pair = both[1:]
            left = self._retired_claims.get(pair, 0) - 1
            if left > 0:
                self._retired_claims[pair] = left
            else:
                self._retired_claims.pop(pair, None)
        return helds

    def _forget_key(self, held: Held) -> None:
        keys = self._keys.get(held.raw_key)
        if keys is not None:
            keys.discard(held.key)
            if not keys:
                del self._keys[held.raw_key]

    def _free_held(self, held: Held) -> None:
        # The stamp says "freed" before anything else may use the region.
        self._stamp(held, 0)
        if self._pool is not None:
            self._pool.free(held.offset, held.span or held.plan_size)

    def _stamp(self, held: Held, value: int) -> None:
        """Writes ``held``'s stamp (under ``_lock``)."""
        if held.token and self._pool is not None:
            stamp.write(self._pool.array, held.offset + stamp.stamp_at(held.plan_size), value)


def serve(router: zmq.Socket, sends: Sends, stop: threading.Event, curve: bool) -> None:
    """The claim socket's thread: answers what ``router`` receives with
    ``sends`` (``curve``: whether the socket is a CURVE server, so that a
    claim's owner is its key) and expires what ``sends`` holds, until
    ``stop`` is set; then closes ``router``."""
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    next_expiry = 0.0
    try:
        while not stop.is_set():
            ready = dict(poller.poll(100))
            # A receiver's ``taken`` waits for this turn rather than wake
            # this thread: a wake would take a core from the receiver's
            # get, which sent it; a put that finds the pool full takes
            # them itself.
            try:
                sends.take_notes()
            except Exception:
                logger.exception("FerryConnector: a notification was not handled")
            if router in ready:
                while True:
                    try:
                        # Frames, not bytes: their properties carry the
                        # connection's authenticated key.
                        frames = router.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    if len(frames) < 2:
                        continue
                    owner = owner_of(frames, curve)
                    if owner is None:
                        logger.warning("FerryConnector: dropped a control message with no CURVE key")
                        continue
                    try:
                        answer = sends.answer([f.bytes for f in frames[1:]], owner)
                    except Exception:
                        logger.exception("FerryConnector: a control message was not answered")
                        continue
                    if answer is not None:
                        send_quiet(router, [frames[0].bytes, *answer])
            now = time.monotonic()
            if now >= next_expiry:
                next_expiry = now + 0.25
                try:
                    sends.expire(now)
                except Exception:
                    logger.exception("FerryConnector: expiring sent payloads failed")
    except Exception:
        logger.exception("FerryConnector: the listener stopped")
    finally:
        router.close(linger=0)


def owner_of(frames: List[Any], curve: bool) -> Optional[bytes]:
    """Who sent a message the ROUTER received (as frames): under CURVE the
    key its connection was admitted with (the ZAP handler's User-Id, which
    libzmq attaches to every message of the connection), else the
    connection (its routing id). None under CURVE without a key."""
    if curve:
        try:
            user = frames[1].get("User-Id")
        except zmq.ZMQError:
            return None
        return b"key:" + user.encode() if user else None
    return b"conn:" + frames[0].bytes


def _owner_text(owner: bytes) -> str:
    kind, _, value = owner.partition(b":")
    return f"key {value.decode()}" if kind == b"key" else f"connection {value.hex()}"
