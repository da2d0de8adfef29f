"""Serving patterns: streams that hop threads, long-open windows, signal timeouts, the user's
own profiler mid-window, shutdowns with hung exporters. Each risky case runs in a fresh
interpreter (as tests/capture/test_exit.py does): a profiler left running crashes the exit.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from fresh_interpreter import run_fresh

import profkit
from profkit.testing import capture

pytestmark = pytest.mark.timeout(240)


@pytest.mark.slow
def test_streams_through_iterate_in_threadpool_leave_no_profiler_behind() -> None:
    """60 concurrent sampled streams via Starlette's threadpool: no thread keeps a profiler."""
    rc, report, err = run_fresh("serving_threadpool_streams")
    assert 0 == rc, err[-3000:]
    assert [list(range(8))] * 60 == report["out"]
    assert [False] * 40 == report["probes"]  # no pool thread has a profiler on
    assert report["flag"] is False
    assert report["flushed"]
    assert report["calls"], "some streams were sampled"
    for ops, truncated in report["calls"]:
        assert ops > 0 or truncated, "an exported call has ops or says why not"
    assert all(truncated == "first_step" for _, truncated in report["calls"])
    assert "Profiler is already enabled" not in err


@pytest.mark.slow
def test_long_open_stream_is_cut_short_without_stalling_the_loop() -> None:
    """A 3 s sampled stream on a busy loop: stopped at max_window_s, the loop never held up.

    The loop's thread spends under 0.5 s of CPU in any one 5 ms beat (CPU time: another
    process's load stretches a beat's wall time, not that); and no beat comes back later than
    the stream's own length, which a loop blocked by the window would (a deadline, not a
    latency figure).
    """
    rc, report, err = run_fresh("serving_long_open_stream")
    assert 0 == rc, err[-3000:]
    assert report["stall_cpu"] < 0.5, report
    assert report["stall"] < 3.0, report
    assert report["grew"] < 150 * 1024 * 1024, report
    assert 1 == len(report["truncated"])
    assert report["truncated"][0] in ("max_window_s", "busy_thread")
    assert report["ops"][0] > 0


@pytest.mark.slow
def test_signal_timeouts_always_reach_the_caller_and_sampling_goes_on() -> None:
    """1,500 calls hit by random SIGALRM timeouts: each timeout raised, then 50 clean samples."""
    rc, report, err = run_fresh("serving_signal_timeouts")
    assert 0 == rc, err[-3000:]
    _no_half_done_session(err)
    assert report["fired"] > 500  # the timers did hit
    assert report["fired"] == report["caught"]  # every timeout reached the caller
    assert 50 == report["sampled"]
    assert 50 == report["exported"]
    assert "None" == report["frame"]
    assert report["enabled"] is False
    assert report["flag"] is False
    assert report["shut"]


def _storm_rows_hold(rows: list[dict[str, Any]], fleet: bool = False) -> None:
    """Each storm: every timeout reached the caller, every sampled call one outcome."""
    for row in rows:
        assert row["fired"] >= 1500, row  # the timers did hit, as often as asked
        assert row["fired"] == row["caught"], row["lost_at"]  # every timeout reached the caller
        assert row["sampled"] == row["outcomes"], row  # exported, dropped or skipped: once
        assert row["exported"] == row["captured"], row  # exported means the exporter has it
        # a speculative call is released or kept as slow, or lost with its window (counted)
        lost = row["dropped"].get("interrupted", 0)
        assert row["released"] + row["slow"] <= row["speculative"], row
        assert row["speculative"] <= row["released"] + row["slow"] + lost, row
        assert row["root_calls"] <= row["calls"], row
        assert {} == row["errors"], row  # a timeout is the application's, not profkit's error
        assert row["enabled"] is False, row  # no profiler left on
        # a timeout landing on the first instruction of a root batch()'s __exit__ (before any
        # of it runs) leaves that context inside the unsampled call: a known limit
        # (docs/reliability.md, "Signals and the counters"); the storms without batches
        # never leave a frame behind
        assert row["frame"] in (("None",) if not fleet else ("None", "<profkit unsampled>")), row


