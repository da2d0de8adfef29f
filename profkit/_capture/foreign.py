"""The slot seen from outside: someone else's profiler, and waiting for a window to end.

Two torch profilers at once crash the process. :func:`may_open` tells the window owner
whether anyone else's profiler runs or starts; the hook that runs before one starts
(installed where a session starts, :func:`install_hooks`) waits on the slot's claim, so a
window that is starting is as visible to it as one that records.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from .._deadline import Deadline
from . import hooks as _hooks
from . import resident as _resident
from .slot import SLOT
from .window import foreign_profiler_active

__all__ = ["install_hooks", "may_open", "remove_hooks", "wait_for_other_thread", "window_held"]

#: longest a user's profiler start waits for a window on another thread that is starting
_FOREIGN_START_S = 5.0
#: how often a waiter looks whether the slot was freed
_POLL_S = 0.005


def may_open() -> bool:
    """No profiler of anyone else's is running or starting.

    Starting lasts from its preparation until it is on, however long: a scheduled
    ``torch.profiler.profile`` prepares at its warmup step and starts only at the next
    ``step()``, maybe seconds later, and a window opened over the prepared profiler leaves
    torch without a session for that start (SIGSEGV)."""
    if SLOT.foreign_starting:
        return False
    res = SLOT.resident  # (its profiler sets torch's flag: this thread's is ours)
    return not foreign_profiler_active() or (res is not None and res.owner == threading.get_ident())


def wait_for_other_thread(keeper: Any, deadline: Deadline) -> None:
    """Wait while ``keeper`` has calls in flight in a window on another thread, or that
    thread is closing it (a full window whose calls ended is about to close: stopping a
    large one takes seconds), so that it is handed off before the pipeline shuts.

    It polls: the request path that frees the slot takes no Python-level lock or
    condition (a signal's exception landing inside one would leave it taken). A resident
    session steps aside first (closed on this thread; another thread's loop is asked).
    """
    _resident.step_aside()
    while not deadline.passed:
        win = SLOT.held
        if win is None or win.keeper is not keeper or win.owner == threading.get_ident():
            return
        if not (win.in_flight or win.close_running or win.full):
            return
        time.sleep(min(deadline.left(), _POLL_S))


def _before_foreign_start() -> None:
    """Someone else's torch profiler is about to start: make sure it overlaps no window.

    Two profilers at once crash the process. From now on no window opens; a window that is
    starting (claimed, not yet held) or open on another thread is asked to stop at its next
    checkpoint (its deadline is brought forward) and waited for. A window on this very
    thread (the user's profiler inside a sampled call) cannot be waited for: torch empties
    it, so its calls are dropped (``foreign_profiler``).

    Raises:
        RuntimeError: the window did not close within ``max(5, 2 * max_window_s)`` s;
            starting the profiler anyway would crash the process.
    """
    SLOT.foreign_starting = time.monotonic()
    limit: Deadline | None = None
    while SLOT.claimed:
        win = SLOT.held
        if win is None and _resident.step_aside():  # this thread's: closed (else: asked)
            continue
        if win is not None and win.owner == threading.get_ident():
            win.clobbered = True
            return
        if win is not None:
            win.cut_reason = "foreign_profiler"
            win.deadline = 0.0  # stop at the next checkpoint
            if limit is None:
                limit = Deadline(max(_FOREIGN_START_S, 2 * win.config.max_window_s))
        if limit is None:
            limit = Deadline(_FOREIGN_START_S)  # still starting: it takes milliseconds
        if limit.passed:
            SLOT.foreign_starting = 0.0
            raise RuntimeError(
                "profkit: a sampled call on another thread still records a profiler "
                "window; starting a second torch profiler now would crash the process "
                "(see profkit's reliability docs, 'Your own profiler')"
            )
        time.sleep(_POLL_S)


def _after_foreign_start() -> None:
    """The foreign profiler is on (torch's flag now keeps new windows shut), or its
    preparation failed (nothing is prepared)."""
    SLOT.foreign_starting = 0.0


def install_hooks() -> None:
    """Where a session starts: torch's profiler hooks (idempotent), the resident session's."""
    _resident.install()
    _hooks.install_profiler_hooks(_before_foreign_start, _after_foreign_start)


def window_held() -> bool:
    """Whether a window holds (or is claiming) the slot."""
    return SLOT.claimed


def remove_hooks() -> None:
    """Where the last session stops: torch's own functions back, once no window is held and
    no profiler of anyone else's is prepared (its start must still be seen: until then no
    window may open, in this session or a later one)."""
    if not SLOT.claimed and not SLOT.foreign_starting:
        _hooks.remove_profiler_hooks()
