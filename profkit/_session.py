"""The session: decide, join and end root calls.

Request path only: ``begin_root`` counts a root call, asks the samplers, and opens a window
in the process-wide slot (:mod:`profkit._slot`) or joins the one this thread holds;
``end_root`` stops the window after its last call and hands it to the export pipeline
(:mod:`profkit._pipeline`). Everything after the hand-off runs on the pipeline's worker.
"""

from __future__ import annotations

import contextvars
import itertools
import threading
import time
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
from ._slot import SLOT, WindowOwner
from ._window import Window, make_profiler, prime

__all__ = ["Session", "make_sampler"]

#: other root calls that may run on a window's thread while it records (a thread-local
#: profiler records them too: on a busy event loop they fill a window within milliseconds)
_MAX_OTHERS = 200
_SAMPLED = TraceFlags.SAMPLED


#: the key under which OTel's API keeps the current span in a context, found through the API
#: itself: a dict lookup then replaces trace.get_current_span()'s calls and isinstance check
def _find_otel_current() -> Any:
    """OTel's ``context.get_current``, as the C ``ContextVar.get`` behind it where it is one.

    The SDK's default runtime context keeps the current context in one ContextVar; reading
    it directly saves two Python frames on every root call. Any other runtime context
    (``OTEL_PYTHON_CONTEXT``) goes through the API.
    """
    var = getattr(getattr(otel_context, "_RUNTIME_CONTEXT", None), "_current_context", None)
    return var.get if isinstance(var, contextvars.ContextVar) else otel_context.get_current


_otel_current = _find_otel_current()
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
        self.triggered = Triggered()
        self._window_ids = itertools.count(1)
        spans, exporters = build_exporters(config)
        fanout = Fanout(self.stats, spans, exporters, config.export_timeout)
        processor = Processor(config, self.stats)
        self.pipeline = ExportPipeline(
            self.stats, processor, fanout, config.queue_size, after_each=self._build_spare
        )
        self.keeper = WindowKeeper(self.stats, self.pipeline, config.all_threads)
        self._gate = Gate(config, self.stats, self.pipeline)
        #: seconds the once-per-process profiler start took in ``start()`` (0.0: primed)
        self.prime_seconds = 0.0
        #: the next window's profiler, built ahead (start(), the worker): ~0.1 ms off requests
        self._spare: Any = None

    # -- request path -----------------------------------------------------------------------

    def begin_root(self, label: str) -> CallRecord | None:
        """Count a root call and decide whether it runs under the profiler.

        A call inside a trace that was not sampled is not profiled (its spans would never be
        exported): it is counted as ``skipped_unsampled_trace`` before the sampler, a
        trigger or an open window sees it, so it uses up none of them.
        """
        next(self.stats.roots)  # every off-sample call passes here: a C call, no lock
        held = SLOT.held
        otel = _otel_current()  # empty (falsy) when no span is active: no lookup
        span: Any = otel.get(_SPAN_KEY) if otel else None  # trace.get_current_span(), minus ~250 ns
        parent: SpanContext | None = span.get_span_context() if span is not None else None
        if held is not None and held.window.owner == threading.get_ident():
            call = self._on_own_thread(held.owner, held.window, parent)
            if call is not None:
                return call
        # the sampled bit first: one int operation on the usual path (a sampled trace)
        if parent is not None and not parent.trace_flags & _SAMPLED and parent.is_valid:
            next(self.stats.unsampled_traces)  # lock-free, like the root count
            return None
        if self.triggered.pending and not self.pipeline.full() and self.triggered.take(label):
            policy = "trigger"
        else:
            trace_id = parent.trace_id if self._ratio and parent and parent.is_valid else None
            if not self._sampler.decide(trace_id):
                return None
            refused = self._gate.refused()
            if refused is not None:
                self.stats.add(refused)
                return None
            policy = self._sampler.description
        return self._open(policy, parent)

    def _on_own_thread(
        self, owner: WindowOwner, win: Window, parent: SpanContext | None
    ) -> CallRecord | None:
        """A root call on the thread of the open window: a checkpoint, then join it or not."""
        if win.prof is None:  # closed, but the slot was not freed (an exception cut it short)
            SLOT.vacate(win)
        elif time.monotonic() > win.deadline:
            owner.truncate(win, win.cut_reason)
        elif owner is not self.keeper:
            SLOT.close_retired(self.keeper)  # an idle window of a replaced session
        elif not win.full:
            if parent is not None and not parent.trace_flags & _SAMPLED and parent.is_valid:
                return None  # an unsampled trace does not join (counted by the caller)
            return self._join(win, "window", parent)
        elif not win.in_flight:  # all its calls ended, yet it is open: an end cut short
            owner.close_window(win)
        else:  # another request on a thread the window records (an event loop's)
            win.others += 1
            if win.others > _MAX_OTHERS:
                owner.truncate(win, "busy_thread")
        return None

    def _open(self, policy: str, parent: SpanContext | None) -> CallRecord | None:
        cpu0 = time.thread_time()  # profkit's CPU time on the request thread: the budget's
        if not SLOT.acquire():
            self.stats.skip("skipped_busy")
            return None
        win: Window | None = None
        opened = charged = False
        try:
            if not SLOT.may_open():
                self.stats.skip("skipped_foreign")
                return None
            win = Window(next(self._window_ids), self.config)
            spare, self._spare = self._spare, None  # built ahead, off the request path
            with guard(self.stats, "profiler_start"):
                win.start(spare)
            if win.prof is None:  # sampled, but the profile is lost: a drop, not a skip
                self.stats.add("sampled")
                self.stats.drop("profiler_start_failed")
                return None
            self.stats.add("windows")
            self.stats.cpu.charge(time.thread_time() - cpu0)  # before the window is visible
            charged = True
            SLOT.occupy(self.keeper, win)
            call = self._join(win, policy, parent)
            opened = True  # only now: an exception before leaves no window without its call
            return call
        finally:
            if not opened:
                if win is not None:
                    win.ensure_stopped()  # started, then an exception landed: never leave it on
                SLOT.vacate(win)
                if not charged:
                    self.stats.cpu.charge(time.thread_time() - cpu0)  # after cleaning up

    def _join(self, win: Window, policy: str, parent: SpanContext | None) -> CallRecord:
        warm = len(win.calls) < self.config.warmup
        call = CallRecord(
            window=win,
            index=len(win.calls),
            policy=policy,
            warmup=warm,
            parent_span_context=parent if parent is not None and parent.is_valid else None,
            thread_name=threading.current_thread().name,
        )
        self.stats.add("warmup_calls" if warm else "sampled")
        win.calls.append(call)  # joined: one atomic step (the window's counts derive from it)
        return call

    def end_root(self, call: CallRecord, error: BaseException | None) -> None:
        """Close a sampled call; the last call of a window stops the profiler and hands it off."""
        call.error = error
        call.stopped = True
        call.done = True
        win = call.window
        if (win.full or not self.active) and win.in_flight == 0:
            held = SLOT.held
            if held is not None and held.window is win:
                self.keeper.close_window(win)

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

    def trigger(self, n: int = 1, label: str | None = None) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"profkit.trigger(n): n must be an int >= 1, got {n!r}")
        if label is not None and not isinstance(label, str):
            raise ValueError(f"profkit.trigger(label=): a label is a str, got {label!r}")
        self.triggered.add(n, label)

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
        SLOT.wait_for_other_thread(self.keeper, deadline)
        self.close_idle_window()
        flushed = self.pipeline.shutdown(deadline)
        return self._no_new_span_failures() and flushed

    def _no_new_span_failures(self) -> bool:
        """Whether no profkit span failed OTLP export since this was last asked."""
        return not self.stats.grown_since_asked("otlp_spans_failed")

    def close_idle_window(self) -> None:
        """Close this session's window that waits for more calls (``window`` > 1), if any."""
        SLOT.close_idle(self.keeper)

    def at_fork_reinit(self) -> None:
        """In a forked child: fresh counters and triggers (the pipeline re-inits itself)."""
        self.stats.at_fork_reinit()
        self.triggered = Triggered()