@pytest.mark.slow
def test_a_storm_of_1500_timeouts_under_capture_slow_leaves_counters_that_add_up() -> None:
    """1,500 random SIGALRM timeouts over fast and slow calls, capture_slow on and the
    sampler picking too: every timeout raised to the caller, every call counted once."""
    rc, report, err = run_fresh("serving_signal_storm_slow", "11", "1500", "function", "1")
    assert 0 == rc, err[-3000:]
    _storm_rows_hold(report["rows"])
    _no_half_done_session(err)


#: what torch logs at a stop that finds kineto with no session: the profiler was enabled
#: unprepared or a prepared session was left behind, the states in which torch 2.13 crashes
#: the process at a later start or stop (SIGSEGV in CI on 186adbd, in this file's storms)
HALF_DONE = "disableProfiler called but no active profiling session"


def _no_half_done_session(err: str) -> None:
    """No timeout left kineto half started or half stopped: profkit holds signals while
    torch's profiler starts and stops (on 186adbd a storm logged 38-1,608 of these)."""
    assert HALF_DONE not in err, f"{err.count(HALF_DONE)}x: {err[-1500:]}"


@pytest.mark.slow
def test_ten_storms_with_both_cores_busy_lose_no_timeout() -> None:
    """10 storms of 1,500 timeouts while two processes keep both cores busy, the handler a
    function, a functools.partial or a callable object in turn, through batches and metrics
    too: no timeout is lost. (On
    0.2 a partial's or an object's timeout landing in the profiler's start or stop was
    swallowed as profkit's internal error: `_errors.foreign` knew functions only.)"""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        rc, report, err = run_fresh(
            "serving_signal_storm_slow", "12", "1500", "mixed", "10", "fleet", timeout=1500
        )
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert 0 == rc, err[-3000:]
    assert 10 == len(report["rows"])
    _storm_rows_hold(report["rows"], fleet=True)
    _no_half_done_session(err)


@pytest.mark.slow
def test_users_profiler_started_mid_window_on_another_thread() -> None:
    """The user's torch profiler waits for profkit's window on another thread: no crash."""
    rc, report, err = run_fresh("serving_user_profiler_mid_window")
    assert 0 == rc, err[-3000:]
    assert 1 == report["user_ops"]  # the user's profiler kept its events
    # the window stopped at its next checkpoint, not at the call's end: the user's profiler
    # started a few of the call's steps after it asked (steps, not seconds: a busy machine
    # slows both threads alike)
    assert report["started_at_step"] < report["steps"] == 400, report
    assert report["started_at_step"] - report["requested_at_step"] <= 100, report
    assert ["foreign_profiler"] == report["truncated"]


def test_users_profiler_inside_a_sampled_call_drops_it_with_a_reason() -> None:
    """The user's profiler nested in a sampled call empties profkit's window: dropped, why."""

    @profkit.profiled("outer")
    def outer() -> float:
        with torch_profiler() as prof:
            value = float(torch_ones().add_(1).sum())
        assert prof.events()  # the user's own profile is intact
        return value

    with capture(sample_every=1) as cap:
        assert 18.0 == outer()
    assert [] == cap.calls
    assert {"foreign_profiler": 1} == cap.stats["dropped_reasons"]
    assert 0 == cap.stats["exported"]


def torch_profiler() -> object:
    import torch

    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])


def torch_ones() -> object:
    import torch

    return torch.ones(3, 3)


class _Hung(profkit.exporters.Exporter):
    """An exporter whose every call hangs for ``hang`` seconds."""

    name = "hung"

    def __init__(self, hang: float) -> None:
        self.hang = hang

    def export(self, summary: object) -> None:
        time.sleep(self.hang)

    def force_flush(self, timeout: float = 5.0) -> bool:
        time.sleep(self.hang)
        return True

    def shutdown(self, timeout: float = 5.0) -> None:
        time.sleep(self.hang)


def _profkit_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("profkit-")}


def test_no_thread_outlives_shutdowns_with_hung_exporters() -> None:
    """Six configure/shutdown cycles with hung exporters: every profkit thread then exits."""

    @profkit.profiled("call")
    def call() -> int:
        return 1

    hang = 1.0
    before = _profkit_threads()
    for _ in range(6):
        profkit.configure(sample_every=1, exporters=(), extra_exporters=(_Hung(hang),))
        assert 1 == call()
        assert not profkit.shutdown(timeout=0.2)
    deadline = time.monotonic() + hang + 60.0  # a poll: on a busy machine threads end late
    while _profkit_threads() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [] == sorted(t.name for t in _profkit_threads() - before)
