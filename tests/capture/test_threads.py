"""Many threads, one process-wide window: no deadlock, no mixed samples, counters that add up."""

from __future__ import annotations

import math
import threading

import pytest
import torch

import profkit
from profkit._global import get_session
from profkit.testing import capture

THREADS = 16
CALLS_PER_THREAD = 60
EVERY = 7
TRIGGERED = 5
#: every reason a sampled decision is turned away before a window opens (part of unsampled;
#: StatsSnapshot, docs/reliability.md "Counters that add up")
REFUSED = ("skipped_backlog", "skipped_budget", "skipped_rate_limit")


@profkit.profiled("mm_handler")
def mm_handler(x: torch.Tensor) -> float:
    """Matmuls only."""
    for _ in range(3):
        x = torch.mm(x, x)
    return float(x.sum())


@profkit.profiled("softmax_handler")
def softmax_handler(x: torch.Tensor) -> float:
    """Softmaxes only."""
    for _ in range(3):
        x = torch.softmax(x, dim=1)
    return float(x.sum())


def _op_names(call: profkit.CallSummary) -> set[str]:
    return {row.name for scope in call.scopes for row in scope.ops}


def _run_threads(errors: list[BaseException]) -> None:
    barrier = threading.Barrier(THREADS)

    def work(i: int) -> None:
        try:
            x = torch.full((8, 8), 0.01)
            fn = mm_handler if i % 2 == 0 else softmax_handler
            expected = fn.__wrapped__(x)
            for _ in range(CALLS_PER_THREAD):
                barrier.wait(30)  # lockstep rounds: both kinds stay in play to the end
                assert expected == fn(x)
        except BaseException as exc:
            errors.append(exc)

    names = ("mm" if i % 2 == 0 else "softmax" for i in range(THREADS))
    threads = [
        threading.Thread(target=work, args=(i,), name=f"{kind}-{i}") for i, kind in enumerate(names)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [] == [t.name for t in threads if t.is_alive()]


@pytest.mark.timeout(120)
def test_sixteen_threads_each_sample_holds_only_its_threads_ops() -> None:
    """A matmul handler's sample has no softmax and vice versa, over many windows."""
    errors: list[BaseException] = []
    with capture(sample_every=EVERY, top_k=50) as cap:
        profkit.trigger(TRIGGERED)
        _run_threads(errors)
    assert [] == errors
    assert len(cap.calls) >= 20
    assert {"mm_handler", "softmax_handler"} == {call.label for call in cap.calls}
    for call in cap.calls:
        names = _op_names(call)
        assert call.attribution == "thread"
        if call.label == "mm_handler":
            assert call.thread_name.startswith("mm-")
            assert "aten::mm" in names
            assert set() == {n for n in names if "softmax" in n}
        else:
            assert call.thread_name.startswith("softmax-")
            assert {"aten::softmax", "aten::_softmax"} <= names
            assert "aten::mm" not in names


@pytest.mark.timeout(120)
def test_sixteen_threads_counters_reconcile() -> None:
    """Every root call is counted once and every sampled call ends in exactly one bucket."""
    errors: list[BaseException] = []
    with capture(sample_every=EVERY) as cap:
        session = get_session()
        assert session is not None
        profkit.trigger(TRIGGERED)
        _run_threads(errors)
    stats = cap.stats
    roots = THREADS * CALLS_PER_THREAD
    # each label's sampler is exact over all its calls: ceil(calls / N) picks per label. A
    # trigger takes a call whatever its pick was: a call both picked and triggered is
    # profiled once (as a trigger), so the calls profiled or refused are the picks plus at
    # most the triggers taken. A pick can still be refused before its window opens (on a
    # busy machine the queue fills: skipped_backlog); a refused pick is unsampled
    taken = TRIGGERED - session.triggered.pending
    picks = 2 * math.ceil(roots / 2 / EVERY)  # two labels, half of the calls each
    refused = sum(stats[reason] for reason in REFUSED)
    assert [] == errors
    assert roots == stats["root_calls"]
    assert picks <= stats["sampled"] + refused <= picks + taken
    assert refused <= stats["unsampled"]
    assert 0 == stats["warmup_calls"]
    assert (0, 0) == (stats["skipped_unsampled_trace"], stats["speculative_released"])
    assert stats["root_calls"] == stats["sampled"] + stats["unsampled"]
    assert stats["sampled"] == (
        stats["exported"] + stats["dropped"] + stats["skipped_busy"] + stats["skipped_foreign"]
    )
    assert stats["windows"] == stats["exported"] + stats["dropped"]
    assert len(cap.calls) == stats["exported"]
    assert stats["skipped_busy"] > 0  # the threads really did contend for the one window
    assert 0 == stats["errors"]


@pytest.mark.timeout(120)
def test_threads_with_warmup_and_multi_call_windows_reconcile() -> None:
    """With warm-up calls and 3-call windows the buckets still add up to the root calls."""
    errors: list[BaseException] = []
    with capture(sample_every=EVERY, window=3, warmup=1) as cap:
        session = get_session()
        assert session is not None
        _run_threads(errors)
    # a window whose thread exited before it filled is let go of (and counted) at shutdown
    stats = session.stats.snapshot()
    assert [] == errors
    assert THREADS * CALLS_PER_THREAD == stats["root_calls"]
    assert stats["root_calls"] == stats["sampled"] + stats["warmup_calls"] + stats["unsampled"]
    assert stats["warmup_calls"] == stats["windows"]
    assert stats["sampled"] == (
        stats["exported"] + stats["dropped"] + stats["skipped_busy"] + stats["skipped_foreign"]
    )
    assert len(cap.calls) == stats["exported"]
    assert {call.policy for call in cap.calls} >= {"window"}
    for call in cap.calls:
        names = _op_names(call)
        bad = "softmax" if call.label == "mm_handler" else "aten::mm"
        assert set() == {n for n in names if bad in n}
