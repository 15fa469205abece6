"""The receiver's side of the claim protocol (``_control``): the payloads a
``FerryConnector`` is receiving, from the claim to the payload handed out.

A receive claims its payload from the sender's claim socket, on a DEALER
of its own for that sender (under CURVE a CURVE client of the sender's
key: only that sender can answer), and with ferry's metadata reads the
put's region at once, while the claim travels, and then the put's stamp
(``_stamp``): a stamp that still names the put (unclaimed, or claimed by
this receive) makes the read good without the claim's answer, so that
the payload comes back after one read and one eight-byte read, in the
call that posted them where the data plane reads within the call (the
local plane). Else the grant decides: a read of what it names is used, a
read of anything else is discarded (its region freed once the read is
final) and the grant read instead, and a grant that names another engine
or region than the put is not read at all. ``done`` frees the sender's
payload once the read is used, ``release`` hands it back when it is
not."""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Tuple

import zmq
from vllm_omni.distributed.omni_connectors.utils.serialization import OmniSerializer

import tensorferry
from tensorferry.vllm_omni import _control as control
from tensorferry.vllm_omni import _payload as payload
from tensorferry.vllm_omni import _stamp as stamp
from tensorferry.vllm_omni._get import Get, Named, Sender, failure, named, stamp_verdict, tell_taken
from tensorferry.vllm_omni._guard import claim_key, foreign_grant
from tensorferry.vllm_omni._metrics import Metrics
from tensorferry.vllm_omni._pool import Pool
from tensorferry.vllm_omni._sockets import Dealers, Link, send_quiet, session_key

logger = logging.getLogger("tensorferry.vllm_omni")

_STEP_BYTES = 100 << 20
# How long abandon_get waits for a read in flight before leaving its
# region to be freed when the read ends.
_ABANDON_WAIT = 1.0
# Keys whose early read is remembered (so that a claim asked again does not
# read again).
_EARLY_MEMORY = 4096
# The longest a waiting get holds the lock while it polls its claim's
# socket (other threads' gets wait meanwhile).
_POLL_SLICE = 0.001


