"""Every private access to torch, OpenTelemetry and CPython internals, in one place.

Each function names what it reads or writes and the versions it was checked against. When
one of them changes upstream, this is the one module to mend.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import itertools
import os
import signal
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.autograd.profiler as _autograd_profiler
from opentelemetry import baggage, trace
from opentelemetry import context as otel_context

from ._weak import WeakIds

__all__ = [
    "BAGGAGE_KEY",
    "SPAN_KEY",
    "clear_profiler_flag",
    "finish_interrupted_start",
    "hold_signals",
    "kineto_quiet",
    "otel_current",
    "peek_count",
    "profiler_enabled_here",
    "profiler_flag",
    "provider_shut_down",
    "range_enter",
    "register_before_exit",
    "watch_provider_shutdown",
]


def _find_otel_current() -> Any:
    """OTel's ``context.get_current``, as the C ``ContextVar.get`` behind it where it is one.

    The SDK's default runtime context (``opentelemetry.context._RUNTIME_CONTEXT``, a
    ``ContextVarsRuntimeContext`` with ``_current_context``; checked on opentelemetry-api
    1.25-1.39) keeps the current context in one ContextVar; reading it directly saves two
    Python frames on every root call. Any other runtime context (``OTEL_PYTHON_CONTEXT``)
    goes through the API.
    """
    var = getattr(getattr(otel_context, "_RUNTIME_CONTEXT", None), "_current_context", None)
    return var.get if isinstance(var, contextvars.ContextVar) else otel_context.get_current


#: ``otel_current()``: the current OTel context (a dict-like ``Context``; empty: falsy)
otel_current = _find_otel_current()
#: the key under which OTel's API keeps the current span in a context, found through the API
#: itself: a dict lookup then replaces trace.get_current_span()'s calls and isinstance check
SPAN_KEY = next(iter(trace.set_span_in_context(trace.INVALID_SPAN, otel_context.Context())))
#: the key of OTel's baggage in a context, found the same way
BAGGAGE_KEY = next(iter(baggage.set_baggage("profkit.profile", "1", otel_context.Context())))


#: kineto's log level above its highest (``USDT`` = 5): no ``USDT ... profiler_start`` lines
KINETO_QUIET_LEVEL = "6"


@contextlib.contextmanager
def kineto_quiet() -> Iterator[None]:
    """Around the process's first profiler start: kineto without its per-window stderr lines.

    Kineto logs ``USDT: ... profiler_start`` and ``profiler_stop`` on stderr at every start
    and stop, at its highest level (5: ``KINETO_LOG_LEVEL=3``, errors only, leaves them).
    It reads ``KINETO_LOG_LEVEL`` once, in ``libkineto_init``, at the first profiler start
    of the process, not at ``import torch`` (measured on torch 2.13: set after the import
    and before the first start, the variable hides them for the life of the process, even
    once removed again; set after a first start, it changes nothing; no Python API in
    ``torch._C._profiler`` or ``torch.autograd`` sets kineto's level). So the variable is
    set to 6 for that first start only, unless the user set it, and removed again after it
    so that child processes inherit the user's environment.
    """
    if "KINETO_LOG_LEVEL" in os.environ:
        yield
        return
    os.environ["KINETO_LOG_LEVEL"] = KINETO_QUIET_LEVEL
    try:
        yield
    finally:
        os.environ.pop("KINETO_LOG_LEVEL", None)


def peek_count(count: itertools.count[int]) -> int:
    """The next number ``count`` hands out, without taking it.

    ``repr(count)`` is ``"count(<n>)"`` (CPython 3.10-3.14; ``count.__reduce__`` is gone in
    3.14): read it without consuming a value, lock-free.
    """
    return int(repr(count)[6:-1])


def profiler_flag() -> bool:
    """``torch.autograd.profiler._is_profiler_enabled``: a process global both profiler
    front-ends set while any profiler runs (torch 2.3-2.13)."""
    return bool(getattr(_autograd_profiler, "_is_profiler_enabled", False))


def clear_profiler_flag() -> None:
    """Clear that flag after a stop that failed or a profiler given up on: left set, every
    later window would be refused as "someone else's profiler runs" (torch 2.3-2.13)."""
    _autograd_profiler._is_profiler_enabled = False


#: torch's C profiler entry points (``_prepare_profiler``, ``_enable_profiler``, ...)
_c_autograd: Any = torch._C._autograd


def finish_interrupted_start(inner: Any) -> None:
    """Run kineto's start and stop once for a profile whose ``start()`` an exception (a
    signal's) cut between its preparation and its start, or whose state is unknown.

    ``_prepare_profiler`` leaves kineto a prepared session; one left behind makes the next
    profile's stop find none, and an enable that no preparation preceded crashes the process
    at its disable (segfault; measured on torch 2.13). A prepared session is therefore always
    followed by an enable and a disable: prepared once more first, which is harmless either
    way (a fresh one, or one already prepared: torch logs one warning then). Always: no
    state of the profile tells a prepared session from a spent one (a stop cut between
    ``_disable_profiler`` and keeping its result looks prepared; enabling then crashed
    ``tests/capture/test_interrupted_everywhere.py``). The caller
    checked that no profiler records this thread; ``inner`` is the profile's
    ``torch.autograd.profiler.profile`` (torch 2.3-2.13).
    """
    try:
        prepare_config, start_config = (
            inner.config(create_trace_id=True),
            inner.config(create_trace_id=False),
        )
    except TypeError:  # torch before 2.6: config() takes no argument
        prepare_config = start_config = inner.config()
    activities, c_autograd = inner.kineto_activities, _c_autograd
    c_autograd._prepare_profiler(prepare_config, activities)  # (no hook: torch's C function)
    c_autograd._enable_profiler(start_config, activities)
    c_autograd._disable_profiler()


def _op(packet: Any, overload: str) -> Any:
    """The C function behind one overload of a torch op (``OpOverload._op``, torch 2.3-2.13),
    or the Python overload itself where it has none."""
    op = getattr(packet, overload)
    return getattr(op, "_op", op)


#: torch's ``record_function`` enter op, called without its Python class:
#: ``range_enter(name, None)`` opens a range (``profiler::_record_function_enter_new``, a C
#: function: no signal handler runs inside it) and returns its handle, a ``_RecordFunction``
#: whose destruction ends the range (0.3-0.4 µs; torch's exit op through ``_op`` costs 8.5 µs
#: of torch-function dispatch, its Python class's exit 2.6; torch 2.3-2.13)
range_enter: Any = _op(torch.ops.profiler._record_function_enter_new, "default")


def profiler_enabled_here() -> bool:
    """``torch._C._autograd._profiler_enabled()``: a profiler records this thread (it does
    not see an all-threads profiler; torch 2.13)."""
    return bool(torch._C._autograd._profiler_enabled())


#: providers whose span processors were shut down (seen by :func:`watch_provider_shutdown`)
_shut_down = WeakIds()  # (no WeakSet: its callback may run on a request thread, _weak)
#: the span processors already watched (a provider seen again is not wrapped twice)
_watched = WeakIds()
_watch_lock = threading.Lock()


def watch_provider_shutdown(provider: Any) -> None:
    """Note when an SDK ``TracerProvider`` shuts down, however it is shut down.

    ``TracerProvider.shutdown()`` (called by the provider's own exit hook, which holds the
    bound method, or by the application) calls ``self._active_span_processor.shutdown()``,
    looked up at call time (opentelemetry-sdk 1.25-1.45): that instance attribute is
    wrapped, once, to mark the provider shut down before its processors stop. Any other
    provider (the API's no-op or proxy one, a vendor's) is left alone.
    """
    processor = getattr(provider, "_active_span_processor", None)
    original = getattr(processor, "shutdown", None)
    if processor is None or original is None or not callable(original):
        return
    with _watch_lock:
        try:
            if processor in _watched:
                return
            ref = weakref.ref(provider)
        except TypeError:  # not weakly referenceable: not the SDK's
            return

        def shutdown(*args: Any, **kwargs: Any) -> Any:
            owner = ref()
            if owner is not None:
                _shut_down.add(owner)
            return original(*args, **kwargs)

        try:
            processor.shutdown = shutdown
        except (AttributeError, TypeError):
            return
        _watched.add(processor)


def provider_shut_down(provider: Any) -> bool:
    """Whether ``provider`` was shut down since :func:`watch_provider_shutdown` saw it."""
    try:
        return provider in _shut_down
    except TypeError:
        return False


def register_before_exit(callback: Callable[[], None]) -> bool:
    """Run ``callback`` when the interpreter begins to exit, before every ``atexit`` hook.

    ``threading._register_atexit`` (CPython 3.9-3.14, what ``concurrent.futures`` uses):
    its callbacks run in ``threading._shutdown``, before non-daemon threads are joined and
    before ``atexit``'s hooks, whatever order those were registered in. False when it is
    missing or the interpreter already exits.
    """
    register = getattr(threading, "_register_atexit", None)
    if register is None:
        return False
    try:
        register(callback)
    except RuntimeError:
        return False
    return True


#: CPython's C signal module: ``signal``'s functions without its enum conversions (0.1 µs a
#: call instead of 0.8; CPython 3.9-3.14)
_signal: Any = importlib.import_module("_signal")
#: every signal a Python handler can be installed for (CPython 3.9-3.14)
_SIGNALS = tuple(sorted(int(s) for s in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}))
#: the holds in progress (a forked child gives them up: see _release_in_child)
_holds: list[_Hold] = []
_fork_hook = [False]


class _Hold:
    """The handler a held signal has: it notes the signal for delivery at the hold's end.

    One left installed past its hold (a fresh signal's exception cut the restore short)
    heals itself: it puts the application's handler back and calls it, at once; a later
    hold takes it for the application's handler.
    """

    __slots__ = ("caught", "handlers", "over")

    def __init__(self) -> None:
        self.handlers: dict[int, Any] = {}
        self.caught: list[tuple[int, Any]] = []
        self.over = False

    def __call__(self, signum: int, frame: Any) -> Any:
        if not self.over:
            self.caught.append((signum, frame))
            return None
        handler = self.handlers[signum]
        with contextlib.suppress(Exception):
            _signal.signal(signum, handler)
        return handler(signum, frame)


@contextlib.contextmanager
def hold_signals() -> Iterator[None]:
    """Python signal handlers wait while this block runs on the main thread, then run.

    A signal's handler runs at the interpreter's next check point on the main thread; one
    that raises (a request timeout, ``KeyboardInterrupt``) there cuts the Python code of
    torch's profiler start or stop between two of its C calls, and kineto, left with a
    prepared session or a profiler enabled unprepared, crashes the process at a later
    start or stop (segfault, torch 2.13). While held, each signal with a Python handler has
    a :class:`_Hold` instead, which notes it; as the block ends, each noted signal's handler
    is called, in order of arrival (still held: a signal arriving meanwhile is noted and
    handed over too), then the application's handlers are put back. The first exception a
    handler raised propagates (the others' are added to it as notes). Other threads never
    run signal handlers: there it does nothing. ``signal.signal`` resets ``siginterrupt`` for
    the signals it swaps (``_signal`` is CPython's C module, 3.9-3.14).
    """
    if threading.get_ident() != threading.main_thread().ident:
        yield
        return
    hold = _Hold()
    handlers = hold.handlers
    try:
        _holds.append(hold)
        if not _fork_hook[0]:
            _fork_hook[0] = True
            os.register_at_fork(after_in_child=_release_in_child)
        for signum in _SIGNALS:
            handler = _signal.getsignal(signum)
            if isinstance(handler, _Hold):
                if not handler.over:  # an outer hold's: it delivers
                    continue
                handler = handler.handlers[signum]  # one left behind: the application's
            if callable(handler):
                handlers[signum] = handler  # before the swap: an exception then restores it
                try:
                    _signal.signal(signum, hold)
                except ValueError as exc:
                    if "main interpreter" not in str(exc):  # (a handler's own ValueError)
                        raise
                    del handlers[signum]  # a subinterpreter: no signal can be swapped
                    break
    except BaseException:  # a handler due before its swap ran, and raised: nothing started
        _release(hold)
        raise
    try:
        yield
    finally:
        _release(hold)


def _release(hold: _Hold) -> None:
    """Hand the noted signals to their handlers, then put the application's handlers back."""
    errors: list[BaseException] = []
    _deliver(hold, errors)  # while still held: no fresh exception can land in between
    for _ in range(8):  # ``signal()`` first runs a handler that is due, which may raise
        try:
            for signum, handler in hold.handlers.items():
                if _signal.getsignal(signum) is hold:
                    _signal.signal(signum, handler)
            break
        except BaseException as exc:  # a signal's, put back already, or a noted one's
            errors.append(exc)
            _deliver(hold, errors)
    hold.over = True  # from here on a hold still installed delivers at once
    _deliver(hold, errors)  # noted while the handlers were put back
    with contextlib.suppress(ValueError):
        _holds.remove(hold)
    if errors:
        first = errors[0]
        note = getattr(first, "add_note", None)  # (Python 3.11+)
        for later in errors[1:]:
            if note is not None:
                note(f"profkit held signals; another handler raised too: {later!r}")
        raise first


def _deliver(hold: _Hold, errors: list[BaseException]) -> None:
    """Call the handler of each noted signal, oldest first; keep what they raise."""
    caught, handlers = hold.caught, hold.handlers
    while caught:
        signum, frame = caught.pop(0)
        try:
            handlers[signum](signum, frame)
        except BaseException as exc:
            errors.append(exc)


def _release_in_child() -> None:
    """A fork while the main thread held signals: the child's handlers are the application's
    again (its noted signals were the parent's)."""
    for hold in _holds:
        hold.over = True
        hold.caught.clear()
        for signum, handler in hold.handlers.items():
            with contextlib.suppress(Exception):
                if _signal.getsignal(signum) is hold:
                    _signal.signal(signum, handler)
    _holds.clear()