class Gate:
    """What a call the sampler chose must pass before a window opens for it.

    Checked in this order, so that a call turned away uses up no rate-cap token: the export
    queue is full (a window recorded now could not be exported: ``skipped_backlog``),
    profkit is over its CPU budget (``skipped_budget``), the rate cap
    (``skipped_rate_limit``). Only sampled decisions get here, never the off-sample path.
    """

    def __init__(self, config: Config, stats: Stats, pipeline: ExportPipeline) -> None:
        self._stats = stats
        self._pipeline = pipeline
        self._budget = config.max_overhead
        self._limiter = RateLimiter(config.max_per_minute) if config.max_per_minute else None

    def refused(self) -> str | None:
        """The counter of the reason this call is not profiled after all, or None."""
        if self._pipeline.full():
            return "skipped_backlog"
        if self._budget is not None and self._stats.cpu.share() >= self._budget:
            return "skipped_budget"
        if self._limiter is not None and not self._limiter.allow():
            return "skipped_rate_limit"
        return None


class WindowKeeper:
    """Closes, cuts short and discards the windows of one session (the slot's WindowOwner).

    Runs on the window's own thread (close, truncate) or wherever the slot frees a window
    whose thread is gone (discard). A closed window goes to the session's pipeline.
    """

    def __init__(self, stats: Stats, pipeline: ExportPipeline, all_threads: bool) -> None:
        self.stats = stats
        self.pipeline = pipeline
        self.all_threads = all_threads

    def yielded(self, call: CallRecord) -> None:
        """A sampled generator root yielded; its next step may run on another thread.

        Its thread-local window stops now (the calls are exported as truncated,
        ``"first_step"``); a window recording all threads goes on (any thread can stop it).
        """
        held = SLOT.held
        if (
            not self.all_threads
            and held is not None
            and held.window is call.window
            and call.window.owner == threading.get_ident()
        ):
            self.truncate(call.window, "first_step")

    # -- control ----------------------------------------------------------------------------

    def close_window(self, win: Window) -> None:
        """Stop ``win`` on its own thread and hand it to the pipeline; then free the slot."""
        try:
            cpu0 = time.thread_time()
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
            self.stats.cpu.charge(time.thread_time() - cpu0)
        except BaseException:  # a signal's exception mid-stop: the profiler must not stay on
            win.ensure_stopped()
            raise
        finally:
            try:
                SLOT.vacate(win)
            except BaseException:  # cut short itself: it is idempotent, so once more
                SLOT.vacate(win)
                raise

    def truncate(self, win: Window, reason: str) -> None:
        """Stop ``win`` now, on its thread, though calls still run in it; export what it has.

        Their open ranges are closed first (so the profile has them), later scopes of those
        calls record nothing, and each call says why it was cut short (``truncated``).
        """
        for call in win.calls:
            call.stopped = True
            if not call.done and call.truncated is None:
                call.truncated = reason
            failure = call.close_scopes()
            if failure is not None:
                self.stats.error("record_function", failure)
        self.close_window(win)

    def discard_window(self, win: Window, reason: str) -> None:
        """Give ``win`` up unread (its thread is gone, or the interpreter is exiting)."""
        try:
            recorded = win.recorded
            win.discard()
            if recorded:
                self.stats.drop(reason, recorded)
        finally:
            SLOT.vacate(win)
