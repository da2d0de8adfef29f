"""A root scope that never exits (issue 38 cases 2 and 3): a plain generator holding a root
``region()`` across ``yield``, kept alive; a ``batch`` entered and never exited. The scope's
frame is no longer running, so the thread's next profkit call gives it up: its window is cut
(the call exported, ``truncated="scope_abandoned"``) and that call is a root call again."""

from __future__ import annotations

from collections.abc import Iterator

import psutil
import pytest
import torch

import profkit
from profkit._capture.slot import SLOT
from profkit.testing import capture

pytestmark = pytest.mark.timeout(120)

X = torch.ones(4, 4)


@profkit.profiled("later")
def later() -> None:
    """A small labelled call."""
    torch.mm(X, X)


def held_region() -> Iterator[int]:
    """A plain generator that holds a root region across its yield."""
    with profkit.region("held"):
        torch.mm(X, X)
        yield 1
        torch.mm(X, X)


def test_a_generator_holding_a_root_region_lets_later_calls_be_roots() -> None:
    """Advanced once and kept alive: the 200 later calls are root calls, sampled as usual."""
    with capture(sample_every=1, cold_calls=0) as cap:
        gen = held_region()
        next(gen)
        for _ in range(200):
            later()
            assert profkit.force_flush()  # (no backlog: each call is sampled)
        held_open = SLOT.held is not None
    assert (False, 201, 201) == (held_open, cap.stats["root_calls"], cap.stats["sampled"])
    truncated = [c.truncated for c in cap.calls if c.label == "held"]
    assert (["scope_abandoned"], 200) == (truncated, sum(c.label == "later" for c in cap.calls))
    assert gen is not None  # (kept alive to the end)


def test_a_batch_entered_and_never_exited_lets_later_calls_be_roots() -> None:
    """Entered by a function that returned: the 100 later calls are roots, sampled as usual."""

    def start(b: profkit.batch) -> None:
        b.__enter__()  # and never exited

    with capture(sample_every=1, cold_calls=0) as cap:
        b = profkit.batch("forward", [profkit.batch_member()])
        start(b)
        for _ in range(100):
            later()
            assert profkit.force_flush()
    assert (101, 101) == (cap.stats["root_calls"], cap.stats["sampled"])
    truncated = [c.truncated for c in cap.calls if c.label == "forward"]
    assert ["scope_abandoned"] == truncated


def test_the_profiler_of_a_held_region_is_off_after_the_next_call() -> None:
    """100k unlabelled ops after the thread's next profkit call: RSS grows < 20 MB."""
    with capture(sample_every=1, cold_calls=0):
        gen = held_region()
        next(gen)
        later()
        one = torch.ones(1)
        for _ in range(2_000):  # warm the allocator up
            one.add_(1)
        rss0 = psutil.Process().memory_info().rss
        for _ in range(100_000):
            one.add_(1)
        grown = psutil.Process().memory_info().rss - rss0
        held_open = SLOT.held is not None
    assert (False, True) == (held_open, grown < 20 * 2**20), grown
    assert gen is not None


def test_a_flush_on_the_thread_exports_the_call_a_held_region_left_behind() -> None:
    """``force_flush()`` right after the generator's first step: the call is exported."""
    with capture(sample_every=1, cold_calls=0) as cap:
        gen = held_region()
        next(gen)
        flushed = profkit.force_flush()
        held_open = SLOT.held is not None
    truncated = [c.truncated for c in cap.calls if c.label == "held"]
    assert (True, False, ["scope_abandoned"]) == (flushed, held_open, truncated)
    assert gen is not None
