"""The authentication handler of ``FerryConnector``'s ZeroMQ context.

libzmq puts every new connection to a guarded socket (one with a ZAP
domain, or a CURVE server) to the handler bound at
``inproc://zeromq.zap.01`` of the socket's context, before it reads a
message of that connection (ZAP 1.0, RFC 27). ferry's own sockets have a
handler in ferry's Rust libzmq context; pyzmq's context is another libzmq
context, so the connector runs this one on it. It decides nothing itself:
every verdict is ``tensorferry.Guard.verdict``, the answer ferry's Rust
handler gives, so that the connector's claim socket admits exactly whom
the engine's sockets and ferry's nodes admit.

The handler must stay bound as long as a socket it guards is open: a CURVE
server whose context has no handler admits any client key (which is why
the connector also sets ``ZAP_ENFORCE_DOMAIN`` on its socket, so that a
missing handler refuses instead)."""

from __future__ import annotations

import logging
import threading
from typing import Any, List, Sequence

import zmq
from zmq.utils import z85

logger = logging.getLogger("tensorferry.vllm_omni")

#: Where libzmq sends a context's authentication requests.
ZAP_ENDPOINT = "inproc://zeromq.zap.01"
_VERSION = b"1.0"
# Refusals logged: the first ten, then one in a thousand (as ferry's own
# handler does), so that a flood of connections costs a counter, not the log.
_LOG_FIRST = 10
_LOG_EVERY = 1000


class ZapHandler:
    """Answers the authentication requests of ``ctx`` from a thread of its
    own, with ``guard``'s verdicts. Start it before binding a socket it
    guards, ``close`` it after closing them."""

    def __init__(self, ctx: zmq.Context, guard: Any) -> None:
        self._guard = guard
        self._refused = 0
        self._stop = threading.Event()
        sock = ctx.socket(zmq.REP)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.bind(ZAP_ENDPOINT)
        except zmq.ZMQError as e:
            sock.close(linger=0)
            raise RuntimeError(
                f"FerryConnector: cannot start its authentication handler at {ZAP_ENDPOINT}: {e} "
                "(another handler already serves this ZeroMQ context)"
            ) from e
        # Bound here, so that no guarded socket binds before the handler
        # exists; from now on only the thread uses the socket (starting a
        # thread is the memory barrier ZeroMQ asks of a socket that
        # changes threads).
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, name="ferry-omni-zap", daemon=True)
        self._thread.start()

    @property
    def refused(self) -> int:
        """Connections refused so far."""
        return self._refused

    def close(self) -> None:
        """Stops the thread, which closes the socket. Idempotent."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _serve(self) -> None:
        sock = self._sock
        try:
            while not self._stop.is_set():
                try:
                    if not sock.poll(100):
                        continue
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    continue
                except zmq.ZMQError as e:
                    if e.errno == zmq.ETERM:
                        return
                    logger.warning("FerryConnector: the authentication handler could not read a request: %s", e)
                    continue
                try:
                    sock.send_multipart(self.reply(frames))
                except zmq.ZMQError as e:
                    # A REP socket that did not answer cannot read the next
                    # request; libzmq refuses a connection whose request
                    # goes unanswered, so nothing is let in meanwhile.
                    logger.warning("FerryConnector: the authentication handler could not answer: %s", e)
        finally:
            sock.close(linger=0)

    def reply(self, frames: Sequence[bytes]) -> List[bytes]:
        """The reply to one request (version, request id, domain, address,
        identity, mechanism, credentials...): 200 with the User-Id the
        guard names, or 400 with why. Never raises: anything it cannot
        read is refused."""
        request_id = bytes(frames[1]) if len(frames) > 1 else b""
        address = ""
        credentials = b""
        try:
            if len(frames) < 6 or bytes(frames[0]) != _VERSION:
                ok, text = False, "not a ZAP 1.0 request"
            else:
                domain = bytes(frames[2]).decode("utf-8", "replace")
                address = bytes(frames[3]).decode("utf-8", "replace")
                mechanism = bytes(frames[5])
                credentials = bytes(frames[6]) if len(frames) > 6 else b""
                ok, text = self._guard.verdict(domain, address, mechanism, credentials)
        except Exception as e:  # anything: a request is answered, never dropped
            ok, text = False, f"the request could not be judged: {type(e).__name__}"
        if ok:
            return [_VERSION, request_id, b"200", b"OK", text.encode(), b""]
        self._refused += 1
        n = self._refused
        if n <= _LOG_FIRST or n % _LOG_EVERY == 0:
            key = z85.encode(credentials).decode() if len(credentials) == 32 else ""
            logger.warning(
                "FerryConnector: refused a connection from %s%s: %s (%d refused so far)",
                address or "an unknown address",
                f" with key {key}" if key else "",
                text,
                n,
            )
        return [_VERSION, request_id, b"400", text.encode()[:255], b"", b""]
