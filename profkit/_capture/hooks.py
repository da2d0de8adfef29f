"""Every hook profkit installs in the process, in one place, and only when a session starts.

``import profkit`` changes nothing in torch, in signal handlers, in fork or exit hooks. A
session's start (``configure()``, ``testing.capture()``) installs them; the last session's
shutdown takes torch's functions and the exit hook back. ``os.register_at_fork`` cannot be
undone, so one dispatcher is registered with the first session and runs what is registered
here at that moment (nothing once every session is gone).

The torch hook: ``torch.profiler.profile`` (and ``torch.autograd.profiler.profile``) first
prepare the profiler (``torch.autograd.profiler._prepare_profiler``, which already disturbs
one that runs on another thread) and then start it (``_run_on_profiler_start``). profkit
wraps both module functions: ``before`` runs ahead of the preparation of any profiler that
is not profkit's own and may block (to let a window stop) or raise (rather than let two
profilers overlap); ``after`` runs once it is on (or once its preparation raised): between
the two, which may be seconds apart (a scheduled profile's warmup step), no window opens.
Checked against torch 2.3-2.13.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import threading
from collections.abc import Callable
from typing import Any

import torch.autograd.profiler as _autograd_profiler

from .._compat import register_before_exit
from .profiler import ours_starting

__all__ = [
    "at_exit",
    "at_fork_in_child",
    "before_exit",
    "cancel_at_exit",
    "exit_past_native_teardown",
    "install_profiler_hooks",
    "native_exit_armed",
    "profiler_hooked",
    "remove_profiler_hooks",
]

#: re-entrant: a signal handler's configure() or shutdown() may land while its thread is in
#: here (each section is short and idempotent)
_lock = threading.RLock()


class _State:
    #: torch's own functions while profkit's wrappers are installed
    originals: tuple[Any, Any] | None = None
    fork_callbacks: dict[str, Callable[[], None]] = {}  # noqa: RUF012  (module state)
    fork_registered = False
    exit_callbacks: list[Callable[[], None]] = []  # noqa: RUF012
    before_exit_callbacks: list[Callable[[], None]] = []  # noqa: RUF012
    before_exit_registered = False
    native_exit = False


_state = _State()


def install_profiler_hooks(before: Callable[[], None], after: Callable[[], None]) -> None:
    """Wrap torch's profiler preparation and start (idempotent)."""
    with _lock:
        prepare = getattr(_autograd_profiler, "_prepare_profiler", None)
        start = getattr(_autograd_profiler, "_run_on_profiler_start", None)
        if _state.originals is not None or prepare is None or start is None:
            return

        def prepare_profiler(*args: Any, **kwargs: Any) -> Any:
            if ours_starting():
                return prepare(*args, **kwargs)
            try:
                before()
                return prepare(*args, **kwargs)
            except BaseException:
                after()  # nothing was prepared: windows may open again
                raise

        def run_on_profiler_start() -> None:
            try:
                start()
            finally:
                if not ours_starting():
                    after()

        _state.originals = (prepare, start)
        _autograd_profiler._prepare_profiler = prepare_profiler  # type: ignore[attr-defined]
        _autograd_profiler._run_on_profiler_start = run_on_profiler_start


def remove_profiler_hooks() -> None:
    """Put torch's own functions back (only while ours are still the installed ones)."""
    with _lock:
        originals, _state.originals = _state.originals, None
        if originals is not None:
            _autograd_profiler._prepare_profiler = originals[0]  # type: ignore[attr-defined]
            _autograd_profiler._run_on_profiler_start = originals[1]


def profiler_hooked() -> bool:
    """Whether profkit's profiler hooks are installed."""
    return _state.originals is not None


def at_fork_in_child(key: str, callback: Callable[[], None]) -> None:
    """Run ``callback`` in a forked child (the latest one given for ``key``)."""
    with _lock:
        _state.fork_callbacks[key] = callback
        if not _state.fork_registered:
            _state.fork_registered = True
            os.register_at_fork(after_in_child=_run_fork_callbacks)


def cancel_at_fork(key: str) -> None:
    """Forget the fork callback of ``key``."""
    with _lock:
        _state.fork_callbacks.pop(key, None)


def _run_fork_callbacks() -> None:
    for callback in list(_state.fork_callbacks.values()):
        callback()


def exit_past_native_teardown() -> None:
    """In a forked child of a process where torch's profiler ran: end the process with its
    exit status once the interpreter has finalised, ahead of the C-level exit handlers
    registered before the fork (glibc ``on_exit``; elsewhere nothing is done).

    The first profiler start creates kineto's config-polling thread; a forked child has its
    ``std::thread`` without the thread, and the static ``ConfigLoader``'s destructor joins it
    at ``exit()``: the child hangs for ever, or aborts (``std::system_error``), however it
    ends its Python (torch 2.13, with or without profkit; issue 38). Everything Python runs
    at exit still runs (``atexit`` hooks, flushes, finalisers); what is skipped is the C and
    C++ teardown inherited from the parent (static destructors, C ``atexit`` handlers), as
    with ``os._exit``. Handlers the child registers itself run first (last in, first out).
    """
    if _state.native_exit:
        return
    try:
        libc = ctypes.CDLL(None)
        on_exit = libc.on_exit
        end = ctypes.cast(libc._exit, ctypes.c_void_p)
    except (OSError, AttributeError):  # not glibc: the documented hang stays torch's
        return
    on_exit.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    # on_exit calls end(status, NULL): _exit(status), its second argument unread
    _state.native_exit = on_exit(end, None) == 0


def native_exit_armed() -> bool:
    """Whether :func:`exit_past_native_teardown` took effect in this process."""
    return _state.native_exit


def at_exit(callback: Callable[[], None]) -> None:
    """Run ``callback`` at interpreter exit (once, however often it is given)."""
    with _lock:
        if callback not in _state.exit_callbacks:
            _state.exit_callbacks.append(callback)
            atexit.register(callback)


def cancel_at_exit(callback: Callable[[], None]) -> None:
    """Take ``callback`` off the interpreter's exit hooks (and off those before them)."""
    with _lock:
        if callback in _state.exit_callbacks:
            _state.exit_callbacks.remove(callback)
            atexit.unregister(callback)
        if callback in _state.before_exit_callbacks:
            _state.before_exit_callbacks.remove(callback)


def before_exit(callback: Callable[[], None]) -> None:
    """Run ``callback`` as the interpreter begins to exit, ahead of every ``atexit`` hook
    (an OpenTelemetry ``TracerProvider``'s own shutdown among them, whenever it was made),
    and again once the non-daemon threads have ended, still ahead of every ``atexit`` hook.

    One dispatcher is registered with the first callback (it cannot be taken back) and runs
    what is registered here then; :func:`cancel_at_exit` takes a callback off.
    """
    with _lock:
        if callback not in _state.before_exit_callbacks:
            _state.before_exit_callbacks.append(callback)
        if not _state.before_exit_registered:
            _state.before_exit_registered = register_before_exit(_run_before_exit)


def _run_before_exit() -> None:
    _run_before_exit_callbacks()
    # non-daemon threads are joined after this, and may go on sampling meanwhile: once they
    # are, the callbacks run again, ahead of every atexit hook (one registered now runs first)
    atexit.register(_run_before_exit_callbacks)


def _run_before_exit_callbacks() -> None:
    for callback in list(_state.before_exit_callbacks):
        callback()
