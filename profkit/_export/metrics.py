"""OpenTelemetry metrics (``configure(metrics=True)``): the fleet's view of every process.

Three kinds of instrument, made on the session's MeterProvider (``meter_provider``, else the
global one) only while ``metrics`` is on:

* ``profkit.call.duration`` (histogram, s, attribute ``profkit.label``): every root call,
  profiled or not. A profiled call that is exported carries its span's trace and span ids
  as the exemplar's context, so a bucket links to a trace that holds an op table.
* ``profkit.op.self_time`` (histogram, s, ``profkit.label`` and ``profkit.op``): one
  measurement per op row of each exported call (its ``top_k`` rows and ``other``).
* ``profkit.calls`` (observable counter, attribute ``profkit.outcome``, and
  ``profkit.reason`` for ``dropped``), ``profkit.windows`` and ``profkit.errors``
  (``profkit.reason``): the ``stats()`` counters, read when the reader collects.

The SDK's ``Histogram.record()`` costs 5-30 µs a call (measured, see docs/fleet.md): far
too much for every root call. The request path only appends ``(label, ns)`` to a deque
(one C call); the measurements reach the SDK off the request path, on the ``profkit-metrics``
thread every second and at the start of every collection (the counters' callback drains
first, so a scrape sees every call that ended before it). A profiled call's duration waits
for its window's export, so that its exemplar can carry its own span's ids; a window that
never reaches the exporters (dropped) lets it go without one after ``_HOLD_S`` or at the
next flush. Labels and ops are bounded per provider, across sessions
(:mod:`profkit._export.bounds`): ``MAX_LABELS`` labels, ``MAX_OPS`` op names per label and
``MAX_OP_SERIES`` op series in all, past which new ones are counted as ``other``.

So is the hand-off: each ``record()`` holds the GIL for its 5-30 µs, so the thread hands
the SDK at most ``MAX_DURATIONS_PER_S`` unprofiled durations a second. More than that
waiting (a service making more root calls a second than that, or a thread starved of the
GIL) and the oldest are shed, each one counted (``stats()["metrics_shed"]``): the thread
looks every ``_CHECK_S``, so what waits stays bounded, in memory and in the GIL time it
would take.
"""

from __future__ import annotations

import collections
import functools
import threading
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics as otel_metrics
from opentelemetry import trace

from .._compat import SPAN_KEY as _SPAN_KEY
from .._deadline import Deadline
from .._model import CallSummary
from .._records import CallRecord
from .._stats import Stats
from .._version import __version__
from .._weak import WeakIdMap, at_fork_in_child_weakly, renewed_at_fork
from .bounds import MAX_LABELS, MAX_OP_SERIES, MAX_OPS, SeriesBounds

__all__ = ["CALL_BUCKETS_S", "MAX_LABELS", "MAX_OPS", "MAX_OP_SERIES", "OP_BUCKETS_S", "Metrics"]

#: seconds a profiled call's duration waits for its window's export (for its exemplar)
_HOLD_S = 10.0
#: seconds between drains on the ``profkit-metrics`` thread
DRAIN_S = 1.0
#: seconds between the thread's looks at the backlog (shedding what is past its bound)
_CHECK_S = 0.1
#: measurements handed to the SDK between looks at a flush's deadline
_DEADLINE_EVERY = 256
#: unprofiled root-call durations handed to the SDK per second at most; past them the
#: oldest waiting are shed and counted (``metrics_shed``): a second's worth waits at most
MAX_DURATIONS_PER_S = 20_000
#: bucket bounds (s) of ``profkit.call.duration``: 0.5 ms to 10 s (the SDK's default
#: bounds, 0 to 10000, are made for milliseconds)
CALL_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
#: bucket bounds (s) of ``profkit.op.self_time``: 1 µs to 1 s
OP_BUCKETS_S = (
    1e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.1, 1.0,
)  # fmt: skip
_OUTCOMES = (
    "root_calls",
    "sampled",
    "unsampled",
    "exported",
    "skipped_busy",
    "skipped_foreign",
    "skipped_rate_limit",
    "skipped_unsampled_trace",
    "skipped_backlog",
    "skipped_budget",
    "warmup_calls",
    "speculative",
    "speculative_released",
    "stage_records",
    "metrics_shed",
)
#: the other integer ``stats()`` counters (not outcomes of a root call): ``profkit.counts``
_COUNTS = (
    "shared_label_calls", "batch_members_unsampled", "batch_members_truncated",
    "batch_members_invalid", "batch_weights_invalid", "otlp_spans_failed",
)  # fmt: skip
_EMPTY = otel_context.Context()
_SAMPLED = trace.TraceFlags(trace.TraceFlags.SAMPLED)


