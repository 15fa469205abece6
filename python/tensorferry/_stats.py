"""What the nodes' ``stats()`` return, key by key (the tests check these
against the extension module's dicts)."""

from __future__ import annotations

from typing import TypedDict


class InstanceStats(TypedDict):
    """``tensorferry.Instance.stats()``: counters since the instance started,
    and gauges now."""

    #: Requests staged and committed.
    staged: int
    #: Requests written to their receiver.
    sent: int
    #: Requests that failed before reaching their receiver.
    send_failed: int
    #: Deliveries received.
    received: int
    #: Deliveries released (or failed) by the application.
    released: int
    #: Deliveries the application held that the coordinator aborted.
    aborted: int
    #: Writes posted on the data plane.
    writes: int
    #: Writes that failed.
    write_errors: int
    #: Bytes written to peers.
    bytes_written: int
    #: Control messages received.
    messages_in: int
    #: Control messages sent.
    messages_out: int
    #: Control messages the state machine ignored (late, duplicated, not
    #: for this instance).
    ignored: int
    #: Frames dropped: not decodable, too large, malformed.
    bad_frames: int
    #: Deliveries forwarded (received, then staged for the next leg in one
    #: message).
    forwarded: int
    #: ``transfer_alloc`` messages held for lack of room (under sglang's
    #: head).
    allocs_held: int
    #: Requests held now, in any state (gauge).
    requests_held: int
    #: Pool slots allocated now, preallocated ones included (gauge).
    live_slots: int
    #: Preallocated receive slots (gauge).
    prealloc_slots: int
    #: Preallocated receive slots in use now (gauge).
    prealloc_in_use: int


class CoordinatorStats(TypedDict):
    """``tensorferry.Coordinator.stats()``: its figures now."""

    #: Instances registered now.
    members: int
    #: Requests in flight now.
    in_flight: int
    #: Preallocated slots taken now.
    prealloc_taken: int
    #: Requests delivered since it started.
    delivered: int
    #: Requests failed since it started.
    failed: int
    #: Hand-offs that took the preallocated-slot fast path.
    fast_path: int
    #: Control messages it ignored (late, duplicated, not for a peer it
    #: knows).
    ignored: int
