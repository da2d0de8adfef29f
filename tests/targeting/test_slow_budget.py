"""Speculation paid from the CPU budget (issue 37, item 3): ``max_per_minute`` caps the
profiles exported, not the speculative windows that are released unread; those are paid
from ``max_overhead`` (or, with none set, a default budget of their own).

Count-based: which calls were slow is known from the plan (a flag in a region's attributes),
the slow ones are ~10x the fast ones, and the floors are generous (the machine is busy).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import pytest
import torch

import profkit
from profkit._capture.gate import SPECULATION_BUDGET
from profkit._overhead import CpuMeter
from profkit.testing import Capture, capture

CALLS = 600


def _handler(label: str = "predict", sleep_ms: float = 0.0) -> profkit.profiled:
    """A ~2 ms handler of real torch ops; a slow call adds ~20 ms of ``tanh`` (or sleeps
    ``sleep_ms``)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)
    )
    x = torch.randn(64, 256)
    big = torch.randn(512, 512)
    with torch.inference_mode():
        per_forward = _seconds(lambda: model(x))
        per_tanh = _seconds(lambda: torch.tanh(big))
    forwards = max(1, min(40, round(0.002 / per_forward)))
    tanhs = max(4, min(400, round(0.020 / per_tanh)))

    def body(i: int, slow: bool) -> int:
        with profkit.region("forward", call=i, slow=slow), torch.inference_mode():
            for _ in range(forwards):
                model(x)
            if slow and sleep_ms:
                time.sleep(sleep_ms / 1e3)
            elif slow:
                for _ in range(tanhs):
                    torch.tanh(big)
        return i

    return profkit.profiled(label)(body)


def _seconds(op: Callable[[], object]) -> float:
    """The fastest of five runs of ``op`` (seconds; at least 10 µs)."""
    op()
    best = 1.0
    for _ in range(5):
        t0 = time.perf_counter()
        op()
        best = min(best, time.perf_counter() - t0)
    return max(1e-5, best)


def _plan(calls: int, every: int, seed: int) -> list[bool]:
    rng = random.Random(seed)
    first = rng.randrange(every)
    return [i % every == first for i in range(calls)]


def _kept(cap: Capture, label: str) -> list[tuple[int, bool, int]]:
    """(call, slow, op rows) of each call kept as slow."""
    out = []
    for c in cap.calls:
        if c.policy == "slow" and c.label == label:
            attrs = c.scopes[1].attributes
            rows = sum(len(s.ops) for s in c.scopes)
            out.append((int(attrs["call"]), bool(attrs["slow"]), rows))
    return out


@pytest.mark.usefixtures("one_thread")
def test_speculation_is_not_capped_by_max_per_minute() -> None:
    """slow_ms=8, max_overhead=0.5, the default max_per_minute, one thread, 600 calls of a
    ~2 ms handler, 1 in 40 ~20 ms: most slow calls are kept with their op rows, and the
    calls kept are slow (the speculative windows used to share the rate cap: 1 of 15)."""
    handler = _handler()
    plan = _plan(CALLS, 40, 37)
    with capture(
        capture_slow=True, slow_ms=8.0, max_overhead=0.5, max_per_minute=60.0, exporters=()
    ) as cap:
        for i, slow in enumerate(plan):
            handler(i, slow)
    kept = _kept(cap, "predict")
    slow_after_warmup = [i for i, s in enumerate(plan) if s and i >= 40]
    caught = {i for i, slow, rows in kept if slow and rows > 0 and i >= 40}
    assert len(caught) >= 0.8 * len(slow_after_warmup), (len(caught), str(cap.stats))
    assert sum(slow for _, slow, _ in kept) >= 0.95 * len(kept), (kept, cap.stats)
    assert cap.stats["speculative"] > 60, cap.stats  # more than the rate cap's windows' worth


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_one_off_labels_do_not_starve_a_steady_label() -> None:
    """300 one-off region labels, then a steady label whose 1 call in 20 sleeps 30 ms: at
    least half its slow calls are kept (1 of 30 before)."""
    plan = _plan(CALLS, 20, 38)
    steady = _handler("steady", sleep_ms=30.0)

    with capture(  # the production defaults (the tests' own turn cold calls off)
        capture_slow=True,
        slow_ms=8.0,
        max_overhead=0.5,
        max_per_minute=60.0,
        cold_calls=3,
        exporters=(),
    ) as cap:
        for i in range(300):
            with profkit.region(f"/items/{i}"):
                torch.ones(4).sum()
        for i, slow in enumerate(plan):
            steady(i, slow)
    kept = _kept(cap, "steady")
    slow_calls = [i for i, s in enumerate(plan) if s and i >= 20]
    caught = {i for i, slow, _ in kept if slow and i >= 20}
    assert len(caught) >= 0.5 * len(slow_calls), (
        len(caught),
        len(slow_calls),
        str(cap.stats),
        kept,
    )
    assert sum(slow for _, slow, _ in kept) >= 0.9 * len(kept), (kept, cap.stats)


def test_slow_profiles_exported_are_capped_by_max_per_minute() -> None:
    """One call in four slow, no budget to speak of: speculative windows open freely, and
    the profiles exported stay within max_per_minute (a full bucket of 3, plus its refills);
    the slow calls past it are released, counted ``skipped_rate_limit``."""

    @profkit.profiled("sleepy")
    def sleepy(ms: float) -> None:
        time.sleep(ms / 1e3)

    t0 = time.monotonic()
    with capture(
        sample_every=10**9,
        capture_slow=True,
        slow_ms=5.0,
        max_overhead=1.0,  # (sleeping calls: profkit's share of the process is high)
        max_per_minute=3,
        exporters=(),
    ) as cap:
        for i in range(200):
            sleepy(12.0 if i % 4 == 3 else 1.0)
    refilled = int((time.monotonic() - t0) / 60 * 3) + 1
    slow = [c for c in cap.calls if c.policy == "slow"]
    windows = {c.window_id for c in slow}
    assert 1 <= len(windows), str(cap.stats)
    # (the sampler's first call took a token too)
    assert len(windows) + 1 <= 3 + refilled, (len(windows), str(cap.stats))
    counts = cap.stats["slow_calls"]["sleepy"]
    assert len(slow) == counts["kept"], str(cap.stats)
    assert cap.stats["skipped_rate_limit"] >= 1, str(cap.stats)  # the rest: counted


@pytest.mark.parametrize(("share", "opens"), [(0.009, True), (0.011, False)])
def test_with_no_max_overhead_speculation_is_paid_from_one_percent(
    monkeypatch: pytest.MonkeyPatch, share: float, opens: bool
) -> None:
    """No max_overhead: speculative windows open while profkit's CPU share is under 1% of
    the process's (SPECULATION_BUDGET, measured in docs/targeted-capture.md), none past it."""
    monkeypatch.setattr(CpuMeter, "budget_share", lambda self, budget: share)

    @profkit.profiled("quick")
    def quick() -> None:
        time.sleep(0.0005)

    with capture(sample_every=10**9, capture_slow=True, max_overhead=None, exporters=()) as cap:
        for _ in range(60):
            quick()
    assert 0.01 == SPECULATION_BUDGET
    assert opens == (cap.stats["speculative"] > 0), cap.stats
