"""Where exporters that run outside profkit's pipeline (the OTLP span exporter) count.

They are constructed with their counters; when they are not, they count into the default
set here by :func:`profkit.configure` (the global session's), like OpenTelemetry's API
falls back to its global provider. This module sits below the session, so exporters never
import the layers above them.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Protocol

__all__ = ["DEFAULT", "OWNED", "Counters", "flush_owned"]


class Counters(Protocol):
    """What an exporter counts into (a session's stats satisfy it)."""

    def add(self, name: str, n: int = 1) -> None:
        """Add ``n`` to the counter ``name``."""

    def error(self, reason: str, exc: BaseException | None) -> None:
        """Count (and log once) an error under ``reason``."""


def unexport(counters: Counters, reason: str, n: int) -> None:
    """``n`` calls counted exported whose spans never left: dropped for ``reason`` (where
    the counters can move them: a session's stats; other counters only count failures)."""
    move = getattr(counters, "unexport", None)
    if move is not None:
        move(reason, n)


class _Default:
    __slots__ = ("counters",)

    def __init__(self) -> None:
        self.counters: Counters | None = None


#: the global session's counters (None: no session, count nowhere)
DEFAULT = _Default()


class _Owned:
    """The span processors profkit built (``otlp_span_processor``), flushed by profkit's own
    ``force_flush()`` and ``shutdown()`` wherever they are added, the application's global
    provider too: what they fail to send is then known, and counted, before those return."""

    __slots__ = ("_lock", "_processors")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._processors: weakref.WeakSet[Any] = weakref.WeakSet()

    def add(self, processor: Any) -> None:
        with self._lock:
            self._processors.add(processor)

    def discard(self, processor: Any) -> None:
        with self._lock:
            self._processors.discard(processor)

    def live(self) -> list[Any]:
        with self._lock:
            return list(self._processors)


#: the live processors profkit built
OWNED = _Owned()


def flush_owned(timeout_millis: int) -> bool:
    """Flush every live processor profkit built, one after another within ``timeout_millis``
    in all; True when each flushed."""
    import time

    end = time.monotonic() + timeout_millis / 1000
    ok = True
    for processor in OWNED.live():
        left = int((end - time.monotonic()) * 1000)
        if left <= 0 or not processor.force_flush(left):
            ok = False
    return ok
