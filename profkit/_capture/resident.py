"""A resident profiler session on an event loop's thread (``resident=True``): between
speculative windows the profiler stays on with its collection off, so the next window on
that thread costs a toggle (µs), not a start and a stop (~0.5 ms; bench/resident_cost.py).

Where it is kept: only on the thread of a running asyncio loop, only after a speculative
window none of whose calls is read (a window that must be read is stopped as before), only
for CPU-only, thread-local profiles that profkit reads itself (no ``all_threads``,
``profile_memory``, ``with_stack``, trace files). A pool thread never keeps one: profkit
cannot make an idle pool thread run anything, and only the owning thread can stop it.

It never outlives what profkit can close. It keeps the slot's claim (no other profiler
starts: two at once crash torch), and it is closed on its own thread:

* by its loop's timer once it has been idle ``IDLE_S``, and after ``MAX_WINDOWS`` windows
  (what it recorded is kept until it stops: the stop frees it);
* when its loop is freed (``asyncio.run`` returned), when its thread ends, at exit;
* when a profiler of anyone else's is about to start (on its thread: at once; from another
  thread its loop is asked to, and that start waits for it, as for a window), when another
  thread's call would open a window (its loop is asked: that call is skipped, the next
  ones open), at ``shutdown()``;
* in a forked child it is stopped if it was the forking thread's, else forgotten.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from asyncio import AbstractEventLoop, _get_running_loop
from typing import Any

from .._compat import hold_signals, profiler_enabled_here
from .._config import Config
from .._records import Policy
from . import hooks as _hooks
from .profiler import cpu_only
from .slot import SLOT
from .window import Window, stop_resident

__all__ = ["IDLE_S", "MAX_WINDOWS", "Resident", "applies", "install", "keep", "step_aside", "take"]

#: seconds without a window after which its loop's timer closes a resident session
IDLE_S = 1.0
#: windows one resident session serves before it is stopped (a stop frees what it recorded)
MAX_WINDOWS = 50

#: the loops whose end is watched (once each)
_watched: weakref.WeakSet[AbstractEventLoop] = weakref.WeakSet()


class Resident:
    """One resident session: its profiler (on, collection off), its thread and loop."""

    __slots__ = (
        "armed",
        "asked",
        "config",
        "last",
        "loop",
        "owner",
        "prof",
        "stats",
        "thread",
        "windows",
    )

    def __init__(self, win: Window, loop: AbstractEventLoop) -> None:
        self.prof: Any = None
        self.config: Config = win.config
        self.owner = threading.get_ident()
        self.thread = threading.current_thread()
        self.loop = weakref.ref(loop)  # (its finalizer closes this: no strong reference)
        self.stats: Any = win.keeper.stats if win.keeper is not None else None
        self.windows = 0
        self.last = time.monotonic()
        #: its loop was asked to close it (from another thread); its idle timer is pending
        self.asked = self.armed = False

    def ask(self) -> bool:
        """From another thread: ask its loop to close it, once (False: wait for it); True
        when its thread is gone (its thread-local state went with it: nothing to stop)."""
        if not self.thread.is_alive():
            _forget(self)
            return True
        loop = self.loop()
        if not self.asked and loop is not None:
            self.asked = True
            with contextlib.suppress(RuntimeError):  # (a closed loop: its finalizer closes it)
                loop.call_soon_threadsafe(_close_if_current, self)
        return False


def applies(config: Config) -> bool:
    """Whether windows of ``config`` may keep a resident session."""
    return bool(
        config.resident
        and cpu_only(config.activities)
        and not (config.all_threads or config.profile_memory or config.with_stack)
        and config.trace_dir is None
    )


def take(win: Window) -> Resident | None:
    """This thread's resident session, for ``win`` to record on (its slot claimed by the
    caller); None when there is none. One that cannot serve ``win`` (other settings, its
    loop no longer running, its profiler gone) is stopped here; the claim stays the caller's."""
    if applies(win.config):
        win.keep = keep  # (its stop asks keep() first)
    res: Resident | None = SLOT.resident
    if res is None or res.owner != threading.get_ident():
        return None
    if res.config is win.config and profiler_enabled_here() and _get_running_loop() is res.loop():
        return res
    _stop(res)
    return None


def keep(win: Window) -> bool:
    """At the close of ``win`` on its thread: keep its profiler on, collection off, as this
    thread's resident session (True), or let the caller stop it (False)."""
    if not (win.speculative and applies(win.config)) or win.clobbered or win.stopped_refs:
        return False
    if win.prof is None or SLOT.foreign_starting or SLOT.held is not win:
        return False
    if any(not c.done or c.policy is not Policy.RELEASED for c in win.calls):
        return False  # a call to read: the profile must stop
    loop, res = _get_running_loop(), win.resident
    if loop is None or (res is not None and (res.windows >= MAX_WINDOWS or res.loop() is not loop)):
        return False
    _ThreadEnd.ensure()
    res = res or Resident(win, loop)
    res.prof, res.windows, res.last, res.asked = win.prof, res.windows + 1, time.monotonic(), False
    SLOT.resident = res  # from here the slot's claim stays this thread's (its vacate keeps it)
    try:  # (an exception from here on: the window's stop on the way out stops it too, and
        win.pause()  # the next take() finds it stopped and lets it go)
    except Exception:
        SLOT.resident = None
        return False  # the caller stops it
    if not res.armed:
        with contextlib.suppress(RuntimeError):  # (a closing loop: it closes at its end)
            _arm(res, loop)
    return True


