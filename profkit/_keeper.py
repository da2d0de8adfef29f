"""After the sampler: the gate a chosen call passes, and the keeper of a session's windows.

:class:`Gate` turns a sampled decision away when a window could not be exported or would
cost more than the budget; :class:`WindowKeeper` closes, cuts short and discards windows
(the slot's ``WindowOwner``) and hands closed ones to the export pipeline. Speculative
windows (``capture_slow``) keep only their slow calls; one with none is released unread.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

from opentelemetry.trace import SpanContext

from ._config import Config
from ._errors import Stats, guard
from ._pipeline import ExportPipeline
from ._records import CallRecord
from ._sampling import RateLimiter
from ._slot import SLOT
from ._slow import LatencyBook, Speculation
from ._window import Window

__all__ = ["Gate", "WindowKeeper", "judge"]

#: seconds an over-budget verdict stands before the CPU share is read again
_OVER_RECHECK_S = 0.01


def judge(book: LatencyBook, stats: Stats, call: CallRecord, busy_ns: Callable[[], int]) -> None:
    """A profiled call ended under capture_slow: the label's unprofiled median beside it
    (the observer effect); a speculative call is kept when slower than the threshold.

    What the export worker took of the call's time (its busy time while the call ran: it
    holds the GIL while it summarises) does not count: otherwise a fast call that ran while
    the worker summarised a slow one would look slow, and its window would keep the worker
    busy in turn. The call that opened the window is never kept: right after a start the
    profiler's own threads stall about one first call in five by 1-5 ms (torch 2.13, CPU).
    A call still running when its window is cut short is judged on its time until the cut:
    the slowest calls are the ones that outlast a window (``max_window_s``)."""
    label = call.scopes[0].label if call.scopes else ""
    call.unsampled_p50_ms = book.p50_ms(label)
    if call.policy != "speculative":
        return
    root = call.scopes[0] if call.scopes else None
    limit = None
    if root is not None and call.index > 0:  # cut short: its time so far (end_ns: the cut)
        limit = book.judge(label, root.end_ns - root.start_ns - (busy_ns() - call.worker_busy_ns))
    if limit is not None:
        call.slow_threshold_ms = limit / 1e6
        call.policy = "slow"
        stats.add("sampled")
    else:
        call.policy = "released"
        stats.add("speculative_released")
        # its per-op recording is profkit's cost too: the worker, which charges a read
        # window's, never sees a released call (the profiled-over-unprofiled median)
        stats.cpu.charge(book.inflation_ns(label) / 1e9)


class Gate:
    """What a call the sampler (or a client's baggage) chose must pass before a window opens.

    Checked in this order, so that a call turned away uses up no rate-cap token: the export
    queue is full (a window recorded now could not be exported: ``skipped_backlog``),
    profkit is over its CPU budget (``skipped_budget``), the rate cap
    (``skipped_rate_limit``). Only sampled decisions get here, never the off-sample path.
    A refused call is counted under its reason.
    """

    def __init__(self, config: Config, stats: Stats, pipeline: ExportPipeline) -> None:
        self._stats = stats
        self._pipeline = pipeline
        self._budget = config.max_overhead
        #: ``time.monotonic()`` until which profkit is known to be over its budget
        self._over_until = 0.0
        self._limiter = RateLimiter(config.max_per_minute) if config.max_per_minute else None
        #: speculative windows (capture_slow) have a rate cap of their own, of the same size
        per_minute = config.max_per_minute if config.capture_slow else None
        self._spec_limiter = RateLimiter(per_minute) if per_minute else None

    def admits(self) -> bool:
        """Whether this call may open a window; if not, count the reason."""
        refused = self.refused()
        if refused is not None:
            next(self._stats.refused[refused])
        return refused is None

    def refused(self) -> str | None:
        """The counter of the reason this call is not profiled after all, or None."""
        if self._pipeline.full():
            return "skipped_backlog"
        if self._budget is not None and self._over_budget():
            return "skipped_budget"
        if self._limiter is not None and not self._limiter.allow():
            return "skipped_rate_limit"
        return None

    def _over_budget(self) -> bool:
        """Whether profkit's CPU share is at its budget; once it is, said again for 10 ms
        without asking (the share reads the process's CPU clock, a system call: at
        ``sample_every=1`` over budget that was ~1.7 µs on every call, now ~0.1 µs)."""
        now = time.monotonic()
        if now < self._over_until:
            return True
        assert self._budget is not None
        if self._stats.cpu.share() >= self._budget:
            self._over_until = now + _OVER_RECHECK_S
            return True
        return False

    def speculate(self) -> bool:
        """Whether a speculative window may open now: room in the queue, in the budget and
        in its own rate cap (nothing is counted when not: no call was sampled)."""
        if self._pipeline.full():
            return False
        if self._budget is not None and self._over_budget():
            return False
        return self._spec_limiter is None or self._spec_limiter.allow()


class WindowKeeper:
    """Closes, cuts short and discards the windows of one session (the slot's WindowOwner).

    Opens a window for a chosen call and joins calls to it (on the request path), closes and
    truncates it (on its own thread), discards it (wherever the slot frees a window whose
    thread is gone). A closed window goes to the session's pipeline.
    """

    def __init__(
        self,
        config: Config,
        stats: Stats,
        pipeline: ExportPipeline,
        speculation: Speculation | None = None,
    ) -> None:
        self._config = config
        self.stats = stats
        self.pipeline = pipeline
        self.all_threads = config.all_threads
        self.speculation = speculation
        self._window_ids = itertools.count(1)
        #: the next window's profiler, built ahead (the session's start(), the worker)
        self.spare: Any = None

    # -- open and join (the request path) ---------------------------------------------------

    def open(
        self, policy: str, parent: SpanContext | None, speculative: int = 0
    ) -> CallRecord | None:
        """Open a window for this call; ``speculative``: one of that many calls, counted
        only when slow (a speculative call that cannot have its window is just not timed)."""
        cpu0 = time.thread_time()  # profkit's CPU time on the request thread: the budget's
        if not SLOT.acquire():
            if not speculative:
                self.stats.skip("skipped_busy")
            return None
        win: Window | None = None
        opened = charged = False
        try:
            if not SLOT.may_open():
                if not speculative:
                    self.stats.skip("skipped_foreign")
                return None
            win = Window(next(self._window_ids), self._config, speculative)
            if speculative:
                win.roots_at_open = self.stats.root_calls - 1  # before this call
            spare, self.spare = self.spare, None  # built ahead, off the request path
            with guard(self.stats, "profiler_start"):
                win.start(spare)
            if win.prof is None:  # sampled, but the profile is lost: a drop, not a skip
                if not speculative:
                    self.stats.add("sampled")
                    self.stats.drop("profiler_start_failed")
                return None
            self.stats.add("windows")
            self.stats.cpu.charge(time.thread_time() - cpu0)  # before the window is visible
            charged = True
            SLOT.occupy(self, win)
            call = self.join(win, policy, parent)
            opened = True  # only now: an exception before leaves no window without its call
            return call
        finally:
            if not opened:
                if win is not None:
                    win.ensure_stopped()  # started, then an exception landed: never leave it on
                SLOT.vacate(win)
                if not charged:
                    self.stats.cpu.charge(time.thread_time() - cpu0)  # after cleaning up

    def join(self, win: Window, policy: str, parent: SpanContext | None) -> CallRecord:
        warm = not win.speculative and len(win.calls) < self._config.warmup
        call = CallRecord(
            window=win,
            index=len(win.calls),
            policy=policy,
            warmup=warm,
            parent_span_context=parent if parent is not None and parent.is_valid else None,
            thread_name=threading.current_thread().name,
        )
        if policy == "speculative":
            call.worker_busy_ns = self.pipeline.busy_ns()
        self.stats.add("warmup_calls" if warm else policy if policy == "speculative" else "sampled")
        win.calls.append(call)  # joined: one atomic step (the window's counts derive from it)
        return call

    # -- a root call on the window's thread yielded ----------------------------------------

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
            if win.speculative:
                self._keep_slow(win, time.thread_time() - cpu0)
            # handed off (queued or counted as dropped) before the slot is freed, so that a
            # shutdown() waiting for the window finds it in the queue
            if win.speculative and not win.calls:  # none of its calls was slow: unread
                win.release()
            elif stopped:
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

    def _keep_slow(self, win: Window, stop_s: float) -> None:
        """A stopped speculative window keeps only the calls found slow (or triggered)."""
        spec = self.speculation  # set whenever speculative windows open (capture_slow)
        if spec is not None:
            spec.closed(len(win.calls), stop_s)
            for call in win.calls:
                if call.policy == "speculative":  # still running, cut short: judged so far
                    judge(spec.book, self.stats, call, self.pipeline.busy_ns)
        win.calls[:] = [c for c in win.calls if c.policy not in ("speculative", "released")]

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
