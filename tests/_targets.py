"""Decorated callables of every kind, at module level so they pickle by reference.

Imported by name from a ``spawn`` child process too (``tests/`` is on its ``sys.path``), so
this module imports nothing from the test suite.
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import AsyncIterator, Iterator
from typing import Any

import profkit


@profkit.profiled
def plain(x: int) -> int:
    """A plain function."""
    return x + 1


@profkit.profiled("coro")
async def coro(x: int) -> int:
    """A coroutine function."""
    await asyncio.sleep(0)
    return x * 10


@profkit.profiled
def gen(n: int) -> Iterator[int]:
    """A generator."""
    yield from range(n)


@profkit.profiled
async def agen(n: int) -> AsyncIterator[int]:
    """An async generator."""
    for i in range(n):
        await asyncio.sleep(0)
        yield i


class Holder:
    """Methods of every kind."""

    factor = 3

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Holder)

    def __hash__(self) -> int:
        return 0

    @profkit.profiled
    def method(self, x: int) -> int:
        """A method."""
        return x * self.factor

    @profkit.profiled
    async def amethod(self, x: int) -> int:
        """A coroutine method."""
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


def _add(a: int, b: int) -> int:
    return a + b


class Scale:
    """A callable instance."""

    def __init__(self, factor: int) -> None:
        self.factor = factor

    def __call__(self, x: int) -> int:
        return x * self.factor


scale = profkit.profiled("scale")(Scale(2))
builtin_sqrt = profkit.profiled(math.sqrt)
partial_add = profkit.profiled(functools.partial(_add, 2))


async def _collect(it: AsyncIterator[int]) -> list[int]:
    return [x async for x in it]


def run_every_kind(fns: dict[str, Any]) -> dict[str, Any]:
    """Call each decorated callable in ``fns`` (by its kind) and return what it gave."""
    out: dict[str, Any] = {}
    for name, fn in fns.items():
        if name in ("coro", "amethod"):
            out[name] = asyncio.run(fn(2))
        elif name == "gen":
            out[name] = list(fn(3))
        elif name == "agen":
            out[name] = asyncio.run(_collect(fn(3)))
        else:
            out[name] = fn(4)
    return out


@profkit.profiled("spawn_target")
def spawn_target(fns: dict[str, Any], queue: Any) -> None:
    """A decorated ``multiprocessing`` target: runs the decorated callables it was sent."""
    queue.put(run_every_kind(fns))
