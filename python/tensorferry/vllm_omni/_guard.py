"""Whom a ``FerryConnector`` admits and believes, by ferry's guard
(``tensorferry.Guard``: one for its engine and its claim socket alike).

The guard's settings come from the connector's ``extra``
(``guard_settings``). A receiver under CURVE claims only from a key its
guard admits: the key the put's metadata names, else the one configured
(``sender_key``), as ``claim_key`` decides for each get; and it reads a
grant only if it names the engine (and, with ferry's metadata, the region)
the put named (``foreign_grant``), since a socket that answers at the
sender's address is not proof of being the sender."""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Optional, Tuple

from tensorferry.vllm_omni import _control as control
from tensorferry.vllm_omni._sockets import KEY_TEXT_LEN, session_key

#: The guard's settings, as ``extra`` (or its ``engine_options``) names them.
GUARD_SETTINGS = ("allow_from", "curve_key", "curve_peers")


def guard_settings(config: Dict[str, Any], options: Dict[str, Any]) -> Dict[str, Any]:
    """The guard's keywords ``extra`` gives, at its top level or in its
    ``engine_options`` (taken out of ``options``). Raises ValueError for
    one given in both with two values."""
    settings: Dict[str, Any] = {}
    for name in GUARD_SETTINGS:
        top = config.get(name)
        inner = options.pop(name, None)
        if top is not None and inner is not None and _setting(name, top) != _setting(name, inner):
            raise ValueError(
                f"FerryConnector: extra {name}={top!r} and engine_options {name}={inner!r} differ; "
                "the engine and the claim socket take one guard: give it once"
            )
        value = top if top is not None else inner
        if value is not None:
            settings[name] = value
    return settings


def _setting(name: str, value: Any) -> Any:
    """``value`` of setting ``name`` in a form two spellings of it compare
    equal in: addresses as a set, paths as absolute paths."""
    if name == "allow_from":
        items = value.split(",") if isinstance(value, str) else list(value)
        return frozenset(str(a).strip() for a in items if str(a).strip())
    return os.path.abspath(os.fspath(value)) if isinstance(value, (str, os.PathLike)) else value


def sender_key(value: Any, guard: Any) -> Optional[str]:
    """The key (Z85) a get whose metadata names none claims from, under
    CURVE: ``sender_key`` (a key in Z85, or a certificate file), else the
    one key the guard admits, if it admits one. Raises ValueError for a
    ``sender_key`` that is not a key, without CURVE, or not admitted."""
    if value is None:
        peers = guard.peers if guard.curve else []
        return peers[0] if len(peers) == 1 else None
    text = os.fspath(value) if isinstance(value, os.PathLike) else str(value)
    if len(text) == KEY_TEXT_LEN and not os.path.exists(text):
        key = text
    else:
        import zmq.auth

        try:
            public, _ = zmq.auth.load_certificate(text)
        except (OSError, ValueError) as e:
            raise ValueError(f"FerryConnector: sender_key {text!r}: neither a key in Z85 nor a certificate: {e}") from e
        if not public:
            raise ValueError(f"FerryConnector: sender_key {text!r}: the certificate has no public key")
        key = public.decode()
    if not guard.curve:
        raise ValueError("FerryConnector: sender_key needs CURVE (curve_key and curve_peers, or FERRY_CURVE_*)")
    if not guard.admits_key(key):
        raise ValueError(f"FerryConnector: sender_key {key} is not one of the keys curve_peers admits")
    return key


def claim_key(
    guard: Any,
    configured: Optional[str],
    error: Callable[[str], None],
    key: str,
    endpoint: str,
    source_key: Any,
    ferry_meta: bool,
) -> Any:
    """The sender key the claim of ``key`` (to ``endpoint``) goes to: None
    without CURVE, the key (Z85) under CURVE, False (said why, to
    ``error``) when there is none it may use. ``source_key``: the key the
    put's metadata names; ``ferry_meta``: whether that metadata is ferry's;
    ``configured``: the key ``sender_key`` gave. Raises RuntimeError when
    the configuration names none."""
    if source_key is not None:
        if not guard.curve:
            error(
                f"get of {key}: the sender at {endpoint} speaks CURVE (its metadata names key {source_key!r}), "
                "and this connector has no CURVE key (curve_key, curve_peers)"
            )
            return False
        if not isinstance(source_key, str) or not guard.admits_key(source_key):
            # The metadata is not proof of whom it names: only a key
            # this connector admits may answer its claims.
            error(
                f"get of {key}: the sender's key {source_key!r} (its metadata's source_key) is not one this "
                "connector admits (curve_peers); not claimed"
            )
            return False
        return source_key
    if not guard.curve:
        return None
    if ferry_meta:
        error(
            f"get of {key}: the sender at {endpoint} does not speak CURVE (its metadata names no source_key), "
            "and this connector speaks only CURVE"
        )
        return False
    if configured is None:
        raise RuntimeError(
            f"FerryConnector: get of {key} under CURVE: its metadata names no sender key (source_key), and "
            f"none is configured: set extra sender_key (the sender's public key, or its certificate), or admit "
            f"only the sender's key in curve_peers ({len(guard.peers)} keys are admitted)"
        )
    return configured


def foreign_grant(
    granted: control.Granted, endpoint: str, region: Optional[Tuple[str, int]], server_key: Optional[str]
) -> Optional[str]:
    """Why ``granted`` (from ``endpoint``) is not the put's (None if it may
    be): a reader at the claim's endpoint is not proof of being the sender
    (without CURVE anyone who binds there answers), so a grant is read only
    if it names the engine and region the put's metadata named
    (``region``), and under CURVE an engine whose key is the one that
    answered (``server_key``)."""
    if region is not None and (granted.session, granted.addr) != region:
        return (
            f"the grant from {endpoint} names engine {granted.session!r} at {granted.addr:#x}, but the put's "
            f"metadata named {region[0]!r} at {region[1]:#x}"
        )
    if server_key is not None and session_key(granted.session) != server_key:
        return (
            f"the grant from {endpoint} names engine {granted.session!r}, whose key is not the sender's "
            f"{server_key}"
        )
    return None
