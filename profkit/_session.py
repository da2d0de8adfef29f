"""The session: decide, join and end root calls.

Request path only: ``begin_root`` counts a root call, asks the samplers, and opens a window
in the process-wide slot (:mod:`profkit._slot`) or joins the one this thread holds;
``end_root`` stops the window after its last call and hands it to the export pipeline
(:mod:`profkit._pipeline`). Everything after the hand-off runs on the pipeline's worker.
"""

from __future__ import annotations

import contextvars
import threading
import time
from typing import Any

from opentelemetry import baggage, trace
from opentelemetry import context as otel_context
from opentelemetry.trace import SpanContext, TraceFlags

from ._config import Config
from ._deadline import Deadline
from ._errors import Stats, guard
from ._fanout import Fanout, build_exporters
from ._keeper import Gate, WindowKeeper, judge
from ._pipeline import ExportPipeline
from ._processing import Processor
from ._records import CallRecord
from ._sampling import EveryN, Sampler, TraceIdRatio, Triggered
from ._slot import SLOT, Held
from ._slow import LatencyBook, Speculation, Timed
from ._window import make_profiler, prime

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


#: the key of OTel's baggage in a context, found like ``_SPAN_KEY`` (baggage_trigger), and
#: the ``profkit.profile`` values that ask for a profile, after lower()
_BAGGAGE_KEY = next(iter(baggage.set_baggage("profkit.profile", "1", otel_context.Context())))
_YES = frozenset({"1", "true", "yes"})


