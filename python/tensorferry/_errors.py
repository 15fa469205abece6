"""The exceptions ferry raises (both extension modules raise these classes).

Every error of a ferry call is a ``FerryError``, of the subclass of its
kind; ``kind`` carries the kind's name. The kinds are the core's fault
kinds (``tensorferry._native.FAULT_CODES``: the same names and codes in every
layer) and the kinds of the calls around the data plane (``refused``,
``draining``, ``no_room`` from a node, ``closed`` from anything closed);
``tensorferry._native.ERROR_KINDS`` lists them all, and the tests check this
module against it.

=====================  ===================  ================================
class                  ``kind``             also a
=====================  ===================  ================================
``PeerGoneError``      ``peer_gone``        ``ConnectionError``
``UnknownPeerError``   ``unknown_peer``
``OutOfBoundsError``   ``out_of_bounds``
``TooLargeError``      ``too_large``
``FerryTimeoutError``  ``timeout``          ``TimeoutError``
``RegistrationError``  ``registration``
``FerryIOError``       ``io``               ``OSError``
``RefusedError``       ``refused``
``DrainingError``      ``draining``
``ClosedError``        ``closed``
``NoRoomError``        ``no_room``
=====================  ===================  ================================
"""

from __future__ import annotations

from typing import Dict, Optional, Type


class FerryError(RuntimeError):
    """A ferry call failed; the message names what failed (the peer, the
    address, the call and its errno). Catch a subclass for one kind of
    failure, this class for all of them.

    ``kind`` names the kind of failure (the subclass's ``kind``).
    """

    #: The kind's name (``"peer_gone"``, ``"timeout"``, ...).
    kind: str = "io"

    def __init__(self, message: str = "", kind: Optional[str] = None) -> None:
        super().__init__(message)
        if kind is not None:
            self.kind = kind


class PeerGoneError(FerryError, ConnectionError):
    """The peer is gone: its process exited, its endpoint or memory object
    vanished, its connection was refused."""

    kind = "peer_gone"


class UnknownPeerError(FerryError):
    """The peer's session id or endpoint names nothing this data plane can
    reach, or cannot be parsed."""

    kind = "unknown_peer"


class OutOfBoundsError(FerryError):
    """A write's source or destination lies outside registered memory."""

    kind = "out_of_bounds"


class TooLargeError(FerryError):
    """A message, write or request is larger than the data plane or the
    pool can carry."""

    kind = "too_large"


class FerryTimeoutError(FerryError, TimeoutError):
    """Something awaited did not happen in time (a write, the
    coordinator's answer to a registration). Also a ``TimeoutError``."""

    kind = "timeout"


class RegistrationError(FerryError):
    """A memory registration failed (a bad or overlapping range, a region
    that is not registered, resources exhausted)."""

    kind = "registration"


class FerryIOError(FerryError, OSError):
    """Any other operating-system or library error. Also an ``OSError``."""

    kind = "io"


class RefusedError(FerryError):
    """The coordinator refused the instance's registration, for the reason
    in the message (an unknown role, a work endpoint not admitted...)."""

    kind = "refused"


class DrainingError(FerryError):
    """The instance drains or has left: it takes no new request."""

    kind = "draining"


class ClosedError(FerryError):
    """The engine, instance or coordinator is closed, or the staging or
    delivery was used up already (committed, given back, released)."""

    kind = "closed"


class NoRoomError(FerryError):
    """The pool or the request table has no room now: try again once
    deliveries were released or requests were sent."""

    kind = "no_room"


#: Each kind's class, by its name.
ERROR_CLASSES: Dict[str, Type[FerryError]] = {
    cls.kind: cls
    for cls in (
        PeerGoneError,
        UnknownPeerError,
        OutOfBoundsError,
        TooLargeError,
        FerryTimeoutError,
        RegistrationError,
        FerryIOError,
        RefusedError,
        DrainingError,
        ClosedError,
        NoRoomError,
    )
}


# Shown (in tracebacks, reprs and pickles) as where users find them.
for _cls in (FerryError, *ERROR_CLASSES.values()):
    _cls.__module__ = "tensorferry"
del _cls


def error_for(message: str, kind: str) -> FerryError:
    """The exception of ``kind`` with ``message`` (a plain ``FerryError``
    carrying ``kind`` for a kind this module does not know)."""
    cls = ERROR_CLASSES.get(kind)
    return cls(message) if cls is not None else FerryError(message, kind)
