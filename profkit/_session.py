"""The session: sampling decisions, the one process-wide window, the queue and its worker.

Request path (``begin_root`` / ``end_root``): decide, open or join a window, stop it, hand it
to a bounded queue. Worker thread: summarise, write the trace file, diagnose, export. The
window lock is module-global, not per session: two sessions (an old one being replaced by
``configure()``) must never run two profilers at once, which crashes torch.
"""

from __future__ import annotations

import gc
import itertools
import os
import queue
import threading
import time
from typing import Any

from opentelemetry import trace

from ._config import Config
from ._dispatch import Dispatcher
from ._errors import Stats, guard
from ._sampling import EveryN, RateLimiter, Sampler, TraceIdRatio, Triggered
from ._window import CallRecord, Window, foreign_profiler_active, warm_up

__all__ = ["Session"]

_WINDOW_LOCK = threading.Lock()
_STOP = object()
#: collect garbage on the worker every this many windows (torch's repeated sessions leak cycles)
_GC_EVERY = 25


def _reset_lock_after_fork() -> None:
    global _WINDOW_LOCK
    _WINDOW_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_reset_lock_after_fork)


def make_sampler(config: Config, rng: Any = None) -> Sampler:
    if config.sample_rate is not None:
        return TraceIdRatio(config.sample_rate, rng)
    return EveryN(config.every or 100)


def _parent_span_context() -> Any:
    ctx = trace.get_current_span().get_span_context()
    return ctx if ctx.is_valid else None


