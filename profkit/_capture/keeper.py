"""The owner of a window's life: the one module that opens, joins, cuts short, closes and
discards profiler windows (a test holds every other module to it). :class:`WindowKeeper` is
one session's: it opens windows for the calls ``decide`` chose, joins calls to them, hands
closed ones to its pipeline. The module functions act on the window holding the slot, of any
session: the ``max_window_s`` checkpoint, the thread-end guard, the exit stop, the fork reset.
A window whose calls all ended closes at once, unless ``window`` > 1 or ``warmup`` > 0."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

from opentelemetry.trace import SpanContext

from .._config import Config
from .._errors import guard, retry_once
from .._export.pipeline import ExportPipeline
from .._records import CallRecord, Policy
from .._sampling import RateLimiter
from .._stats import JOINED, SETTLED, Stats
from .._targeting.slow import Speculation
from .._targeting.stages import STALLS
from .._targeting.verdict import SlowToken, judge
from . import foreign as _foreign
from . import hooks as _hooks
from . import resident as _resident
from .room import crowded, has_room
from .slot import SLOT
from .window import Window, stop_leaked

__all__ = [
    "WindowKeeper",
    "checkpoint",
    "close_idle",
    "held_here",
    "install_hooks",
    "orphaned",
    "stop_left_at_exit",
    "yielded",
]


class WindowKeeper:
    """One session's windows: open, join, close, cut short, discard; hand off to export."""

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
        self.speculation = speculation
        self._window_ids = itertools.count(1)
        #: the rate cap: profiles exported a minute (a speculative window spends none to
        #: open, the budget pays for it; one that keeps a slow call spends one)
        self._limiter = RateLimiter(config.max_per_minute) if config.max_per_minute else None
        #: whether a speculative window found slow may be exported (spends its token)
        self.slow_token = SlowToken(self._limiter).allow
        #: the next window's profiler, built ahead (the session's start(), the worker)
        self.spare: Any = None

    # -- open and join (the request path) ---------------------------------------------------

    def open(
        self,
        policy: Policy,
        parent: SpanContext | None,
        *,
        spend: Any = None,
        sampler: str = "",
        speculative: int = 0,
    ) -> CallRecord | None:
        """Open a window for a call the decision chose, or count why it could not.

        In this order, so that a refusal spends nothing: the slot is taken (else
        ``skipped_busy``), no one else's profiler runs or starts (``skipped_foreign``), the
        rate cap has a token (``skipped_rate_limit``; not for a trigger, nor a speculative
        window: it spends one only if it keeps a slow call), ``spend()`` (taking the
        trigger) agrees. A speculative call (``speculative``: the window's size) counts
        no refusal (it was not sampled), nor does a trigger (it waits for the next call)."""
        cpu0 = time.thread_time()  # profkit's CPU time on the request thread: the budget's
        waits = bool(speculative) or policy is Policy.TRIGGER  # counts no refusal: it waits
        call = CallRecord.begin(policy, parent, sampler)  # first: its counts are marked on it
        if not SLOT.acquire() and not _reclaim_if_owner_exited():
            self._refuse(call, waits, "skipped_busy")
            return None
        win: Window | None = None
        opened = charged = interrupted = False
        try:
            if not _foreign.may_open() and not (stop_leaked(self.stats) and _foreign.may_open()):
                self._refuse(call, waits, "skipped_foreign")
                return None
            limiter = None if speculative or policy is Policy.TRIGGER else self._limiter
            if limiter is not None and not limiter.allow():
                call.counted = JOINED | SETTLED  # (with the count: no call in between)
                next(self.stats.refused["skipped_rate_limit"])
                return None
            if spend is not None and not spend():
                return None  # another thread took the last trigger meanwhile
            win = Window(next(self._window_ids), self._config, speculative)
            win.keeper = self
            spare, self.spare = self.spare, None  # built ahead, off the request path
            with guard(self.stats, "profiler_start"), STALLS.timed():  # (all threads wait)
                win.start(spare, _resident.take(win))  # (or this thread's resident session)
            if win.prof is None:  # sampled, but the profile is lost: a drop, not a skip
                if not speculative:
                    self.stats.settle(call, "profiler_start_failed")
                return None
            self.stats.add("windows")
            self.stats.cpu.charge(time.thread_time() - cpu0)  # before the window is visible
            charged = True
            SLOT.occupy(win)
            _ThreadEndGuard.ensure()
            self.join(win, policy, parent, sampler, call)
            opened = True  # only now: an exception before leaves no window without its call
            return call
        except BaseException:  # a signal's exception (a request timeout) landed in here
            interrupted = True
            raise
        finally:
            if not opened:
                if win is not None:
                    win.ensure_stopped()  # started, then an exception landed: never leave it on
                if interrupted and win is not None and win.calls:
                    _count_lost(win, "interrupted")
                elif interrupted and not speculative:  # picked, never opened
                    self.stats.settle(call, "interrupted")
                SLOT.vacate(win)
                if not charged:
                    self.stats.cpu.charge(time.thread_time() - cpu0)  # after cleaning up

    def _refuse(self, call: CallRecord, waits: bool, reason: str) -> None:
        self.stats.skip(reason, call) if not waits else None

    def join(
        self,
        win: Window,
        policy: Policy,
        parent: SpanContext | None,
        sampler: str = "",
        call: CallRecord | None = None,
    ) -> CallRecord:
        """Add a root call to ``win``: appended and counted as one step (``Stats.join``)."""
        warm = not win.speculative and len(win.calls) < self._config.warmup
        call = call or CallRecord.begin(policy, parent, sampler)
        call.window, call.index, call.warmup = win, len(win.calls), warm
        if policy is Policy.SPECULATIVE:
            call.worker_busy_ns = self.pipeline.busy_ns()
        counter = "warmup_calls" if warm else "sampled"
        spec = policy is Policy.SPECULATIVE
        self.stats.join(win.calls, call, "speculative" if spec else counter)
        if win.closing:  # joined as shutdown closed it from another thread: nothing recorded
            call.truncated = call.truncated or "shutdown"
        return call

    def spend_rate_token(self) -> bool:
        """A trigger or baggage call joining a speculative window spends a rate-cap token."""
        return self._limiter is None or self._limiter.allow()

    # -- a root call ended, or yielded; control ---------------------------------------------

    def ended(self, call: CallRecord, active: bool) -> None:
        """A root call of one of this keeper's windows ended: close the window if it is done
        (full, the session stopped, or a speculative window: it never waits on an idle thread)
        and this is its thread (else its loop's timer or its thread's next call closes it)."""
        win: Window = call.window
        if win.in_flight:
            return
        here = win.owner == threading.get_ident() or win.config.all_threads  # else: its thread's
        if (win.full or not active or win.speculative) and SLOT.held is win and here:
            self.close_window(win)

    def close_window(self, win: Window) -> None:
        """Stop ``win`` on its own thread, hand it to the pipeline, free the slot. Once: a
        retry (a signal's exception cut the first short) frees it; one nested in it, nothing."""
        if win.close_running:  # the slot stays held until that close has handed it off
            return
        try:
            if win.closing:
                return
            win.closing = win.close_running = True
            cpu0 = time.thread_time()
            stopped = False
            with guard(self.stats, "profiler_stop"), STALLS.timed():
                win.stop()  # (or kept on, its collection off: :mod:`.resident`)
                stopped = True
            if win.speculative:
                self._keep_slow(win, time.thread_time() - cpu0)
            # handed off (queued or counted as dropped) before the slot is freed, so that a
            # shutdown() waiting for the window finds it in the queue
            if win.speculative and not win.calls:  # none of its calls was slow: unread
                win.release()
            elif stopped:
                self.pipeline.offer(win)
            else:
                _count_lost(win, "profiler_stop_failed")
                win.release()
            self.stats.cpu.charge(time.thread_time() - cpu0)
        except BaseException:  # a signal's exception mid-close: the profiler must not stay on,
            win.ensure_stopped()  # and a window not queued yet is counted, each call once
            if not win.handed:
                retry_once(_count_lost, win, "interrupted")
            raise
        finally:
            win.close_running = False
            retry_once(SLOT.vacate, win)

    def _keep_slow(self, win: Window, stop_s: float) -> None:
        """A stopped speculative window keeps only the calls found slow (or asked for)."""
        spec = self.speculation  # set whenever speculative windows open (capture_slow)
        if spec is not None:
            spec.closed(len(win.calls), stop_s)
            for call in win.calls:
                if call.policy is Policy.SPECULATIVE:  # still running, cut short: judged so far
                    judge(spec.book, self.stats, call, self.pipeline.busy_ns, self.slow_token)
        win.calls[:] = [c for c in win.calls if c.policy.exported]

    def truncate(self, win: Window, reason: str) -> None:
        """Stop ``win`` now, on its thread, though calls still run in it; export what it has.
        Their open ranges are closed first (so the profile has them), later scopes of those
        calls record nothing, and each call says why it was cut short (``truncated``)."""
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
            _count_lost(win, reason)
            win.discard()
        finally:
            SLOT.vacate(win)


