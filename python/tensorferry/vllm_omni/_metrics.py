"""What a ``FerryConnector`` counts: the counters its ``health()`` reports
and its last error, which its sending half (``_claims``, partly on the
claim socket's thread) and its receiving half (``_receives``) both add
to."""

from __future__ import annotations

import logging
import threading
from typing import Dict, Optional

logger = logging.getLogger("tensorferry.vllm_omni")


class Metrics:
    """The connector's counters, and its errors: counted, logged, and the
    last one kept (``last_error``). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Dict[str, int] = {
            "puts": 0,
            "gets": 0,
            "bytes_transferred": 0,
            "errors": 0,
            "timeouts": 0,
            "expired_claims": 0,
            "expired_payloads": 0,
            "early_reads_wasted": 0,
            "connections_refused": 0,
            "foreign_ends": 0,
            "grants_refused": 0,
        }
        self.last_error: Optional[str] = None

    def count(self, name: str, n: int) -> int:
        """Adds ``n`` to the counter ``name``; its new value."""
        with self._lock:
            self._counts[name] += n
            return self._counts[name]

    def error(self, what: str) -> None:
        """Counts ``what`` among the errors, logs it, and keeps it as the
        last."""
        self.count("errors", 1)
        self.last_error = what
        logger.error("FerryConnector: %s", what)

    def counts(self) -> Dict[str, int]:
        """The counters now (a copy)."""
        with self._lock:
            return dict(self._counts)
