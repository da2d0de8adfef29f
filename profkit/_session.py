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
import weakref
from typing import Any

from opentelemetry import trace

from ._config import Config
from ._dispatch import Dispatcher
from ._errors import Stats, guard
from ._sampling import EveryN, RateLimiter, Sampler, TraceIdRatio, Triggered
from ._window import CallRecord, Window, foreign_profiler_active, make_profiler, warm_up

__all__ = ["Session"]

_WINDOW_LOCK = threading.Lock()
_STOP = object()
#: collect garbage on the worker every this many windows (torch's repeated sessions leak cycles)
_GC_EVERY = 25
#: seconds the worker waits after taking a window before it summarises it
_HANDOFF_GRACE_S = 0.001


#: the one open window, process-wide, and the session that opened it (None: no window).
#: Only the window's own thread can stop its profiler (a stop from another thread loses the
#: events and leaks torch's callbacks), which decides how a stranded window is freed.
_current: tuple[Session, Window] | None = None
_reclaim_lock = threading.Lock()


def _reset_lock_after_fork() -> None:
    global _WINDOW_LOCK, _current, _reclaim_lock
    held = _current
    if held is not None and held[1].owner_thread is not threading.current_thread():
        # the window's thread does not exist in the child: nor does its profiler state, but
        # the process-wide "a profiler is running" flag was copied and would block profkit
        held[1].abandon()
    _WINDOW_LOCK = threading.Lock()
    _reclaim_lock = threading.Lock()
    _current = None


def _close_retired(held: tuple[Session, Window]) -> None:
    """An idle window of a replaced session closes on its thread's next root call."""
    session, win = held
    if win.owner_thread is threading.current_thread() and win.in_flight == 0:
        session._close(win)


class _ThreadEndGuard:
    """Closes (and exports) the window still open on a thread when that thread ends.

    It lives in a ``threading.local``: CPython clears a thread's locals on that thread as it
    ends, before the C++ thread-locals holding torch's thread-local profiler state are
    destroyed. A profiler still enabled there makes torch warn ("Requested callback is not
    found", "Leaked callback handle") and the process crash at exit (measured, torch 2.13):
    a thread-per-request server with ``window`` > 1 would otherwise end that way.
    """

    __slots__ = ("window",)

    def __init__(self, win: Window) -> None:
        self.window = weakref.ref(win)

    def __del__(self) -> None:
        win = self.window()
        held = _current
        if win is None or held is None or held[1] is not win or win.in_flight:
            return  # closed already (the usual case), or a call still runs in it
        if win.owner != threading.get_ident():
            return  # not its thread (a forked child clearing the parent's threads)
        try:
            held[0]._close(win)
        except Exception as exc:  # a finalizer must not raise
            held[0].stats.error("thread_end", exc)


_thread_end = threading.local()


def _reclaim_if_owner_exited() -> bool:
    """Free a window whose thread exited with it open; True when the window lock is ours."""
    held = _current
    if held is None or held[1].owner_thread.is_alive():
        return False
    if not _reclaim_lock.acquire(blocking=False):
        return False
    try:
        if _current is not held:
            return False
        held[0]._abandon(held[1])
    finally:
        _reclaim_lock.release()
    return _WINDOW_LOCK.acquire(blocking=False)