class Receives:
    """The payloads a connector is receiving, by key: the claim each sent,
    the read posted for it, and the DEALERs the claims go out on (one per
    sender endpoint and key). Reads go into regions of ``pool``, through
    ``engine``; the DEALERs are sockets of ``ctx`` (under CURVE with
    ``guard``'s key). Thread-safe (one lock); once ``closing`` is set (the
    connector closes), nothing new starts.

    ``sender_key``: under CURVE, the key a claim whose metadata names none
    goes to. ``claim_timeout``: seconds a sender may take to answer a
    claim; ``transfer_timeout``: seconds a read may take (plus 5 per 100
    MiB of the size the metadata gives)."""

    def __init__(
        self,
        pool: Pool,
        engine: "tensorferry.TransferEngine",
        ctx: zmq.Context,
        guard: Any,
        sender_key: Optional[str],
        metrics: Metrics,
        closing: threading.Event,
        *,
        claim_timeout: float,
        transfer_timeout: float,
    ) -> None:
        self._pool: Optional[Pool] = pool
        self._engine: Optional[tensorferry.TransferEngine] = engine
        self._guard = guard
        self._sender_key = sender_key
        self._metrics = metrics
        self._closing = closing
        self.claim_timeout = claim_timeout
        self.transfer_timeout = transfer_timeout
        self._lock = threading.Lock()
        self._dealers = Dealers(ctx, guard)
        self._gets: Dict[str, Get] = {}
        self._claims: Dict[int, Get] = {}
        self._next_sweep = 0.0
        # Early reads made, by key: (sender session, generation). A claim
        # asked again (after "missing" or "busy") reads nothing again.
        self._early: "OrderedDict[str, Tuple[str, int]]" = OrderedDict()
        # Whether a get that names no sender was logged.
        self._unaddressed = False
        # Receives read without a claim whose sender is told ``taken`` once
        # the lock is let go (``get``).
        self._taken: List[Get] = []

    def get(
        self, key: str, raw_key: str, metadata: Optional[Dict[str, Any]], sender: Sender
    ) -> Optional[Tuple[Any, int]]:
        """``FerryConnector.get`` of ``key`` (``raw_key``: the key ``get``
        was given): the first call claims the payload from its sender (at
        ``metadata``'s address, else at ``sender``'s; None when neither
        names one), and a call that finds it arrived returns
        ``(payload, size)``."""
        with self._lock:
            got = self._get(key, raw_key, metadata, sender)
            taken, self._taken = self._taken, []
        # Told without the lock: a notification may wait for room in the
        # sender's inbox, and the other threads' receives go on meanwhile.
        for g in taken:
            self._tell_taken(g)
        return got

    def _get(
        self, key: str, raw_key: str, metadata: Optional[Dict[str, Any]], sender: Sender
    ) -> Optional[Tuple[Any, int]]:
        if self._closing.is_set():
            raise RuntimeError("FerryConnector: get on a closed connector")
        now = time.monotonic()
        self._sweep(now)
        g = self._gets.get(key)
        if g is None:
            g = self._start(key, raw_key, metadata, sender)
            if g is None:
                return None
            if g.state == "claiming" and g.token is not None:
                # The read of the put's region may be good already.
                got = self._advance(g)
                if got is not None or self._gets.get(key) is not g:
                    return got
        g.touched = now
        self._drain(g.link)
        return self._advance(g)

    def wait(self, key: str, timeout: float) -> bool:
        """Waits at most ``timeout`` seconds for ``key``'s receive to move
        on: for its read to be final, else for an answer to its claim;
        False when it has nothing to wait for (no receive of ``key``)."""
        with self._lock:
            g = self._gets.get(key)
            if g is None or self._closing.is_set():
                return False
            running = next((t for t in (g.transfer, g.stamp_read) if t is not None and t.state == "pending"), None)
            if running is None:
                sock = self._dealers.get(g.link)
                if sock is not None and g.state == "claiming":
                    # Under the lock (a socket is one thread's at a time),
                    # for a slice at most.
                    sock.poll(max(1, int(min(timeout, _POLL_SLICE) * 1000)))
                    return True
                return False
        try:
            running.wait(timeout)
        except tensorferry.FerryError:
            pass  # final: the next get reports it
        return True

    def sweep(self, now: float, force: bool = False) -> None:
        """``_sweep``, unless the connector closes."""
        with self._lock:
            if not self._closing.is_set():
                self._sweep(now, force=force)

    def counts(self) -> Tuple[int, int, int]:
        """After a sweep: the receives begun, those granted, and the reads
        (of payloads or stamps) in flight."""
        with self._lock:
            if not self._closing.is_set():
                self._sweep(time.monotonic())
            gets = len(self._gets)
            granted = sum(1 for g in self._gets.values() if g.state == "reading")
            reading = sum(1 for g in self._gets.values() if g.running)
        return gets, granted, reading

    def close(self) -> None:
        """Ends every receive (releasing its read returns once none of its
        bytes moves) and closes the DEALERs; then lets go of the pool, the
        engine and the context, which the connector closes."""
        with self._lock:
            for g in self._gets.values():
                for t in (g.transfer, g.stamp_read):
                    if t is not None:
                        t.release()
            self._gets.clear()
            self._claims.clear()
            self._dealers.close()
            self._pool = None
            self._engine = None

    def _start(self, key: str, raw_key: str, metadata: Optional[Dict[str, Any]], sender: Sender) -> Optional[Get]:
        found = named(metadata, raw_key, sender)
        if found is None:
            # Nothing names a sender: nothing is there to get (said once).
            if not self._unaddressed:
                self._unaddressed = True
                logger.warning(
                    "FerryConnector: get of %s has no metadata naming its sender, and no sender is configured "
                    "(extra sender_host/sender_zmq_port, or zmq_port and from_stage): None",
                    key,
                )
            return None
        if isinstance(found, str):
            self._metrics.error(f"get of {key}: {found}")
            return None
        server_key = claim_key(
            self._guard, self._sender_key, self._metrics.error, key, found.endpoint, found.source_key, found.ferry
        )
        if server_key is False:
            return None
        early = found.early
        if early is not None and server_key is not None and session_key(early.session) != server_key:
            # Inconsistent metadata: the engine it names is not the one
            # whose key answers the claim.
            self._metrics.error(
                f"get of {key}: the put's metadata names engine {early.session!r}, whose key is not its "
                f"source_key {server_key}; not claimed"
            )
            return None
        window = self.transfer_timeout + 5.0 * ((found.expected or 0) // _STEP_BYTES)
        # The sender grants no longer: a read past it could see the region
        # reused.
        window = min(window, control.MAX_WINDOW_MS / 1000.0)
        g = Get(
            key=key,
            raw_key=raw_key,
            endpoint=found.endpoint,
            server_key=server_key,
            claim=secrets.randbits(63),
            sent=time.monotonic(),
            window=window,
            expected=found.expected,
            touched=time.monotonic(),
            region=(early.session, early.addr) if early is not None else None,
        )
        self._gets[key] = g
        self._claims[g.claim] = g
        if early is not None:
            self._read_early(g, early, found)
        # With a stamp to read, the claim waits for its verdict
        # (``_advance_claim``).
        if g.token is None and not self._send_claim(g):
            return None
        return g

    def _send_claim(self, g: Get) -> bool:
        """Sends ``g``'s claim; False (said why, and ``g`` ended) if it
        cannot be."""
        claim = control.Claim(g.key, g.claim, int(g.window * 1000))
        try:
            self._dealers.to(g.link).send_multipart(control.encode(control.CLAIM, claim), zmq.NOBLOCK)
        except zmq.ZMQError as e:
            self._metrics.error(f"get of {g.key}: the claim to {g.endpoint} cannot be sent: {e}")
            self._forget(g)
            return False
        g.claimed = True
        return True

    def _read_early(self, g: Get, early: control.Granted, found: Named) -> None:
        """Reads the region the put's metadata names while the claim
        travels. Its bytes are used if the grant names the same put (its
        generation): a payload is held, unchanged, from its put until it is
        freed, and never held again, so a grant of that generation shows it
        was the payload's during the whole read. Or, without waiting for
        the grant, if the put's stamp, read once this read is final, still
        names the put (``_stamp``). Once per put: a claim asked again
        (after "missing" or "busy") reads nothing until it is granted."""
        g.early_of = (early.session, early.gen)
        if self._early.get(g.key) == g.early_of or not self._valid_grant(g, early, report=False):
            return
        self._early[g.key] = g.early_of
        self._early.move_to_end(g.key)
        while len(self._early) > _EARLY_MEMORY:
            self._early.popitem(last=False)
        if self._post(g, early, quiet=True, span=stamp.span(early.size) if found.token is not None else None):
            g.read_early = True
            g.stamp_at, g.token = found.stamp_at, found.token

    def _advance(self, g: Get) -> Optional[Tuple[Any, int]]:
        if g.state == "claiming":
            return self._advance_claim(g)
        final = not g.running
        if g.state == "discarding":
            if not final:
                return None
            self._free_region(g)
            regrant, g.regrant = g.regrant, None
            if regrant is None:
                self._forget(g)
            else:
                self._read(g, regrant)
            return None
        if g.transfer is None or not final:
            return None
        return self._finish(g)

    def _advance_claim(self, g: Get) -> Optional[Tuple[Any, int]]:
        """``_advance`` of a receive whose claim is not answered: its early
        read, once final, and its stamp's read decide, else the claim's
        timeout."""
        transfer = g.transfer
        if transfer is not None and transfer.state == "failed":
            # The early read failed (the sender is gone, or its metadata
            # was wrong): the grant, if it comes, is read again.
            self._free_region(g)
        elif transfer is not None and g.token is not None:
            good = stamp_verdict(g, self._live_engine(), self._live_pool())
            if good:
                g.state = "reading"
                return self._finish(g)
            if good is False:
                # Freed, or another put's, or another receiver's: the
                # claim's answer decides.
                self._metrics.count("early_reads_wasted", 1)
                g.token = None
                self._free_region(g)
        if not g.claimed and not self._send_claim(g):
            return None
        if time.monotonic() - g.sent > self.claim_timeout:
            self._metrics.count("timeouts", 1)
            self._reset_client(g.link)
            # Under CURVE a refused handshake is silent too.
            hint = (
                f" (under CURVE: or its key is not {g.server_key}, or it does not admit this connector's key "
                f"{self._guard.public_key})"
                if g.server_key is not None
                else ""
            )
            self._metrics.error(
                f"get of {g.key}: the sender at {g.endpoint} did not answer its claim within "
                f"{self.claim_timeout} s{hint}"
            )
        return None

    def _finish(self, g: Get) -> Optional[Tuple[Any, int]]:
        """Hands out ``g``'s payload, its read final and good (granted, or
        stamped), or reports its failure; either way ends the receive."""
        transfer = g.transfer
        if transfer is None:
            return None
        if transfer.state == "failed":
            why = failure(transfer)
            self._send_end(g, control.RELEASE)
            self._forget(g)
            self._metrics.error(f"get of {g.key}: the read from {g.endpoint} failed: {why}")
            return None
        pool = self._live_pool()
        offset, g.offset = g.offset, None
        self._forget(g)
        try:
            if offset is None:
                return None
            region = pool.lease(offset, g.size, span=g.span)
            try:
                value = payload.decode(region, g.header, g.data, OmniSerializer.deserialize)
            except payload.PayloadError as e:
                self._metrics.error(f"get of {g.key} from {g.endpoint}: {e}")
                return None
            finally:
                del region
        finally:
            # The sender frees the payload once told; told after the decode,
            # as a message wakes ZeroMQ's I/O thread, which would take a core
            # from it.
            if g.claimed:
                # After a stamped read the claim may not be answered yet:
                # the sender takes the claim, then this done, in order.
                self._send_end(g, control.DONE)
            elif g.token is not None:
                self._taken.append(g)
        self._metrics.count("gets", 1)
        self._metrics.count("bytes_transferred", g.size)
        return value, g.size

    def _tell_taken(self, g: Get) -> None:
        """``taken`` to ``g``'s sender (``tell_taken``), else on its claim's socket."""
        if not tell_taken(g, self._engine):
            with self._lock:
                if not self._closing.is_set():
                    self._dealers.send(g.link, control.encode(control.TAKEN, control.Taken(g.key, g.token or 0)))

    def _drain(self, link: Link) -> None:
        endpoint = link[0]
        sock = self._dealers.get(link)
        while sock is not None:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            decoded = control.decode(frames)
            if decoded is None:
                logger.debug("FerryConnector: dropped a malformed answer from %s", endpoint)
                continue
            verb, message = decoded
            claim = getattr(message, "claim", None)
            g = self._claims.get(claim) if isinstance(claim, int) else None
            # Only the socket the claim went out on answers it.
            if g is None or g.state != "claiming" or g.link != link:
                if verb == control.GRANTED and isinstance(message, control.Granted):
                    # An answer to a claim given up: let the sender know.
                    send_quiet(sock, control.encode(control.RELEASE, control.Ended("", message.claim)))
                continue
            self._claims.pop(g.claim, None)
            if verb == control.GRANTED and isinstance(message, control.Granted):
                self._early.pop(g.key, None)
                self._on_grant(g, message)
                continue
            if verb == control.MISSING and g.read_early:
                # ferry's metadata comes from a put: a sender that no longer
                # has it freed it (read, cleaned up, or expired), and asking
                # again will not bring it back; said once per put.
                self._metrics.error(
                    f"get of {g.key}: the sender at {endpoint} no longer has that put (read, cleaned up or expired)"
                )
            # Not there yet (missing), or another receiver's (busy): a
            # later get asks again.
            self._forget(g)

    def _on_grant(self, g: Get, granted: control.Granted) -> None:
        foreign = foreign_grant(granted, g.endpoint, g.region, g.server_key)
        if foreign is not None:
            self._metrics.count("grants_refused", 1)
            self._metrics.error(f"get of {g.key}: {foreign}; not read")
            self._send_end(g, control.RELEASE)
            self._forget(g)
            return
        if not self._valid_grant(g, granted, report=True):
            self._send_end(g, control.RELEASE)
            self._forget(g)
            return
        if g.transfer is not None and g.transfer.state == "failed":
            self._free_region(g)  # the early read failed: read the grant
        if g.transfer is None:
            self._read(g, granted)
        elif g.read_of == (granted.session, granted.addr, granted.gen) and g.size == granted.size:
            g.state = "reading"
        else:
            # The early read was of another put: read the granted one once
            # it is final.
            self._metrics.count("early_reads_wasted", 1)
            g.state = "discarding"
            g.regrant = granted

    def _valid_grant(self, g: Get, granted: control.Granted, report: bool) -> bool:
        why = None
        if g.expected is not None and granted.size != g.expected:
            why = f"the sender grants {granted.size} bytes, its metadata said {g.expected}"
        elif not 0 < granted.header <= granted.data <= granted.size:
            why = f"a grant with header {granted.header}, data {granted.data}, size {granted.size}"
        elif granted.data % payload.LEAF_ALIGN or not 0 <= granted.addr < 1 << 64:
            why = f"a grant of data at {granted.data}, address {granted.addr:#x}"
        elif self._pool is not None and granted.size > self._pool.size:
            why = f"a grant of {granted.size} bytes, more than the whole pool ({self._pool.size})"
        if why is not None and report:
            self._metrics.error(f"get of {g.key}: {why}")
        return why is None

    def _read(self, g: Get, granted: control.Granted) -> None:
        """Reads what ``granted`` names, holding its claim."""
        if not self._post(g, granted, quiet=False):
            self._send_end(g, control.RELEASE)
            self._forget(g)
            return
        g.state = "reading"

    def _post(self, g: Get, granted: control.Granted, quiet: bool, span: Optional[int] = None) -> bool:
        """Posts the read of ``granted`` into a new region (of ``span``
        bytes, if more than the payload's); False (and said why, unless
        ``quiet``) if it cannot be."""
        remaining = g.sent + g.window - time.monotonic()
        if remaining <= 0:
            if not quiet:
                self._metrics.error(f"get of {g.key}: the grant came after the claim's window")
            return False
        pool = self._live_pool()
        span = max(span or 0, granted.size)
        offset = pool.alloc(span)
        if offset is None:
            # Received payloads still in use hold the pool: ask again later.
            if not quiet:
                logger.warning(
                    "FerryConnector: get of %s waits for room: %d bytes, %d of %d held",
                    g.key,
                    granted.size,
                    pool.used,
                    pool.size,
                )
            return False
        try:
            transfer = self._live_engine().post_read(
                granted.session, [pool.base + offset], [granted.addr], [granted.size], timeout=remaining
            )
        except Exception as e:  # a FerryError, or a peer's value the engine cannot take
            pool.free(offset, span)
            if not quiet:
                self._metrics.error(f"get of {g.key}: the read from {g.endpoint} was refused: {e}")
            return False
        g.offset = offset
        g.size = granted.size
        g.span = span
        g.header = granted.header
        g.data = granted.data
        g.transfer = transfer
        g.read_of = (granted.session, granted.addr, granted.gen)
        return True

    def _free_region(self, g: Get) -> None:
        """Frees ``g``'s region, whose read is final."""
        if g.offset is not None and self._pool is not None:
            self._pool.free(g.offset, g.span or g.size)
        g.offset = None
        g.transfer = None
        g.stamp_read = None
        g.read_of = None

    def _forget(self, g: Get) -> None:
        """Ends the receive ``g``: now if no read of it runs, else once its
        read is final (it stays, discarding, until then)."""
        self._claims.pop(g.claim, None)
        if g.running:
            g.state = "discarding"
            g.regrant = None
            return
        self._free_region(g)
        if self._gets.get(g.key) is g:
            del self._gets[g.key]

    def abandon(self, match: Any) -> None:
        """Ends the receives ``match`` picks (see ``FerryConnector.abandon_get``)."""
        with self._lock:
            if self._closing.is_set():
                return
            chosen = [g for g in self._gets.values() if match(g)]
        for g in chosen:
            until = time.monotonic() + _ABANDON_WAIT
            while True:
                with self._lock:
                    if self._closing.is_set() or self._gets.get(g.key) is not g:
                        break
                    running = g.transfer if g.transfer is not None and g.transfer.state == "pending" else None
                    # Only a granted read is worth waiting for.
                    if running is None or g.state != "reading" or time.monotonic() >= until:
                        # A read still running is not ended (the data plane
                        # would end the peer's other reads with it): its
                        # region is freed once it is final (``_sweep``).
                        self._send_end(g, control.RELEASE)
                        self._forget(g)
                        break
                try:
                    running.wait(max(0.0, until - time.monotonic()))
                except tensorferry.FerryError:
                    pass  # failed: final all the same

    def _sweep(self, now: float, force: bool = False) -> None:
        """Ends receives nobody asks for any more (under ``_lock``, at most
        twice a second): frees the regions of discarded reads that became
        final, and releases gets not polled for longer than their window,
        as a caller that gave up without ``abandon_get`` leaves them."""
        if now < self._next_sweep and not force:
            return
        self._next_sweep = now + 0.5
        for g in list(self._gets.values()):
            if g.state == "discarding":
                self._advance(g)
            elif now - g.touched > g.window + control.CLAIM_GRACE:
                if g.running:
                    continue  # its deadline ends it; a later sweep frees it
                logger.warning("FerryConnector: nobody asked for %s within %.0f s; its receive is ended", g.key, g.window)
                self._send_end(g, control.RELEASE)
                self._forget(g)

    def _send_end(self, g: Get, verb: bytes) -> None:
        if g.claimed:
            self._dealers.send(g.link, control.encode(verb, control.Ended(g.key, g.claim)))

    def _reset_client(self, link: Link) -> None:
        # A sender that went away leaves claims queued; start clean.
        claiming = [g for g in self._gets.values() if g.link == link and g.state == "claiming"]
        for g in claiming:
            # Should the sender come back, it frees them at once.
            self._send_end(g, control.RELEASE)
        # A moment for the releases (and dones) queued on it.
        self._dealers.drop(link, linger=200)
        for g in claiming:
            self._forget(g)

    def _live_pool(self) -> Pool:
        if self._pool is None:
            raise RuntimeError("FerryConnector: closed")
        return self._pool

    def _live_engine(self) -> "tensorferry.TransferEngine":
        if self._engine is None:
            raise RuntimeError("FerryConnector: closed")
        return self._engine
