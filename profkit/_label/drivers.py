"""Drivers for decorated coroutines, generators and async generators (used by ``_api``).

A coroutine's steps are timed (:class:`Intervals`) so that a sampled task keeps only its own
ops; a generator, and each step of an async generator, is run by one driver (:func:`drive`)
that sets the scope's frame only while the generator runs.
"""

from __future__ import annotations

import contextlib
import time
from asyncio import _get_running_loop, current_task
from collections.abc import Callable, Generator
from contextvars import Token
from typing import Any

from .._capture.keeper import checkpoint, yielded
from .._model import CodeInfo
from .._overhead import Control
from .._targeting.slow import Timed
from .._targeting.stages import Stages
from .scope import FRAME, Active, OffCall, enter, exit_, undo_enter

__all__ = [
    "Intervals", "Stepped", "SteppedAsyncGen", "async_call", "drive", "exit_twice", "watch_loop",
]  # fmt: skip

_set_frame = FRAME.set
_get_frame = FRAME.get


def async_call(
    fn: Callable[..., Any], label: str, attrs: dict[str, Any], code: CodeInfo | None
) -> Callable[..., Any]:
    """``fn`` (a coroutine function) in a scope: a coroutine function itself, one frame.

    A sampled root's task keeps only its own ops (:class:`Intervals`); an unsampled root
    restores the frame inline (``exit_``'s first case: no call).
    """

    async def profiled_coroutine(*args: Any, **kwargs: Any) -> Any:
        entered = error = None
        outer = _get_frame()
        # an unprofiled root's frame, ended with it: the tasks it creates copy it, and make
        # root calls once it is done (with ``OFF`` they would be nested in it for ever)
        off = OffCall()
        try:
            entered = enter(label, attrs, code, True, False, off)  # (its CPU is not its own)
            coro = fn(*args, **kwargs)
            if entered.__class__ is Active:
                call = entered.call
                if entered.session is not None:  # a sampled root: record when its task runs
                    call.intervals, call.tasks = [], {_task()}  # (its child tasks' steps too)
                    own = call.scopes[entered.scope].intervals = []  # its own task's alone
                    return await Intervals(coro, call.intervals, own)
                task = _task()
                if call.intervals is not None and task not in call.tasks:  # in a child task
                    call.tasks.add(task)  # (asyncio.gather): its steps are the call's too
                    own = call.scopes[entered.scope].intervals = []
                    try:
                        return await Intervals(coro, call.intervals, own)
                    finally:
                        call.tasks.discard(task)
            return await coro
        except BaseException as exc:
            error = exc
            raise
        finally:
            try:
                if entered is off:
                    try:
                        _set_frame(None)
                    except BaseException:  # a signal's exception landed before the set
                        _set_frame(None)
                        raise
                elif entered is not None:
                    exit_twice(entered, error)
                elif error is not None:  # enter() returned, its result was never kept: undo
                    undo_enter(outer, error)
            finally:  # (a signal's exception above too: its tasks would be nested for ever)
                off.append(None)  # done (a C call, after the frame is back)

    return profiled_coroutine


def _task() -> Any:
    """The running asyncio task; None outside a loop (a coroutine driven by hand: ``send``)."""
    return current_task() if _get_running_loop() is not None else None


def watch_loop(call: Any) -> None:
    """A sampled root ``region()`` in an event loop: if the loop runs anything else before it
    ends (the region spans an ``await``), its steps are unknown, so another task's ops may be
    in its range: the call then says ``attribution="window"`` (a decorated coroutine is
    exact, :class:`Intervals`). A callback runs only once the task yields to the loop."""
    loop = _get_running_loop()
    if loop is not None:
        with contextlib.suppress(RuntimeError):  # a closing loop: nothing else will run
            loop.call_soon(_interleaved, call)


def _interleaved(call: Any) -> None:
    if not call.done:
        call.interleaved = True


def exit_twice(entered: Any, error: BaseException | None) -> None:
    """:func:`exit_`, run again when a signal's exception cut it short (it is idempotent)."""
    try:
        exit_(entered, error)
    except BaseException:
        exit_(entered, error)
        raise