def stop_left_at_exit() -> None:
    """At interpreter exit, stop a profiler that profkit left running and would crash the exit.

    torch tears down a still-enabled profiler's state during exit, after its callbacks are
    gone, and the process dies with SIGSEGV (measured on torch 2.13: a thread-local profiler on
    the main thread, or an all-threads one started anywhere). Called after the global session's
    shutdown; what remains is a window of a replaced session or one idle on another thread.
    A thread-local profiler on another live thread is never torn down and is left alone.
    """
    held = _current
    if held is None:
        return
    session, win = held
    if not win.config.all_threads and win.owner_thread is not threading.current_thread():
        return
    if not _reclaim_lock.acquire(blocking=False):
        return
    try:
        if _current is held:
            session._abandon(win, "shutdown")
    finally:
        _reclaim_lock.release()


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
        self._closed = False  # set by shutdown(): no window is queued after this
        self._pending = 0
        self._idle = threading.Condition()
        self._windows_done = 0
        self._dispatch = Dispatcher(config, self.stats, exporters)
        self.warmup_seconds = 0.0
        #: the next window's profiler object, built by configure() and by the worker after
        #: each window: building one (~0.1 ms) is then not on the sampled request's path
        self._spare: Any = None
        self._pid = os.getpid()

    # -- request path -----------------------------------------------------------------------

    def begin_root(self, label: str) -> CallRecord | None:
        """Count a root call and decide whether it runs under the profiler."""
        next(self.stats.roots)  # Stats.root(), inlined: every off-sample call passes here
        held = _current
        if held is not None and held[0] is not self:
            _close_retired(held)
        win = self._window
        if win is not None and win.owner == threading.get_ident() and not win.full:
            return self._join(win, "window")
        if self._triggered.pending and self._triggered.take():
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
        global _current
        if not _WINDOW_LOCK.acquire(blocking=False) and not _reclaim_if_owner_exited():
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
            self._window = win
            _current = (self, win)
            _thread_end.guard = _ThreadEndGuard(win)
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
        if (win.full or not self.active) and win.in_flight == 0 and self._window is win:
            self._close(win)

    def _close(self, win: Window) -> None:
        # handed off (queued or counted as dropped) before the window is let go, so that a
        # shutdown() waiting for it finds it in the queue
        try:
            stopped = False
            with guard(self.stats, "profiler_stop"):
                win.stop()
                stopped = True
            recorded = sum(1 for c in win.calls if not c.warmup)
            if stopped:
                self._enqueue(win, recorded)
            else:
                self.stats.drop("profiler_stop_failed", recorded)
        finally:
            self._let_go(win)

    def _let_go(self, win: Window) -> None:
        global _current
        self._window = None
        if _current is not None and _current[1] is win:
            _current = None
        _WINDOW_LOCK.release()
        with self._idle:
            self._idle.notify_all()

    def _abandon(self, win: Window, reason: str = "owner_exited") -> None:
        """Drop a window we cannot close normally: its thread exited, or the interpreter is."""
        try:
            win.abandon()
            recorded = sum(1 for c in win.calls if not c.warmup)
            if recorded:
                self.stats.drop(reason, recorded)
            win.prof = None
            win.calls.clear()
        finally:
            self._let_go(win)

    def _enqueue(self, win: Window, recorded: int) -> None:
        # the lock orders this against shutdown(): a window is queued ahead of the worker's
        # stop marker or counted as dropped, never left in a queue nobody reads
        with self._worker_lock:
            if self._closed:
                win.prof = None
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
            self._spawn_worker()

    def _spawn_worker(self) -> None:
        """Start the export worker unless it runs (call with ``_worker_lock`` held)."""
        if self._worker is None and not self._closed:
            self._worker = threading.Thread(
                target=self._run_worker, name="profkit-export", daemon=True
            )
            self._worker.start()

    # -- worker -----------------------------------------------------------------------------

    def _run_worker(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            # let the thread that handed the window off return from its call first: woken
            # at once, the worker takes the GIL at the call's next release (freeing a tensor
            # can release it) and the sampled request waits out a whole switch interval
            time.sleep(_HANDOFF_GRACE_S)
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
            win.release()  # events and kineto results freed now, by reference counting
            win.calls.clear()
            self._windows_done += 1
            if self._windows_done % _GC_EVERY == 0:
                # young generations only: what release() leaves in cycles is small, and a
                # full collection holds the GIL (every request thread) for hundreds of ms
                gc.collect(1)
            with self._idle:
                self._pending -= recorded
                self._idle.notify_all()
            self._build_spare()

    def _build_spare(self) -> None:
        if self._spare is None and self.active:
            with guard(self.stats, "profiler_build"):
                self._spare = make_profiler(self.config)

    # -- control ----------------------------------------------------------------------------

    def start(self) -> None:
        """Warm the profiler up (once per process) and start the export worker.

        Both happen here, off the request path: otherwise the first sampled call pays the
        profiler's first start (about a second) and a thread start (milliseconds on a busy
        machine). A forked child starts its worker on its first sampled call.
        """
        if self.active:
            with guard(self.stats, "warmup"):
                self.warmup_seconds = warm_up(self.config)
            self._build_spare()
            with self._worker_lock:
                self._spawn_worker()

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
        """Stop sampling, let an open window finish, flush the queue, stop worker and exporters.

        A window still open at the deadline (or on the calling thread itself) is counted as
        dropped with reason "shutdown" when its call ends.
        """
        deadline = time.monotonic() + timeout
        self.active = False
        self._wait_for_window(deadline)
        self.release_idle_window()
        flushed = self.force_flush(max(0.0, deadline - time.monotonic()))
        with self._worker_lock:
            self._closed = True
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

    def _wait_for_window(self, deadline: float) -> None:
        """Wait while calls are in flight in a window on another thread."""
        with self._idle:
            while True:
                win = self._window
                left = deadline - time.monotonic()
                if win is None or not win.in_flight or win.owner == threading.get_ident():
                    return
                if left <= 0:
                    return
                self._idle.wait(min(left, 0.05))

    def release_idle_window(self) -> None:
        """A window waiting for more calls (``window`` > 1) is let go of as soon as possible.

        On its own thread it closes now; if that thread has exited it is dropped now;
        otherwise that thread's next root call (under any session) closes it.
        """
        win = self._window
        if win is None or win.in_flight:
            return  # none, or its running call closes it on exit (the session is inactive)
        if win.owner_thread is threading.current_thread():
            self._close(win)
        elif not win.owner_thread.is_alive() and _reclaim_lock.acquire(blocking=False):
            try:
                if self._window is win:
                    self._abandon(win)
            finally:
                _reclaim_lock.release()

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
        self._window = None
        self._triggered = Triggered()
        self._queue = queue.Queue(maxsize=self.config.queue_size)
        self._worker = None
        self._worker_lock = threading.Lock()
        self._closed = False
        self._pending = 0
        self._idle = threading.Condition()
        self._windows_done = 0
        self._dispatch.after_fork(self.stats)
        self._pid = os.getpid()


def _parent_trace_id() -> int | None:
    ctx = trace.get_current_span().get_span_context()
    return ctx.trace_id if ctx.is_valid else None
