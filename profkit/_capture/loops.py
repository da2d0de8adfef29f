"""A window opened on an event loop's thread: the loop is asked to cut it and to close it.

A thread-local profiler records every op of its thread. On an event loop's thread, after a
sampled root opens a window the loop may run only other work (other requests' tasks,
unlabelled code, a long ``await``), so no profkit call may come there to run the
``max_window_s`` checkpoint. The loop is asked to: a timer at the window's deadline; and
when the loop itself goes (``asyncio.run`` returned: the loop is closed and freed), a window
its thread still holds idle is closed on that thread. Stopping a thread-local profiler from
another thread stops nothing, so both run on the loop's own thread.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from asyncio import AbstractEventLoop, _get_running_loop
from typing import Any

from .._errors import guard
from .keeper import checkpoint, close_idle
from .slot import SLOT

__all__ = ["arm"]

#: the loops whose end is watched (once each)
_watched: weakref.WeakSet[AbstractEventLoop] = weakref.WeakSet()


def arm(call: Any) -> None:
    """A sampled root opened ``call``'s window: on an event loop's thread, ask the loop to run
    the checkpoint at the window's deadline, and to close the window if the loop goes first."""
    loop = _get_running_loop()
    win = call.window
    if loop is None or win.calls[0] is not call:  # (a call that joined: its opener armed it)
        return
    loop.call_later(max(0.0, win.deadline - time.monotonic()) + 0.001, checkpoint)
    with contextlib.suppress(TypeError):  # (a loop type without weak references: its timer)
        if loop not in _watched:
            _watched.add(loop)
            weakref.finalize(loop, _loop_gone, threading.get_ident()).atexit = False


def _loop_gone(ident: int) -> None:
    """A loop of thread ``ident`` was freed: an idle window that thread holds closes (when the
    loop is freed on that thread, as ``asyncio.run`` does; elsewhere it stops nothing)."""
    win = SLOT.held
    if win is not None and win.owner == ident == threading.get_ident():
        with guard(win.keeper.stats, "loop_closed"):  # (a finalizer must not raise)
            close_idle(win.keeper)