class Intervals:
    """Awaits a coroutine step by step, recording when its task actually ran (epoch ns).

    Other tasks' ops on the same thread fall between these intervals, which is how a sampled
    coroutine's summary keeps only its own ops. Each step is a checkpoint for
    ``max_window_s``.
    """

    __slots__ = ("_coro", "_intervals")

    def __init__(
        self, coro: Any, intervals: list[tuple[int, int]], also: list[tuple[int, int]] | None = None
    ) -> None:
        self._coro = coro
        self._intervals = intervals if also is None else _Both(intervals, also)

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, intervals = self._coro, self._intervals
        send: Any = None
        throw: BaseException | None = None
        while True:
            checkpoint()
            t0 = time.time_ns()
            try:
                yielded = coro.throw(throw) if throw is not None else coro.send(send)
            except StopIteration as stop:
                intervals.append((t0, time.time_ns()))
                return stop.value
            except BaseException:
                intervals.append((t0, time.time_ns()))
                raise
            intervals.append((t0, time.time_ns()))
            send, throw = None, None
            try:
                send = yield yielded
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:
                throw = exc


class _Both:
    """Two interval lists appended to together: the call's and a child task's scope's."""

    __slots__ = ("_a", "_b")

    def __init__(self, a: list[tuple[int, int]], b: list[tuple[int, int]]) -> None:
        self._a, self._b = a, b

    def append(self, interval: tuple[int, int]) -> None:
        self._a.append(interval)
        self._b.append(interval)


def drive(it: Any, scope: Stepped, final: bool) -> Generator[Any, Any, Any]:
    """Run a generator-protocol iterator to its end, its scope's frame set only while it runs.

    Yields what ``it`` yields, passes on what is sent or thrown in, returns what it returns.
    It drives a decorated generator itself (``final``: the scope ends with it) and each step
    of a decorated async generator (the ``__await__`` of its ``asend``/``athrow``/``aclose``).
    """
    error: BaseException | None = None
    send: Any = None
    throw: BaseException | None = None
    try:
        while True:
            token = scope.step_in()
            try:
                value = it.throw(throw) if throw is not None else it.send(send)
            except StopIteration as stop:
                return stop.value
            finally:
                scope.step_out(token)
            send, throw = None, None
            if final:
                scope.suspended()
            try:
                send = yield value
            except GeneratorExit as exc:
                if final:  # the decorated generator itself: thrown in as it came (close()
                    throw = exc  # throws one too), so it answers as it would undecorated
                    continue
                token = scope.step_in()  # an awaitable's step: closed, as ``await`` does
                try:
                    it.close()
                finally:
                    scope.step_out(token)
                raise
            except BaseException as exc:
                throw = exc
    except BaseException as exc:
        error = exc
        raise
    finally:
        if final:
            try:
                scope.finish(error)
            except BaseException:  # a signal's exception cut the first attempt short
                scope.finish(error)
                raise


class SteppedAsyncGen:
    """A decorated async generator: each ``asend``/``athrow``/``aclose`` runs in its scope.

    The steps are driven by :func:`drive`, the same driver as a decorated generator's; the
    scope ends when the async generator does (exhausted, raised or closed).
    """

    __slots__ = ("_agen", "_scope")

    def __init__(self, agen: Any, scope: Stepped) -> None:
        self._agen = agen
        self._scope = scope

    def __aiter__(self) -> SteppedAsyncGen:
        return self

    def __anext__(self) -> Any:
        return self._step(self._agen.asend(None), closing=False)

    def asend(self, value: Any) -> Any:
        return self._step(self._agen.asend(value), closing=False)

    def athrow(self, *exc: Any) -> Any:
        return self._step(self._agen.athrow(*exc), closing=False)

    def aclose(self) -> Any:
        return self._step(self._agen.aclose(), closing=True)

    async def _step(self, awaitable: Any, closing: bool) -> Any:
        try:
            result = await _InScope(awaitable, self._scope)
        except StopAsyncIteration:
            self._scope.finish(None)
            raise
        except BaseException as exc:
            self._scope.finish(exc)
            raise
        if closing:
            self._scope.finish(None)
        return result

    def __del__(self) -> None:
        """Dropped before its end (``break`` out of ``async for``, a client that went away
        from a streaming response): the scope ends as if closed, so the sampled call is
        exported and its window closes. (A real async generator is closed by the event
        loop's finalizer hook; this object is not one. The generator it wraps still is.)"""
        try:
            scope = self._scope
            if scope.open:
                scope.finish(None)
        except Exception:  # never raise from a finalizer: at worst the window
            pass  # is cut short at its max_window_s


