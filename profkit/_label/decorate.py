"""``@profiled`` and ``region()``: thin front-ends over :mod:`profkit._label.scope`.

The decorator branches once, at decoration time, on the kind of callable (function,
coroutine function, generator, async generator) and precomputes the label and code
attributes. Off-sample, a decorated call costs the compiler check (a ``return False``), one
ContextVar read, one session check, one counter step and a ContextVar set/reset. Under
``torch.compile`` tracing, labels are nothing (:mod:`profkit._label.compiler`). Decorated callables
pickle and copy like undecorated ones (docs/compile.md).
"""

from __future__ import annotations

import copy
import functools
import inspect
import sys
import types
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, overload

import wrapt

from .._model import CodeInfo
from .._text import as_label
from .compiler import compiled_away, compiling
from .drivers import Stepped, SteppedAsyncGen, async_call, drive, watch_loop
from .routes import warn_if_route
from .scope import FRAME, OFF, Active, OffCall, enter, exit_, sync_call, undo_enter

_get_frame = FRAME.get
_set_frame = FRAME.set

__all__ = ["label_endpoint", "profiled", "region"]

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
    if not inspect.isroutine(target) and not inspect.isclass(target) and callable(target):
        unwrapped = target
        while isinstance(unwrapped, functools.partial):
            unwrapped = unwrapped.func
        if not inspect.isroutine(unwrapped):  # a callable instance: its type's __call__ says
            target = type(unwrapped).__call__
    if inspect.isasyncgenfunction(target):
        return "asyncgen"
    if inspect.iscoroutinefunction(target):
        return "async"
    if inspect.isgeneratorfunction(target):
        return "gen"
    return "sync"


def _make_wrapper(
    func: Any, kind: str, label: str, attrs: dict[str, Any], code: CodeInfo | None
) -> Any:
    """The ``wrapt`` wrapper for a kind of callable, built once at decoration time."""
    if kind == "async":
        acall = async_call(func, label, attrs, code)

        def async_wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
            if wrapped is func:
                return acall(*args, **kwargs)
            return async_call(wrapped, label, attrs, code)(*args, **kwargs)  # bound

        return async_wrapper
    if kind == "gen":

        def gen_wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
            return drive(wrapped(*args, **kwargs), Stepped(label, attrs, code, False), final=True)

        return gen_wrapper
    if kind == "asyncgen":

        def agen_wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
            return SteppedAsyncGen(wrapped(*args, **kwargs), Stepped(label, attrs, code))

        return agen_wrapper
    call = sync_call(func, label, attrs, code)

    def sync_wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        if wrapped is func:
            return call(*args, **kwargs)
        return sync_call(wrapped, label, attrs, code)(*args, **kwargs)  # bound (partialmethod)

    return sync_wrapper


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


def _decorate(
    func: Callable[P, R],
    name: str | None,
    attributes: dict[str, Any] | None,
    check_route: bool = True,
) -> Any:
    if isinstance(func, (classmethod, staticmethod)):  # the same descriptor, around a label
        return type(func)(_decorate(func.__func__, name, attributes))
    kind_of: Any = type(func)  # (a descriptor, not the callable the annotation says)
    if kind_of is property:  # the getter labelled: reading the attribute is the call
        prop: Any = func
        getter = None if prop.fget is None else _decorate(prop.fget, name, attributes)
        return property(getter, prop.fset, prop.fdel, prop.__doc__)
    if kind_of is functools.cached_property:  # its first read is the call
        return functools.cached_property(_decorate(func.func, name, attributes))  # type: ignore[attr-defined]
    label = (as_label(name) if name is not None else "") or default_label(func)
    if check_route:
        warn_if_route(func, label)
    kind = _kind(func)
    attrs = dict(attributes or {})
    code = _code_info(func)
    if kind == "sync" and type(func) is types.FunctionType:
        return _plain_function(func, label, attrs, code)
    if kind == "async" and type(func) is types.FunctionType:  # a plain ``async def``: no proxy
        return functools.update_wrapper(async_call(func, label, attrs, code), func)
    wrapper = _make_wrapper(func, kind, label, attrs, code)
    if kind == "async" and not inspect.iscoroutinefunction(func):  # an instance's async __call__
        return _AsyncProfiled(func, wrapper, label, attrs)
    return _Profiled(func, wrapper, label, attrs)


def _plain_function(
    func: types.FunctionType, label: str, attrs: dict[str, Any], code: CodeInfo | None
) -> Callable[..., Any]:
    """A plain ``def`` (also a method defined in a class body) gets a function, not a proxy.

    ``wrapt.FunctionWrapper`` costs about 1 µs a call for a plain function (it looks up
    ``__self__`` and builds the AttributeError), the whole off-sample budget. The scope's
    function (:func:`profkit._label.scope.sync_call`, one frame a call) is rebuilt on ``func``'s
    globals, where TorchScript resolves the names in ``func``'s source (it reads the source
    through ``__wrapped__``, the names through the wrapper), and ``functools.wraps`` keeps
    name, docstring, ``__wrapped__`` and signature. It binds as a method like any function
    and pickles and copies as one (by its qualified name).
    """
    call = sync_call(func, label, attrs, code)
    wrapper = types.FunctionType(
        call.__code__, func.__globals__, func.__name__, None, call.__closure__
    )
    return functools.update_wrapper(wrapper, func)


