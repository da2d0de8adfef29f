"""Recursion: a decorated level costs a fixed number of frames, sampled or not."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest

import profkit
from profkit.testing import capture


def _max_depth(decorate: Callable[[Any], Any] | None) -> int:
    """How deep a recursive function gets before RecursionError (decorated at each level)."""
    deepest = 0

    def level(n: int) -> int:
        nonlocal deepest
        deepest = n
        return int(step(n + 1))

    step = decorate(level) if decorate is not None else level
    with pytest.raises(RecursionError):
        step(1)
    return deepest


def _root(inner: Callable[[], int]) -> Callable[[], int]:
    """A decorated root call around ``inner`` (so the recursion's levels are nested scopes)."""
    return profkit.profiled("root")(inner)


@pytest.mark.slow
def test_sampled_recursion_reaches_the_unsampled_depth() -> None:
    """Sampled, a decorated recursion gets exactly as deep as unsampled and unconfigured."""
    unconfigured = _root(lambda: _max_depth(profkit.profiled))()
    with capture(sample_every=2) as cap:
        sampled = _root(lambda: _max_depth(profkit.profiled))()
        unsampled = _root(lambda: _max_depth(profkit.profiled))()
    assert (unconfigured, unconfigured) == (sampled, unsampled)
    assert 1 == len(cap.calls)
    assert cap.calls[0].root.op_count >= 0


def test_a_decorated_level_costs_one_frame_more_than_the_function() -> None:
    """Each decorated level is two Python frames: the wrapper and the function."""
    bare = _max_depth(None)
    decorated = _max_depth(profkit.profiled)
    assert abs(bare // 2 - decorated) <= 2, (bare, decorated, sys.getrecursionlimit())


@pytest.mark.slow
def test_a_recursive_region_is_as_deep_sampled_as_unsampled() -> None:
    """``with region()`` around each level: sampled and unsampled depths are the same."""

    def with_region(fn: Callable[[int], int]) -> Callable[[int], int]:
        def level(n: int) -> int:
            with profkit.region("level"):
                return fn(n)

        return level

    with capture(sample_every=2):
        sampled = _root(lambda: _max_depth(with_region))()
        unsampled = _root(lambda: _max_depth(with_region))()
    assert sampled == unsampled
