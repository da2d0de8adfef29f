"""Representative samples (issue 21): each label gets its own 1 in N, cold calls are not the
sample (a label's first ``cold_calls`` root calls), and past the label cap the rest share.

These run with the shipped cold default (the suite's conftest turns the cold rule off for
the other tests: ``PROFKIT_COLD_CALLS=0``), unless a test sets ``cold_calls`` itself.
"""

from __future__ import annotations

import collections
import json
import os
import time

import pytest
import torch
from fresh_interpreter import run_fresh

import profkit
from profkit._config import Config
from profkit._report import read, rollup
from profkit._sampling import MAX_LABELS, LabelPicks
from profkit.exporters._rows import call_fields
from profkit.testing import capture

COLD_DEFAULT = Config().cold_calls


@pytest.fixture(autouse=True)
def _shipped_cold_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROFKIT_COLD_CALLS", raising=False)


@profkit.profiled("a")
def route_a() -> float:
    return float(torch.ones(4).sum())


@profkit.profiled("b")
def route_b() -> float:
    return float(torch.ones(4).sum())


def _per_label(calls: list[profkit.CallSummary]) -> dict[str, int]:
    return dict(collections.Counter(c.label for c in calls))


def test_alternating_labels_each_get_their_share() -> None:
    """Two labels in strict alternation at sample_every=10, 200 calls each: 20 +- 2 samples
    of each (one counter for all root calls gave a: 40, b: 0)."""
    with capture(sample_every=10, queue_size=10_000, exporters=()) as cap:
        for _ in range(200):
            route_a()
            route_b()
    counts = _per_label(cap.calls)
    assert 18 <= counts.get("a", 0) <= 22, counts
    assert 18 <= counts.get("b", 0) <= 22, counts


def test_a_rare_label_gets_one_in_n_of_its_own_calls() -> None:
    """A label that is 2% of the traffic (1 call in 50, in phase with N=10): exactly
    ceil((calls - cold) / N) of its own calls are sampled."""
    with capture(sample_every=10, queue_size=10_000, exporters=()) as cap:
        for _ in range(40):
            for _ in range(49):
                route_a()
            route_b()
    counts = _per_label(cap.calls)
    assert counts.get("b", 0) == -(-(40 - COLD_DEFAULT) // 10), counts
    assert counts.get("a", 0) == -(-(40 * 49 - COLD_DEFAULT) // 10), counts
    assert cap.stats["shared_label_calls"] == 0


@pytest.mark.slow
def test_first_call_of_a_fresh_process_is_not_the_sample() -> None:
    """A fresh process, default settings: a label's first call sleeps 80 ms; no sample is
    that call (the sampler used to pick call 0 of every sampler: the cold one)."""
    rc, report, err = run_fresh("cold_first_call", env=dict(os.environ))
    assert rc == 0, err
    assert report["samples"] >= 1, report
    assert all(ms < 80.0 for ms in report["durations_ms"]), report
    assert report["cold_calls"] == COLD_DEFAULT


def test_a_cold_call_profiled_by_a_trigger_says_so() -> None:
    """trigger() profiles a label's first call anyway: it carries profkit.cold=true (span,
    log fields); a later, warm one does not. The report leaves the cold one out."""
    with capture(sample_every=10**9, cold_calls=2) as cap:
        profkit.trigger(1)
        route_a()  # cold: the label's first call
        route_a()
        route_a()  # warm: the sampler's pick (call cold_calls)
    assert [c.cold for c in cap.calls] == [True, False]
    fields = [call_fields(c) for c in cap.calls]
    assert fields[0]["cold"] is True
    assert "cold" not in fields[1]
    roots = [s for s in cap.spans() if s.attributes and "profkit.sampling.policy" in s.attributes]
    assert sorted(bool(s.attributes.get("profkit.cold")) for s in roots) == [False, True]
    lines = [json.dumps({"event": "profkit.profile", **f}) for f in fields]
    samples, _ = read(lines)
    assert [r.samples for r in rollup(samples)] == [1]
    assert [r.samples for r in rollup(samples, include_cold=True)] == [2]


def test_every_call_mode_ignores_the_cold_rule() -> None:
    """sample_every=1 profiles every call, the first one too (the documented choice)."""
    with capture(sample_every=1, exporters=()) as cap:
        for _ in range(3):
            route_a()
    assert len(cap.calls) == 3
    assert not any(c.cold for c in cap.calls)


def test_cold_calls_zero_samples_the_first_call() -> None:
    """cold_calls=0 turns the rule off: call 0, N, 2N... as before."""
    with capture(sample_every=5, cold_calls=0, exporters=()) as cap:
        for _ in range(10):
            route_a()
    assert [c.call_index for c in cap.calls] == [0, 0]
    assert len(cap.calls) == 2


def test_labels_past_the_cap_share_one_counter() -> None:
    """Labels first seen past MAX_LABELS share one counter, counted in stats(): with one
    cold call, the labels with their own counter are never sampled (their one call is
    cold); the shared counter's second call is its first warm one."""
    extra = 5
    with capture(sample_every=10**9, cold_calls=1, exporters=()) as cap:
        for i in range(MAX_LABELS + extra):
            with profkit.region(f"id-{i}"):
                pass
    assert cap.stats["shared_label_calls"] == extra
    assert [c.label for c in cap.calls] == [f"id-{MAX_LABELS + 1}"]


def test_label_picks_bounded() -> None:
    picks = LabelPicks(lambda: iter(range(100)), max_labels=2)
    assert [next(picks.by_label.get(x) or picks.first(x)) for x in "aabcc"] == [0, 1, 0, 0, 1]
    assert len(picks.by_label) == 2


def test_cold_calls_are_not_timed_for_slow_capture() -> None:
    """capture_slow: a label's cold calls are neither timed into its baseline nor judged."""
    with capture(sample_every=10**9, capture_slow=True, cold_calls=3, exporters=()) as cap:
        session = profkit._global.get_session()
        assert session is not None
        for _ in range(3):
            time.sleep(0.001)
            route_a()
        assert session._book is not None
        assert session._book.p50_ms("a") is None
    assert not cap.calls
