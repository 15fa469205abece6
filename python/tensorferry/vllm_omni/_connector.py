"""``FerryConnector``: vLLM-omni's ``OmniConnectorBase`` on ferry's
transfer engine.

The sender copies a payload into a region of its registered pool
(``put``) and answers claims for it on a ZeroMQ ROUTER; the receiver claims
it, reads it one-sidedly into a region of its own pool, and hands out views
of that region (``get``). One connector does both, as a middle stage that
reuses its input connector to send does.

Who may claim: the connector takes ferry's guard (``allow_from``,
``curve_key``, ``curve_peers``, or the environment's ``FERRY_ALLOW_FROM``,
``FERRY_CURVE_KEY``, ``FERRY_CURVE_PEERS``), one ``tensorferry.Guard`` for
its engine and its claim socket alike. With it the sender's ROUTER refuses
a connection from an address off the allow-list, and under CURVE any
client whose key is not admitted, before reading a message of it (its
authentication handler is ``_zap.ZapHandler``, which asks the guard). A
claim belongs to the connection's authenticated identity: its CURVE key,
else the connection itself; only its owner ends it, and asking again does
not lengthen it. A receiver under CURVE connects as a CURVE client to the
key the put's metadata names (``source_key``), if it admits that key, and
uses a grant only if it names the engine (and, with ferry's metadata, the
region) the put named.

Its parts: ``_claims`` keeps what it sends and answers claims for it,
``_receives`` what it receives (``_get``: one receive, and what its
metadata names); ``_stamp`` is a put's stamp; ``_pool`` is the registered pool,
``_payload`` a payload's layout in it, ``_control`` the claim messages,
``_sockets`` the claim protocol's sockets, ``_guard`` whom they admit and
believe, and ``_metrics`` what ``health()`` counts."""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Dict, Optional, Tuple

import zmq
from vllm_omni.distributed.omni_connectors.connectors.base import OmniConnectorBase
from vllm_omni.distributed.omni_connectors.utils.initialization import compute_connector_zmq_port
from vllm_omni.distributed.omni_connectors.utils.serialization import OmniSerializer

import tensorferry
from tensorferry.vllm_omni import _control as control
from tensorferry.vllm_omni import _payload as payload
from tensorferry.vllm_omni import _stamp as stamp
from tensorferry.vllm_omni._claims import Held, Sends, serve
from tensorferry.vllm_omni._guard import guard_settings, sender_key
from tensorferry.vllm_omni._metrics import Metrics
from tensorferry.vllm_omni._pool import Pool
from tensorferry.vllm_omni._receives import Receives
from tensorferry.vllm_omni._sockets import claim_router, inbox_host, tcp_endpoint
from tensorferry.vllm_omni._zap import ZapHandler

logger = logging.getLogger("tensorferry.vllm_omni")

_DEFAULT_POOL = 1 << 30


def _flag(value: Any) -> bool:
    """A yes/no setting of ``extra``, given as a bool or as text."""
    if isinstance(value, str):
        return value.strip().lower() not in ("0", "false", "no", "off", "")
    return bool(value)


def _kept_by(half: str, name: str, doc: str) -> Any:
    """The property of a setting ``name`` that the connector's half in
    attribute ``half`` keeps: read from it, and assigned to it."""
    return property(
        lambda self: getattr(getattr(self, half), name),
        lambda self, value: setattr(getattr(self, half), name, value),
        doc=doc,
    )


