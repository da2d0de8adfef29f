"""Where exporters that run outside profkit's pipeline (the OTLP span exporter) count.

They are constructed with their counters; when they are not, they count into the default
set here by :func:`profkit.configure` (the global session's), like OpenTelemetry's API
falls back to its global provider. This module sits below the session, so exporters never
import the layers above them.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["DEFAULT", "Counters"]


class Counters(Protocol):
    """What an exporter counts into (a session's stats satisfy it)."""

    def add(self, name: str, n: int = 1) -> None:
        """Add ``n`` to the counter ``name``."""

    def error(self, reason: str, exc: BaseException | None) -> None:
        """Count (and log once) an error under ``reason``."""


class _Default:
    __slots__ = ("counters",)

    def __init__(self) -> None:
        self.counters: Counters | None = None


#: the global session's counters (None: no session, count nowhere)
DEFAULT = _Default()
