"""A put's stamp: eight bytes after the payload in the sender's region
that say whose the region is now, so that a receiver whose metadata
names the region can tell, with one more one-sided read, that what it
read was the put's, without waiting for its claim's answer.

The sender writes the put's token (random, 64 bits, never 0) there
before ``put`` returns the metadata that names it; while a claim holds
the payload it writes ``claimed(token, claim)``, and the token again when
the claim ends; before it frees the region it writes 0. A region holds
one put from its put until it is freed, and never again (tokens are not
reused), and 0 is written before any later use of the region can write
a byte of it. So a receiver that reads the region, and then (once that
read is final) reads the stamp and finds the token or its own claim's
value, read the put's bytes: had the region been freed during the read,
the stamp read, which comes after, would see 0 or another put's.

A stamp of another claim says another receiver holds the payload: the
read is not used (the claim's answer, ``busy``, decides)."""

from __future__ import annotations

import secrets

import numpy as np

#: The stamp's size.
STAMP_BYTES = 8
_MASK = (1 << 64) - 1
# Mixed into a claimed stamp, so that no claim id below 2**63 (a
# receiver's are) leaves the token as it was.
_CLAIMED = 1 << 63


def stamp_at(size: int) -> int:
    """Where a payload of ``size`` bytes has its stamp in its region."""
    return (size + STAMP_BYTES - 1) & ~(STAMP_BYTES - 1)


def span(size: int) -> int:
    """The bytes of a region for a payload of ``size`` bytes and its stamp."""
    return stamp_at(size) + STAMP_BYTES


def new_token() -> int:
    """A put's token: random, never 0 (a freed region's stamp)."""
    return secrets.randbits(64) or 1


def claimed(token: int, claim: int) -> int:
    """The stamp of a put whose payload the claim ``claim`` holds."""
    return (token ^ claim ^ _CLAIMED) & _MASK


def write(array: np.ndarray, at: int, value: int) -> None:
    """Writes the stamp ``value`` at byte ``at`` of ``array`` (the pool)."""
    array[at : at + STAMP_BYTES].view("<u8")[0] = value


def read(array: np.ndarray, at: int) -> int:
    """The stamp at byte ``at`` of ``array``."""
    return int(array[at : at + STAMP_BYTES].view("<u8")[0])