class FerryConnector(OmniConnectorBase):
    """A vLLM-omni connector on ferry: ``name: FerryConnector`` in a stage
    config's ``connectors``.

    ``extra`` (all optional): ``backend`` (``"auto"``, ``"local"``,
    ``"fabric"``, ``"verbs"``: ferry's data plane), ``pool_size`` (bytes of
    the registered pool both directions use, 1 GiB; ``memory_pool_size``
    too), ``prefault`` (make the pool's pages, in a thread, from when the
    connector is made, so that the first put and get into them do not
    fault them in one by one: true; it holds the pool's memory from then
    on), ``host`` (the address peers reach this connector at; default: the
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

    Who may claim, as ferry's engine takes it: ``allow_from`` (addresses,
    a list or a comma-separated string), ``curve_key`` (this process's
    secret CURVE certificate, mode 0600), ``curve_peers`` (the public
    certificates admitted: a directory of ``*.key`` files, or one); also
    accepted in ``engine_options`` (a value given in both must be the same).
    For a part not given (the allow-list; CURVE's key and peers), the
    environment's ``FERRY_ALLOW_FROM``, or ``FERRY_CURVE_KEY`` and
    ``FERRY_CURVE_PEERS``. The engine and the claim
    socket take the same. Under CURVE, ``sender_key`` (the sender's public
    key in Z85, or its certificate) is the key a ``get`` whose metadata
    names none (vLLM-omni's ``{source_host, source_port}``, or none) claims
    from; without it, the one key ``curve_peers`` admits, if it admits one.

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
        # Set when the connector closes: the listener stops, and the
        # receives take no more calls.
        self._closing = threading.Event()
        self._ctx: Optional[zmq.Context] = None
        self._engine: Optional[tensorferry.TransferEngine] = None
        self._pool: Optional[Pool] = None
        self._zap: Optional[ZapHandler] = None
        self._listener_lock = threading.Lock()
        self._metrics = Metrics()

        self.config = dict(config or {})
        self.stage_id = self.config.get("stage_id")
        self.role = str(self.config.get("role", "both")).lower()
        self.backend_name = str(self.config.get("backend", "auto"))
        pool_size = int(self.config.get("pool_size", self.config.get("memory_pool_size", _DEFAULT_POOL)))
        transfer_timeout = float(self.config.get("transfer_timeout", 30.0))
        claim_timeout = float(self.config.get("claim_timeout", 5.0))
        buffer_ttl = float(self.config.get("buffer_ttl_seconds", 300.0))
        options = dict(self.config.get("engine_options") or {})
        settings = guard_settings(self.config, options)
        # One guard for the engine and the claim socket: the engine gets
        # the same keywords (none: both read the same environment).
        try:
            self._guard = tensorferry.Guard(**settings)
        except (TypeError, ValueError) as e:
            raise ValueError(f"FerryConnector: {e}") from e
        self._sender_key = sender_key(self.config.get("sender_key"), self._guard)

        self._engine = tensorferry.TransferEngine(self.backend_name, **options, **settings)
        self._pool = Pool(self._engine, pool_size, prefault=_flag(self.config.get("prefault", True)))
        self._ctx = zmq.Context()
        self._sends = Sends(self._pool, self._engine, self._metrics, buffer_ttl)
        self._receives = Receives(
            self._pool,
            self._engine,
            self._ctx,
            self._guard,
            self._sender_key,
            self._metrics,
            self._closing,
            claim_timeout=claim_timeout,
            transfer_timeout=transfer_timeout,
        )
        host = self.config.get("host")
        if host in (None, "", "auto", "*", "0.0.0.0", "::"):
            host = inbox_host(self._engine.session_id)
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
            "FerryConnector on %s (%s), pool %d MiB, role %s, %s",
            self._engine.backend,
            self.host,
            self._pool.size >> 20,
            self.role,
            self._guard,
        )

    # The halves keep these settings: assigning one here changes what they
    # do from then on.
    transfer_timeout = _kept_by("_receives", "transfer_timeout", "Seconds a read may take.")
    claim_timeout = _kept_by("_receives", "claim_timeout", "Seconds a sender may take to answer a claim.")
    buffer_ttl = _kept_by("_sends", "buffer_ttl", "Seconds a sent payload no receiver claimed is kept.")

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
            self._metrics.error(f"put of {key}: {e}")
            return False, 0, None
        # The payload, then its stamp (``_stamp``).
        span = stamp.span(layout.size)
        offset = pool.alloc(span)
        if offset is None:
            # The pool serves both ways: free what sends and receives let go.
            now = time.monotonic()
            self._sends.take_notes()
            self._sends.expire(now)
            self._receives.sweep(now, force=True)
            offset = pool.alloc(span)
        if offset is None:
            self._metrics.error(
                f"put of {key}: {layout.size} bytes do not fit the pool ({pool.used} of {pool.size} held)"
            )
            return False, 0, None
        token = stamp.new_token()
        try:
            layout.write(pool.array[offset : offset + layout.size])
            stamp.write(pool.array, offset + stamp.stamp_at(layout.size), token)
            port = self._ensure_listener()
        except Exception as e:
            pool.free(offset, span)
            self._metrics.error(f"put of {key}: {e}")
            return False, 0, None
        held = Held(
            key=key,
            raw_key=put_key,
            offset=offset,
            plan_size=layout.size,
            header=len(layout.header),
            data=layout.data_start,
            expires=time.monotonic() + self.buffer_ttl,
            token=token,
            span=span,
        )
        self._sends.add(held)
        metadata = {
            "ferry": control.METADATA_FORMAT,
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
            # Where the stamp is in the region, and the put's token: a read
            # of the region followed by one of a stamp that still says so
            # needs no answer to its claim.
            "stamp": [stamp.stamp_at(layout.size), token],
        }
        if self._guard.curve:
            # The key the claim socket serves with: a receiver connects to
            # it as a CURVE client (if it admits it), so that only this
            # sender can answer its claim.
            metadata["source_key"] = self._guard.public_key
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
            keys = self._sends.keys_of(request_id)
        self._sends.drop(keys)
        self._receives.abandon(lambda g: g.key in keys or g.raw_key == request_id)

    def reap_consumed(self) -> None:
        """Frees sent payloads whose lease or claim ran out (the listener
        does it too, on its own), and the regions of receives given up
        whose reads have ended (``get`` and ``health`` do it too)."""
        now = time.monotonic()
        self._sends.expire(now)
        self._receives.sweep(now)

    # -- receiving -----------------------------------------------------

    def get(
        self, from_stage: str, to_stage: str, get_key: str, metadata: Optional[Dict[str, Any]] = None
    ) -> Optional[Tuple[Any, int]]:
        """``(payload, size)`` once the payload ``put`` sent under this key
        has arrived, else None (also when neither ``metadata`` nor the
        configuration names a sender to ask); never waits for the sender.
        The first call claims it from its sender (at ``metadata``'s
        address, else the configured sender) and, with ferry's metadata,
        posts its read at once, and then the read of the put's stamp; the
        call that sees the read done and the stamp still the put's (on the
        local plane, the first), or the claim granted, returns it. A failure (a sender that does not answer or dies, a read
        that fails) is logged and counted in ``health()``, frees what the
        receive held, and returns None; a later call starts over."""
        if self._closed:
            raise RuntimeError("FerryConnector: get on a closed connector")
        key = self._make_key(get_key, from_stage, to_stage)
        return self._receives.get(key, get_key, metadata, (self.sender_host, self.sender_zmq_port))

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
        (``time.monotonic()``) passes, then None. Between tries it waits on
        what the receive waits for (its read, or its claim's answer), not
        on a timer. A read still running at the deadline is not ended and
        its memory is not freed: it stays the receive's, for a later
        ``get`` or until ``abandon_get``."""
        key = self._make_key(get_key, from_stage, to_stage)
        pause = 0.0001
        while True:
            result = self.get(from_stage, to_stage, get_key, metadata)
            if result is not None:
                return result
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            if self._receives.wait(key, min(remaining, 1.0)):
                pause = 0.0001
                continue
            # Nothing to wait on (no sender named yet, or the payload is
            # not there yet): ask again a little later.
            time.sleep(min(pause, remaining))
            pause = min(pause * 2, 0.005)

    def abandon_get(self, get_key: str) -> None:
        """Gives up receiving ``get_key`` (under any stages): its claim is
        released at once; a granted read in flight is not ended but waited
        for, up to a second, and its memory freed. A read still running
        then (or one begun before the grant) is left to end: its memory is
        freed by the first ``get``, ``health`` or ``reap_consumed`` after
        it has."""
        self._receives.abandon(lambda g: g.raw_key == get_key or g.key == get_key)

    def update_sender_info(self, sender_host: str, sender_zmq_port: int, sender_rank: Optional[int] = None) -> None:
        """Where ``get`` without metadata asks (vLLM-omni's KV manager calls
        it)."""
        self.sender_host = sender_host
        self.sender_zmq_port = int(sender_zmq_port)

    def get_connection_info(self) -> Dict[str, Any]:
        """This connector's addresses (and, under CURVE, its public key)."""
        if self._engine is None:
            raise RuntimeError("FerryConnector: closed")
        info: Dict[str, Any] = {
            "host": self.host,
            "zmq_port": self.zmq_port,
            "session_id": self._engine.session_id,
        }
        if self._guard.curve:
            info["public_key"] = self._guard.public_key
        return info

    # -- the connector -------------------------------------------------

    def health(self) -> Dict[str, Any]:
        """Counters and what is held: ``sends_held`` (payloads put, not yet
        read) and ``sends_claimed``; ``gets_pending`` (receives begun),
        ``gets_granted`` (their claims granted) and ``gets_reading`` (reads
        in flight); ``pool_used``/``pool_size`` bytes, and
        ``pool_prefault_seconds`` (what making the pool's pages took; None
        while they are being made); ``errors``,
        ``timeouts``, ``expired_claims``, ``expired_payloads``,
        ``early_reads_wasted`` (reads made from a put's metadata whose
        grant named another put of the same region);
        ``connections_refused`` (by the guard, at the claim socket),
        ``foreign_ends`` (``done``/``release`` of a claim from a connection
        that does not own it: ignored), ``grants_refused`` (grants naming
        another engine or region than the put, or than the sender's key:
        not read); ``guard`` (``curve``, ``allow_from``); and
        ``last_error``."""
        pool, engine = self._pool, self._engine
        if self._closed or pool is None or engine is None:
            return {"status": "closed", **self._metrics_now(), "last_error": self._metrics.last_error}
        sends, claimed = self._sends.counts()
        gets, granted, reading = self._receives.counts()
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
            "pool_prefault_seconds": pool.prefault_seconds,
            "guard": {"curve": self._guard.curve, "allow_from": self._guard.allow_from},
            **self._metrics_now(),
            "last_error": self._metrics.last_error,
        }

    def _metrics_now(self) -> Dict[str, Any]:
        metrics: Dict[str, Any] = self._metrics.counts()
        zap = self._zap
        if zap is not None:
            metrics["connections_refused"] = zap.refused
        return metrics

    def close(self) -> None:
        """Stops the listener, ends receives in flight (returning once none
        of their bytes moves), and closes the engine. Idempotent."""
        if getattr(self, "_closed", True) and getattr(self, "_engine", None) is None:
            return
        self._closed = True
        self._closing.set()
        listener = getattr(self, "_listener", None)
        if listener is not None and listener is not threading.current_thread():
            listener.join()
        self._listener = None
        # After the claim socket closed (the listener closes it): a CURVE
        # socket without a handler would admit any key.
        if self._zap is not None:
            self._zap.close()
        receives: Optional[Receives] = getattr(self, "_receives", None)
        if receives is not None:
            receives.close()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        # Views a caller still holds keep the pool's memory mapped.
        self._pool = None
        sends: Optional[Sends] = getattr(self, "_sends", None)
        if sends is not None:
            sends.close()

    # -- the claim socket ------------------------------------------------

    def _ensure_listener(self) -> int:
        with self._listener_lock:
            if self.zmq_port is not None:
                if self._listener is None or not self._listener.is_alive():
                    raise RuntimeError("FerryConnector: the listener has stopped; receivers cannot claim")
                return self.zmq_port
            assert self._ctx is not None
            router = claim_router(self._ctx, self._guard, self.host, self._start_zap)
            try:
                if "zmq_port" in self.config and self.role != "receiver":
                    port = self._derived_port()
                    router.bind(tcp_endpoint(self.host, port))
                else:
                    port = router.bind_to_random_port(tcp_endpoint(self.host, None))
            except zmq.ZMQError as e:
                router.close(linger=0)
                raise RuntimeError(f"FerryConnector: cannot listen at {self.host}: {e}") from e
            self.zmq_port = int(port)
            self._listener = threading.Thread(
                target=self._serve, args=(router,), name=f"ferry-omni-{port}", daemon=True
            )
            self._listener.start()
            return self.zmq_port

    def _start_zap(self) -> None:
        # Once per context, and before a socket it guards binds.
        if self._zap is None:
            assert self._ctx is not None
            self._zap = ZapHandler(self._ctx, self._guard)

    def _serve(self, router: zmq.Socket) -> None:
        # The listener's thread runs this method, not ``serve`` itself: the
        # thread holding the connector keeps a connector nobody else holds
        # from being collected (and closed) while it answers claims.
        serve(router, self._sends, self._closing, self._guard.curve)

    def _derived_port(self) -> int:
        from vllm_omni.distributed.omni_connectors.utils.local_rank import get_connector_local_rank

        return compute_connector_zmq_port(
            int(self.config["zmq_port"]),
            purpose=self.config.get("purpose", "request_forwarding"),
            from_stage=int(self.config.get("from_stage", self.stage_id or 0)),
            local_rank=get_connector_local_rank(),
            replica_id=max(int(os.environ.get("VLLM_OMNI_REPLICA_ID", "0")), 0),
        )