def _count_lost(win: Window, reason: str) -> None:
    """Count each call of ``win`` (unseen by the export worker) once: released or dropped."""
    for call in win.calls:
        if call.policy is Policy.SPECULATIVE:
            win.keeper.stats.judge(call, Policy.RELEASED, "speculative_released")
    win.keeper.pipeline.lose(win, reason, release=False)


# -- whatever window holds the slot -------------------------------------------------------


def held_here(keeper: WindowKeeper) -> Window | None:
    """A root call on this thread while a window holds the slot: the window it may join.

    First the checkpoint: a window closed but still held is freed, one past its deadline is
    cut short, an idle one of a replaced session or one whose calls all ended is closed.
    Returns the window of ``keeper`` on this thread that has room, else None (and another
    request on a thread the window records, an event loop's, is counted against it).
    """
    win = SLOT.held
    if win is None or win.owner != threading.get_ident() or win.close_running:
        return None  # (closing: a signal handler's call nested in that close joins nothing)
    owner = win.keeper
    if win.prof is None:  # closed, but the slot was not freed (an exception cut it short)
        SLOT.vacate(win)
    elif time.monotonic() > win.deadline:
        owner.truncate(win, win.cut_reason)
    elif owner is not keeper or win.clobbered:  # (clobbered: your profiler on this thread
        if win.in_flight == 0:  # emptied it; later calls would be dropped with it)
            owner.close_window(win)  # an idle window of a replaced session, or that one
    elif has_room(win):
        return win
    elif not win.in_flight:  # all its calls ended, yet it is open: an end cut short
        owner.close_window(win)
    else:  # another request on a thread the window records (an event loop's)
        win.others += 1
        if crowded(win):
            owner.truncate(win, "busy_thread")
    return None


