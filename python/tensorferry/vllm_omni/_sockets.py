"""The claim protocol's ZeroMQ sockets: the sender's claim socket (a
ROUTER, guarded as ferry's own sockets are), a receiver's DEALERs to its
senders (under CURVE each a client of its sender's key), the endpoints
they meet at, what an engine's session id names (the host of its
notification inbox, and under CURVE its key), and a send that neither
blocks nor raises."""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional, Tuple

import zmq
from zmq.utils import z85

logger = logging.getLogger("tensorferry.vllm_omni")

#: The length of a CURVE public key in Z85.
KEY_TEXT_LEN = 40

#: Where a receiver's claims go: a sender's endpoint, and under CURVE its
#: key (Z85; None without).
Link = Tuple[str, Optional[str]]


def claim_router(ctx: zmq.Context, guard: Any, host: str, start_handler: Callable[[], None]) -> zmq.Socket:
    """The sender's claim socket (not bound yet): a ROUTER of ``ctx`` for
    ``host``, guarded by ``guard`` (see ``_guard_router``; ``start_handler``
    starts the authentication handler it needs). Raises RuntimeError if it
    cannot be guarded."""
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.ROUTER_MANDATORY, 0)
    # IPv6 only on an IPv6 host, as the engine's inbox: on an IPv4
    # host it would name IPv4 peers ``::ffff:a.b.c.d`` to the
    # authentication handler, which no IPv4 allow-list admits.
    router.setsockopt(zmq.IPV6, 1 if ":" in host else 0)
    # Control messages are small; anything larger is not one.
    router.setsockopt(zmq.MAXMSGSIZE, 1 << 16)
    try:
        _guard_router(router, guard, host, start_handler)
    except (zmq.ZMQError, RuntimeError) as e:
        router.close(linger=0)
        raise RuntimeError(f"FerryConnector: cannot guard its claim socket at {host}: {e}") from e
    return router


def _guard_router(router: zmq.Socket, guard: Any, host: str, start_handler: Callable[[], None]) -> None:
    """Sets the claim socket up as ferry's ``Guard.server`` sets up its
    own sockets: a CURVE server with the guard's key, and the ZAP domain
    that puts each connection to the handler (``start_handler`` starts it
    on the socket's context, a ``_zap.ZapHandler``, before the socket
    binds)."""
    if not guard.enforces:
        return
    start_handler()
    if guard.curve:
        router.curve_server = True
        router.curve_secretkey = str(guard.secret_key).encode()
        router.curve_publickey = str(guard.public_key).encode()
    domain = guard.domain(tcp_endpoint(host, None))
    if domain is not None:
        router.zap_domain = domain.encode()
    # Should the handler ever be gone while the socket is open, refuse
    # every connection rather than let any CURVE key in. A second line
    # of defence (the handler is bound before the socket and closed
    # after it), so a libzmq without the option does without it.
    try:
        router.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
    except (AttributeError, zmq.ZMQError) as e:
        logger.debug("FerryConnector: ZAP_ENFORCE_DOMAIN is not available: %s", e)


class Dealers:
    """A receiver's DEALERs, one per ``Link``: its claims to a sender, and
    the sender's answers, go over the DEALER of that sender's endpoint and
    key (sockets of ``ctx``; under CURVE with ``guard``'s key). Not
    thread-safe: its user's lock guards it."""

    def __init__(self, ctx: zmq.Context, guard: Any) -> None:
        self._ctx: Optional[zmq.Context] = ctx
        self._guard = guard
        self._socks: Dict[Link, zmq.Socket] = {}

    def get(self, link: Link) -> Optional[zmq.Socket]:
        """The DEALER of ``link``, if one is open."""
        return self._socks.get(link)

    def to(self, link: Link) -> zmq.Socket:
        """The DEALER to ``link``'s endpoint, connected now if none is
        open: under CURVE a CURVE client of its server key."""
        sock = self._socks.get(link)
        if sock is None:
            assert self._ctx is not None
            endpoint, server_key = link
            sock = self._ctx.socket(zmq.DEALER)
            try:
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.IPV6, 1)
                sock.setsockopt(zmq.SNDHWM, 10000)
                if server_key is not None:
                    # Only the holder of the server key's secret completes
                    # the handshake: no other socket at the endpoint can
                    # answer a claim.
                    sock.curve_serverkey = server_key.encode()
                    sock.curve_publickey = str(self._guard.public_key).encode()
                    sock.curve_secretkey = str(self._guard.secret_key).encode()
                sock.connect(endpoint)
            except zmq.ZMQError:
                sock.close(linger=0)
                raise
            self._socks[link] = sock
        return sock

    def send(self, link: Link, frames: List[bytes]) -> None:
        """``send_quiet`` on the DEALER to ``link``; nothing once closed."""
        if self._ctx is None:
            return
        send_quiet(self.to(link), frames)

    def drop(self, link: Link, linger: int) -> None:
        """Closes the DEALER of ``link``, if one is open, giving what is
        queued on it ``linger`` ms."""
        sock = self._socks.pop(link, None)
        if sock is not None:
            sock.close(linger=linger)

    def close(self) -> None:
        """Closes every DEALER at once, and lets go of the context."""
        for sock in self._socks.values():
            sock.close(linger=0)
        self._socks.clear()
        self._ctx = None


def tcp_endpoint(host: str, port: Optional[int]) -> str:
    """``tcp://host:port`` (``tcp://host`` without a port), an IPv6 host in
    brackets."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"tcp://{host}" if port is None else f"tcp://{host}:{port}"


def inbox_host(session_id: str) -> str:
    """The host of the engine's notification inbox, named at the end of its
    session id (``<plane session>|tcp://host:port``, under CURVE
    ``<plane session>|<key>@tcp://host:port``): the address this host is
    reached at on the engine's network."""
    _, _, inbox = session_id.rpartition("|")
    if session_key(session_id) is not None:
        inbox = inbox[KEY_TEXT_LEN + 1 :]
    if not inbox.startswith("tcp://"):
        return "127.0.0.1"
    host, _, _ = inbox[len("tcp://") :].rpartition(":")
    return host.strip("[]") or "127.0.0.1"


def session_key(session_id: str) -> Optional[str]:
    """The CURVE key (Z85) an engine's session id names for its inbox
    (``...|<key>@tcp://...``; an engine's key is its whole guard's, the
    claim socket's too), or None. By position, as the engine reads it:
    ``@`` is a Z85 character."""
    _, bar, inbox = session_id.rpartition("|")
    if not bar or len(inbox) <= KEY_TEXT_LEN or inbox[KEY_TEXT_LEN] != "@":
        return None
    key = inbox[:KEY_TEXT_LEN]
    try:
        z85.decode(key.encode())
    except (ValueError, KeyError, IndexError):
        return None
    return key


def send_quiet(sock: zmq.Socket, frames: List[bytes]) -> None:
    """Sends ``frames`` if ``sock`` takes them now; a control message that
    is not sent is only logged (at debug level)."""
    try:
        sock.send_multipart(frames, zmq.NOBLOCK)
    except zmq.ZMQError as e:
        logger.debug("FerryConnector: a control message was not sent: %s", e)
