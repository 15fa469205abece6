"""``FerryConnector``: vLLM-omni's ``OmniConnectorBase`` on ferry's
transfer engine.

The sender copies a payload into a region of its registered pool
(``put``) and answers claims for it on a ZeroMQ ROUTER; the receiver claims
it, reads it one-sidedly into a region of its own pool, and hands out views
of that region (``get``). One connector does both, as a middle stage that
reuses its input connector to send does."""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Set, Tuple

import zmq
from vllm_omni.distributed.omni_connectors.connectors.base import OmniConnectorBase
from vllm_omni.distributed.omni_connectors.utils.initialization import compute_connector_zmq_port
from vllm_omni.distributed.omni_connectors.utils.serialization import OmniSerializer

import tensorferry
from tensorferry.vllm_omni import _control as control
from tensorferry.vllm_omni import _payload as payload
from tensorferry.vllm_omni._pool import Pool

logger = logging.getLogger("tensorferry.vllm_omni")

#: The protocol of the metadata ``put`` returns; a receiver refuses others.
METADATA_FORMAT = 1
_DEFAULT_POOL = 1 << 30
_STEP_BYTES = 100 << 20
# A sender keeps a claimed region this long past the claim's window, for a
# done that is on its way.
_CLAIM_GRACE = 1.0
# How long abandon_get waits for a read in flight before leaving its
# region to be freed when the read ends.
_ABANDON_WAIT = 1.0
# Keys whose early read is remembered (so that a claim asked again does not
# read again).
_EARLY_MEMORY = 4096


@dataclass
class _Held:
    """A payload ``put`` placed in a region, until a receiver read it."""

    key: str
    raw_key: str
    offset: int
    plan_size: int
    header: int
    data: int
    expires: float
    gen: int = 0
    claim: Optional[int] = None
    claim_expires: float = 0.0


@dataclass
class _Get:
    """A payload this connector is receiving.

    ``state``: ``claiming`` (the claim is not answered; a read from the
    put's metadata may run already), ``reading`` (granted, and the read
    running is of what was granted), ``discarding`` (a read runs whose
    bytes are not to be used: once it is final its region is freed, and
    ``regrant``, if any, read instead)."""

    key: str
    raw_key: str
    endpoint: str
    claim: int
    sent: float
    window: float
    expected: Optional[int]
    state: str = "claiming"
    offset: Optional[int] = None
    size: int = 0
    header: int = 0
    data: int = 0
    transfer: Optional["tensorferry.Transfer"] = None
    read_of: Optional[Tuple[str, int, int]] = None
    regrant: Optional[control.Granted] = None
    touched: float = 0.0
    early_of: Optional[Tuple[str, int]] = None


