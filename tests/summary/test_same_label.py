"""Scopes that share a label, nested or side by side: each gets its own profiler range.

A scope's profiler times come from the ``record_function`` range of its label inside its
Python bounds (give or take a slack). A recursive function's inner call, or a region inside
a region of the same label, lies within the slack of the outer one: each must still get its
own range, never the outer one's timing and ops.
"""

from __future__ import annotations

import asyncio
import itertools

import torch

import profkit
from profkit.testing import capture

A = torch.randn(32, 32)


@profkit.profiled
def walk(n: int) -> torch.Tensor:
    x = A.sum()
    if n:
        walk(n - 1)
    return x


def test_a_recursive_function_s_calls_have_their_own_ranges() -> None:
    """walk(3): four scopes, each one ``sum`` more than the one inside it, nested in time."""
    with capture(sample_every=1, cold_calls=0) as cap:
        walk(3)
    (call,) = cap.calls
    scopes = call.scopes
    assert 4 == len(scopes)
    sums = [sum(r.count for r in s.ops if r.name == "aten::sum") for s in scopes]
    assert [4, 3, 2, 1] == sums
    assert all(s.timing == "profiler" for s in scopes)
    for outer, inner in itertools.pairwise(scopes):
        assert outer.start_ns < inner.start_ns
        assert inner.end_ns < outer.end_ns
    assert len({(s.start_ns, s.end_ns) for s in scopes}) == 4


def test_a_region_inside_a_region_of_the_same_label_keeps_its_own_ops() -> None:
    """The inner ``r`` holds the matmul only; the sum and relu around it are the outer's."""

    @profkit.profiled("h")
    def h() -> None:
        with profkit.region("r"):
            A.sum()
            with profkit.region("r"):
                A @ A
            A.relu()

    with capture(sample_every=1, cold_calls=0) as cap:
        for _ in range(3):
            h()
    assert 3 == len(cap.calls)
    for call in cap.calls:
        _, outer, inner = call.scopes
        assert inner.parent == outer.index
        inner_ops = {r.name for r in inner.ops}
        assert "aten::mm" in inner_ops
        assert not {"aten::sum", "aten::relu"} & inner_ops
        assert {"aten::sum", "aten::relu"} <= {r.name for r in outer.ops}
        assert (inner.start_ns, inner.end_ns) != (outer.start_ns, outer.end_ns)
        assert outer.start_ns < inner.start_ns
        assert inner.end_ns < outer.end_ns


def test_concurrent_calls_of_one_label_in_one_window_keep_their_own_ranges() -> None:
    """Three gathered coroutines of one label in a ``window=3`` window: no two calls share a
    range, and each call's range lies inside its own Python bounds."""

    @profkit.profiled("step")
    async def step(i: int) -> None:
        await asyncio.sleep(0.001 * i)
        (A @ A).relu()
        await asyncio.sleep(0)
        A.sum()

    async def main() -> None:
        await asyncio.gather(*(step(i) for i in range(3)))

    for _ in range(3):
        with capture(sample_every=1, cold_calls=0, window=3) as cap:
            asyncio.run(main())
        roots = [c.scopes[0] for c in cap.calls]
        assert 3 == len(roots)
        assert len({(s.start_ns, s.end_ns) for s in roots}) == 3