class _Instruments:
    """One MeterProvider's profkit instruments, made once, and the sessions feeding them.

    The SDK hands back the instrument already registered under a name, callbacks and all: a
    second ``configure()`` on the same provider must feed the same instruments. The
    counters report every session's counts added up (a retired session's final ones kept),
    so that they never go down.
    """

    def __init__(self, meter: Any) -> None:
        self.duration = meter.create_histogram(
            "profkit.call.duration",
            unit="s",
            description="Duration of profkit root calls",
            explicit_bucket_boundaries_advisory=CALL_BUCKETS_S,
        )
        self.self_time = meter.create_histogram(
            "profkit.op.self_time",
            unit="s",
            description="Self CPU time of an op in one exported profiled call",
            explicit_bucket_boundaries_advisory=OP_BUCKETS_S,
        )
        for name, unit, what in (
            ("profkit.calls", "{call}", "profkit root calls by outcome (stats())"),
            ("profkit.windows", "{window}", "Profiler windows opened"),
            ("profkit.errors", "{error}", "profkit internal errors by reason"),
            ("profkit.counts", "1", "the other stats() counters, by name"),
        ):
            callback = functools.partial(self._observe, name)
            meter.create_observable_counter(name, [callback], unit=unit, description=what)
        self._lock = renewed_at_fork(self)
        #: the labels and op series these instruments hold (every session's, bounded)
        self.bounds = SeriesBounds()
        self.live: list[Metrics] = []
        self._retired: collections.Counter[tuple[str, tuple[tuple[str, str], ...]]] = (
            collections.Counter()
        )

    def attach(self, metrics: Metrics) -> None:
        with self._lock:
            self.live.append(metrics)

    def retire(self, metrics: Metrics) -> None:
        """``metrics``' session shut down: its final counts stay in the totals."""
        with self._lock:
            if metrics in self.live:
                self.live.remove(metrics)
                self._retired.update(_counts(metrics.stats.snapshot()))

    def _observe(self, name: str, options: Any) -> list[otel_metrics.Observation]:
        with self._lock:
            live = list(self.live)
            totals = collections.Counter(self._retired)
        if name == "profkit.calls":
            for metrics in live:  # first: a collection sees every call that ended before it
                metrics.drain()
        for metrics in live:
            totals.update(_counts(metrics.stats.snapshot()))
        return [
            otel_metrics.Observation(value, dict(attrs))
            for (instrument, attrs), value in totals.items()
            if instrument == name
        ]


