"""@profiled and region(): every callable kind, root versus nested, pass-through semantics."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import threading
import time
import traceback
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import torch

import profkit
from profkit._label.scope import FRAME
from profkit.testing import capture


def _labels(call: profkit.CallSummary) -> list[str]:
    return [s.label.rsplit(".", 1)[-1] for s in call.scopes]


@profkit.profiled
def plain(x: int, y: int = 2) -> int:
    """Adds."""
    return x + y


class Model:
    """Holder for method kinds."""

    factor = 3

    @profkit.profiled
    def method(self, x: int) -> int:
        """A method."""
        return x * self.factor

    @profkit.profiled
    @classmethod
    def cls_method(cls, x: int) -> int:
        """A classmethod."""
        return x * cls.factor

    @profkit.profiled
    @staticmethod
    def static(x: int) -> int:
        """A staticmethod."""
        return x - 1


@profkit.profiled("coro")
async def coro(x: int) -> int:
    """A coroutine function."""
    await asyncio.sleep(0)
    return x * 10


@profkit.profiled(name="gen", attributes={"kind": "gen"})
def gen(n: int) -> Iterator[int]:
    """A generator."""
    for i in range(n):
        with profkit.region("step"):
            yield int(torch.ones(2).sum().item()) + i


@profkit.profiled
async def agen(n: int) -> AsyncIterator[int]:
    """An async generator."""
    for i in range(n):
        await asyncio.sleep(0)
        yield i


def test_metadata_is_preserved() -> None:
    """Name, docstring, signature, __wrapped__ and the inspect predicates survive decoration."""
    assert plain.__name__ == "plain"
    assert plain.__doc__ == "Adds."
    assert str(inspect.signature(plain)) == "(x: 'int', y: 'int' = 2) -> 'int'"
    assert plain.__wrapped__(1) == 3  # type: ignore[attr-defined]
    assert inspect.iscoroutinefunction(coro)
    assert inspect.isgeneratorfunction(gen)
    assert inspect.isasyncgenfunction(agen)
    assert not inspect.iscoroutinefunction(plain)


def _call_every_kind() -> None:
    """Call each decorated kind once and check it returns exactly what it would."""
    assert plain(1) == 3
    assert Model().method(2) == 6
    assert Model.cls_method(2) == 6
    assert Model.static(2) == 1
    assert asyncio.run(coro(2)) == 20
    assert list(gen(2)) == [2, 3]
    assert asyncio.run(_collect(agen(3))) == [0, 1, 2]


def test_every_callable_kind_returns_unchanged_unconfigured() -> None:
    """Before configure(), every kind runs and returns exactly what it would."""
    _call_every_kind()


async def _collect(it: AsyncIterator[int]) -> list[int]:
    return [x async for x in it]


def test_every_callable_kind_is_sampled_with_its_label() -> None:
    """Sampled every time, each kind yields one call named after its qualname or label."""
    with capture(sample_every=1) as cap:
        _call_every_kind()
    labels = sorted(c.label for c in cap.calls)
    expected = sorted(
        ["plain", "Model.method", "Model.cls_method", "Model.static", "coro", "gen", "agen"]
    )
    assert expected == labels


def test_generator_window_records_its_first_step() -> None:
    """A sampled generator's thread-local window stops at its first yield, and says so."""
    with capture(sample_every=1) as cap:
        assert list(gen(3)) == [2, 3, 4]
    (call,) = cap.calls
    assert ["gen", "step"] == _labels(call)
    assert "first_step" == call.truncated
    assert call.root.attributes["kind"] == "gen"
    assert any(r.name == "aten::ones" for r in call.root.ops)
    assert not torch._C._autograd._profiler_enabled()


def test_generator_scope_spans_the_iteration_with_all_threads() -> None:
    """Recording all threads, a generator's scope covers every step, regions nested in it."""
    with capture(sample_every=1, all_threads=True) as cap:
        assert list(gen(3)) == [2, 3, 4]
    (call,) = cap.calls
    assert ["gen", "step", "step", "step"] == _labels(call)
    assert all(s.parent == 0 for s in call.scopes[1:])
    assert call.truncated is None
    assert any(r.name == "aten::ones" for r in call.root.ops)


