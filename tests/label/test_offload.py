"""Offloaded work (asyncio.to_thread, run_in_executor, a thread pool) and the attribution rule.

With ``all_threads=True`` the profiler records every thread. Work offloaded in the call's
copied context inside a profkit scope (a region, or a decorated function) is attributed
exactly; offloaded work with no scope of the call around it makes the call say "window".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import threading
from collections.abc import Callable

import pytest
import torch

import profkit
from profkit.testing import capture

X = torch.full((8, 8), 0.01)


@profkit.profiled("offload_mm")
def labelled_mm(x: torch.Tensor) -> float:
    """Three matmuls, labelled, for running on a worker thread."""
    for _ in range(3):
        x = torch.mm(x, x)
    return float(x.sum())


def bare_mm(x: torch.Tensor) -> float:
    """Three matmuls with no profkit label."""
    for _ in range(3):
        x = torch.mm(x, x)
    return float(x.sum())


EXPECTED = bare_mm(X)


async def _to_thread(fn: Callable[[torch.Tensor], float], x: torch.Tensor) -> float:
    return await asyncio.to_thread(fn, x)


async def _run_in_executor(fn: Callable[[torch.Tensor], float], x: torch.Tensor) -> float:
    loop = asyncio.get_running_loop()
    ctx = contextvars.copy_context()
    return await loop.run_in_executor(None, functools.partial(ctx.run, fn, x))


OFFLOADS = {"to_thread": _to_thread, "run_in_executor": _run_in_executor}


def _rows(scope: profkit.ScopeSummary) -> dict[str, int]:
    return {row.name: row.count for row in scope.ops}


@profkit.profiled("handler")
async def handler(x: torch.Tensor, offload: str, fn: Callable[[torch.Tensor], float]) -> float:
    """Softmax on the loop, then matmuls on a worker thread."""
    torch.softmax(x, dim=1)
    return await OFFLOADS[offload](fn, x)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("offload", sorted(OFFLOADS))
def test_labelled_offload_is_attributed_exactly(offload: str) -> None:
    """all_threads: the worker thread's ops join the call, exactly, under their own scope."""
    with capture(sample_every=1, all_threads=True, top_k=50) as cap:
        assert EXPECTED == asyncio.run(handler(X, offload, labelled_mm))
    (call,) = cap.calls
    assert call.attribution == "task"
    assert ["handler", "offload_mm"] == [s.label for s in call.scopes]
    root, worker = call.scopes
    assert 3 == _rows(root)["aten::mm"]
    assert 1 == _rows(root)["aten::softmax"]
    assert 3 == _rows(worker)["aten::mm"]
    assert "aten::softmax" not in _rows(worker)
    assert worker.timing == "profiler"


@pytest.mark.timeout(60)
def test_sync_handler_offload_to_pool_with_copied_context() -> None:
    """A sync handler submitting ctx.run to a ThreadPoolExecutor: attribution "thread"."""

    @profkit.profiled("sync_handler")
    def sync_handler(pool: concurrent.futures.ThreadPoolExecutor, x: torch.Tensor) -> float:
        torch.softmax(x, dim=1)
        return pool.submit(contextvars.copy_context().run, labelled_mm, x).result()

    with (
        concurrent.futures.ThreadPoolExecutor(2) as pool,
        capture(sample_every=1, all_threads=True, top_k=50) as cap,
    ):
        assert EXPECTED == sync_handler(pool, X)
    (call,) = cap.calls
    assert call.attribution == "thread"
    assert 3 == _rows(call.root)["aten::mm"]
    assert 1 == _rows(call.root)["aten::softmax"]


@pytest.mark.timeout(60)
def test_concurrent_requests_offloads_are_not_mixed() -> None:
    """Two requests offload at the same moment; the sampled one has only its own offload."""
    both_running = threading.Barrier(2)
    tanh_done = threading.Event()

    @profkit.profiled("offload_tanh")
    def labelled_tanh(x: torch.Tensor) -> float:
        both_running.wait(10)
        for _ in range(4):
            x = torch.tanh(x)
        tanh_done.set()
        return float(x.sum())

    @profkit.profiled("offload_mm_together")
    def labelled_mm_together(x: torch.Tensor) -> float:
        both_running.wait(10)
        result = labelled_mm.__wrapped__(x)
        tanh_done.wait(10)  # the other request's ops fall inside this call's time range
        return result

    async def main() -> list[float]:
        sampled = handler(X, "to_thread", labelled_mm_together)  # first root call: sampled
        other = handler(X, "to_thread", labelled_tanh)
        return list(await asyncio.gather(sampled, other))

    with capture(sample_every=1000, all_threads=True, top_k=50) as cap:
        results = asyncio.run(main())
    assert EXPECTED == results[0]
    (call,) = cap.calls
    assert call.attribution == "task"
    rows = _rows(call.root)
    assert 3 == rows["aten::mm"]
    assert 1 == rows["aten::softmax"]  # its own softmax, not the other request's
    assert "aten::tanh" not in rows


@pytest.mark.timeout(60)
def test_unlabelled_offload_says_window() -> None:
    """all_threads with no scope around the offloaded work: ops kept, attribution "window"."""
    with capture(sample_every=1, all_threads=True, top_k=50) as cap:
        assert EXPECTED == asyncio.run(handler(X, "to_thread", bare_mm))
    (call,) = cap.calls
    assert call.attribution == "window"
    assert 3 == _rows(call.root)["aten::mm"]
    (span,) = [s for s in cap.spans() if s.name == "handler"]
    assert span.attributes is not None
    assert span.attributes["profkit.attribution"] == "window"


@pytest.mark.timeout(60)
def test_without_all_threads_offloaded_ops_are_not_recorded() -> None:
    """Default mode records the call's own thread only: the worker's scope is empty."""
    with capture(sample_every=1, top_k=50) as cap:
        assert EXPECTED == asyncio.run(handler(X, "to_thread", labelled_mm))
    (call,) = cap.calls
    assert call.attribution == "task"
    assert ["handler", "offload_mm"] == [s.label for s in call.scopes]
    assert "aten::mm" not in _rows(call.root)
    assert 0 == call.scopes[1].op_count
    assert call.scopes[1].timing == "python"
