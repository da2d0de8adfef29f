"""The counters of one session, and what ``profkit.stats()`` returns."""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Callable
from typing import TypedDict

from ._compat import peek_count
from ._errors import log
from ._overhead import CpuMeter

__all__ = ["Stats", "StatsSnapshot"]

_REFUSED = ("skipped_backlog", "skipped_budget", "skipped_rate_limit")


class StatsSnapshot(TypedDict):
    """What :func:`profkit.stats` returns: the counters of the global session.

    Every root call is exactly one of ``sampled``, ``warmup_calls`` or ``unsampled``
    (``skipped_unsampled_trace``, ``skipped_backlog``, ``skipped_budget`` and
    ``skipped_rate_limit`` are part of ``unsampled``: those calls are not profiled). Every
    sampled call ends as exactly one of ``exported``, ``dropped`` (by reason in
    ``dropped_reasons``), ``skipped_busy`` or ``skipped_foreign``, or is still pending: once
    ``force_flush()`` returned True,
    ``sampled == exported + dropped + skipped_busy + skipped_foreign``.
    """

    root_calls: int
    sampled: int
    unsampled: int
    exported: int
    """Calls handed to a recording span or taken by an exporter (log events, console, ...)."""
    dropped: int
    skipped_busy: int
    skipped_foreign: int
    skipped_rate_limit: int
    skipped_unsampled_trace: int
    """Root calls not profiled because the active trace was not sampled (part of unsampled)."""
    skipped_backlog: int
    """Sampled decisions not profiled because the export queue was full (part of unsampled):
    a window recorded then could not have been exported."""
    skipped_budget: int
    """Sampled decisions not profiled because profkit was over ``max_overhead`` (part of
    unsampled)."""
    warmup_calls: int
    speculative: int
    """capture_slow: root calls recorded by a speculative window; those found slow are then
    ``sampled`` (policy "slow"), the others ``speculative_released`` (part of unsampled)."""
    speculative_released: int
    """Speculative calls not slow: released unread, nothing summarised (part of unsampled)."""
    shared_label_calls: int
    """Root calls of labels first seen after the sampler counted 1024 labels apart: those
    share one 1-in-N counter (and one cold count); nonzero means labels carry ids."""
    windows: int
    """Profiler windows opened (one window records ``window`` root calls, after ``warmup``)."""
    errors: int
    """profkit's internal errors (counted, logged once per reason, never raised)."""
    otlp_spans_failed: int
    """Spans in OTLP batches that failed (reported by ``profkit.exporters.otlp``)."""
    slow_calls: dict[str, dict[str, int]]
    """capture_slow, per label: ``{"seen": n, "kept": k}``, the slow calls seen (timed
    unprofiled over the label's threshold, plus those kept) and kept under the profiler;
    ``kept / seen`` is the label's recall. Empty when capture_slow is off."""
    dropped_reasons: dict[str, int]
    error_reasons: dict[str, int]
    overhead: float
    """profkit's share of the process's CPU time over the last ~10 s (see docs/performance.md)."""


class Stats:
    """Counters of one session. ``snapshot()`` is what ``profkit.stats()`` returns."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: root-call counter, lock-free: the off-sample path calls ``next()`` on it directly
        self.roots = itertools.count()
        #: root calls in unsampled traces, lock-free for the same reason
        self.unsampled_traces = itertools.count()
        #: sampled decisions the gate turned away, by reason, lock-free (at sample_every=1
        #: over the budget, that is every call)
        self.refused = {name: itertools.count() for name in _REFUSED}
        #: root calls of labels past the sampler's per-label cap (the decision's counter)
        self.shared_label_calls = itertools.count()
        #: capture_slow: the latency book's per-label slow calls seen and kept
        self.slow_calls: Callable[[], dict[str, dict[str, int]]] | None = None
        self._counts: Counter[str] = Counter()
        self.dropped_reasons: Counter[str] = Counter()
        self.error_reasons: Counter[str] = Counter()
        self._logged: set[str] = set()
        self._asked: dict[str, int] = {}
        #: profkit's own CPU time (window start/stop, worker, exporters): ``overhead``
        self.cpu = CpuMeter()

    def grown_since_asked(self, name: str) -> int:
        """How much counter ``name`` grew since this was last asked (0 the first time too)."""
        with self._lock:
            now = self._counts[name]
            seen = self._asked.get(name, 0)
            self._asked[name] = now
        return now - seen

    def at_fork_reinit(self) -> None:
        """In a forked child: fresh counters (and lock); the parent keeps its own."""
        slow_calls = self.slow_calls
        Stats.__init__(self)
        self.slow_calls = slow_calls

    @property
    def root_calls(self) -> int:
        return peek_count(self.roots)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def skip(self, reason: str) -> None:
        """A sampled call that ran unprofiled after all (``skipped_busy``, ``skipped_foreign``)."""
        with self._lock:
            self._counts["sampled"] += 1
            self._counts[reason] += 1

    def drop(self, reason: str, n: int = 1) -> None:
        with self._lock:
            self._counts["dropped"] += n
            self.dropped_reasons[reason] += n

    def error(self, reason: str, exc: BaseException | None) -> None:
        with self._lock:
            self._counts["errors"] += 1
            self.error_reasons[reason] += 1
            first = reason not in self._logged
            self._logged.add(reason)
        if first:
            log.warning(
                "profkit internal error in %s (further ones are only counted)",
                reason,
                exc_info=exc,
            )

    def snapshot(self) -> StatsSnapshot:
        with self._lock:
            counts = dict(self._counts)
            dropped = dict(self.dropped_reasons)
            errors = dict(self.error_reasons)
        root_calls = self.root_calls
        sampled = counts.get("sampled", 0)
        warmup = counts.get("warmup_calls", 0)
        return StatsSnapshot(
            root_calls=root_calls,
            sampled=sampled,
            unsampled=root_calls - sampled - warmup,
            exported=counts.get("exported", 0),
            dropped=counts.get("dropped", 0),
            skipped_busy=counts.get("skipped_busy", 0),
            skipped_foreign=counts.get("skipped_foreign", 0),
            skipped_rate_limit=peek_count(self.refused["skipped_rate_limit"]),
            skipped_unsampled_trace=peek_count(self.unsampled_traces),
            skipped_backlog=peek_count(self.refused["skipped_backlog"]),
            skipped_budget=peek_count(self.refused["skipped_budget"]),
            warmup_calls=warmup,
            speculative=counts.get("speculative", 0),
            speculative_released=counts.get("speculative_released", 0),
            shared_label_calls=peek_count(self.shared_label_calls),
            windows=counts.get("windows", 0),
            errors=counts.get("errors", 0),
            otlp_spans_failed=counts.get("otlp_spans_failed", 0),
            slow_calls=self.slow_calls() if self.slow_calls is not None else {},
            dropped_reasons=dropped,
            error_reasons=errors,
            overhead=self.cpu.share(),
        )
