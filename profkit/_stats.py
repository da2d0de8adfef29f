"""The counters of one session, and what ``profkit.stats()`` returns."""

from __future__ import annotations

import itertools
import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any, TypedDict

from ._compat import peek_count
from ._errors import log
from ._overhead import CpuMeter

__all__ = ["JOINED", "JUDGED", "SETTLED", "Stats", "StatsSnapshot"]

_REFUSED = ("skipped_backlog", "skipped_budget", "skipped_rate_limit")

#: the steps of a sampled call's accounting on the request thread (``CallRecord.counted``):
#: joined its window, judged (``capture_slow``), settled without the export worker
JOINED, JUDGED, SETTLED = 1, 2, 4


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
    stage_records: int
    """capture_slow: slow calls that no window watched, recorded by their regions (policy
    "slow_stages", no op rows); part of ``sampled``, so exported or dropped like any sampled
    call (past the rate cap: ``dropped_reasons["stage_rate_limit"]``)."""
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
    batch_members_unsampled: int
    """Members of profiled batches that got no member span: their trace was not sampled (or
    they had no span when ``batch_member()`` was called)."""
    batch_members_truncated: int
    """Members of profiled batches past the first ``profkit.batch.MAX_MEMBERS`` (128): never
    read, no member span, no link (1 for an iterable of unknown length that had more)."""
    batch_members_invalid: int
    """Members given to ``profkit.batch()`` that were not ``batch_member()`` tokens (left out)."""
    batch_weights_invalid: int
    """Batches whose ``weights`` could not be used (equal shares instead)."""
    metrics_shed: int
    """``metrics=True``: unprofiled root-call durations not handed to the SDK, because more
    than ``MAX_DURATIONS_PER_S`` (20,000) a second were waiting (docs/fleet.md)."""
    dropped_reasons: dict[str, int]
    error_reasons: dict[str, int]
    overhead: float
    """profkit's share of the process's CPU time over the last ~10 s (see docs/performance.md)."""


class Stats:
    """Counters of one session. ``snapshot()`` is what ``profkit.stats()`` returns."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # re-entrant: a signal handler may read or count
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
        # defaultdicts, not Counters: a missing key runs no Python code (a Counter's
        # ``__missing__`` is a Python method, a point where a signal's exception can land)
        self._counts: defaultdict[str, int] = defaultdict(int)
        self.dropped_reasons: defaultdict[str, int] = defaultdict(int)
        self.error_reasons: defaultdict[str, int] = defaultdict(int)
        self._logged: set[str] = set()
        self._asked: dict[str, int] = {}
        #: profkit's own CPU time (window start/stop, worker, exporters): ``overhead``
        self.cpu = CpuMeter()

    def grown_since_asked(self, name: str, asking: bool = True) -> int:
        """How much counter ``name`` grew since this was last asked (0 the first time too;
        ``asking=False``: a look that leaves the next ask's answer as it is)."""
        with self._lock:
            now = self._counts[name]
            seen = self._asked.get(name, 0)
            if asking:
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

    # -- a sampled call's accounting on the request thread ------------------------------------
    # A signal handler's exception (a request timeout) can land on the request thread at any
    # point where Python checks for signals: a function's start, a backward jump, after a
    # call. Each method below is one such step: its body makes no call between its effects,
    # so the exception lands before them all or after them all, and the ``counted`` bit it
    # sets makes it idempotent, so the retry after an interruption neither loses nor
    # doubles a count (docs/reliability.md, "Signals").

    def join(self, calls: list[Any], call: Any, name: str) -> None:
        """``call`` joins its window's ``calls``, counted under ``name``, as one step."""
        with self._lock:
            if not call.counted & JOINED:
                call.counted |= JOINED
                calls += (call,)  # in place, like append(), but no call: no signal check
                self._counts[name] += 1

    def judge(self, call: Any, policy: Any, name: str) -> None:
        """A speculative call's verdict: its policy set and counted under ``name``, once."""
        with self._lock:
            if not call.counted & JUDGED:
                call.counted |= JUDGED
                call.policy = policy
                self._counts[name] += 1

    def settle(self, call: Any, reason: str) -> None:
        """A sampled call the export worker will not see: ``sampled`` (unless it joined a
        window, which counted it) and ``dropped`` for ``reason``, once."""
        with self._lock:
            if not call.counted & JOINED:
                call.counted |= JOINED
                self._counts["sampled"] += 1
            if not call.counted & SETTLED:
                call.counted |= SETTLED
                self._counts["dropped"] += 1
                self.dropped_reasons[reason] += 1

    def skip(self, reason: str, call: Any) -> None:
        """A sampled call that ran unprofiled after all (``skipped_busy``, ``skipped_foreign``)."""
        with self._lock:
            if not call.counted & SETTLED:
                call.counted |= JOINED | SETTLED
                self._counts["sampled"] += 1
                self._counts[reason] += 1

    def drop(self, reason: str, n: int = 1) -> None:
        with self._lock:
            self._counts["dropped"] += n
            self.dropped_reasons[reason] += n

    def unexport(self, reason: str, n: int = 1) -> None:
        """``n`` calls counted ``exported`` never left after all (their spans failed on the
        wire, after the span step ended them): ``dropped`` for ``reason`` instead."""
        with self._lock:
            self._counts["exported"] -= n
            self._counts["dropped"] += n
            self.dropped_reasons[reason] += n

    def error(self, reason: str, exc: BaseException | None, n: int = 1) -> None:
        with self._lock:
            self._counts["errors"] += n
            self.error_reasons[reason] += n
            first = reason not in self._logged
            self._logged.add(reason)
        if first:
            log.warning(
                "profkit: %s (counted in stats()['error_reasons']; further ones are only counted)",
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
            stage_records=counts.get("stage_records", 0),
            shared_label_calls=peek_count(self.shared_label_calls),
            windows=counts.get("windows", 0),
            errors=counts.get("errors", 0),
            otlp_spans_failed=counts.get("otlp_spans_failed", 0),
            slow_calls=self.slow_calls() if self.slow_calls is not None else {},
            batch_members_unsampled=counts.get("batch_members_unsampled", 0),
            batch_members_truncated=counts.get("batch_members_truncated", 0),
            batch_members_invalid=counts.get("batch_members_invalid", 0),
            batch_weights_invalid=counts.get("batch_weights_invalid", 0),
            metrics_shed=counts.get("metrics_shed", 0),
            dropped_reasons=dropped,
            error_reasons=errors,
            overhead=self.cpu.share(),
        )