class _InScope:
    """An awaitable run by :func:`drive` (its frame set per step, the scope left open)."""

    __slots__ = ("_awaitable", "_scope")

    def __init__(self, awaitable: Any, scope: Stepped) -> None:
        self._awaitable = awaitable
        self._scope = scope

    def __await__(self) -> Generator[Any, Any, Any]:
        return drive(self._awaitable.__await__(), self._scope, final=False)


class Stepped:
    """A scope held open across the steps of a generator: its frame is set only per step.

    The scope is entered at the first step (``spec=False``: never speculatively); each step
    runs with the scope's frame set (so scopes inside the generator nest under it) and
    restores the caller's afterwards. Each step is a checkpoint for ``max_window_s``.
    """

    __slots__ = (
        "_entered", "_frame", "_intervals", "_started", "_t0", "_timed",
        "attributes", "code", "label", "spec",
    )  # fmt: skip

    def __init__(
        self, label: str, attributes: dict[str, Any], code: CodeInfo | None, spec: bool = True
    ) -> None:
        self.label, self.attributes, self.code, self.spec = label, attributes, code, spec
        self._started = False
        self._entered: Active | None = None
        self._frame: Any = None
        #: an unprofiled root, timed (with its regions: ``Stages``): ended with it
        self._timed: Timed | Control | Stages | None = None
        #: a sampled root's running intervals: other tasks' (or the consumer's) ops fall between
        self._intervals: _Both | None = None
        self._t0 = 0

    def step_in(self) -> Token[Any] | None:
        """Before a step: enter the scope on the first one, then set its frame."""
        if not self._started:
            self._started = True
            outer = FRAME.get()
            try:
                entered = enter(self.label, self.attributes, self.code, self.spec, False)
                if entered is not None:
                    self._frame = FRAME.get()  # OFF (an unsampled root) or the scope's Active
                    timed = entered.__class__ in (Timed, Control, Stages)
                    self._timed = entered if timed else None
                    if isinstance(entered, Active):
                        self._entered = entered
                        if entered.session is not None:  # a root: its steps are timed
                            call = entered.call
                            own: list[tuple[int, int]] = []  # its steps alone, no child's
                            call.intervals = []
                            call.scopes[entered.scope].intervals = own
                            self._intervals = _Both(call.intervals, own)
                            call.tasks = {_task()}
            finally:
                FRAME.set(outer)  # the caller's frame; ours is set per step below
        if self._frame is None:
            return None
        if self._entered is not None:
            checkpoint()
            self._t0 = time.time_ns()
        return FRAME.set(self._frame)

    def step_out(self, token: Token[Any] | None) -> None:
        """After a step: the caller's frame again (and a sampled root's step timed)."""
        if self._intervals is not None:
            self._intervals.append((self._t0, time.time_ns()))
        if token is not None:
            try:  # noqa: SIM105  # contextlib.suppress builds an object per step
                FRAME.reset(token)
            except ValueError:  # the step ended in another context: nothing to restore
                pass

    def suspended(self) -> None:
        """A generator yielded: its thread may change before the next step.

        A thread-local profiler can only be stopped on the thread that started it, so a
        sampled generator root stops its window here (``truncated = "first_step"``) unless
        the window records all threads (then any thread can stop it).
        """
        entered = self._entered
        if entered is not None and entered.session is not None and not entered.call.stopped:
            yielded(entered.call)

    @property
    def open(self) -> bool:
        """Entered and not finished: there is a scope (or an unprofiled root) to end."""
        return self._frame is not None

    def finish(self, error: BaseException | None) -> None:
        """The generator is done (returned, raised or closed): end the scope (idempotent)."""
        entered = self._entered
        self._frame = None
        if self._timed is not None:
            self._timed.end()
        if entered is not None:
            exit_(
                entered,
                error if not isinstance(error, GeneratorExit) else None,
                restore=False,
            )