def test_generator_closed_early_ends_the_scope() -> None:
    """close() on a half-consumed generator still ends the call and exports it."""
    with capture(sample_every=1) as cap:
        it = gen(5)
        assert next(it) == 2
        it.close()
        assert plain(1) == 3  # a new root, so the generator's root really ended
    assert ["gen", "plain"] == sorted(c.label for c in cap.calls)
    assert 0 == cap.stats["dropped"]


def _swallows() -> Iterator[object]:
    try:
        yield 1
    except GeneratorExit as exc:
        yield ("caught", exc)


def _returns() -> Iterator[object]:
    try:
        yield 1
    except GeneratorExit:
        return "done"


def _outcome(it: Iterator[object], exc: BaseException) -> object:
    next(it)
    try:
        return ("yielded", it.throw(exc))
    except StopIteration as stop:
        return ("returned", stop.value)
    except BaseException as raised:
        return ("raised", type(raised), raised.args)


@pytest.mark.parametrize("body", [_swallows, _returns])
def test_generator_exit_thrown_in_passes_through_as_thrown(body: Any) -> None:
    """``throw(GeneratorExit(...))`` (what ``contextlib.contextmanager`` does with a with-body
    that raises it) reaches the generator as thrown, and its answer reaches the caller, as
    undecorated; ``close()`` keeps its usual result and ends the call."""
    plain_exc, decorated_exc = GeneratorExit("why"), GeneratorExit("why")
    with capture(sample_every=1) as cap:
        expected = _outcome(body(), plain_exc)
        got = _outcome(profkit.profiled(body)(), decorated_exc)
        closing = profkit.profiled(_swallows)()
        next(closing)
        with pytest.raises(RuntimeError, match="ignored GeneratorExit"):
            closing.close()  # as undecorated: the generator yielded again
        ended = profkit.profiled(_returns)()
        next(ended)
        ended.close()
    if expected[0] == "yielded":  # the very exception thrown in was caught
        assert ("yielded", ("caught", plain_exc)) == expected
        assert ("yielded", ("caught", decorated_exc)) == got
    else:
        assert ("returned", "done") == expected == got
    assert 0 == cap.stats["dropped"]
    assert 2 <= len(cap.calls)


def test_generator_error_passes_through() -> None:
    """An exception raised inside a generator reaches the consumer unchanged."""

    @profkit.profiled
    def bad() -> Iterator[int]:
        yield 1
        raise KeyError("k")

    with capture(sample_every=1) as cap:
        it = bad()
        assert next(it) == 1
        with pytest.raises(KeyError, match="k"):
            next(it)
    assert isinstance(cap.calls[0].error, KeyError)


def test_frame_is_not_leaked_between_generator_steps() -> None:
    """Between yields, the consumer's context is its own: its calls are roots again."""
    seen = []
    with capture(sample_every=1) as cap:
        for _ in gen(2):
            seen.append(FRAME.get())
            plain(1)
    assert [None, None] == seen
    # the consumer's calls are roots of their own; the generator's window stopped at its
    # first yield, so they are sampled too
    assert 3 == cap.stats["root_calls"]
    assert 0 == cap.stats["skipped_busy"]
    assert ["gen", "plain", "plain"] == sorted(c.label for c in cap.calls)


def test_window_of_an_all_threads_generator_stays_open_between_steps() -> None:
    """Recording all threads, the generator's window spans its steps: the consumer's wait."""
    with capture(sample_every=1, all_threads=True) as cap:
        for _ in gen(2):
            plain(1)
    assert 2 == cap.stats["skipped_busy"]
    assert ["gen"] == [c.label for c in cap.calls]