def close_idle(keeper: WindowKeeper, stopping: bool = False) -> None:
    """Let go of ``keeper``'s window that waits for more calls, if any. On its own thread it
    closes now, and so does one recording all threads when ``stopping`` (shutdown: no root
    call joins it, and any thread can stop it); if its thread has exited it is discarded
    now; otherwise that thread's next root call (under any session) closes it."""
    win = SLOT.held
    if win is None or win.keeper is not keeper or win.in_flight:
        return  # none, or its running call closes it on exit (the session is inactive)
    here, alive = win.owner_thread is threading.current_thread(), win.owner_thread.is_alive()
    if here or (stopping and alive and win.config.all_threads):
        keeper.close_window(win)
    elif not alive:
        _discard_if_still(win, "owner_exited")


def yielded(call: CallRecord, reason: str = "first_step") -> None:
    """A sampled generator root yielded (its next step may run on another thread), or a root
    scope was left behind, never to exit (``"scope_abandoned"``, ``owner.left_behind``). Its
    thread-local window stops now (the calls are exported as truncated, ``reason``); a
    window recording all threads goes on (any thread can stop it)."""
    win: Window = call.window
    if not win.config.all_threads and SLOT.held is win and win.owner == threading.get_ident():
        win.keeper.truncate(win, reason)


