"""An exporter stuck in a flush, flushes from many threads, and the timeout an exporter is
handed: a window counted dropped is never delivered after all, callers flushing at once all
get the flush's answer, a stuck flush gets no healthy exporter blamed, and "wait as long as
it takes" reaches an exporter as a number it can use."""

from __future__ import annotations

import math
import threading
import time

import pytest
from fresh_interpreter import run_fresh

import profkit
from profkit import WindowSummary


@profkit.profiled("work")
def work() -> int:
    return 1


#: every call sampled, from the first, no rate cap
SETTINGS: dict[str, object] = {"sample_every": 1, "cold_calls": 0, "max_per_minute": None}


class GatedFlush:
    """An exporter whose flush blocks until ``gate`` is set (a collector that hangs)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.calls = 0
        self.flushes = 0

    def export(self, summary: WindowSummary) -> None:
        self.calls += len(summary.calls)

    def force_flush(self, timeout: float = 5.0) -> bool:
        self.flushes += 1
        self.entered.set()
        return self.gate.wait(30)


def _settled(deadline_s: float = 20.0) -> dict[str, object]:
    """stats() once every sampled call is exported or dropped."""
    end = time.monotonic() + deadline_s
    while True:
        stats = profkit.stats()
        if stats["sampled"] == stats["exported"] + stats["dropped"] or time.monotonic() > end:
            return stats
        time.sleep(0.02)


def test_a_window_dropped_behind_a_stuck_flush_is_never_delivered() -> None:
    exporter = GatedFlush("stuck")
    profkit.configure(**SETTINGS, exporters=(), extra_exporters=(exporter,), export_timeout=0.2)  # type: ignore[arg-type]
    try:
        work()
        assert 1 == _settled()["exported"]  # (exported before the short flush, however busy)
        assert profkit.force_flush(0.3) is False  # the exporter's flush hangs
        for _ in range(4):
            work()
        stats = _settled()
        assert 5 == stats["sampled"]
        assert 4 == stats["dropped"], stats
        assert 4 == stats["dropped_reasons"].get("export_timeout:stuck"), stats["dropped_reasons"]
    finally:
        exporter.gate.set()  # the collector comes back
    assert profkit.force_flush(10.0) is False  # it runs, but windows were lost since the last
    assert profkit.force_flush(10.0) is True
    stats = profkit.stats()
    assert (1, 4) == (stats["exported"], stats["dropped"])
    assert 1 == exporter.calls  # a window counted dropped was not delivered after all


def test_callers_flushing_at_once_all_get_the_flushs_answer() -> None:
    exporter = GatedFlush("slow")
    profkit.configure(**SETTINGS, exporters=(), extra_exporters=(exporter,))  # type: ignore[arg-type]
    work()
    results: dict[int, bool] = {}

    def flush(i: int) -> None:
        results[i] = profkit.force_flush(30.0)

    first = threading.Thread(target=flush, args=(0,))
    first.start()
    assert exporter.entered.wait(10)
    others = [threading.Thread(target=flush, args=(i,)) for i in range(1, 4)]
    for t in others:
        t.start()
    time.sleep(0.2)  # (not a timing assertion: the others are waiting, or not yet there)
    assert {} == {i: r for i, r in results.items() if i}  # none answered before the flush
    exporter.gate.set()
    for t in [first, *others]:
        t.join(30)
    assert {0: True, 1: True, 2: True, 3: True} == results
    assert {} == profkit.stats()["error_reasons"]


def test_a_stuck_flush_gets_no_other_exporter_blamed() -> None:
    stuck, healthy = GatedFlush("stuck"), GatedFlush("healthy")
    healthy.gate.set()
    profkit.configure(**SETTINGS, exporters=(), extra_exporters=(stuck, healthy))  # type: ignore[arg-type]
    try:
        work()
        assert 1 == _settled()["exported"]  # (exported before the short flush, however busy)
        assert profkit.force_flush(0.5) is False
        reasons = profkit.stats()["error_reasons"]
        assert 1 == reasons.get("flush_timeout:stuck"), reasons
        assert "flush_timeout:healthy" not in reasons, reasons
        assert 1 == healthy.flushes
    finally:
        stuck.gate.set()


@pytest.mark.parametrize("how", ["force_flush", "shutdown"])
def test_waiting_as_long_as_it_takes_reaches_an_exporter_as_a_usable_number(how: str) -> None:
    seen: list[float] = []

    class LockedFlush:
        name = "locked"

        def export(self, summary: WindowSummary) -> None:
            pass

        def force_flush(self, timeout: float = 5.0) -> bool:
            seen.append(timeout)
            return threading.Lock().acquire(timeout=timeout)  # OverflowError past TIMEOUT_MAX

        def shutdown(self, timeout: float = 5.0) -> None:
            seen.append(timeout)
            threading.Lock().acquire(timeout=timeout)

    profkit.configure(**SETTINGS, exporters=(), extra_exporters=(LockedFlush(),))  # type: ignore[arg-type]
    work()
    assert getattr(profkit, how)(None) is True
    assert seen
    assert all(math.isfinite(t) and t > 0 for t in seen), seen
    assert {} == profkit.stats()["error_reasons"]


class KeywordOnlyFlush:
    name = "kwonly"

    def __init__(self) -> None:
        self.timeouts: list[float] = []

    def export(self, summary: WindowSummary) -> None:
        pass

    def force_flush(self, *, timeout: float = 5.0) -> bool:
        self.timeouts.append(timeout)
        return True


def test_a_keyword_only_timeout_is_passed_by_keyword() -> None:
    exporter = KeywordOnlyFlush()
    profkit.configure(**SETTINGS, exporters=(), extra_exporters=(exporter,))  # type: ignore[arg-type]
    work()
    assert profkit.force_flush(5.0) is True
    assert 1 == len(exporter.timeouts)
    assert 0 < exporter.timeouts[0] <= 5.0


class AsyncExporter:
    name = "async"

    def __init__(self) -> None:
        self.delivered = 0

    async def export(self, summary: WindowSummary) -> None:  # no one would ever run it
        self.delivered += 1


@pytest.mark.filterwarnings("error::RuntimeWarning")  # (no "never awaited" left behind)
def test_an_async_def_exporter_is_an_error_not_a_delivery() -> None:
    exporter = AsyncExporter()
    profkit.configure(**SETTINGS, exporters=(), extra_exporters=(exporter,))  # type: ignore[arg-type]
    work()
    assert profkit.force_flush(5.0) is False
    stats = profkit.stats()
    assert (0, 1) == (stats["exported"], stats["dropped"])
    assert 1 == stats["dropped_reasons"].get("export_error:async"), stats["dropped_reasons"]
    assert 0 == exporter.delivered


class FailingShutdown:
    def __init__(self, name: str, hang: bool) -> None:
        self.name = name
        self.hang = hang
        self.release = threading.Event()

    def export(self, summary: WindowSummary) -> None:
        pass

    def shutdown(self, timeout: float) -> None:
        if self.hang:
            self.release.wait(30)
        else:
            raise ConnectionError("could not send the last batch")


@pytest.mark.parametrize("hang", [False, True], ids=["raises", "hangs"])
def test_an_exporter_whose_shutdown_fails_makes_shutdown_false(hang: bool) -> None:
    exporter = FailingShutdown("closing", hang)
    profkit.configure(**SETTINGS, exporters=(), extra_exporters=(exporter,))  # type: ignore[arg-type]
    try:
        work()
        assert profkit.shutdown(0.5) is False
        kind = "timeout" if hang else "error"
        assert 1 == profkit.stats()["error_reasons"].get(f"shutdown_{kind}:closing")
    finally:
        exporter.release.set()


def test_a_flush_overlapping_a_shutdown_that_drops_its_window_says_false() -> None:
    entered, release = threading.Event(), threading.Event()

    class Slow:
        name = "slow"

        def export(self, summary: WindowSummary) -> None:
            entered.set()
            release.wait(30)

    profkit.configure(**SETTINGS, exporters=(), extra_exporters=(Slow(),), export_timeout=30)  # type: ignore[arg-type]
    try:
        work()
        assert entered.wait(10)
        results: dict[str, bool] = {}
        flusher = threading.Thread(
            target=lambda: results.setdefault("flush", profkit.force_flush(30))
        )
        flusher.start()
        results["shutdown"] = profkit.shutdown(0.3)  # gives up on the window in export
        flusher.join(30)
    finally:
        release.set()
    assert {"flush": False, "shutdown": False} == results
    assert {"shutdown": 1} == profkit.stats()["dropped_reasons"]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("what", ["raise", "flush"])
def test_a_signal_at_any_line_of_a_runner_leaves_it_working(what: str) -> None:
    """A handler that raises (Ctrl-C) or flushes, landing at each line of the runner's
    submit and wait: the runner's state stays whole (a job half-queued wedged it for good; a
    handler joining a job never queued, or one cancelled, waited its whole timeout, for ever
    with None, or made the caller's flush raise ValueError)."""
    rc, report, err = run_fresh("runner_signal_every_line", what, timeout=280)
    assert rc == 0, err[-3000:]
    assert [] == report["key_missed"]  # the lines where it wedged were among those hit
    assert [] == report["failures"]
    assert report["shutdown"] is True