def test_async_generator_sampled_and_closed() -> None:
    """An async generator is one root call over its iteration, also when closed early."""

    async def main() -> list[int]:
        out = [x async for x in agen(3)]
        it = agen(10)
        out.append(await it.__anext__())
        await it.aclose()
        return out

    with capture(sample_every=1) as cap:
        assert asyncio.run(main()) == [0, 1, 2, 0]
    assert ["agen", "agen"] == [c.label for c in cap.calls]


def test_async_generator_left_with_break_ends_its_call() -> None:
    """``break`` out of ``async for`` (no ``aclose()``: the usual idiom, and what a client
    disconnect does to a streaming response) still ends the sampled call: it is exported,
    the profiler is off after the session, and the next calls are sampled, not busy."""

    async def main() -> None:
        async for x in agen(10):
            if x == 2:
                break
        await asyncio.sleep(0)

    with capture(sample_every=1) as cap:
        asyncio.run(main())
        assert profkit.force_flush(5.0)
        assert 1 == profkit.stats()["exported"]
        for _ in range(3):
            plain(1)
        assert profkit.force_flush(5.0)
    assert 0 == cap.stats["skipped_busy"]
    assert ["agen", "plain", "plain", "plain"] == [c.label for c in cap.calls]
    assert not torch.autograd.profiler._is_profiler_enabled


def test_a_property_or_cached_property_decorated_reads_its_value() -> None:
    """``@profiled`` above ``@property`` or ``@functools.cached_property``: reading the
    attribute gives the getter's value itself and is the root call, labelled by the getter;
    setter and docstring are kept."""

    class Model:
        def __init__(self) -> None:
            self._size = 42

        @profkit.profiled
        @property
        def size(self) -> int:
            """The size."""
            return self._size

        @size.setter
        def size(self, value: int) -> None:
            self._size = value

        @profkit.profiled("loaded")
        @functools.cached_property
        def weights(self) -> list[int]:
            return [1, 2]

    model = Model()
    with capture(sample_every=1) as cap:
        assert 42 == model.size
        assert type(model.size) is int
        model.size = 7
        assert 7 == model.size
        assert [1, 2] == model.weights
        assert model.weights is model.weights  # cached: read once
    assert Model.size.__doc__ == "The size."
    labels = [c.label for c in cap.calls]
    assert ["Model.size"] * 3 + ["loaded"] == [
        label.rsplit("<locals>.", 1)[-1] for label in labels
    ]


def test_a_callable_instance_with_an_async_call_is_a_coroutine_scope() -> None:
    """An instance whose ``__call__`` is ``async def``: calling the decorated one gives a
    coroutine whose work is the sampled call (not just making the coroutine), and
    Starlette's check for an async callable still says so (a ``BackgroundTask`` awaits it)."""
    from starlette._utils import is_async_callable

    class Notify:
        async def __call__(self, who: str) -> str:
            await asyncio.sleep(0)
            time.sleep(0.03)  # the call's work, after its first await
            return f"sent {who}"

    decorated = profkit.profiled(Notify())
    assert is_async_callable(Notify())
    assert is_async_callable(decorated)
    assert inspect.iscoroutinefunction(decorated.__call__)
    with capture(sample_every=1) as cap:
        assert "sent x" == asyncio.run(decorated("x"))
    (call,) = cap.calls
    assert "Notify.__call__" in call.label
    assert call.root.end_ns - call.root.start_ns >= 25_000_000


def test_exceptions_pass_through_with_traceback() -> None:
    """The user's exception propagates unchanged, with the user's frame in its traceback."""

    @profkit.profiled
    def boom() -> None:
        raise ValueError("user error")

    with capture(sample_every=1) as cap:
        with pytest.raises(ValueError, match="user error") as info:
            boom()
        names = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "boom" in names
    assert isinstance(cap.calls[0].error, ValueError)
    assert 1 == cap.stats["exported"]


def test_async_exception_passes_through() -> None:
    """A coroutine's exception reaches the awaiting caller unchanged."""

    @profkit.profiled
    async def aboom() -> None:
        await asyncio.sleep(0)
        raise RuntimeError("async user error")

    with capture(sample_every=1), pytest.raises(RuntimeError, match="async user error"):
        asyncio.run(aboom())


