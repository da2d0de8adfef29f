"""Samplers: exact counts, trace-id consistency, the rate cap, and trigger()."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

import profkit
from profkit._sampling import (
    COLD,
    EveryN,
    RateLimiter,
    TraceIdRatio,
    Triggered,
    trace_id_bound,
)


def test_every_n_samples_first_and_every_nth() -> None:
    """EveryN(4) picks calls 0, 4, 8, ... of a label's 12."""
    picks = EveryN(4).picks()
    assert [0, 4, 8] == [i for i in range(12) if next(picks) is True]


@given(n=st.integers(1, 50), calls=st.integers(0, 500))
def test_every_n_count_is_exact(n: int, calls: int) -> None:
    """EveryN(n) over `calls` calls of a label samples exactly ceil(calls / n)."""
    picks = EveryN(n).picks()
    assert math.ceil(calls / n) == sum(next(picks) is True for _ in range(calls))


@given(n=st.sampled_from([2, 7, 256, 257, 5000]), cold=st.integers(0, 20))
def test_every_n_cold_calls_first_then_every_nth(n: int, cold: int) -> None:
    """With ``cold``: the first ``cold`` answers are COLD, then calls cold, cold+N, ... (a
    cycle up to N=256, a count past it: the same answers)."""
    picks = EveryN(n, cold=cold).picks()
    answers = [next(picks) for _ in range(cold + 2 * n + 1)]
    assert answers[:cold] == [COLD] * cold
    assert [i for i, a in enumerate(answers) if a is True] == [cold, cold + n, cold + 2 * n]


def test_every_call_is_never_cold() -> None:
    """sample_every=1 and sample_rate=1.0 mean every call: the cold rule does not apply."""
    assert next(EveryN(1, cold=5).picks()) is True
    assert next(TraceIdRatio(1.0, cold=5).picks()) is not COLD
    assert next(TraceIdRatio(0.5, cold=5).picks()) is COLD


def test_ratio_uses_trace_id_like_otel() -> None:
    """The decision is low64(trace_id) < rate * 2**64, as OTel's TraceIdRatioBased."""
    s = TraceIdRatio(0.25)
    bound = trace_id_bound(0.25)
    assert s.decide((7 << 64) | (bound - 1))
    assert not s.decide((7 << 64) | bound)


@given(rate=st.floats(0, 1), trace_id=st.integers(1, (1 << 128) - 1))
def test_two_sessions_decide_identically_for_a_trace(rate: float, trace_id: int) -> None:
    """Two independent samplers (two processes) agree for every trace id."""
    a = TraceIdRatio(rate, rng=random.Random(1).random)
    b = TraceIdRatio(rate, rng=random.Random(2).random)
    assert a.decide(trace_id) == b.decide(trace_id)


def test_ratio_without_trace_uses_injected_rng() -> None:
    """With no active trace the injected RNG decides."""
    values = iter([0.05, 0.5, 0.09, 0.99])
    s = TraceIdRatio(0.1, rng=lambda: next(values))
    assert [True, False, True, False] == [s.decide(None) for _ in range(4)]


@given(rate=st.floats(0, 1), seed=st.integers(0, 1000))
def test_ratio_extremes(rate: float, seed: int) -> None:
    """Rate 0 never samples, rate 1 always does, for traces and for the RNG."""
    rng = random.Random(seed)
    tid = rng.getrandbits(128) | 1
    assert not TraceIdRatio(0.0).decide(tid)
    assert TraceIdRatio(1.0).decide(tid)
    assert TraceIdRatio(rate, rng=lambda: 0.0).decide(None) == (rate > 0)


def test_rate_limiter_caps_and_refills() -> None:
    """60/min allows a burst of 60, then one more per second of the injected clock."""
    now = [0.0]
    limiter = RateLimiter(60, clock=lambda: now[0])
    assert 60 == sum(limiter.allow() for _ in range(100))
    now[0] = 1.0
    assert [True, False] == [limiter.allow(), limiter.allow()]


def test_triggered_counts_down() -> None:
    """trigger(n) grants exactly n overrides."""
    t = Triggered()
    t.add(2)
    assert [True, True, False] == [t.take(), t.take(), t.take()]
    assert 0 == t.pending


def test_a_trigger_for_another_label_costs_other_calls_no_lock() -> None:
    """trigger(1, label="typo") leaves pending set; calls of other labels must not take the
    lock from then on (every root call would)."""
    import threading

    from profkit._sampling import Triggered

    trig = Triggered()
    trig.add(1, "typo")
    assert trig.pending
    results: list[bool] = []
    with trig._lock:  # held: a take() that locks would wait here
        t = threading.Thread(target=lambda: results.append(trig.take("predict")))
        t.start()
        t.join(2)
        assert results == [False]
    assert trig.take("typo")
    assert not trig.pending
    trig.signalled()  # a signal's trigger applies to any label: the lock path again
    assert trig.take("predict")


@pytest.mark.parametrize("bad", [{"n": -1}, {"n": "3"}, {"n": True}, {"n": 1, "label": 7}])
def test_trigger_checks_its_arguments_with_a_session_or_without(bad: dict[str, object]) -> None:
    """trigger()'s ValueError does not depend on whether profkit is configured yet: code
    that passes the wrong thing learns it in a test run without a session too."""
    with pytest.raises(ValueError, match="trigger"):
        profkit.trigger(**bad)  # type: ignore[arg-type]
    profkit.configure(sample_every=10**9, exporters=())
    with pytest.raises(ValueError, match="trigger"):
        profkit.trigger(**bad)  # type: ignore[arg-type]
    profkit.shutdown()
    with pytest.raises(ValueError, match="trigger"):
        profkit.trigger(**bad)  # type: ignore[arg-type]


def test_trigger_says_how_many_it_added() -> None:
    """At most 1000 pending: the return value says how many of ``n`` were added (0 with no
    session to profile them)."""
    assert 0 == profkit.trigger(5)
    profkit.configure(sample_every=10**9, exporters=())
    assert 990 == profkit.trigger(990)
    assert 10 == profkit.trigger(50, label="x")
    assert 0 == profkit.trigger(1)
    profkit.configure(enabled=False)
    assert 0 == profkit.trigger(3)  # calls run plain: nothing will take them
    profkit.shutdown()
