"""The gates before a window (rule 4 of :mod:`profkit._capture.decide`): the export queue
has room, profkit is within its CPU budget.

A speculative window (``capture_slow``) is paid from the same budget, ``max_overhead``; with
none set, from :data:`SPECULATION_BUDGET`: the rate cap (``max_per_minute``) counts the
profiles exported, and a speculative window released unread exports nothing
(docs/targeted-capture.md, "What speculation costs")."""

from __future__ import annotations

import time

from .._config import Config
from .._export.pipeline import ExportPipeline
from .._stats import Stats

__all__ = ["SPECULATION_BUDGET", "Gate"]

#: the CPU share speculative windows may bring profkit to when ``max_overhead`` is not set
#: (measured in docs/targeted-capture.md: a service then spends 1-2% in profkit)
SPECULATION_BUDGET = 0.01

#: seconds an over-budget verdict stands before the CPU share is read again
_OVER_RECHECK_S = 0.01


class Gate:
    """The gates before a window (rule 4): the export queue has room, profkit is within its
    CPU budget (``max_overhead``)."""

    def __init__(self, config: Config, stats: Stats, pipeline: ExportPipeline) -> None:
        self._stats = stats
        self._pipeline = pipeline
        self._budget = config.max_overhead
        #: speculative windows' budget: ``max_overhead``, else :data:`SPECULATION_BUDGET`
        self._speculation: float = (
            SPECULATION_BUDGET if config.max_overhead is None else config.max_overhead
        )
        #: ``time.monotonic()`` until which profkit is known to be over a budget: the
        #: sampled calls' (``max_overhead``), the speculative windows'
        self._over_until = self._spec_over_until = 0.0

    def refused(self) -> str | None:
        """The gate before a window: the queue has room, profkit is within its budget."""
        if self._pipeline.full():
            return "skipped_backlog"
        if self._budget is not None and self.over_budget():
            return "skipped_budget"
        return None

    def speculation_refused(self) -> str | None:
        """The gate before a speculative window: the queue has room, profkit is within the
        speculative windows' budget (``max_overhead``, else :data:`SPECULATION_BUDGET`)."""
        if self._pipeline.full():
            return "skipped_backlog"
        now = time.monotonic()
        if now < self._spec_over_until:
            return "skipped_budget"
        budget = self._speculation
        if self._stats.cpu.budget_share(budget) >= budget:
            self._spec_over_until = now + _OVER_RECHECK_S
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
