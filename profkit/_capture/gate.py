"""The gates before a window (rule 4 of :mod:`profkit._capture.decide`): the export queue
has room, profkit is within its CPU budget."""

from __future__ import annotations

import time

from .._config import Config
from .._export.pipeline import ExportPipeline
from .._stats import Stats

__all__ = ["Gate"]

#: seconds an over-budget verdict stands before the CPU share is read again
_OVER_RECHECK_S = 0.01


class Gate:
    """The gates before a window (rule 4): the export queue has room, profkit is within its
    CPU budget (``max_overhead``)."""

    def __init__(self, config: Config, stats: Stats, pipeline: ExportPipeline) -> None:
        self._stats = stats
        self._pipeline = pipeline
        self._budget = config.max_overhead
        #: ``time.monotonic()`` until which profkit is known to be over its budget
        self._over_until = 0.0

    def refused(self) -> str | None:
        """The gate before a window: the queue has room, profkit is within its budget."""
        if self._pipeline.full():
            return "skipped_backlog"
        if self._budget is not None and self.over_budget():
            return "skipped_budget"
        return None

    def over_budget(self) -> bool:
        """Whether profkit's CPU share is at its budget (the decisions' own share counted up
        to half of it: :meth:`CpuMeter.budget_share`); once it is, said again for 10 ms
        without asking (the share reads the process's CPU clock, a system call)."""
        now = time.monotonic()
        if now < self._over_until:
            return True
        assert self._budget is not None
        if self._stats.cpu.budget_share(self._budget) >= self._budget:
            self._over_until = now + _OVER_RECHECK_S
            return True
        return False