def checkpoint() -> None:
    """A point profkit controls on this thread: cut a window past ``max_window_s`` short."""
    win = SLOT.held
    if win is not None and win.owner == threading.get_ident() and time.monotonic() > win.deadline:
        win.keeper.truncate(win, win.cut_reason)


def orphaned() -> None:
    """A root call on a thread when no session takes root calls (shut down, disabled):
    a window this thread still holds, idle, closes now (its calls, if any, are counted as
    dropped by the shut pipeline), instead of recording this thread for ever."""
    win = SLOT.held
    if win is not None and win.owner == threading.get_ident() and not win.in_flight:
        with guard(win.keeper.stats, "orphaned"):  # runs on the user's call: never raise
            win.keeper.close_window(win)


def _reclaim_if_owner_exited() -> bool:
    """Free a window whose thread exited with it open; True when the slot is then ours."""
    win = SLOT.held
    if win is None or win.owner_thread.is_alive():
        return False
    return _discard_if_still(win, "owner_exited") and SLOT.acquire()


def _discard_if_still(win: Window, reason: str) -> bool:
    """Discard ``win`` if it still holds the slot (whoever gets the reclaim lock first)."""
    if not SLOT.reclaim_lock.acquire(blocking=False):
        return False
    try:
        if SLOT.held is not win:
            return False
        win.keeper.discard_window(win, reason)
        return True
    finally:
        SLOT.reclaim_lock.release()


class _ThreadEndGuard:
    """Closes (and exports) the window still open on a thread when that thread ends.

    It lives in a ``threading.local`` of each thread that opened a window (made once, so its
    finalizer runs only at the thread's end): CPython clears those on the thread as it ends,
    before torch's C++ thread-locals; a profiler still on there crashes the exit (torch 2.13).
    """

    __slots__ = ()
    _local = threading.local()

    @classmethod
    def ensure(cls) -> None:
        if getattr(cls._local, "guard", None) is None:
            cls._local.guard = cls()

    def __del__(self) -> None:
        win = SLOT.held
        if win is None or win.in_flight or win.owner != threading.get_ident():
            return  # closed already (the usual case), a call still runs, or not this thread's
        win.keeper.close_window(win)  # guarded inside: a finalizer must not raise


def stop_left_at_exit() -> None:
    """At interpreter exit, stop a profiler that profkit left running and would crash it.

    torch tears a still-enabled profiler down after its callbacks are gone: SIGSEGV (torch
    2.13; a thread-local one on this thread, an all-threads one anywhere; others are left).
    """
    win = SLOT.held
    if win is None:  # none open, but one a storm of signals left on would crash it too
        stop_leaked(None)
    elif win.config.all_threads or win.owner_thread is threading.current_thread():
        _discard_if_still(win, "shutdown")


def _after_fork_in_child() -> None:
    """Fresh slot; the parent's window is given up. Another thread's: its thread and profiler
    state are not in the child (the copied flag would block us). The forking thread's own (a
    ``window`` > 1 open between calls): its thread-local profiler *is* in the child, on this
    thread, and would record for ever as somebody else's; it is stopped here."""
    win = SLOT.held
    if win is not None:
        win.discard()
    SLOT.reset()


def install_hooks() -> None:
    """Where a session starts: torch's profiler hooks and the slot's fork reset."""
    _foreign.install_hooks()
    _hooks.at_fork_in_child("slot", _after_fork_in_child)
