"""``tensorferry.TransferEngine``: sglang's ``BaseTransferEngine`` contract, and
what NIXL-style connectors are built on: transfers by handle
(``tensorferry.Transfer``), one-sided reads, notifications."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type

from tensorferry import _native
from tensorferry._errors import FerryIOError

#: What ``transfer_sync`` and ``batch_transfer_sync`` return, by failure
#: kind (``FerryError.kind``'s names); 0 is success. The core's table
#: (``FaultKind::code``), as the extension module exports it.
ERROR_CODES: Dict[str, int] = dict(_native.FAULT_CODES)

#: The longest notification, in bytes.
MAX_NOTIFICATION: int = _native.MAX_NOTIFICATION


def _fabric_module() -> Any:
    """The libfabric plugin's extension module, or a ``FerryIOError``
    saying how to install it."""
    try:
        import tensorferry_fabric._native as fabric
    except ImportError as e:
        raise FerryIOError(
            "the fabric backend is ferry's libfabric plugin, which cannot be "
            f"imported here ({e}); install it with `pip install tensorferry-fabric` "
            "(its wheel carries libfabric), or `pip install ./python/fabric` from "
            "tensorferry's repository against the host's libfabric (1.17 or later)"
        ) from e
    return fabric


class TransferEngine:
    """A transfer engine, with the names of sglang's ``BaseTransferEngine``.

    ``backend`` names its data plane as ``tensorferry.Instance`` and the
    CLI do: ``"local"`` (processes on this host, any memory they
    registered, by cross-memory attach; ``"shm"``, pools in shared memory,
    is a node's only), ``"fabric"`` (ferry's libfabric data
    plane; needs the ``tensorferry-fabric`` plugin), ``"verbs"`` (an RDMA NIC), or
    ``"auto"`` (verbs when the host has an RDMA device, else local).

    Options (keywords): ``timeout`` (seconds a transfer may take, 30: past
    it its operations are ended, and the call returns once they have, so
    that no byte of it moves after any return; a data plane that cannot
    end them returns, at most ``tensorferry.END_GRACE`` seconds later,
    ``NotEnded`` as a timeout, with their memory kept in use;
    ``post_write`` and ``post_read`` may name their own); ``notify_host``
    (the address of this host peers send notifications to: loopback for
    ``local``, else the first IPv4 address of an interface that is up);
    who may reach the engine's endpoints (its notification inbox, and the
    verbs side channel): ``allow_from`` (IP addresses, a list or a
    comma-separated string), ``curve_key`` (this process's secret CURVE
    certificate, mode 0600) and ``curve_peers`` (the public certificates of
    the engines admitted: a directory of ``*.key`` files, or one); for a
    part not given (the allow-list; CURVE's key and peers, a pair),
    ``FERRY_ALLOW_FROM``, or ``FERRY_CURVE_KEY`` and ``FERRY_CURVE_PEERS``
    (as a deployment sets them once for every ferry object of a
    process). With CURVE a notification's sender is the
    key it came with: one naming another engine's session is dropped.
    local: ``threads``, ``split_at``; fabric: ``provider``
    (``"tcp"``, ``"efa"``, ``"verbs;ofi_rxm"``, ...: libfabric's ``shm``
    is refused, as it cannot end an operation a peer has taken; use
    ``"local"`` on one host), ``source``, ``max_chunk``, ``write_timeout``;
    verbs: ``device``, ``port``, ``gid_index``, ``listen``,
    ``max_chunk``, ``write_timeout`` (the same options, read by the same
    parser, as a node's). An option the backend does not take raises
    ``TypeError``.

    Errors are ``tensorferry.FerryError`` subclasses by kind (a closed engine's
    calls raise ``ClosedError``); the ``*_sync`` calls return codes instead.
    Every method may be called from many threads at once; transfers release
    the GIL while they run. A process that only receives makes no calls
    (but ``notifications`` to read its notifications).
    """

    def __init__(self, backend: str = "auto", **options: Any) -> None:
        module = _fabric_module() if backend == "fabric" else _native
        self._engine = module.TransferEngine(backend, **options)

    @property
    def session_id(self) -> str:
        """What peers pass as ``dst_session_id`` (read it after registering:
        the fabric backend names its regions in it)."""
        return self._engine.session_id

    @property
    def supports_gpu_direct(self) -> bool:
        """False: ferry's engines move host memory."""
        return False

    @property
    def backend(self) -> str:
        """The data plane in use: ``"local"``, ``"fabric"`` or ``"verbs"``."""
        return self._engine.backend

    @property
    def last_error(self) -> Optional[str]:
        """Why this thread's last transfer failed (``None`` after a success)."""
        return self._engine.last_error

    def register_buffer(self, ptr: int, length: int) -> None:
        """Registers ``length`` bytes at address ``ptr`` (a numpy array's
        ``ctypes.data``, a tensor's ``data_ptr()``): peers may write into
        them and this engine may write from them, until deregistered. Keep
        the memory alive meanwhile. Raises ``RegistrationError`` (or
        another ``FerryError``)."""
        self._engine.register_buffer(ptr, length)

    def deregister_buffer(self, ptr: int) -> None:
        """Ends the registration of the region at ``ptr``; once it returns,
        no peer writes into it. Raises ``FerryError``."""
        self._engine.deregister_buffer(ptr)

    def transfer_sync(self, dst_session_id: str, src_addr: int, dst_addr: int, length: int) -> int:
        """Writes ``length`` bytes from ``src_addr`` (in a region registered
        here) to ``dst_addr`` (in one the peer registered). Returns 0 once
        every byte is visible at the peer, a negative ``ERROR_CODES`` value
        on failure, with the reason in ``last_error``."""
        return self._engine.transfer_sync(dst_session_id, src_addr, dst_addr, length)

    def batch_transfer_sync(
        self,
        dst_session_id: str,
        src_addrs: List[int],
        dst_addrs: List[int],
        lengths: List[int],
    ) -> int:
        """``transfer_sync`` of every ``(src, dst, length)`` of the three
        lists at once: 0 when all arrived, negative on any failure."""
        return self._engine.batch_transfer_sync(dst_session_id, src_addrs, dst_addrs, lengths)

    def read_sync(self, src_session_id: str, local_addr: int, remote_addr: int, length: int) -> int:
        """Reads ``length`` bytes from ``remote_addr`` (in a region the peer
        ``src_session_id`` registered) into ``local_addr`` (in one registered
        here). Returns 0 once every byte is here, a negative ``ERROR_CODES``
        value on failure, with the reason in ``last_error``."""
        return self._engine.read_sync(src_session_id, local_addr, remote_addr, length)

    def batch_read_sync(
        self,
        src_session_id: str,
        local_addrs: List[int],
        remote_addrs: List[int],
        lengths: List[int],
    ) -> int:
        """``read_sync`` of every ``(local, remote, length)`` of the three
        lists at once: 0 when all arrived, negative on any failure."""
        return self._engine.batch_read_sync(src_session_id, local_addrs, remote_addrs, lengths)

    def post_write(
        self,
        dst_session_id: str,
        src_addrs: Sequence[int],
        dst_addrs: Sequence[int],
        lengths: Sequence[int],
        *,
        notify: Optional[bytes] = None,
        timeout: Optional[float] = None,
    ) -> "Transfer":
        """Posts writes of every ``(src, dst, length)`` (``src`` here,
        ``dst`` in the peer ``dst_session_id``) and returns at once with
        their ``Transfer``. With ``notify`` (at most ``MAX_NOTIFICATION``
        bytes), the peer is sent that notification once every byte is in
        its memory (none if the transfer fails). ``timeout``: seconds until
        the transfer is ended if unfinished (default: the engine's).

        Raises ``FerryError`` if it is refused before anything moves (a
        source outside this engine's registered memory, lists of different
        lengths, a notification too long or to a peer with no notification
        endpoint, a closed engine); failures while it runs are the
        ``Transfer``'s."""
        native = self._engine.post_write(
            dst_session_id, list(src_addrs), list(dst_addrs), list(lengths), notify=notify, timeout=timeout
        )
        return Transfer(native)

    def post_read(
        self,
        src_session_id: str,
        local_addrs: Sequence[int],
        remote_addrs: Sequence[int],
        lengths: Sequence[int],
        *,
        notify: Optional[bytes] = None,
        timeout: Optional[float] = None,
    ) -> "Transfer":
        """Posts one-sided reads of every ``(local, remote, length)``
        (``remote`` in the memory the peer ``src_session_id`` registered,
        ``local`` here) and returns their ``Transfer``; the peer makes no
        call. ``notify`` is sent to the peer once every byte is here;
        ``timeout`` and errors as ``post_write`` (a destination outside this
        engine's registered memory is refused)."""
        native = self._engine.post_read(
            src_session_id, list(local_addrs), list(remote_addrs), list(lengths), notify=notify, timeout=timeout
        )
        return Transfer(native)

    def notify(self, dst_session_id: str, message: bytes) -> None:
        """Sends ``message`` (at most ``MAX_NOTIFICATION`` bytes) to the peer
        engine ``dst_session_id`` now, after every notification this engine
        sent it before, from this thread. A peer that reads none fails only
        the sends to it: once its outbox is full (64 KiB beyond the two
        sockets' buffers) this waits for room at most ten seconds, then
        raises ``FerryTimeoutError``. Raises ``TooLargeError`` for a
        longer message, ``UnknownPeerError`` for a session id that names no
        notification endpoint (a ferry node's, or not an engine's)."""
        self._engine.notify(dst_session_id, message)

    def notifications(self) -> List[Tuple[str, bytes]]:
        """Every notification that arrived since the last call, as
        ``(sender's session id, message)``, in the order each sender sent
        them; an empty list if none. Does not wait."""
        return self._engine.notifications()

    def notification_fd(self) -> int:
        """A file descriptor that polls readable when notifications may
        have arrived that ``notifications`` has not taken, to wait on
        (``select``, ``selectors``, asyncio's ``add_reader``,
        ``zmq.Poller``) instead of calling ``notifications`` in a loop.
        Readable is a hint: the call may then find none. Valid until
        ``close``; never close it."""
        return self._engine.notification_fd()

    def close(self) -> None:
        """Ends every transfer still pending (it returns once no byte of
        them moves) and every registration, and closes the engine; later
        calls fail."""
        self._engine.close()

    def __enter__(self) -> "TransferEngine":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return repr(self._engine)


class Transfer:
    """A transfer posted by ``TransferEngine.post_write`` or ``post_read``.

    Poll it (``state``), wait for it (``wait``), and release it
    (``release``, or leave a ``with`` block, or drop it): once it is final
    (done, failed, or ended by its timeout) or released, no byte of it
    moves any more, so its sources may be reused and its destinations
    read. Any number may be in flight at once, from any threads; ``wait``
    and ``release`` let go of the GIL.
    """

    __slots__ = ("_transfer",)

    def __init__(self, native: Any) -> None:
        self._transfer = native

    @property
    def state(self) -> str:
        """``"pending"`` (bytes of it may still move), ``"done"`` (every
        byte arrived, and its notification was sent) or ``"failed"`` (it
        failed, timed out, or was released unfinished; none of its bytes
        moves any more). Does not wait."""
        return self._transfer.state

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Waits at most ``timeout`` seconds (``None``: until it is final,
        which its own timeout bounds). Returns True once it is done, False
        if it is still pending; raises its failure (a ``FerryError`` by
        kind: ``FerryTimeoutError`` past its timeout, ``ClosedError`` if it
        was released unfinished or its engine closed)."""
        return self._transfer.wait(timeout)

    def release(self) -> None:
        """Ends it if it is still pending, and returns once no byte of it
        moves (its data plane ends every operation in flight with the same
        peer, so that peer's other transfers may fail too). Raises nothing,
        and may be called again: afterwards ``state`` is its final state,
        and ``wait()`` returns True or raises its failure at once."""
        self._transfer.release()

    def __enter__(self) -> "Transfer":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return repr(self._transfer)
