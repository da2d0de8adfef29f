"""The session: decide, join and end root calls.

Request path only: ``begin_root`` counts a root call, asks the samplers, and opens a window
in the process-wide slot (:mod:`profkit._slot`) or joins the one this thread holds;
``end_root`` stops the window after its last call and hands it to the export pipeline
(:mod:`profkit._pipeline`). Everything after the hand-off runs on the pipeline's worker.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanContext, TraceFlags

from ._config import Config
from ._deadline import Deadline
from ._errors import Stats, guard
from ._fanout import Fanout, build_exporters
from ._pipeline import ExportPipeline
from ._processing import Processor
from ._records import CallRecord
from ._sampling import EveryN, RateLimiter, Sampler, TraceIdRatio, Triggered
from ._slot import SLOT
from ._window import Window, foreign_profiler_active, make_profiler, prime

__all__ = ["Session", "make_sampler"]

_SAMPLED = TraceFlags.SAMPLED
#: the key under which OTel's API keeps the current span in a context, found through the API
#: itself: a dict lookup then replaces trace.get_current_span()'s calls and isinstance check
_SPAN_KEY = next(iter(trace.set_span_in_context(trace.INVALID_SPAN, otel_context.Context())))


def make_sampler(config: Config) -> Sampler:
    if config.sample_rate is not None:
        return TraceIdRatio(config.sample_rate)
    return EveryN(config.every or 100)


class Session:
    """One profkit session: settings, counters, samplers, and its export pipeline."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.stats = Stats()
        self.active = config.enabled
        self._sampler = make_sampler(config)
        self._ratio = config.sample_rate is not None
        self._limiter = RateLimiter(config.max_per_minute) if config.max_per_minute else None
        self._triggered = Triggered()
        self._window_ids = itertools.count(1)
        spans, exporters = build_exporters(config)
        self.pipeline = ExportPipeline(
            self.stats,
            Processor(config, self.stats),
            Fanout(self.stats, spans, exporters, config.export_timeout),
            config.queue_size,
            after_each=self._build_spare,
        )
        #: seconds the once-per-process profiler start took in ``start()`` (0.0: primed)
        self.prime_seconds = 0.0
        #: the next window's profiler object, built by start() and by the worker after each
        #: window: building one (~0.1 ms) is then not on the sampled request's path
        self._spare: Any = None
        #: ``otlp_spans_failed`` when a flush last reported (a later failure makes it False)
        self._failures_reported = 0
        self._flush_lock = threading.Lock()

    # -- request path -----------------------------------------------------------------------

    def begin_root(self, label: str) -> CallRecord | None:
        """Count a root call and decide whether it runs under the profiler.

        A call inside a trace that was not sampled is not profiled (its spans would never be
        exported): it is counted as ``skipped_unsampled_trace`` before the sampler, a
        trigger or an open window sees it, so it uses up none of them.
        """
        next(self.stats.roots)  # every off-sample call passes here: a C call, no lock
        held = SLOT.held
        if held is not None and held.owner is not self:
            SLOT.close_retired(self)
            held = None
        otel = otel_context.get_current()  # empty (falsy) when no span is active: no lookup
        span: Any = otel.get(_SPAN_KEY) if otel else None  # trace.get_current_span(), minus ~250 ns
        parent: SpanContext | None = span.get_span_context() if span is not None else None
        # the sampled bit first: one int operation on the usual path (a sampled trace)
        if parent is not None and not parent.trace_flags & _SAMPLED and parent.is_valid:
            next(self.stats.unsampled_traces)  # lock-free, like the root count
            return None
        if held is not None and held.window.owner == threading.get_ident() and not held.window.full:
            return self._join(held.window, "window", parent)
        if self._triggered.pending and self._triggered.take():
            policy = "trigger"
        else:
            trace_id = parent.trace_id if self._ratio and parent and parent.is_valid else None
            if not self._sampler.decide(trace_id):
                return None
            if self._limiter is not None and not self._limiter.allow():
                self.stats.add("skipped_rate_limit")
                return None
            policy = self._sampler.description
        return self._open(policy, parent)

    def _open(self, policy: str, parent: SpanContext | None) -> CallRecord | None:
        if not SLOT.acquire():
            self._skip("skipped_busy")
            return None
        opened = False
        try:
            if foreign_profiler_active():
                self._skip("skipped_foreign")
                return None
            win = Window(next(self._window_ids), self.config)
            spare, self._spare = self._spare, None  # built ahead, off the request path
            with guard(self.stats, "profiler_start"):
                win.start(spare)
            if win.prof is None:  # sampled, but the profile is lost: a drop, not a skip
                self.stats.add("sampled")
                self.stats.drop("profiler_start_failed")
                return None
            SLOT.occupy(self, win)
            opened = True
            self.stats.add("windows")
            return self._join(win, policy, parent)
        finally:
            if not opened:
                SLOT.vacate()

    def _skip(self, reason: str) -> None:
        self.stats.add("sampled")
        self.stats.add(reason)

    def _join(self, win: Window, policy: str, parent: SpanContext | None) -> CallRecord:
        win.opened += 1
        win.in_flight += 1
        warm = win.opened <= self.config.warmup
        call = CallRecord(
            window=win,
            index=len(win.calls),
            policy=policy,
            warmup=warm,
            parent_span_context=parent if parent is not None and parent.is_valid else None,
            thread_name=threading.current_thread().name,
        )
        win.calls.append(call)
        self.stats.add("warmup_calls" if warm else "sampled")
        return call

    def end_root(self, call: CallRecord, error: BaseException | None) -> None:
        """Close a sampled call; the last call of a window stops the profiler and hands it off."""
        call.error = error
        call.done = True
        win = call.window
        win.in_flight -= 1
        if (win.full or not self.active) and win.in_flight == 0:
            held = SLOT.held
            if held is not None and held.window is win:
                self.close_window(win)

    # -- the slot's callbacks (WindowOwner) -----------------------------------------------

    def close_window(self, win: Window) -> None:
        """Stop ``win`` on its own thread and hand it to the pipeline; then free the slot."""
        try:
            stopped = False
            with guard(self.stats, "profiler_stop"):
                win.stop()
                stopped = True
            # handed off (queued or counted as dropped) before the slot is freed, so that a
            # shutdown() waiting for the window finds it in the queue
            if stopped:
                self.pipeline.offer(win)
            elif win.recorded:
                self.stats.drop("profiler_stop_failed", win.recorded)
        finally:
            SLOT.vacate(win)

    def discard_window(self, win: Window, reason: str) -> None:
        """Give ``win`` up unread (its thread is gone, or the interpreter is exiting)."""
        try:
            recorded = win.recorded
            win.discard()
            if recorded:
                self.stats.drop(reason, recorded)
        finally:
            SLOT.vacate(win)

    # -- control ----------------------------------------------------------------------------

    def start(self) -> None:
        """Prime the profiler (once per process) and start the export worker.

        Both happen here, off the request path: otherwise the first sampled call pays the
        profiler's first start (about a second) and a thread start (milliseconds on a busy
        machine). A forked child starts its worker on its first sampled call.
        """
        if self.active:
            with guard(self.stats, "prime"):
                self.prime_seconds = prime(self.config)
            self._build_spare()
            self.pipeline.start()

    def _build_spare(self) -> None:
        if self._spare is None and self.active:
            with guard(self.stats, "profiler_build"):
                self._spare = make_profiler(self.config)

    def trigger(self, n: int = 1) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"profkit.trigger(n): n must be an int >= 1, got {n!r}")
        self._triggered.add(n)

    def force_flush(self, timeout: float = 5.0) -> bool:
        """Wait until every handed-off window is exported or dropped, then flush exporters.

        False also when profkit spans failed OTLP export since the last flush or shutdown
        (counted by :func:`profkit.exporters.otlp.otlp_span_processor`).
        """
        flushed = self.pipeline.force_flush(Deadline(timeout))
        return self._no_new_span_failures() and flushed

    def shutdown(self, timeout: float = 5.0) -> bool:
        """Stop sampling, let an open window finish, flush, stop the worker and exporters.

        A window still open at the deadline (or on the calling thread itself) is counted as
        dropped with reason "shutdown" when its call ends. The result is False as for
        :meth:`force_flush`.
        """
        deadline = Deadline(timeout)
        self.active = False
        SLOT.wait_for_other_thread(self, deadline)
        self.close_idle_window()
        flushed = self.pipeline.shutdown(deadline)
        return self._no_new_span_failures() and flushed

    def _no_new_span_failures(self) -> bool:
        """Whether no profkit span failed OTLP export since this was last asked."""
        failed = self.stats.snapshot()["otlp_spans_failed"]
        with self._flush_lock:
            seen, self._failures_reported = self._failures_reported, failed
        return failed <= seen

    def close_idle_window(self) -> None:
        """Close this session's window that waits for more calls (``window`` > 1), if any."""
        SLOT.close_idle(self)

    def at_fork_reinit(self) -> None:
        """In a forked child: fresh counters and triggers (the pipeline re-inits itself)."""
        self.stats.at_fork_reinit()
        self._triggered = Triggered()
        self._failures_reported = 0
        self._flush_lock = threading.Lock()