def _counts(snap: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], int]:
    """A ``stats()`` snapshot as (instrument, attributes) -> count."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {
        ("profkit.calls", (("profkit.outcome", o),)): int(snap[o]) for o in _OUTCOMES
    }
    for reason, n in snap["dropped_reasons"].items():
        out["profkit.calls", (("profkit.outcome", "dropped"), ("profkit.reason", reason))] = n
    out["profkit.windows", ()] = int(snap["windows"])
    for name in _COUNTS:
        out["profkit.counts", (("profkit.counter", name),)] = int(snap[name])
    for reason, n in snap["error_reasons"].items():
        out["profkit.errors", (("profkit.reason", reason),)] = n
    return out


#: each MeterProvider's instruments (weakly: a provider the application drops goes)
_BY_PROVIDER: WeakIdMap[_Instruments] = WeakIdMap()
_BY_PROVIDER_LOCK = threading.Lock()


def _instruments(provider: Any) -> _Instruments:
    with _BY_PROVIDER_LOCK:
        try:
            found = _BY_PROVIDER.get(provider)
        except TypeError:  # a provider that cannot be weakly referenced: no reuse
            return _Instruments(provider.get_meter("profkit", __version__))
        if found is None:
            found = _Instruments(provider.get_meter("profkit", __version__))
            _BY_PROVIDER.set(provider, found)
        return found


class Metrics:
    """One session's hand-off from the request path to its provider's instruments."""

    def __init__(self, provider: Any, stats: Stats, label_limit: int) -> None:
        self.stats = stats
        self._limit = label_limit  # labels recorded as spans carry them: max_attribute_length
        provider = provider if provider is not None else otel_metrics.get_meter_provider()
        self._instruments = _instruments(provider)
        self._duration = self._instruments.duration
        self._self_time = self._instruments.self_time
        self._bounds = self._instruments.bounds
        self._lock = threading.Lock()  # one drain at a time
        #: ``(label, ns)`` of ended root calls, appended on the request path (lock-free)
        self._pending: collections.deque[tuple[str, int]] = collections.deque()
        #: ``timed((label, ns))``: the request path's one call, the deque's own ``append``
        #: (a C call: the scope reads the clock and builds the tuple itself)
        self.timed = self._pending.append
        self._init_state()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        at_fork_in_child_weakly(self, "at_fork_reinit")  # (no WeakMethod: see profkit._weak)
        self._instruments.attach(self)

    def _init_state(self) -> None:
        self._pending.clear()
        #: exported calls (with span ids), appended on the export worker
        self._delivered: collections.deque[CallSummary] = collections.deque()
        #: profiled calls waiting for their export: (window id, index) -> (label, ns, since)
        self._held: dict[tuple[int, int], tuple[str, int, float]] = {}
        self._held_lock = threading.RLock()  # (the request path's: re-entrant, as in _stats)

    # -- request path -----------------------------------------------------------------------

    def ended(self, call: CallRecord, label: str) -> None:
        """A profiled root call ended (a sampled call: not the off-sample path)."""
        start = call.scopes[0].start_ns if call.scopes else 0
        ns = max(0, time.time_ns() - start) if start else 0
        if call.warmup or not call.policy.exported:
            self._pending.append((label, ns))  # never exported: no span to point at
            return
        with self._held_lock:
            self._held[(call.window.id, call.index)] = (label, ns, time.monotonic())

    # -- export worker ----------------------------------------------------------------------

    def delivered(self, calls: Sequence[CallSummary]) -> None:
        """The fan-out delivered ``calls`` (counted ``exported``): their rows and exemplars."""
        self._delivered.extend(calls)

    # -- off the request path ---------------------------------------------------------------

    def start(self) -> None:
        """Start the thread that hands measurements to the SDK every ``DRAIN_S``."""
        if self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(target=self._run, name="profkit-metrics", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        checks = round(DRAIN_S / _CHECK_S)
        while True:
            for _ in range(checks):
                if self._stop.wait(_CHECK_S):
                    return
                self.shed()
            self.drain()

    def shed(self, keep: int = MAX_DURATIONS_PER_S) -> int:
        """Count and let go of the oldest unprofiled durations past ``keep`` waiting: a pop
        each (no SDK call), so the thread always keeps up. Returns how many went."""
        pending = self._pending
        excess = len(pending) - keep
        if excess <= 0:
            return 0
        pop, shed = pending.popleft, 0
        try:
            for _ in range(excess):
                pop()
                shed += 1
        except IndexError:  # drained meanwhile
            pass
        finally:
            self.stats.add("metrics_shed", shed)
        return shed

    def drain(self, release_all: bool = False, deadline: Deadline | None = None) -> bool:
        """Hand every pending measurement to the SDK (``release_all``: held ones too); False
        when ``deadline`` passed first (the rest wait for the drain thread's next turn)."""
        wait = deadline.wait_arg() if deadline is not None else None
        if not self._lock.acquire(timeout=-1 if wait is None else wait):
            return False
        cpu0 = time.thread_time()
        try:
            if self._drain_delivered(deadline) and self._drain_pending(deadline):
                self._release_held(release_all)
                return True
            return False
        finally:
            self.stats.cpu.charge(time.thread_time() - cpu0)
            self._lock.release()

    def _drain_delivered(self, deadline: Deadline | None) -> bool:
        record_self, delivered, bounds = self._self_time.record, self._delivered, self._bounds
        n = 0
        while True:
            if deadline is not None and not n % _DEADLINE_EVERY and deadline.passed:
                return False
            n += 1
            try:
                call = delivered.popleft()
            except IndexError:
                return True
            label = bounds.label(call.label, self._limit)["profkit.label"]  # bounded
            for row in call.root.ops:  # each row's attributes: two dict lookups
                record_self(row.self_cpu_us / 1e6, bounds.op(label, row.name), _EMPTY)
            with self._held_lock:
                held = self._held.pop((call.window_id, call.call_index), None)
            if held is not None:
                attrs = self._bounds.label(held[0], self._limit)
                self._duration.record(held[1] / 1e9, attrs, _exemplar(call))

    def _drain_pending(self, deadline: Deadline | None) -> bool:
        record, pending, label_of = self._duration.record, self._pending, self._bounds.label
        limit = self._limit
        self.shed()  # more than a second's worth: the oldest go, counted
        n = 0
        while True:
            if deadline is not None and not n % _DEADLINE_EVERY and deadline.passed:
                return False
            n += 1
            try:
                label, ns = pending.popleft()
            except IndexError:
                return True
            record(ns / 1e9, label_of(label, limit), _EMPTY)

    def _release_held(self, release_all: bool) -> None:
        """Durations whose window never reached the exporters, past ``_HOLD_S`` (or all).

        ``_held`` is in the order the calls ended (a dict keeps insertion order, and
        ``since`` only grows), so the scan stops at the first one still waiting: a drain
        costs what it releases, not what is held.
        """
        if not self._held:
            return
        cutoff = time.monotonic() - _HOLD_S
        keys: list[tuple[int, int]] = []
        with self._held_lock:
            held = self._held
            for key, value in held.items():
                if not release_all and value[2] >= cutoff:
                    break
                keys.append(key)
            released = [held.pop(key) for key in keys]
        for label, ns, _ in released:
            self._duration.record(ns / 1e9, self._bounds.label(label, self._limit), _EMPTY)

    # -- control ----------------------------------------------------------------------------

    def flush(self, deadline: Deadline | None = None) -> bool:
        """Everything handed off is exported or dropped: every measurement to the SDK, by
        ``deadline`` (False when it passed first)."""
        return self.drain(release_all=True, deadline=deadline)

    def shutdown(self, deadline: Deadline | None = None) -> bool:
        """Flush and stop the drain thread (the MeterProvider is the application's); what the
        deadline left undrained is counted ``metrics_shed`` (a call's op rows go with its
        duration), and the answer is then False."""
        self._stop.set()
        flushed = self.flush(deadline)
        if not flushed:
            with self._held_lock:
                left = len(self._pending) + len(self._held)
                self._pending.clear()
                self._held.clear()
                self._delivered.clear()  # (op rows: their calls' durations are in _held)
            self.stats.add("metrics_shed", left)
        self._instruments.retire(self)
        return flushed

    def at_fork_reinit(self) -> None:
        """In a forked child: the parent's measurements are the parent's; a new thread."""
        self._lock = threading.Lock()
        self._init_state()
        self._thread = None
        if not self._stop.is_set():
            self.start()


def _exemplar(call: CallSummary) -> Any:
    """A context whose span is ``call``'s own (what the SDK's exemplar reads), or empty."""
    if not call.trace_id or not call.span_id:
        return _EMPTY
    ctx = trace.SpanContext(
        int(call.trace_id, 16), int(call.span_id, 16), is_remote=False, trace_flags=_SAMPLED
    )
    return otel_context.Context({_SPAN_KEY: trace.NonRecordingSpan(ctx)})  # what
    # trace.set_span_in_context(span) makes from an empty context, without copying it
