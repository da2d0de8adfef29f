"""``@profiled`` and ``region()``: thin front-ends over :mod:`profkit._scope`.

The decorator branches once, at decoration time, on the kind of callable (function,
coroutine function, generator, async generator) and precomputes the label and code
attributes. Off-sample, a decorated call costs one ContextVar read, one session check, one
counter step and a ContextVar set/reset.
"""

from __future__ import annotations

import functools
import inspect
import time
import types
from collections.abc import Callable, Generator
from typing import Any, ParamSpec, TypeVar, overload

import wrapt

from ._model import CodeInfo
from ._scope import FRAME, OFF, Active, Stepped, enter, exit_, sync_runner
from ._slot import SLOT

_get_frame = FRAME.get

__all__ = ["profiled", "region"]

P = ParamSpec("P")
R = TypeVar("R")


def _code_info(func: Any) -> CodeInfo | None:
    target = getattr(func, "__func__", func)
    while isinstance(target, functools.partial):
        target = target.func
    target = inspect.unwrap(getattr(target, "__func__", target))
    if not hasattr(target, "__code__") and callable(target):
        target = type(target).__call__  # a callable instance: where its __call__ lives
    code = getattr(target, "__code__", None)
    if code is None:
        return None
    return CodeInfo(
        function=getattr(target, "__qualname__", code.co_name),
        file_path=code.co_filename,
        line_number=code.co_firstlineno,
    )


def _kind(func: Any) -> str:
    target = getattr(func, "__func__", func)
    if inspect.isasyncgenfunction(target):
        return "asyncgen"
    if inspect.iscoroutinefunction(target):
        return "async"
    if inspect.isgeneratorfunction(target):
        return "gen"
    return "sync"


def _make_wrapper(kind: str, label: str, attrs: dict[str, Any], code: CodeInfo | None) -> Any:
    """The ``wrapt`` wrapper for a kind of callable, built once at decoration time."""
    if kind == "async":

        async def async_wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
            entered = error = None
            try:
                entered = enter(label, attrs, code)
                coro = wrapped(*args, **kwargs)
                if isinstance(entered, Active) and entered.session is not None:
                    entered.call.intervals = []  # a sampled root: record when its task runs
                    return await _Intervals(coro, entered.call.intervals)
                return await coro
            except BaseException as exc:
                error = exc
                raise
            finally:
                _exit_twice(entered, error)

        return async_wrapper
    if kind == "gen":

        def gen_wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
            return _drive(wrapped(*args, **kwargs), Stepped(label, attrs, code), final=True)

        return gen_wrapper
    if kind == "asyncgen":

        def agen_wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
            return _SteppedAsyncGen(wrapped(*args, **kwargs), Stepped(label, attrs, code))

        return agen_wrapper

    def sync_wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        return sync_runner(label, attrs, code, wrapped)(*args, **kwargs)

    return sync_wrapper


def _exit_twice(entered: Any, error: BaseException | None) -> None:
    """:func:`exit_`, run again when a signal's exception cut it short (it is idempotent)."""
    try:
        exit_(entered, error)
    except BaseException:
        exit_(entered, error)
        raise


class _Intervals:
    """Awaits a coroutine step by step, recording when its task actually ran (epoch ns).

    Other tasks' ops on the same thread fall between these intervals, which is how a sampled
    coroutine's summary keeps only its own ops. Each step is a checkpoint for
    ``max_window_s``.
    """

    __slots__ = ("_coro", "_intervals")

    def __init__(self, coro: Any, intervals: list[tuple[int, int]]) -> None:
        self._coro = coro
        self._intervals = intervals

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, intervals = self._coro, self._intervals
        send: Any = None
        throw: BaseException | None = None
        while True:
            SLOT.checkpoint()
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


def _drive(it: Any, scope: Stepped, final: bool) -> Generator[Any, Any, Any]:
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
            except GeneratorExit:
                token = scope.step_in()
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


class _SteppedAsyncGen:
    """A decorated async generator: each ``asend``/``athrow``/``aclose`` runs in its scope.

    The steps are driven by :func:`_drive`, the same driver as a decorated generator's; the
    scope ends when the async generator does (exhausted, raised or closed).
    """

    __slots__ = ("_agen", "_scope")

    def __init__(self, agen: Any, scope: Stepped) -> None:
        self._agen = agen
        self._scope = scope

    def __aiter__(self) -> _SteppedAsyncGen:
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


class _InScope:
    """An awaitable run by :func:`_drive` (its frame set per step, the scope left open)."""

    __slots__ = ("_awaitable", "_scope")

    def __init__(self, awaitable: Any, scope: Stepped) -> None:
        self._awaitable = awaitable
        self._scope = scope

    def __await__(self) -> Generator[Any, Any, Any]:
        return _drive(self._awaitable.__await__(), self._scope, final=False)


