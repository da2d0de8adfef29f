"""Whether a root call on a window's thread may join it, and when other calls crowd it out.

The policy only; :mod:`profkit._capture.keeper` acts on it (it alone changes a window's life).
A window takes its thread's calls until it is full (``window`` calls, or a speculative
window's size). A speculative window (``capture_slow``) takes more while one of its calls
still runs, up to :data:`CROWD`: on an event loop most slow calls start while another call
is in flight, and its thread-local profiler records them anyway. Root calls of other
requests on the thread of a window that has no room are counted against it
(``Window.others``); past a limit the window is cut short (``busy_thread``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["CROWD", "MAX_OTHERS", "crowded", "has_room"]

#: other root calls that may run on a window's thread while it records (a thread-local
#: profiler records them too: on a busy event loop they fill a window within milliseconds)
MAX_OTHERS = 200
#: most calls a speculative window takes while one of its calls runs; past it, a quarter
#: as many other calls cut it short (its calls still running are judged on their time so
#: far: a slow one is kept, truncated). 512: with 32 tasks that all await, 128 cut a window
#: about 10 ms in, before its slow calls had run long enough to be judged slow (recall
#: 0.30-0.53 on bench/slow_recall.py's drift workload, 0.91-0.92 at 512); ``max_events``
#: still bounds what a window that keeps a slow call costs to read
CROWD = 512


def has_room(win: Any) -> bool:
    """Whether a root call on ``win``'s thread may join it."""
    return not win.full or bool(win.speculative and len(win.calls) < CROWD and win.in_flight)


def crowded(win: Any) -> bool:
    """Whether ``win`` has been passed by too many other calls on its thread (after one more)."""
    return bool(win.others > (CROWD // 4 if win.speculative else MAX_OTHERS))
