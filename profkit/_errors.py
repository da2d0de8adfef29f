"""The one internal-error guard (the counters it reports to are :mod:`profkit._stats`).

Every internal step (sampling, profiler start/stop, summarising, exporting) runs inside
:func:`guard`. An exception there is counted under a reason, logged once per reason with its
traceback (then only counted), and swallowed: the host sees "no telemetry", never an error.
Under profkit's own test suite ``raise_internal`` is switched on so bugs are not hidden.
"""

from __future__ import annotations

import functools
import logging
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["foreign", "guard", "internal", "log", "retry_once"]

log = logging.getLogger("profkit")

#: re-raise internal errors instead of swallowing them (set by profkit's test suite)
raise_internal = False


def foreign(exc: BaseException, *, below: bool = False) -> bool:
    """True when ``exc`` is not profkit's to handle: raised by a Python signal handler.

    A handler's exception (a SIGALRM request timeout, say) can land on any bytecode, inside
    profkit's own code too; it belongs to the application and must reach it unchanged. Its
    traceback passes through the handler's frame, which is how it is told apart: a function,
    a bound method, a ``functools.partial`` or a callable object (:func:`_handler_code`).
    ``below``: the frame that caught ``exc`` is not looked at (profkit's own handler, which
    catches what it calls). Only the exception path pays for this check.
    """
    handlers = set()
    for signum in signal.valid_signals():
        try:
            code = _handler_code(signal.getsignal(signum))
        except (ValueError, OSError):  # pragma: no cover - a signal Python cannot query
            continue
        if code is not None:
            handlers.add(code)
    if not handlers:
        return False
    tb = exc.__traceback__
    if below and tb is not None:
        tb = tb.tb_next
    while tb is not None:
        if tb.tb_frame.f_code in handlers:
            return True
        tb = tb.tb_next
    return False


def _handler_code(handler: Any) -> Any:
    """The code object whose frame a Python signal handler runs first, or None (SIG_DFL,
    SIG_IGN, a C function)."""
    for _ in range(8):  # a partial of a partial ...: unwrapped, boundedly
        if not isinstance(handler, functools.partial):
            break
        handler = handler.func
    code = getattr(handler, "__code__", None)  # a function, or a bound method's function
    if code is None and not isinstance(handler, int) and callable(handler):
        call = getattr(type(handler), "__call__", None)  # noqa: B004  # (its code, not a test)
        code = getattr(call, "__code__", None)
    return code


def internal(stats: Any, reason: str, exc: Exception) -> None:
    """Count an exception caught in profkit's code, unless it is the application's.

    Re-raises a :func:`foreign` exception (and, under profkit's test suite, every one).
    """
    if foreign(exc):
        raise exc
    stats.error(reason, exc)
    if raise_internal:
        raise exc


@contextmanager
def guard(stats: Any, reason: str) -> Iterator[None]:
    """Run an internal step; count, log once and swallow what it raises (if profkit's)."""
    try:
        yield
    except Exception as exc:
        internal(stats, reason, exc)


def retry_once(fn: Any, *args: Any) -> None:
    """Run ``fn`` (idempotent); once more if a signal's exception cut the first run short."""
    try:
        fn(*args)
    except BaseException:
        fn(*args)
        raise