class FerryConnector(OmniConnectorBase):
    """A vLLM-omni connector on ferry: ``name: FerryConnector`` in a stage
    config's ``connectors``.

    ``extra`` (all optional): ``backend`` (``"auto"``, ``"local"``,
    ``"fabric"``, ``"verbs"``: ferry's data plane), ``pool_size`` (bytes of
    the registered pool both directions use, 1 GiB; ``memory_pool_size``
    too), ``host`` (the address peers reach this connector at; default: the
    engine's), ``zmq_port`` (the base port: a sender listens at
    ``compute_connector_zmq_port(zmq_port, from_stage, ...)``, as vLLM-omni's
    transfer-engine connectors do, and a receiver asks there when ``get``
    has no metadata; without it a sender listens on a free port, which its
    metadata names), ``sender_host``/``sender_zmq_port`` (where a receiver
    asks without metadata), ``transfer_timeout`` (seconds a read may take,
    30, plus 5 per 100 MiB of the size the metadata gives, at most 600),
    ``purpose`` (``compute_connector_zmq_port``'s, ``request_forwarding``),
    ``claim_timeout`` (seconds a sender may take
    to answer a claim, 5), ``buffer_ttl_seconds`` (how long a sent payload
    no receiver claimed is kept, 300), ``engine_options`` (keywords for
    ``tensorferry.TransferEngine``: ``provider`` for fabric, ...).

    ``get`` never waits for the sender: it returns None until the payload
    has arrived (on the local plane, the call that posts the read makes its
    copy, a CPU copy between processes).
    Received tensors are zero-copy views of this connector's pool; their
    memory returns to it when they are gone. Raw bytes come back as a
    ``FerryBuffer`` (``.tensor``, ``.release()``).
    """

    supports_raw_data: bool = True

    def __init__(self, config: Dict[str, Any]) -> None:
        # close() (also from __del__) must work whatever step failed.
        self._closed = True
        self._listener: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._ctx: Optional[zmq.Context] = None
        self._engine: Optional[tensorferry.TransferEngine] = None
        self._pool: Optional[Pool] = None
        self._clients: Dict[str, zmq.Socket] = {}
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._listener_lock = threading.Lock()
        self._sends: Dict[str, _Held] = {}
        self._send_keys: Dict[str, Set[str]] = {}
        self._gets: Dict[str, _Get] = {}
        self._claims: Dict[int, _Get] = {}
        # Payloads replaced or cleaned up while a receiver held a claim on
        # them, by claim: freed when it ends.
        self._retired: Dict[Tuple[int, str], List[_Held]] = {}
        self._next_expiry = 0.0
        self._next_sweep = 0.0
        # Puts so far: each payload's generation, which a grant names.
        self._puts = 0
        self._metrics = {
            "puts": 0,
            "gets": 0,
            "bytes_transferred": 0,
            "errors": 0,
            "timeouts": 0,
            "expired_claims": 0,
            "expired_payloads": 0,
            "early_reads_wasted": 0,
        }
        self._last_error: Optional[str] = None
        self._metrics_lock = threading.Lock()
        # Early reads made, by key: (sender session, generation). A claim
        # asked again (after "missing" or "busy") reads nothing again.
        self._early: "OrderedDict[str, Tuple[str, int]]" = OrderedDict()
        # The sender's claims granted, by claim id: the key each holds.
        self._claim_keys: Dict[int, str] = {}

        self.config = dict(config or {})
        self.stage_id = self.config.get("stage_id")
        self.role = str(self.config.get("role", "both")).lower()
        self.backend_name = str(self.config.get("backend", "auto"))
        pool_size = int(self.config.get("pool_size", self.config.get("memory_pool_size", _DEFAULT_POOL)))
        self.transfer_timeout = float(self.config.get("transfer_timeout", 30.0))
        self.claim_timeout = float(self.config.get("claim_timeout", 5.0))
        self.buffer_ttl = float(self.config.get("buffer_ttl_seconds", 300.0))
        options = dict(self.config.get("engine_options") or {})

        self._engine = tensorferry.TransferEngine(self.backend_name, **options)
        self._pool = Pool(self._engine, pool_size)
        self._ctx = zmq.Context()
        host = self.config.get("host")
        if host in (None, "", "auto", "*", "0.0.0.0", "::"):
            host = _inbox_host(self._engine.session_id)
        self.host = str(host)
        self.zmq_port: Optional[int] = None
        self.sender_host: Optional[str] = self.config.get("sender_host")
        sender_port = self.config.get("sender_zmq_port")
        self.sender_zmq_port: Optional[int] = int(sender_port) if sender_port is not None else None
        if self.sender_zmq_port is None and "zmq_port" in self.config and "from_stage" in self.config:
            # A receiver finds its sender where vLLM-omni's rule puts it.
            self.sender_zmq_port = self._derived_port()
        if not self.sender_host or str(self.sender_host).lower() == "auto":
            self.sender_host = self.host if self.sender_zmq_port is not None else None
        self._closed = False
        if self.role != "receiver":
            # A receiver listens only once it sends (a middle stage).
            self._ensure_listener()
        logger.info(
            "FerryConnector on %s (%s), pool %d MiB, role %s",
            self._engine.backend,
            self.host,
            self._pool.size >> 20,
            self.role,
        )

    # -- sending -------------------------------------------------------

    def put(self, from_stage: str, to_stage: str, put_key: str, data: Any) -> Tuple[bool, int, Optional[Dict[str, Any]]]:
        """Copies ``data`` into a region of the pool, and returns
        ``(True, size, metadata)``; the receiver passes ``metadata`` to its
        ``get``. ``(False, 0, None)`` when the payload cannot be sent (the
        pool is full, a value cannot be serialized), logged with why."""
        pool, engine = self._pool, self._engine
        if self._closed or pool is None or engine is None:
            raise RuntimeError("FerryConnector: put on a closed connector")
        key = self._make_key(put_key, from_stage, to_stage)
        try:
            layout = payload.plan(data, OmniSerializer.serialize)
        except Exception as e:
            self._error(f"put of {key}: {e}")
            return False, 0, None
        offset = pool.alloc(layout.size)
        if offset is None:
            # The pool serves both ways: free what sends and receives let go.
            now = time.monotonic()
            self._expire_sends(now)
            with self._lock:
                if not self._closed:
                    self._sweep(now, force=True)
            offset = pool.alloc(layout.size)
        if offset is None:
            self._error(f"put of {key}: {layout.size} bytes do not fit the pool ({pool.used} of {pool.size} held)")
            return False, 0, None
        try:
            layout.write(pool.array[offset : offset + layout.size])
            port = self._ensure_listener()
        except Exception as e:
            pool.free(offset, layout.size)
            self._error(f"put of {key}: {e}")
            return False, 0, None
        held = _Held(
            key=key,
            raw_key=put_key,
            offset=offset,
            plan_size=layout.size,
            header=len(layout.header),
            data=layout.data_start,
            expires=time.monotonic() + self.buffer_ttl,
        )
        with self._send_lock:
            self._puts += 1
            held.gen = self._puts
            old = self._sends.pop(key, None)
            if old is not None:
                self._retire(old)
            self._sends[key] = held
            self._send_keys.setdefault(put_key, set()).add(key)
            self._count("puts", 1)
            self._count("bytes_transferred", layout.size)
        metadata = {
            "ferry": METADATA_FORMAT,
            "source_host": self.host,
            "source_port": port,
            "data_size": layout.size,
            # Where the receiver may read before its claim is answered.
            "grant": [
                engine.session_id,
                pool.base + offset,
                layout.size,
                held.header,
                held.data,
                held.gen,
            ],
        }
        return True, layout.size, metadata

    def cleanup(self, request_id: str, from_stage: Optional[str] = None, to_stage: Optional[str] = None) -> None:
        """Frees what this connector holds for ``request_id``: payloads put
        under that key (or that key with the stages, or the internal key),
        once no receiver holds a claim on them, and ends receives of it as
        ``abandon_get`` does."""
        if (from_stage is None) != (to_stage is None):
            raise ValueError("cleanup: give both from_stage and to_stage, or neither")
        if from_stage is not None and to_stage is not None:
            keys = {self._make_key(request_id, from_stage, to_stage)}
        else:
            with self._send_lock:
                keys = set(self._send_keys.get(request_id, ())) | {request_id}
        with self._send_lock:
            for key in keys:
                held = self._sends.pop(key, None)
                if held is not None:
                    self._retire(held)
        self._abandon(lambda g: g.key in keys or g.raw_key == request_id)

    def reap_consumed(self) -> None:
        """Frees sent payloads whose lease or claim ran out (the listener
        does it too, on its own), and the regions of receives given up
        whose reads have ended (``get`` and ``health`` do it too)."""
        now = time.monotonic()
        self._expire_sends(now)
        with self._lock:
            if not self._closed:
                self._sweep(now)

    # -- receiving -----------------------------------------------------

    def get(
        self, from_stage: str, to_stage: str, get_key: str, metadata: Optional[Dict[str, Any]] = None
    ) -> Optional[Tuple[Any, int]]:
        """``(payload, size)`` once the payload ``put`` sent under this key
        has arrived, else None; never waits for the sender. The first call
        claims it from its sender (at ``metadata``'s address, else the
        configured sender) and, with ferry's metadata, posts its read at
        once; the call that sees the read done and the claim granted
        returns it. A failure (a sender that does not answer or dies, a read
        that fails) is logged and counted in ``health()``, frees what the
        receive held, and returns None; a later call starts over."""
        if self._closed:
            raise RuntimeError("FerryConnector: get on a closed connector")
        key = self._make_key(get_key, from_stage, to_stage)
        with self._lock:
            if self._closed:
                raise RuntimeError("FerryConnector: get on a closed connector")
            now = time.monotonic()
            self._sweep(now)
            g = self._gets.get(key)
            if g is None:
                g = self._start(key, get_key, metadata)
                if g is None:
                    return None
            g.touched = now
            self._drain(g.endpoint)
            return self._advance(g)

    def get_with_deadline(
        self,
        from_stage: str,
        to_stage: str,
        get_key: str,
        metadata: Optional[Dict[str, Any]] = None,
        *,
        deadline: float,
    ) -> Optional[Tuple[Any, int]]:
        """``get``, retried until it returns the payload or ``deadline``
        (``time.monotonic()``) passes, then None. A read still running at
        the deadline is not ended and its memory is not freed: it stays the
        receive's, for a later ``get`` or until ``abandon_get``."""
        pause = 0.0001
        while True:
            result = self.get(from_stage, to_stage, get_key, metadata)
            if result is not None:
                return result
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            key = self._make_key(get_key, from_stage, to_stage)
            with self._lock:
                g = self._gets.get(key)
                transfer = g.transfer if g is not None and g.state != "claiming" else None
            if transfer is not None:
                try:
                    transfer.wait(min(remaining, 1.0))
                except tensorferry.FerryError:
                    pass  # the next get() reports it
                continue
            time.sleep(min(pause, remaining))
            pause = min(pause * 2, 0.005)

    def abandon_get(self, get_key: str) -> None:
        """Gives up receiving ``get_key`` (under any stages): its claim is
        released at once; a granted read in flight is not ended but waited
        for, up to a second, and its memory freed. A read still running
        then (or one begun before the grant) is left to end: its memory is
        freed by the first ``get``, ``health`` or ``reap_consumed`` after
        it has."""
        self._abandon(lambda g: g.raw_key == get_key or g.key == get_key)

    def update_sender_info(self, sender_host: str, sender_zmq_port: int, sender_rank: Optional[int] = None) -> None:
        """Where ``get`` without metadata asks (vLLM-omni's KV manager calls
        it)."""
        self.sender_host = sender_host
        self.sender_zmq_port = int(sender_zmq_port)

    def get_connection_info(self) -> Dict[str, Any]:
        """This connector's addresses."""
        return {"host": self.host, "zmq_port": self.zmq_port, "session_id": self._live_engine().session_id}

    # -- the connector -------------------------------------------------

    def health(self) -> Dict[str, Any]:
        """Counters and what is held: ``sends_held`` (payloads put, not yet
        read) and ``sends_claimed``; ``gets_pending`` (receives begun),
        ``gets_granted`` (their claims granted) and ``gets_reading`` (reads
        in flight); ``pool_used``/``pool_size`` bytes; ``errors``,
        ``timeouts``, ``expired_claims``, ``expired_payloads``,
        ``early_reads_wasted`` (reads made from a put's metadata whose
        grant named another put); and ``last_error``."""
        pool, engine = self._pool, self._engine
        if self._closed or pool is None or engine is None:
            return {"status": "closed", **self._metrics, "last_error": self._last_error}
        with self._send_lock:
            sends = len(self._sends)
            claimed = sum(1 for h in self._sends.values() if h.claim is not None)
        with self._lock:
            if not self._closed:
                self._sweep(time.monotonic())
            gets = len(self._gets)
            granted = sum(1 for g in self._gets.values() if g.state == "reading")
            reading = sum(1 for g in self._gets.values() if g.transfer is not None and g.transfer.state == "pending")
        return {
            "status": "healthy",
            "backend": engine.backend,
            "host": self.host,
            "zmq_port": self.zmq_port,
            "sends_held": sends,
            "sends_claimed": claimed,
            "gets_pending": gets,
            "gets_granted": granted,
            "gets_reading": reading,
            "pool_used": pool.used,
            "pool_size": pool.size,
            **self._metrics,
            "last_error": self._last_error,
        }

    def close(self) -> None:
        """Stops the listener, ends receives in flight (returning once none
        of their bytes moves), and closes the engine. Idempotent."""
        if getattr(self, "_closed", True) and getattr(self, "_engine", None) is None:
            return
        self._closed = True
        self._stop.set()
        listener = getattr(self, "_listener", None)
        if listener is not None and listener is not threading.current_thread():
            listener.join()
        self._listener = None
        with self._lock:
            for g in self._gets.values():
                if g.transfer is not None:
                    g.transfer.release()
            self._gets.clear()
            self._claims.clear()
            for sock in self._clients.values():
                sock.close(linger=0)
            self._clients.clear()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        # Views a caller still holds keep the pool's memory mapped.
        self._pool = None

    # -- receiving, inside -----------------------------------------------

    def _start(self, key: str, raw_key: str, metadata: Optional[Dict[str, Any]]) -> Optional[_Get]:
        meta = metadata
        if isinstance(meta, dict) and raw_key in meta and isinstance(meta[raw_key], dict):
            meta = meta[raw_key]
        expected: Optional[int] = None
        grant: Any = None
        if isinstance(meta, dict) and meta.get("source_host") and meta.get("source_port"):
            if "ferry" in meta and meta["ferry"] != METADATA_FORMAT:
                self._error(f"get of {key}: metadata of format {meta['ferry']!r}, not {METADATA_FORMAT}")
                return None
            try:
                endpoint = _endpoint(str(meta["source_host"]), int(meta["source_port"]))
                if meta.get("data_size") is not None:
                    expected = int(meta["data_size"])
            except (TypeError, ValueError) as e:
                self._error(f"get of {key}: metadata {meta!r} does not name a sender: {e}")
                return None
            grant = meta.get("grant")
        elif self.sender_host and self.sender_zmq_port:
            endpoint = _endpoint(self.sender_host, self.sender_zmq_port)
        else:
            raise RuntimeError(
                f"FerryConnector: get of {key} has no metadata naming its sender, and no sender is configured "
                "(extra sender_host/sender_zmq_port, or zmq_port and from_stage)"
            )
        window = self.transfer_timeout + 5.0 * ((expected or 0) // _STEP_BYTES)
        # The sender grants no longer: a read past it could see the region
        # reused.
        window = min(window, control.MAX_WINDOW_MS / 1000.0)
        g = _Get(
            key=key,
            raw_key=raw_key,
            endpoint=endpoint,
            claim=secrets.randbits(63),
            sent=time.monotonic(),
            window=window,
            expected=expected,
            touched=time.monotonic(),
        )
        try:
            sock = self._client(endpoint)
            sock.send_multipart(control.encode(control.CLAIM, control.Claim(key, g.claim, int(window * 1000))), zmq.NOBLOCK)
        except zmq.ZMQError as e:
            self._error(f"get of {key}: the claim to {endpoint} cannot be sent: {e}")
            return None
        self._gets[key] = g
        self._claims[g.claim] = g
        # The put's metadata names the region: read it while the claim
        # travels. Its bytes are used only if the grant names the same put
        # (its generation): a payload is held, unchanged, from its put until
        # it is freed, and never held again, so a grant of that generation
        # shows it was the payload's during the whole read.
        # Once per put: a claim asked again (after "missing" or "busy")
        # reads nothing until it is granted.
        if isinstance(grant, list) and len(grant) == 6 and all(isinstance(v, int) for v in grant[1:]):
            early = control.Granted(g.claim, str(grant[0]), *grant[1:])
            g.early_of = (early.session, early.gen)
            if self._early.get(key) != g.early_of and self._valid_grant(g, early, report=False):
                self._early[key] = g.early_of
                self._early.move_to_end(key)
                while len(self._early) > _EARLY_MEMORY:
                    self._early.popitem(last=False)
                self._post(g, early, quiet=True)
        return g

    def _advance(self, g: _Get) -> Optional[Tuple[Any, int]]:
        transfer = g.transfer
        final = transfer is None or transfer.state != "pending"
        if g.state == "claiming":
            if transfer is not None and transfer.state == "failed":
                # The early read failed (the sender is gone, or its metadata
                # was wrong): the grant, if it comes, is read again.
                self._free_region(g)
            if time.monotonic() - g.sent > self.claim_timeout:
                self._count("timeouts", 1)
                self._reset_client(g.endpoint)
                self._error(f"get of {g.key}: the sender at {g.endpoint} did not answer its claim within {self.claim_timeout} s")
            return None
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
        if transfer is None or not final:
            return None
        if transfer.state == "failed":
            why = _failure(transfer)
            self._send_end(g, control.RELEASE)
            self._forget(g)
            self._error(f"get of {g.key}: the read from {g.endpoint} failed: {why}")
            return None
        pool = self._live_pool()
        offset, g.offset = g.offset, None
        self._forget(g)
        self._send_end(g, control.DONE)
        if offset is None:
            return None
        region = pool.lease(offset, g.size)
        try:
            value = payload.decode(region, g.header, g.data, OmniSerializer.deserialize)
        except payload.PayloadError as e:
            self._error(f"get of {g.key} from {g.endpoint}: {e}")
            return None
        finally:
            del region
        self._count("gets", 1)
        self._count("bytes_transferred", g.size)
        return value, g.size

    def _drain(self, endpoint: str) -> None:
        sock = self._clients.get(endpoint)
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
            if g is None or g.state != "claiming" or g.endpoint != endpoint:
                if verb == control.GRANTED and isinstance(message, control.Granted):
                    # An answer to a claim given up: let the sender know.
                    _send_quiet(sock, control.encode(control.RELEASE, control.Ended("", message.claim)))
                continue
            self._claims.pop(g.claim, None)
            if verb == control.GRANTED and isinstance(message, control.Granted):
                self._early.pop(g.key, None)
                self._on_grant(g, message)
                continue
            if verb == control.MISSING and g.early_of is not None and g.transfer is not None:
                # ferry's metadata comes from a put: a sender that no longer
                # has it freed it (read, cleaned up, or expired), and asking
                # again will not bring it back; said once per put.
                self._error(f"get of {g.key}: the sender at {endpoint} no longer has that put (read, cleaned up or expired)")
            # Not there yet (missing), or another receiver's (busy): a
            # later get asks again.
            self._forget(g)

    def _on_grant(self, g: _Get, granted: control.Granted) -> None:
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
            self._count("early_reads_wasted", 1)
            g.state = "discarding"
            g.regrant = granted

    def _valid_grant(self, g: _Get, granted: control.Granted, report: bool) -> bool:
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
            self._error(f"get of {g.key}: {why}")
        return why is None

    def _read(self, g: _Get, granted: control.Granted) -> None:
        """Reads what ``granted`` names, holding its claim."""
        if not self._post(g, granted, quiet=False):
            self._send_end(g, control.RELEASE)
            self._forget(g)
            return
        g.state = "reading"

    def _post(self, g: _Get, granted: control.Granted, quiet: bool) -> bool:
        """Posts the read of ``granted`` into a new region; False (and said
        why, unless ``quiet``) if it cannot be."""
        remaining = g.sent + g.window - time.monotonic()
        if remaining <= 0:
            if not quiet:
                self._error(f"get of {g.key}: the grant came after the claim's window")
            return False
        pool = self._live_pool()
        offset = pool.alloc(granted.size)
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
            pool.free(offset, granted.size)
            if not quiet:
                self._error(f"get of {g.key}: the read from {g.endpoint} was refused: {e}")
            return False
        g.offset = offset
        g.size = granted.size
        g.header = granted.header
        g.data = granted.data
        g.transfer = transfer
        g.read_of = (granted.session, granted.addr, granted.gen)
        return True

    def _free_region(self, g: _Get) -> None:
        """Frees ``g``'s region, whose read is final."""
        if g.offset is not None and self._pool is not None:
            self._pool.free(g.offset, g.size)
        g.offset = None
        g.transfer = None
        g.read_of = None

    def _forget(self, g: _Get) -> None:
        """Ends the receive ``g``: now if no read of it runs, else once its
        read is final (it stays, discarding, until then)."""
        self._claims.pop(g.claim, None)
        if g.transfer is not None and g.transfer.state == "pending":
            g.state = "discarding"
            g.regrant = None
            return
        self._free_region(g)
        if self._gets.get(g.key) is g:
            del self._gets[g.key]

    def _abandon(self, match: Any) -> None:
        with self._lock:
            if self._closed:
                return
            chosen = [g for g in self._gets.values() if match(g)]
        for g in chosen:
            until = time.monotonic() + _ABANDON_WAIT
            while True:
                with self._lock:
                    if self._closed or self._gets.get(g.key) is not g:
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
            elif now - g.touched > g.window + _CLAIM_GRACE:
                if g.transfer is not None and g.transfer.state == "pending":
                    continue  # its deadline ends it; a later sweep frees it
                logger.warning("FerryConnector: nobody asked for %s within %.0f s; its receive is ended", g.key, g.window)
                self._send_end(g, control.RELEASE)
                self._forget(g)

    def _send_end(self, g: _Get, verb: bytes) -> None:
        if self._ctx is None:
            return
        _send_quiet(self._client(g.endpoint), control.encode(verb, control.Ended(g.key, g.claim)))

    def _client(self, endpoint: str) -> zmq.Socket:
        sock = self._clients.get(endpoint)
        if sock is None:
            assert self._ctx is not None
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.IPV6, 1)
            sock.setsockopt(zmq.SNDHWM, 10000)
            sock.connect(endpoint)
            self._clients[endpoint] = sock
        return sock

    def _reset_client(self, endpoint: str) -> None:
        # A sender that went away leaves claims queued; start clean.
        claiming = [g for g in self._gets.values() if g.endpoint == endpoint and g.state == "claiming"]
        for g in claiming:
            # Should the sender come back, it frees them at once.
            self._send_end(g, control.RELEASE)
        sock = self._clients.pop(endpoint, None)
        if sock is not None:
            # A moment for the releases (and dones) queued on it.
            sock.close(linger=200)
        for g in claiming:
            self._forget(g)

    # -- sending, inside -------------------------------------------------

    def _ensure_listener(self) -> int:
        with self._listener_lock:
            if self.zmq_port is not None:
                if self._listener is None or not self._listener.is_alive():
                    raise RuntimeError("FerryConnector: the listener has stopped; receivers cannot claim")
                return self.zmq_port
            assert self._ctx is not None
            router = self._ctx.socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            router.setsockopt(zmq.ROUTER_MANDATORY, 0)
            router.setsockopt(zmq.IPV6, 1)
            # Control messages are small; anything larger is not one.
            router.setsockopt(zmq.MAXMSGSIZE, 1 << 16)
            try:
                if "zmq_port" in self.config and self.role != "receiver":
                    port = self._derived_port()
                    router.bind(_endpoint(self.host, port))
                else:
                    port = router.bind_to_random_port(_endpoint(self.host, None))
            except zmq.ZMQError as e:
                router.close(linger=0)
                raise RuntimeError(f"FerryConnector: cannot listen at {self.host}: {e}") from e
            self.zmq_port = int(port)
            self._listener = threading.Thread(
                target=self._serve, args=(router,), name=f"ferry-omni-{port}", daemon=True
            )
            self._listener.start()
            return self.zmq_port

    def _derived_port(self) -> int:
        from vllm_omni.distributed.omni_connectors.utils.local_rank import get_connector_local_rank

        return compute_connector_zmq_port(
            int(self.config["zmq_port"]),
            purpose=self.config.get("purpose", "request_forwarding"),
            from_stage=int(self.config.get("from_stage", self.stage_id or 0)),
            local_rank=get_connector_local_rank(),
            replica_id=max(int(os.environ.get("VLLM_OMNI_REPLICA_ID", "0")), 0),
        )

    def _serve(self, router: zmq.Socket) -> None:
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                if poller.poll(100):
                    while True:
                        try:
                            frames = router.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        if len(frames) < 2:
                            continue
                        try:
                            answer = self._answer(frames[1:])
                        except Exception:
                            logger.exception("FerryConnector: a control message was not answered")
                            continue
                        if answer is not None:
                            _send_quiet(router, [frames[0], *answer])
                now = time.monotonic()
                if now >= self._next_expiry:
                    self._next_expiry = now + 0.25
                    try:
                        self._expire_sends(now)
                    except Exception:
                        logger.exception("FerryConnector: expiring sent payloads failed")
        except Exception:
            logger.exception("FerryConnector: the listener stopped")
        finally:
            router.close(linger=0)

    def _answer(self, frames: List[bytes]) -> Optional[List[bytes]]:
        decoded = control.decode(frames)
        if decoded is None:
            logger.debug("FerryConnector: dropped a malformed control message")
            return None
        verb, message = decoded
        now = time.monotonic()
        with self._send_lock:
            if verb == control.CLAIM and isinstance(message, control.Claim):
                held = self._sends.get(message.key)
                if held is None:
                    return control.encode(control.MISSING, control.Refused(message.claim))
                if held.claim is not None and held.claim != message.claim and held.claim_expires > now:
                    return control.encode(control.BUSY, control.Refused(message.claim))
                window = min(max(message.window_ms, 0), control.MAX_WINDOW_MS) / 1000.0
                if held.claim is not None:
                    self._claim_keys.pop(held.claim, None)
                held.claim = message.claim
                held.claim_expires = now + window + _CLAIM_GRACE
                self._claim_keys[message.claim] = message.key
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
            if isinstance(message, control.Ended):
                key = message.key or self._claim_keys.get(message.claim, "")
                self._claim_keys.pop(message.claim, None)
                retired = self._retired.pop((message.claim, key), None)
                if retired is not None:
                    for held in retired:
                        self._free_held(held)
                    return None
                held = self._sends.get(key)
                if held is None or held.claim != message.claim:
                    return None
                if verb == control.DONE:
                    del self._sends[key]
                    self._forget_key(held)
                    self._free_held(held)
                else:
                    held.claim = None
        return None

    def _expire_sends(self, now: float) -> None:
        with self._send_lock:
            for key, held in list(self._sends.items()):
                if held.claim is not None and held.claim_expires <= now:
                    self._claim_keys.pop(held.claim, None)
                    held.claim = None
                    self._count("expired_claims", 1)
                    logger.warning(
                        "FerryConnector: the receiver that claimed %s did not finish within its window; "
                        "the claim ended",
                        key,
                    )
                if held.claim is None and held.expires <= now:
                    del self._sends[key]
                    self._forget_key(held)
                    self._count("expired_payloads", 1)
                    logger.warning(
                        "FerryConnector: %s was not received within %.0f s; its %d bytes are freed",
                        key,
                        self.buffer_ttl,
                        held.plan_size,
                    )
                    self._free_held(held)
            for both, helds in list(self._retired.items()):
                if all(held.claim_expires <= now for held in helds):
                    del self._retired[both]
                    self._claim_keys.pop(both[0], None)
                    for held in helds:
                        self._count("expired_claims", 1)
                        logger.warning(
                            "FerryConnector: the receiver that claimed %s (since cleaned up) did not finish "
                            "within its window; its %d bytes are freed",
                            held.key,
                            held.plan_size,
                        )
                        self._free_held(held)

    def _retire(self, held: _Held) -> None:
        """Frees ``held`` now if no receiver holds it, else once its claim
        ends (under ``_send_lock``)."""
        self._forget_key(held)
        if held.claim is None:
            self._free_held(held)
        else:
            self._retired.setdefault((held.claim, held.key), []).append(held)

    def _forget_key(self, held: _Held) -> None:
        keys = self._send_keys.get(held.raw_key)
        if keys is not None:
            keys.discard(held.key)
            if not keys:
                del self._send_keys[held.raw_key]

    def _free_held(self, held: _Held) -> None:
        if self._pool is not None:
            self._pool.free(held.offset, held.plan_size)

    # -- helpers ---------------------------------------------------------

    def _live_pool(self) -> Pool:
        if self._pool is None:
            raise RuntimeError("FerryConnector: closed")
        return self._pool

    def _live_engine(self) -> "tensorferry.TransferEngine":
        if self._engine is None:
            raise RuntimeError("FerryConnector: closed")
        return self._engine

    def _count(self, name: str, n: int) -> None:
        with self._metrics_lock:
            self._metrics[name] += n

    def _error(self, what: str) -> None:
        self._count("errors", 1)
        self._last_error = what
        logger.error("FerryConnector: %s", what)


def _endpoint(host: str, port: Optional[int]) -> str:
    """``tcp://host:port`` (``tcp://host`` without a port), an IPv6 host in
    brackets."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"tcp://{host}" if port is None else f"tcp://{host}:{port}"


def _inbox_host(session_id: str) -> str:
    """The host of the engine's notification inbox, named at the end of its
    session id (``<plane session>|tcp://host:port``): the address this host
    is reached at on the engine's network."""
    _, _, inbox = session_id.rpartition("|tcp://")
    host, _, _ = inbox.rpartition(":")
    return host.strip("[]") or "127.0.0.1"


def _failure(transfer: "tensorferry.Transfer") -> str:
    try:
        transfer.wait(0)
    except tensorferry.FerryError as e:
        return str(e)
    return "unknown"


def _send_quiet(sock: zmq.Socket, frames: List[bytes]) -> None:
    try:
        sock.send_multipart(frames, zmq.NOBLOCK)
    except zmq.ZMQError as e:
        logger.debug("FerryConnector: a control message was not sent: %s", e)