def test_root_versus_nested() -> None:
    """Only the outermost scope samples; nested decorated calls and regions only label."""

    @profkit.profiled
    def inner() -> torch.Tensor:
        return torch.ones(3) * 2

    @profkit.profiled
    def outer() -> float:
        with profkit.region("stage", step=1):
            x = inner()
        return float(inner().sum() + x.sum())

    with capture(sample_every=1) as cap:
        assert outer() == 12.0
    (call,) = cap.calls
    assert ["outer", "stage", "inner", "inner"] == _labels(call)
    assert [-1, 0, 1, 0] == [s.parent for s in call.scopes]
    assert 1 == cap.stats["root_calls"]
    assert call.scopes[1].attributes == {"step": 1}
    root, stage = call.scopes[0], call.scopes[1]
    assert root.start_ns <= stage.start_ns <= stage.end_ns <= root.end_ns


def test_nested_scopes_inside_unsampled_root_are_not_roots() -> None:
    """With 1-in-2 sampling, an unsampled root's nested scopes do not count as roots."""

    @profkit.profiled
    def inner() -> int:
        return 1

    @profkit.profiled
    def outer() -> int:
        return inner() + inner()

    with capture(sample_every=2) as cap:
        assert [outer() for _ in range(4)] == [2, 2, 2, 2]
    assert 4 == cap.stats["root_calls"]
    assert 2 == len(cap.calls)


def test_region_as_decorator_and_async_context_manager() -> None:
    """region() also decorates, and works with async with."""

    @profkit.region("decorated", flavour="x")
    def f() -> int:
        return 7

    async def g() -> int:
        async with profkit.region("async-stage"):
            await asyncio.sleep(0)
            return f()

    with capture(sample_every=1) as cap:
        assert f() == 7
        assert asyncio.run(g()) == 7
    assert [["decorated"], ["async-stage", "decorated"]] == [_labels(c) for c in cap.calls]
    assert cap.calls[0].root.attributes == {"flavour": "x"}


def test_region_object_can_be_reentered() -> None:
    """One region object used nested in itself keeps both levels balanced."""
    r = profkit.region("again")
    with capture(sample_every=1) as cap:
        with r, r:
            pass
        assert FRAME.get() is None
    assert ["again", "again"] == _labels(cap.calls[0])


def test_contextvars_isolated_between_threads() -> None:
    """A scope open in one thread is invisible to another: each thread's call is a root."""
    inside = threading.Event()
    release = threading.Event()
    seen: list[object] = []

    @profkit.profiled
    def hold() -> None:
        inside.set()
        release.wait(10)

    def other() -> None:
        inside.wait(10)
        seen.append(FRAME.get())
        plain(1)
        release.set()

    with capture(sample_every=1000) as cap:
        t1 = threading.Thread(target=hold)
        t2 = threading.Thread(target=other)
        t1.start()
        t2.start()
        t1.join(10)
        t2.join(10)
    assert [None] == seen
    assert 2 == cap.stats["root_calls"]


def test_contextvars_isolated_between_tasks() -> None:
    """Concurrent asyncio tasks each get their own root call."""

    @profkit.profiled
    async def handler(i: int) -> int:
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return i

    async def main() -> list[int]:
        return list(await asyncio.gather(*(handler(i) for i in range(10))))

    with capture(sample_every=1000) as cap:
        assert asyncio.run(main()) == list(range(10))
    assert 10 == cap.stats["root_calls"]


def test_copied_context_in_thread_is_nested() -> None:
    """Work run in a copied context (run_in_executor style) nests under the sampled call."""

    @profkit.profiled
    def outer() -> int:
        ctx = contextvars.copy_context()
        result: list[int] = []
        t = threading.Thread(target=lambda: result.append(ctx.run(plain, 1)))
        t.start()
        t.join(10)
        return result[0]

    with capture(sample_every=1) as cap:
        assert outer() == 3
    assert ["outer", "plain"] == _labels(cap.calls[0])
    assert 1 == cap.stats["root_calls"]