def _redecorate(wrapped: Any, label: str, attributes: dict[str, Any]) -> Any:
    """A decorated callable again, from what it wraps (unpickling and copying by value)."""
    return _decorate(wrapped, label, attributes)


def _global_name(obj: Any) -> str | None:
    """``obj``'s qualified name if its module holds it there (pickle's rule for functions)."""
    module = sys.modules.get(str(getattr(obj, "__module__", None)))
    qualname = getattr(obj, "__qualname__", None)
    if module is None or not isinstance(qualname, str):
        return None
    found: Any = module
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return qualname if found is obj else None


#: what ``copy`` returns as is (it copies functions, builtins and classes by reference)
_ATOMIC = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, type)


class _BoundProfiled(wrapt.BoundFunctionWrapper[..., Any]):
    """A decorated method bound to an instance (or looked up on its class).

    Pickles, copies and deep-copies like a bound method: as ``getattr(instance, name)``.
    """

    def __reduce_ex__(self, protocol: Any) -> Any:
        return getattr, (self._bound_to(), self.__name__)

    def __reduce__(self) -> Any:
        return self.__reduce_ex__(2)

    def __copy__(self) -> Any:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return getattr(copy.deepcopy(self._bound_to(), memo), self.__name__)

    def _bound_to(self) -> Any:
        return self._self_owner if self._self_instance is None else self._self_instance


class _Profiled(wrapt.FunctionWrapper[..., Any]):
    """A decorated coroutine function, generator, async generator or other callable.

    A wrapt proxy (so ``inspect`` predicates and attribute access see the wrapped object)
    that pickles and copies like what it wraps: by its qualified name when its module holds
    it (as functions pickle), else by value: the wrapped object, decorated again on load.
    """

    __bound_function_wrapper__ = _BoundProfiled

    def __init__(self, wrapped: Any, wrapper: Any, label: str, attributes: dict[str, Any]):
        super().__init__(wrapped, wrapper)
        self._self_label = label
        self._self_attributes = attributes

    def __reduce_ex__(self, protocol: Any) -> Any:
        name = _global_name(self)
        if name is not None:
            return name  # pickle saves a global and checks that it finds this object again
        return _redecorate, (self.__wrapped__, self._self_label, self._self_attributes)

    def __reduce__(self) -> Any:
        return self.__reduce_ex__(2)

    def __copy__(self) -> Any:
        if isinstance(self.__wrapped__, _ATOMIC):
            return self
        return _redecorate(copy.copy(self.__wrapped__), self._self_label, self._self_attributes)

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        if isinstance(self.__wrapped__, _ATOMIC):
            return self
        wrapped = copy.deepcopy(self.__wrapped__, memo)
        return _redecorate(wrapped, self._self_label, self._self_attributes)


class _AsyncProfiled(_Profiled):
    """A decorated callable instance whose ``__call__`` is a coroutine function.

    Its own ``__call__`` is one too, so that checks that look there for an async callable
    (Starlette's and FastAPI's, on a background task, a dependency or an endpoint) see what
    they see undecorated; calling it gives a coroutine, as undecorated.
    """

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        wrapper: Any = self._self_wrapper  # (wrapper, instance, args, kwargs), as wrapt calls it
        return await wrapper(self.__wrapped__, None, args, kwargs)


def label_endpoint(func: Any, label: str, attributes: dict[str, Any]) -> Any:
    """``profiled(label, attributes=...)(func)`` for a route's endpoint, which the caller
    puts where the route calls it (``instrument_app``): no check for the wrong order."""
    return _decorate(func, label, attributes, check_route=False)


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
    methods, classmethods, staticmethods, properties and ``functools.cached_property``
    (placed above them: reading the attribute is the call), coroutine functions, generators
    and async generators; signature, name, docstring and ``inspect`` results are kept, and
    results and exceptions pass through untouched. The label defaults to ``__qualname__``
    (that of the wrapped function for a ``functools.partial``, ``<type>.__call__`` for a
    callable instance), never to a ``repr()`` that could show argument values or addresses.
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
        self.label = name if name.__class__ is str else as_label(name)
        self._attributes = attributes
        self._entered: Any = None
        self._outer: list[Any] | None = None  # only when one object re-enters

    def __enter__(self) -> region:
        if compiling() and compiled_away(self.label):
            return self  # traced by torch.compile: nothing to record or undo
        outer = _get_frame()
        if self._entered is None and (
            outer is OFF or (outer.__class__ is OffCall and not outer)  # (empty: running)
        ):
            return self  # nested in an unsampled root call: nothing to record or undo
        try:
            entered = enter(self.label, self._attributes, None)
        except RecursionError:  # no stack left to record it (enter undid its part): unlabelled
            return self
        except BaseException as exc:  # landed after enter() set the frame: __exit__ won't run
            undo_enter(outer, exc)
            raise
        if entered.__class__ is Active and entered.session is not None:  # a sampled root
            try:
                watch_loop(entered.call)
            except BaseException as exc:  # a signal's, at its first instruction: undone
                undo_enter(outer, exc)
                raise
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
        if entered is OFF:  # an unsampled root call ends: exit_'s first case, inlined
            try:
                _set_frame(None)
            except BaseException:  # a signal's exception landed before the set: once more
                _set_frame(None)
                raise
            return
        try:  # exit_twice, inlined: a frame less on every off-sample region
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
