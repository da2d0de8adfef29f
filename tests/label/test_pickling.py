"""Decorated callables pickle, copy and deepcopy like undecorated ones, and cross ``spawn``."""

from __future__ import annotations

import copy
import multiprocessing
import pickle
import queue
from typing import Any

import _targets
import pytest
from _targets import Holder, Scale, agen, builtin_sqrt, coro, gen, partial_add, plain, scale

import profkit
from profkit.testing import capture

#: callables that are found by their qualified name: each round trip gives back itself
BY_NAME: dict[str, Any] = {
    "plain": plain,
    "coro": coro,
    "gen": gen,
    "agen": agen,
    "static": Holder.static,
}
#: bound methods and by-value objects: a round trip gives an equal, working callable
EVERY_KIND: dict[str, Any] = {
    **BY_NAME,
    "method": Holder().method,
    "amethod": Holder().amethod,
    "cls_method": Holder.cls_method,
    "scale": scale,
    "builtin_sqrt": builtin_sqrt,
    "partial_add": partial_add,
}
EXPECTED = {
    "plain": 5,
    "coro": 20,
    "gen": [0, 1, 2],
    "agen": [0, 1, 2],
    "static": 3,
    "method": 12,
    "amethod": 6,
    "cls_method": 12,
    "scale": 8,
    "builtin_sqrt": 2.0,
    "partial_add": 6,
}


def _pickled(obj: Any) -> Any:
    return pickle.loads(pickle.dumps(obj))


ROUND_TRIPS = {"pickle": _pickled, "copy": copy.copy, "deepcopy": copy.deepcopy}


def test_the_expected_results_are_those_of_the_decorated_callables() -> None:
    """The table of results the round-trip tests compare with is right to begin with."""
    assert EXPECTED == _targets.run_every_kind(EVERY_KIND)


@pytest.mark.parametrize("how", sorted(ROUND_TRIPS))
@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_by_name_round_trips_give_back_the_same_object(name: str, how: str) -> None:
    """A module-level decorated function of any kind pickles and copies to itself."""
    obj = BY_NAME[name]
    assert obj is ROUND_TRIPS[how](obj)


@pytest.mark.parametrize("how", sorted(ROUND_TRIPS))
@pytest.mark.parametrize("name", sorted(EVERY_KIND))
def test_round_trips_keep_a_working_decorated_callable(name: str, how: str) -> None:
    """Every kind survives pickle, copy and deepcopy, still decorated, with the same result."""
    again = ROUND_TRIPS[how](EVERY_KIND[name])
    with capture(sample_every=1) as cap:
        actual = _targets.run_every_kind({name: again})
    assert {name: EXPECTED[name]} == actual
    assert 1 == len(cap.calls)


@pytest.mark.parametrize("how", sorted(ROUND_TRIPS))
def test_round_trips_of_methods_give_bound_methods(how: str) -> None:
    """A decorated method round-trips to a method of the same function, as undecorated."""
    for method in (Holder().method, Holder.cls_method, Holder().amethod):
        again = ROUND_TRIPS[how](method)
        assert method.__func__ is again.__func__
        assert type(method.__self__) is type(again.__self__)


def test_copies_of_a_callable_instance_are_copies() -> None:
    """copy/deepcopy of a decorated callable instance copy the instance, as undecorated."""
    shallow, deep = copy.copy(scale), copy.deepcopy(scale)
    assert (scale.__wrapped__, scale.__wrapped__) != (shallow.__wrapped__, deep.__wrapped__)
    assert isinstance(deep, Scale)
    scale.factor = 5
    try:
        assert (20, 8, 8) == (scale(4), shallow(4), deep(4))
    finally:
        scale.factor = 2


def test_a_pickled_callable_instance_keeps_its_label() -> None:
    """The label given at decoration survives a by-value round trip."""
    with capture(sample_every=1) as cap:
        _pickled(scale)(1)
    assert ["scale"] == [c.label for c in cap.calls]


@pytest.mark.timeout(120)
def test_spawn_process_runs_decorated_targets() -> None:
    """A spawn child runs a decorated target sent decorated callables of every kind."""
    ctx = multiprocessing.get_context("spawn")
    results: Any = ctx.Queue()
    child = ctx.Process(target=_targets.spawn_target, args=(EVERY_KIND, results))
    child.start()
    try:
        actual = results.get(timeout=90)
    except queue.Empty:
        actual = None
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()
            child.join()
    assert EXPECTED == actual
    assert 0 == child.exitcode


def test_decorating_twice_pickles_too() -> None:
    """A profkit wrapper around a profkit wrapper (a label added later) still round-trips."""
    relabelled = profkit.profiled("again")(scale)
    assert 8 == _pickled(relabelled)(4)