class Session:
    """One profkit session: settings, counters, sampler, queue, worker and exporters."""

    def __init__(self, config: Config, *, rng: Any = None, exporters: Any = None) -> None:
        self.config = config
        self.stats = Stats()
        self.active = config.enabled
        self._sampler = make_sampler(config, rng)
        self._ratio = config.sample_rate is not None
        self._limiter = RateLimiter(config.max_per_minute) if config.max_per_minute else None
        self._triggered = Triggered()
        self._window: Window | None = None
        self._window_ids = itertools.count(1)
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=config.queue_size)
        self._worker: threading.Thread | None = None
        self._worker_lock = threading.Lock()
        self._pending = 0
        self._idle = threading.Condition()
        self._windows_done = 0
        self._dispatch = Dispatcher(config, self.stats, exporters)
        self.warmup_seconds = 0.0
        self._pid = os.getpid()

    # -- request path -----------------------------------------------------------------------

    def begin_root(self, label: str) -> CallRecord | None:
        """Count a root call and decide whether it runs under the profiler."""
        self.stats.root()
        win = self._window
        if win is not None and win.owner == threading.get_ident() and not win.full:
            return self._join(win, "window")
        if self._triggered.take():
            policy = "trigger"
        else:
            trace_id = _parent_trace_id() if self._ratio else None
            if not self._sampler.decide(trace_id):
                return None
            if self._limiter is not None and not self._limiter.allow():
                self.stats.add("skipped_rate_limit")
                return None
            policy = self._sampler.description
        return self._open(policy)

    def _open(self, policy: str) -> CallRecord | None:
        if not _WINDOW_LOCK.acquire(blocking=False):
            self._skip("skipped_busy")
            return None
        opened = False
        try:
            if foreign_profiler_active():
                self._skip("skipped_foreign")
                return None
            win = Window(next(self._window_ids), self.config)
            with guard(self.stats, "profiler_start"):
                win.start()
            if win.prof is None:
                self._skip("skipped_profiler_failed")
                return None
            self._window = win
            opened = True
            self.stats.add("windows")
            return self._join(win, policy)
        finally:
            if not opened:
                _WINDOW_LOCK.release()

    def _skip(self, reason: str) -> None:
        self.stats.add("sampled")
        self.stats.add(reason)

    def _join(self, win: Window, policy: str) -> CallRecord:
        win.opened += 1
        win.in_flight += 1
        warm = win.opened <= self.config.warmup
        call = CallRecord(
            window=win,
            index=len(win.calls),
            policy=policy,
            warmup=warm,
            parent_span_context=_parent_span_context(),
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
        if win.full and win.in_flight == 0 and self._window is win:
            self._close(win)

    def _close(self, win: Window) -> None:
        try:
            stopped = False
            with guard(self.stats, "profiler_stop"):
                win.stop()
                stopped = True
        finally:
            self._window = None
            _WINDOW_LOCK.release()
        recorded = sum(1 for c in win.calls if not c.warmup)
        if not stopped:
            self.stats.drop("profiler_stop_failed", recorded)
            return
        self._enqueue(win, recorded)

    def _enqueue(self, win: Window, recorded: int) -> None:
        if not self.active and self._worker is None:
            self.stats.drop("shutdown", recorded)
            return
        with self._idle:
            self._pending += recorded
        try:
            self._queue.put_nowait(win)
        except queue.Full:
            with self._idle:
                self._pending -= recorded
            win.prof = None
            self.stats.drop("queue_full", recorded)
            return
        self._ensure_worker()

    # -- worker -----------------------------------------------------------------------------

    def _ensure_worker(self) -> None:
        if self._worker is not None:
            return
        with self._worker_lock:
            if self._worker is None:
                worker = threading.Thread(
                    target=self._run_worker, name="profkit-export", daemon=True
                )
                worker.start()
                self._worker = worker

    def _run_worker(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            self._process(item)

    def _process(self, win: Window) -> None:
        recorded = sum(1 for c in win.calls if not c.warmup)
        try:
            ok = False
            with guard(self.stats, "worker"):
                ok = self._dispatch.process(win)
            if ok:
                self.stats.add("exported", recorded)
            elif recorded:
                self.stats.drop(self._dispatch.last_failure or "worker_error", recorded)
        finally:
            win.prof = None
            win.calls.clear()
            self._windows_done += 1
            if self._windows_done % _GC_EVERY == 0:
                gc.collect()
            with self._idle:
                self._pending -= recorded
                self._idle.notify_all()

    # -- control ----------------------------------------------------------------------------

    def start(self) -> None:
        """Warm the profiler up (once per process) so the first sampled call is not slow."""
        if self.active:
            with guard(self.stats, "warmup"):
                self.warmup_seconds = warm_up(self.config)

    def trigger(self, n: int = 1) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"profkit.trigger(n): n must be an int >= 1, got {n!r}")
        self._triggered.add(n)

    def force_flush(self, timeout: float = 5.0) -> bool:
        """Wait until every handed-off window is exported or dropped, then flush exporters."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._pending > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return self._dispatch.flush(max(0.0, deadline - time.monotonic()))

    def shutdown(self, timeout: float = 5.0) -> bool:
        """Stop sampling, flush what is queued, stop the worker and the exporters."""
        deadline = time.monotonic() + timeout
        self.active = False
        flushed = self.force_flush(timeout)
        worker = self._worker
        if worker is not None:
            try:
                self._queue.put(_STOP, timeout=max(0.01, deadline - time.monotonic()))
            except queue.Full:
                flushed = False
            worker.join(max(0.01, deadline - time.monotonic()))
        self._drain_as_dropped()
        self._dispatch.shutdown(max(0.0, deadline - time.monotonic()))
        return flushed

    def _drain_as_dropped(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not _STOP:
                n = sum(1 for c in item.calls if not c.warmup)
                self.stats.drop("shutdown", n)
                with self._idle:
                    self._pending -= n

    def after_fork(self) -> None:
        """In a forked child: fresh counters, queue, worker and locks; the parent is untouched."""
        self.stats = Stats()
        self._dispatch.stats = self.stats
        self._window = None
        self._triggered = Triggered()
        self._queue = queue.Queue(maxsize=self.config.queue_size)
        self._worker = None
        self._worker_lock = threading.Lock()
        self._pending = 0
        self._idle = threading.Condition()
        self._pid = os.getpid()


def _parent_trace_id() -> int | None:
    ctx = trace.get_current_span().get_span_context()
    return ctx.trace_id if ctx.is_valid else None
