"""Which frame holds a root scope open, and whether it still runs (issue 38: scopes held open).

A plain generator holding a root ``region()`` across ``yield`` and kept alive, or a ``batch``
entered and never exited, leaves the context saying "inside a sampled call" after the frame
that entered the scope has stopped running: no later call would be a root call, and the
thread's profiler would record everything. A sampled ``region``/``batch`` root therefore
notes the sync frame that entered it (:func:`own`; a coroutine's or an async generator's
scope is its task's, whose callbacks run off its frame: not noted); the thread's next profkit
scope in that context looks for that frame on its own stack (:func:`gone`), and when it is
not there the call is given up (:func:`left_behind`).
"""

from __future__ import annotations

import inspect
import sys
import threading
from typing import Any

from .._capture.keeper import yielded
from .frames import FRAME, Active

__all__ = ["left_behind", "own", "release_here"]

_ASYNC_FLAGS = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE


def own(active: Any, depth: int) -> None:
    """Note on the sampled root ``active`` (an ``Active`` whose ``session`` is set) the frame
    that entered it, ``depth`` frames above the caller, unless it is a coroutine's."""
    if getattr(active, "session", None) is not None:
        caller = sys._getframe(depth + 1)
        if not caller.f_code.co_flags & _ASYNC_FLAGS:
            active.owner = (caller, threading.get_ident())


def left_behind(active: Active) -> bool:
    """Whether the sampled call of the owned frame ``active`` was left behind: its owner
    frame no longer runs on its thread, which is this one (a context copied to another
    thread is never judged). Then its window is cut (the call exported, ``truncated=
    "scope_abandoned"``) and the frame reset: the caller is a root call."""
    frame, tid = active.owner  # type: ignore[misc]
    if tid != threading.get_ident():
        return False
    f: Any = sys._getframe(1)
    while f is not None:
        if f is frame:
            return False
        f = f.f_back
    FRAME.set(None)
    call = active.call
    if not call.stopped:
        yielded(call, "scope_abandoned")
        call.stopped = True  # (a window recording all threads goes on: not with this call)
        call.truncated = call.truncated or "scope_abandoned"
    return True


def release_here() -> None:
    """``force_flush()`` / ``shutdown()``: a sampled call left behind in this context is
    given up first, so that it is exported with the flush instead of pending for ever."""
    frame = FRAME.get()
    if frame.__class__ is Active and frame.owner is not None and not frame.call.done:
        left_behind(frame)