def asks_to_profile(ctx: otel_context.Context) -> bool:
    """Whether the OTel baggage in ``ctx`` holds ``profkit.profile`` = 1, true or yes.

    ``baggage.get_baggage("profkit.profile", ctx)`` without its three Python frames.
    """
    bag = ctx.get(_BAGGAGE_KEY)
    value = bag.get("profkit.profile") if isinstance(bag, dict) else None
    return isinstance(value, str) and value.strip().lower() in _YES


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
        self._baggage = config.baggage_trigger  # a plain attribute: one read when it is off
        self.triggered = Triggered()
        spans, exporters = build_exporters(config)
        fanout = Fanout(self.stats, spans, exporters, config.export_timeout)
        processor = Processor(config, self.stats)
        self.pipeline = ExportPipeline(
            self.stats, processor, fanout, config.queue_size, after_each=self._build_spare
        )
        self._gate = Gate(config, self.stats, self.pipeline)
        #: capture_slow: the latency book (None when off: then no root call is timed)
        self._book = LatencyBook(config.slow_ms) if config.capture_slow else None
        self._speculation = Speculation(self._book, self._gate.speculate) if self._book else None
        self.keeper = WindowKeeper(config, self.stats, self.pipeline, self._speculation)
        #: ``timed(label, t0)``: an unprofiled root call that ``begin_root`` timed has ended
        self.timed = self._book.note_since if self._book is not None else None
        #: seconds the once-per-process profiler start took in ``start()`` (0.0: primed)
        self.prime_seconds = 0.0

    # -- request path -----------------------------------------------------------------------

    def begin_root(self, label: str, speculate: bool = True) -> CallRecord | int | None:
        """Count a root call and decide whether it runs under the profiler.

        A call inside a trace that was not sampled is not profiled (its spans would never be
        exported): it is counted as ``skipped_unsampled_trace`` before the sampler, a
        trigger or an open window sees it, so it uses up none of them. A call whose baggage
        asks for a profile (``baggage_trigger``) skips the sampler, not the gate. A root
        that cannot be judged (``speculate=False``: a generator, whose first yield stops a
        thread-local window) is neither timed nor speculative.
        """
        next(self.stats.roots)  # every off-sample call passes here: a C call, no lock
        held = SLOT.held
        otel = _otel_current()  # empty (falsy) when no span is active: no lookup
        span: Any = otel.get(_SPAN_KEY) if otel else None  # trace.get_current_span(), minus ~250 ns
        parent: SpanContext | None = span.get_span_context() if span is not None else None
        if held is not None and held.window.owner == threading.get_ident():
            call = self._on_own_thread(held, parent, label, otel, speculate)
            if call is not None:
                return call
        # the sampled bit first: one int operation on the usual path (a sampled trace)
        if parent is not None and not parent.trace_flags & _SAMPLED and parent.is_valid:
            next(self.stats.unsampled_traces)  # lock-free, like the root count
            return None
        # a trigger waits while another thread's window holds the slot: spent on this call,
        # it would profile nothing (skipped_busy); the next call that can have a window takes it
        trig = self.triggered
        if trig.pending and SLOT.held is None and not self.pipeline.full() and trig.take(label):
            return self.keeper.open("trigger", parent)
        if self._baggage and otel and asks_to_profile(otel):  # an empty context holds none
            policy = "baggage"
        else:
            trace_id = parent.trace_id if self._ratio and parent and parent.is_valid else None
            if not self._sampler.decide(trace_id):
                if self._book is None or not speculate:
                    return None
                return self._unprofiled(label, parent)
            policy = self._sampler.description
        return self.keeper.open(policy, parent) if self._gate.admits() else None

    def _on_own_thread(
        self, held: Held, parent: SpanContext | None, label: str, otel: Any, speculate: bool
    ) -> CallRecord | None:
        """A root call on the thread of the open window: a checkpoint, then join it or not.

        A speculative window keeps a call that a trigger or the baggage asks for as such
        (exported, never judged), like the window it would have had otherwise."""
        owner, win = held
        if win.prof is None:  # closed, but the slot was not freed (an exception cut it short)
            SLOT.vacate(win)
        elif time.monotonic() > win.deadline:
            owner.truncate(win, win.cut_reason)
        elif owner is not self.keeper:
            SLOT.close_retired(self.keeper)  # an idle window of a replaced session
        elif not win.full:
            if parent is not None and not parent.trace_flags & _SAMPLED and parent.is_valid:
                return None  # an unsampled trace does not join (counted by the caller)
            policy = "window"
            if win.speculative:
                if self.triggered.pending and self.triggered.take(label):
                    policy = "trigger"
                elif self._baggage and otel and asks_to_profile(otel):
                    policy = "baggage"
                elif speculate:
                    policy = "speculative"
                else:  # a generator: its first yield would cut the window short
                    return None
            return self.keeper.join(win, policy, parent)
        elif not win.in_flight:  # all its calls ended, yet it is open: an end cut short
            owner.close_window(win)
        else:  # another request on a thread the window records (an event loop's)
            win.others += 1
            if win.others > _MAX_OTHERS:
                owner.truncate(win, "busy_thread")
        return None

    def _unprofiled(self, label: str, parent: SpanContext | None) -> CallRecord | int | None:
        """capture_slow: a speculative window for this call, or else its start time (the
        scope gives it back to :attr:`timed` with the label when the call ends)."""
        spec = self._speculation
        if spec is None:
            return None
        if spec.rest:
            spec.rest -= 1
        elif SLOT.held is None and spec.want(label):  # a window elsewhere: no token spent
            call = self.keeper.open("speculative", parent, spec.calls)
            if call is not None:
                return call
        return time.perf_counter_ns()

    def end_root(self, call: CallRecord | Timed, error: BaseException | None) -> None:
        """Close a sampled call; the last call of a window stops the profiler and hands it off.

        A timed unprofiled call (``capture_slow``) goes into the latency book; a speculative
        call is judged: slow, it is sampled (policy "slow"), else released unread.
        """
        if isinstance(call, Timed):
            call.end()
            return
        call.error = error
        call.stopped = True
        call.done = True
        if self._book is not None:
            judge(self._book, self.stats, call, self.pipeline.busy_ns)
        win = call.window
        done = win.full or not self.active or win.done_early(self.stats.root_calls)
        if done and win.in_flight == 0:
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
        """Build the next window's profiler ahead (here, and on the worker after a window):
        constructing one costs ~0.1 ms that no request then pays."""
        if self.keeper.spare is None and self.active:
            with guard(self.stats, "profiler_build"):
                self.keeper.spare = make_profiler(self.config)

    def trigger(self, n: int = 1, label: str | None = None) -> None:
        self.triggered.add(n, label)  # checks its arguments (ValueError)

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
