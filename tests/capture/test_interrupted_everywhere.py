"""A signal handler's exception at every point of a sampled call where one can land, in turn
(not by chance, as the storms of tests/test_serving.py find them): the exception reaches the
caller, and the process is left as it was: no profiler on, no half-started kineto session, no
window that nobody counts, the frame back to "no call".

On 0.3.0's first cut (54f86d5), 11 of the points, between torch's ``_prepare_profiler`` and
its ``_enable_profiler``, left kineto a prepared session: the next window's stop found none
("disableProfiler called but no active profiling session found"), and under the storms with
both cores busy the process crashed (SIGSEGV in ``record_function``; an enable that no
preparation preceded crashes torch 2.13 at its disable).
"""

from __future__ import annotations

import signal

import pytest
from fresh_interpreter import run_fresh

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGALRM"), reason="needs SIGALRM")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "slow", "batch", "region"])
def test_a_timeout_at_every_point_of_a_sampled_call_leaves_nothing_behind(mode: str) -> None:
    """``sync``: a ``@profiled`` handler with nested regions, every call sampled; ``slow``:
    the same under ``capture_slow`` (speculative windows, the verdict); ``batch``: a
    ``profkit.batch`` of four requests, ``region``: a root ``region()`` (neither at its
    ``__exit__``'s first instruction, the one case docs/reliability.md leaves open)."""
    rc, r, err = run_fresh("interrupted_at_every_line", mode, timeout=600)
    assert rc == 0, err[-3000:]
    # the points reached the decision, the window's start and stop, torch's front-ends
    assert r["positions"] >= 150, r["landed"]
    for where in ("scope.py", "decide.py", "keeper.py", "window.py", "profiler.py"):
        assert r["landed"].get(where, 0) > 0, r["landed"]
    if mode == "slow":
        assert r["landed"].get("slow.py", 0) > 0, r["landed"]
    if mode == "batch":
        assert r["landed"].get("batch.py", 0) > 0, r["landed"]
    assert r["lost"] == []  # every timeout reached the caller
    assert r["left_on"] == []  # no profiler left recording the thread
    assert r["noisy_after"] == []  # no prepared session left for the next window
    assert r["frame_left"] == []  # the next call is a root call again
    assert r["slow_flush"] == []  # no window left that nobody counts
    assert r["failed_after"] == []  # the next calls were profiled and exported
    assert r["wrong"] == 0
    assert r["errors"] == {}  # none of it was taken for profkit's own error
    assert r["flushed"] is True
    assert r["sampled"] == r["outcomes"]  # each sampled call has exactly one outcome
    assert r["odd_drops"] == []  # and a call the timeout cost its profile says so
    assert r["enabled"] is False