def step_aside() -> bool:
    """Make the resident session (if any) give the slot up: on its thread it is closed now;
    another thread's loop is asked to close it, once. True when it is gone."""
    res: Resident | None = SLOT.resident
    if res is None:
        return False
    if res.owner == threading.get_ident():
        close(res)
        return True
    return res.ask()


def close(res: Resident) -> None:
    """Stop ``res`` on its own thread and free the slot's claim (no window holds it)."""
    _stop(res)
    if SLOT.held is None:
        SLOT.vacate(None)


def close_here() -> None:
    """This thread's resident session, if any, is closed (its thread ends, exit, shutdown)."""
    res = SLOT.resident
    if res is not None and res.owner == threading.get_ident():
        close(res)


def _stop(res: Resident) -> None:
    """Stop ``res``'s profiler (its events unread and freed); it no longer holds the slot."""
    cpu0 = time.thread_time()
    with hold_signals():  # no signal's exception inside torch's stop
        prof, res.prof = res.prof, None
        if prof is not None:
            stop_resident(prof)
        if SLOT.resident is res:
            SLOT.resident = None
    if res.stats is not None:  # the stop frees what its windows recorded: the budget's
        res.stats.cpu.charge(time.thread_time() - cpu0)


def _forget(res: Resident) -> None:
    """``res``'s thread is gone (or this is a forked child): nothing of it to stop here."""
    if SLOT.resident is res:
        SLOT.resident = None
        if SLOT.held is None:
            SLOT.drop_claim()


def _close_if_current(res: Resident) -> None:
    """On its loop (asked from another thread, or its idle timer): close it if still idle."""
    if SLOT.resident is res and res.owner == threading.get_ident():
        with contextlib.suppress(Exception):  # (a loop callback must not raise)
            close(res)


def _tick(res: Resident) -> None:
    """Its loop's timer: closed once idle ``IDLE_S``, else looked at again then (in a window
    or closed: the timer ends; :func:`keep` arms it again)."""
    if SLOT.resident is not res:
        res.armed = False
        return
    idle = time.monotonic() - res.last
    if idle >= IDLE_S:
        res.armed = False
        _close_if_current(res)
        return
    loop = res.loop()
    if loop is not None:
        with contextlib.suppress(RuntimeError):  # (a closed loop: its finalizer closes it)
            loop.call_later(IDLE_S - idle + 0.001, _tick, res)


def _arm(res: Resident, loop: AbstractEventLoop) -> None:
    """Its loop's idle timer, and its close when that loop is freed on this thread."""
    loop.call_later(IDLE_S + 0.001, _tick, res)
    res.armed = True
    if loop not in _watched:
        _watched.add(loop)
        weakref.finalize(loop, _loop_gone, res.owner).atexit = False


def _loop_gone(ident: int) -> None:
    """A loop of thread ``ident`` was freed (on that thread): its resident session closes."""
    res = SLOT.resident
    if res is not None and res.owner == ident == threading.get_ident():
        with contextlib.suppress(Exception):  # (a finalizer must not raise)
            close(res)


def _after_fork_in_child() -> None:
    """The forking thread's own resident session is on in the child, on this thread: it is
    stopped (as a window of that thread is). Another thread's is not in the child."""
    res = SLOT.resident
    if res is not None:
        if res.owner == threading.get_ident():
            with contextlib.suppress(Exception):
                _stop(res)
        else:
            prof, res.prof = res.prof, None
            if prof is not None:
                stop_resident(prof)  # (enabled elsewhere: it only clears torch's copied flag)
        SLOT.resident = None


def _at_exit() -> None:
    """The interpreter exits: this thread's is stopped (torch's teardown of a profiler still
    on crashes the exit); another thread's loop is asked to."""
    with contextlib.suppress(Exception):
        step_aside()


class _ThreadEnd:
    """Closes its thread's resident session as the thread ends (CPython clears a thread's
    locals on that thread, before torch's C++ thread-locals: see keeper's guard)."""

    __slots__ = ()
    _local = threading.local()

    @classmethod
    def ensure(cls) -> None:
        if getattr(cls._local, "guard", None) is None:
            cls._local.guard = cls()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # (a finalizer must not raise)
            close_here()


def install() -> None:
    """Where a session starts: the fork reset (registered ahead of the slot's) and the exit."""
    _hooks.at_fork_in_child("resident", _after_fork_in_child)
    _hooks.before_exit(_at_exit)