def default_label(func: Any) -> str:
    """A callable's label from qualified names only, never ``repr()``.

    ``repr()`` of a ``functools.partial`` shows its bound arguments (an API key) and that of
    most objects an address, so neither may name a span. A partial is labelled by the
    function it wraps, a callable instance by its type's ``__call__``.
    """
    target = getattr(func, "__func__", func)
    while isinstance(target, (functools.partial, functools.partialmethod)):
        target = target.func
    target = getattr(target, "__func__", target)
    qualname = getattr(target, "__qualname__", None)
    if isinstance(qualname, str) and qualname:
        return qualname
    return f"{getattr(type(target), '__qualname__', 'callable')}.__call__"


def _decorate(func: Callable[P, R], name: str | None, attributes: dict[str, Any] | None) -> Any:
    label = name or default_label(func)
    kind = _kind(func)
    attrs = dict(attributes or {})
    if kind == "sync" and type(func) is types.FunctionType:
        return _plain_function(func, label, attrs, _code_info(func))
    return wrapt.FunctionWrapper(func, _make_wrapper(kind, label, attrs, _code_info(func)))


def _plain_function(
    func: Callable[..., Any], label: str, attrs: dict[str, Any], code: CodeInfo | None
) -> Callable[..., Any]:
    """A plain ``def`` (also a method defined in a class body) gets a closure, not a proxy.

    ``wrapt.FunctionWrapper`` costs about 1 µs a call for a plain function (it looks up
    ``__self__`` and builds the AttributeError), the whole off-sample budget; the scope's
    own closure (:func:`profkit._scope.sync_runner`), ``functools.wraps``-ed, keeps name,
    docstring, ``__wrapped__`` and signature and binds as a method like any function.
    """
    return functools.wraps(func)(sync_runner(label, attrs, code, func))


@overload
def profiled(func: Callable[P, R], /) -> Callable[P, R]: ...


@overload
def profiled(
    name: str | None = None, /, *, attributes: dict[str, Any] | None = None
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


@overload
def profiled(
    *, name: str | None = None, attributes: dict[str, Any] | None = None
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def profiled(
    func: Any = None, /, *, name: str | None = None, attributes: dict[str, Any] | None = None
) -> Any:
    """Label a function as a profkit scope; its outermost call in a context is a root call.

    Use bare (``@profiled``), with a label (``@profiled("predict")``) or with keywords
    (``@profiled(name="predict", attributes={"model": "mlp"})``). Works on functions,
    methods, classmethods, staticmethods, coroutine functions, generators and async
    generators; signature, name, docstring and ``inspect`` results are kept, and results and
    exceptions pass through untouched. The label defaults to ``__qualname__`` (that of the
    wrapped function for a ``functools.partial``, ``<type>.__call__`` for a callable
    instance), never to a ``repr()`` that could show argument values or addresses.
    """
    if isinstance(func, str):
        label = func

        def with_label(f: Callable[P, R]) -> Callable[P, R]:
            return _decorate(f, label if name is None else name, attributes)  # type: ignore[no-any-return]

        return with_label
    if func is None:

        def with_options(f: Callable[P, R]) -> Callable[P, R]:
            return _decorate(f, name, attributes)  # type: ignore[no-any-return]

        return with_options
    return _decorate(func, name, attributes)


class region:
    """A labelled stage: ``with region("preprocess"):``, ``async with``, or ``@region("x")``.

    The outermost profkit scope in a context is a root call (a sampling point); inside a
    sampled call a region becomes a ``record_function`` range and a child span.

    A region object serves one ``with`` at a time in one context (re-entering it nested is
    fine): write ``with profkit.region("x"):`` where it is used instead of sharing one
    instance between threads or concurrent tasks. The decorator form is always safe.
    """

    __slots__ = ("_attributes", "_entered", "_outer", "label")

    def __init__(self, name: str, /, **attributes: Any) -> None:
        self.label = name
        self._attributes = attributes
        self._entered: Any = None
        self._outer: list[Any] | None = None  # only when one object re-enters

    def __enter__(self) -> region:
        if self._entered is None and _get_frame() is OFF:
            return self  # nested in an unsampled root call: nothing to record or undo
        entered = enter(self.label, self._attributes, None)
        if self._entered is not None:
            if self._outer is None:
                self._outer = []
            self._outer.append(self._entered)
        self._entered = entered
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        entered = self._entered
        if entered is None and not self._outer:
            return
        self._entered = self._outer.pop() if self._outer else None
        try:  # _exit_twice, inlined: a frame less on every off-sample region
            exit_(entered, exc)
        except BaseException:
            exit_(entered, exc)
            raise

    async def __aenter__(self) -> region:
        return self.__enter__()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.__exit__(exc_type, exc, tb)

    def __call__(self, func: Callable[P, R]) -> Callable[P, R]:
        return _decorate(func, self.label, self._attributes)  # type: ignore[no-any-return]
