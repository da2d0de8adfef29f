"""Injected faults: the user's function returns what it would have, nothing escapes, all counted.

Each test runs with ``swallow_internal_errors`` (production behaviour: profkit's internal
errors are logged once, counted and contained) unless it is about a fault that is not an
internal error at all.
"""

from __future__ import annotations

import collections
import threading
import time
import types
from typing import Any

import pytest
import torch
import torch.autograd.profiler as autograd_profiler

import profkit
from profkit._capture import window as _window
from profkit._capture.profiler import KINETO_BASE
from profkit._global import get_session
from profkit._summary import raw as _raw
from profkit.testing import CaptureExporter, capture

pytestmark = pytest.mark.timeout(60)

X = torch.full((8, 8), 0.01)


@profkit.profiled("predict")
def predict(x: torch.Tensor) -> float:
    """A small matmul."""
    return float(torch.mm(x, x).sum())


EXPECTED = predict.__wrapped__(X)


class RaisingExporter:
    """An exporter that always fails."""

    name = "boom"

    def export(self, summary: profkit.WindowSummary) -> None:
        raise RuntimeError("exporter down")

    def force_flush(self, timeout: float) -> bool:
        raise RuntimeError("flush down")


class BlockingExporter:
    """An exporter that hangs until released."""

    name = "slow"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()

    def export(self, summary: profkit.WindowSummary) -> None:
        self.entered.set()
        self.release.wait(60)


def _reconciled(stats: dict[str, Any]) -> bool:
    buckets = stats["exported"] + stats["dropped"] + stats["skipped_busy"]
    return bool(stats["sampled"] == buckets + stats["skipped_foreign"])


def _wait_for(predicate: Any, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


@pytest.mark.usefixtures("swallow_internal_errors")
def test_exporter_raises() -> None:
    """A failing exporter is counted; the other exporters still get the call."""
    with capture(sample_every=1, extra_exporters=(RaisingExporter(),)) as cap:
        assert [EXPECTED] * 3 == [predict(X) for _ in range(3)]
        assert profkit.force_flush(5.0) is False  # the failing exporter's flush is reported
    assert 3 == len(cap.calls)
    assert {"export_error:boom": 3} == cap.stats["dropped_reasons"]
    assert 3 == cap.stats["error_reasons"]["export_error:boom"]
    assert _reconciled(cap.stats)


@pytest.mark.slow
@pytest.mark.usefixtures("swallow_internal_errors")
def test_exporter_blocks_past_export_timeout() -> None:
    """A hanging exporter is cut off at export_timeout; requests never wait for it."""
    slow = BlockingExporter()
    try:
        with capture(sample_every=1, export_timeout=0.2, extra_exporters=(slow,)) as cap:
            assert EXPECTED == predict(X)
            assert slow.entered.wait(20)
            assert EXPECTED == predict(X)  # the request path never waits on the exporter
            profkit.force_flush(5.0)
            stats = profkit.stats()
    finally:
        slow.release.set()
    assert 2 == len(cap.calls)  # the capture exporter, on its own thread, got both
    assert 2 == stats["dropped_reasons"]["export_timeout:slow"]
    assert 0 == stats["exported"]
    assert _reconciled(stats)


@pytest.mark.usefixtures("swallow_internal_errors")
def test_profiler_start_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """A profiler that cannot start costs the sample, counted; the next window works."""

    def broken_start(self: _window.Window) -> None:
        raise RuntimeError("profiler start failed")

    with capture(sample_every=1) as cap:
        monkeypatch.setattr(_window.Window, "start", broken_start)
        assert [EXPECTED] * 3 == [predict(X) for _ in range(3)]
        monkeypatch.undo()
        assert EXPECTED == predict(X)
    assert 1 == len(cap.calls)
    assert {"profiler_start_failed": 3} == cap.stats["dropped_reasons"]
    assert 3 == cap.stats["error_reasons"]["profiler_start"]
    assert 1 == cap.stats["windows"]
    assert _reconciled(cap.stats)


@pytest.mark.usefixtures("swallow_internal_errors")
def test_profiler_start_raises_half_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """A start that enabled the profiler and then raised is undone: no profiler left on."""
    real_start = KINETO_BASE.start  # torch's start, as profkit calls it

    def half_start(self: torch.profiler.profile) -> None:
        real_start(self)
        raise RuntimeError("failed after enabling")

    with capture(sample_every=1) as cap:
        monkeypatch.setattr(KINETO_BASE, "start", half_start)
        assert EXPECTED == predict(X)
        monkeypatch.undo()
        assert autograd_profiler._is_profiler_enabled is False
        assert EXPECTED == predict(X)
    assert 1 == len(cap.calls)
    assert {"profiler_start_failed": 1} == cap.stats["dropped_reasons"]
    assert 0 == cap.stats["skipped_foreign"]
    assert _reconciled(cap.stats)


@pytest.mark.usefixtures("swallow_internal_errors")
def test_profiler_stop_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failing stop drops the window, counted; the user's own exception passes unchanged."""
    real_stop = KINETO_BASE.stop  # torch's stop, as profkit calls it

    def broken_stop(self: torch.profiler.profile) -> None:
        real_stop(self)
        raise RuntimeError("profiler stop failed")

    mine = ValueError("the user's own error")

    @profkit.profiled("fails")
    def fails() -> None:
        raise mine

    with capture(sample_every=1) as cap:
        monkeypatch.setattr(KINETO_BASE, "stop", broken_stop)
        assert EXPECTED == predict(X)
        with pytest.raises(ValueError) as caught:
            fails()
        monkeypatch.undo()
        assert EXPECTED == predict(X)
    assert mine is caught.value
    assert 1 == len(cap.calls)
    assert {"profiler_stop_failed": 2} == cap.stats["dropped_reasons"]
    assert 2 == cap.stats["error_reasons"]["profiler_stop"]
    assert _reconciled(cap.stats)


class _Range:
    def __init__(self, start: float, end: float) -> None:
        self.start = start
        self.end = end


def _weird_events(real: list[Any]) -> list[Any]:
    mm = next(e for e in real if e.name == "aten::mm")
    inside = _Range(mm.time_range.start, mm.time_range.end)
    return [
        object(),
        types.SimpleNamespace(name=None, thread=mm.thread, time_range=inside),
        types.SimpleNamespace(name="aten::no_range", thread=mm.thread),
        types.SimpleNamespace(name="aten::nan", thread=mm.thread, time_range=_Range(0, 1e400)),
        types.SimpleNamespace(
            name="aten::bad_numbers",
            thread=mm.thread,
            time_range=inside,
            self_cpu_time_total="lots",
            cpu_time_total=None,
            flops=float("nan"),
            id=None,
        ),
    ]


@pytest.mark.usefixtures("swallow_internal_errors")
def test_summary_builder_meets_odd_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """Malformed events are skipped or read as zero; the call is still exported."""
    real_events = torch.profiler.profile.events

    def events(self: torch.profiler.profile) -> Any:
        real = list(real_events(self))
        return real + _weird_events(real)

    monkeypatch.setattr(torch.profiler.profile, "events", events)
    monkeypatch.setattr(_window, "read_cpu_events", lambda *a, **k: None)  # torch's parser
    with capture(sample_every=1, top_k=50) as cap:
        assert EXPECTED == predict(X)
    (call,) = cap.calls
    rows = {row.name: row for row in call.root.ops}
    assert 1 == rows["aten::mm"].count
    assert "aten::no_range" not in rows
    assert "aten::nan" not in rows
    assert 0.0 == rows["aten::bad_numbers"].self_cpu_us
    assert 0 == cap.stats["errors"]


@pytest.mark.usefixtures("swallow_internal_errors")
def test_summary_builder_fails_outright(monkeypatch: pytest.MonkeyPatch) -> None:
    """If reading the events fails, the window is dropped and counted, nothing escapes."""

    def events(self: torch.profiler.profile) -> Any:
        raise RuntimeError("cannot parse")

    monkeypatch.setattr(torch.profiler.profile, "events", events)
    monkeypatch.setattr(_window, "read_cpu_events", lambda *a, **k: None)  # torch's parser
    with capture(sample_every=1) as cap:
        assert EXPECTED == predict(X)
    assert [] == cap.calls
    assert {"worker_error": 1} == cap.stats["dropped_reasons"]
    assert 1 == cap.stats["error_reasons"]["worker"]
    assert _reconciled(cap.stats)


@pytest.mark.usefixtures("swallow_internal_errors")
def test_fast_event_reader_fails_outright(monkeypatch: pytest.MonkeyPatch) -> None:
    """If profkit's own raw-event reader fails, the window is dropped and counted."""

    def read(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("odd kineto event")

    monkeypatch.setattr(_window, "read_cpu_events", read)
    with capture(sample_every=1) as cap:
        assert EXPECTED == predict(X)
    assert [] == cap.calls
    assert {"worker_error": 1} == cap.stats["dropped_reasons"]
    assert _reconciled(cap.stats)


class _MangledName:
    """A kineto event whose name torch cannot decode (seen with with_stack on torch 2.13)."""

    def __init__(self, event: Any) -> None:
        self._event = event

    def name(self) -> str:
        raise UnicodeDecodeError("utf-8", b"\x94", 0, 1, "invalid start byte")

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._event, attr)


def test_fast_event_reader_meets_an_undecodable_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """An event name that is not UTF-8 becomes a placeholder row; the call is still exported."""
    real_read = _window.read_cpu_events

    def read(raw: Any, *args: Any, **kwargs: Any) -> Any:
        mangled = [_MangledName(k) if k.name() == "aten::mm" else k for k in raw]
        return real_read(mangled, *args, **kwargs)

    monkeypatch.setattr(_window, "read_cpu_events", read)
    with capture(sample_every=1, top_k=50) as cap:
        assert EXPECTED == predict(X)
    (call,) = cap.calls
    rows = {row.name: row for row in call.root.ops}
    assert 1 == rows[_raw.UNDECODABLE].count
    assert "aten::mm" not in rows
    assert 0 == cap.stats["errors"]
    assert _reconciled(cap.stats)


def test_warm_up_survives_a_parse_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    """The warm-up's throwaway profile may fail to parse: configure() and sampling go on."""

    def events(self: torch.profiler.profile) -> Any:
        raise UnicodeDecodeError("utf-8", b"\x94", 0, 1, "invalid start byte")

    monkeypatch.setattr(_window, "_primed", set())
    monkeypatch.setattr(torch.profiler.profile, "events", events)
    with capture(sample_every=1) as cap:  # internal errors raise in tests: none may occur
        session = get_session()
        assert session is not None
        assert session.prime_seconds > 0
        assert EXPECTED == predict(X)
    assert 1 == len(cap.calls)
    assert 0 == cap.stats["errors"]


@pytest.mark.usefixtures("swallow_internal_errors")
def test_full_queue_skips_calls_before_recording() -> None:
    """A full queue (worker stuck on a slow exporter): later calls are not profiled at all."""
    slow = BlockingExporter()
    try:
        with capture(
            sample_every=1, queue_size=1, export_timeout=30.0, extra_exporters=(slow,)
        ) as cap:
            assert [EXPECTED] * 5 == [predict(X) for _ in range(5)]
            skipped = profkit.stats()["skipped_backlog"]
            slow.release.set()
            assert profkit.force_flush(20.0)
    finally:
        slow.release.set()
    assert skipped >= 3  # one window in the worker, one in the queue, the rest skipped
    assert (skipped, 0) == (cap.stats["skipped_backlog"], cap.stats["dropped"])
    assert 5 - skipped == cap.stats["sampled"] == cap.stats["exported"] == len(cap.calls)
    assert _reconciled(cap.stats)


@pytest.mark.usefixtures("swallow_internal_errors")
def test_recorded_window_that_finds_the_queue_full_is_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A window recorded before the queue filled (the check raced) is dropped as queue_full."""
    slow = BlockingExporter()
    try:
        with capture(
            sample_every=1, queue_size=1, export_timeout=30.0, extra_exporters=(slow,)
        ) as cap:
            session = get_session()
            assert session is not None
            monkeypatch.setattr(session.pipeline, "full", lambda: False)
            assert [EXPECTED] * 5 == [predict(X) for _ in range(5)]
            dropped = profkit.stats()["dropped_reasons"].get("queue_full", 0)
            slow.release.set()
            assert not profkit.force_flush(20.0)  # a window was dropped
    finally:
        slow.release.set()
    assert dropped >= 3  # one window in the worker, one in the queue, the rest dropped
    assert dropped == cap.stats["dropped_reasons"]["queue_full"] == cap.stats["dropped"]
    assert 5 == cap.stats["exported"] + cap.stats["dropped"]
    assert 5 - dropped == len(cap.calls)
    assert _reconciled(cap.stats)


def test_configure_again_while_a_window_is_open() -> None:
    """configure() from inside a sampled call: that call is still exported by the old session."""
    second = CaptureExporter()

    @profkit.profiled("reconfigure")
    def reconfigure() -> float:
        old = get_session()
        profkit.configure(sample_every=1, exporters=(), extra_exporters=(second,))
        assert old is not None
        assert _wait_for(lambda: not old.active)  # the old session is shutting down...
        time.sleep(0.2)  # ...and has had every chance to give up on this call
        return float(torch.mm(X, X).sum())

    with capture(sample_every=1) as cap:
        old = get_session()
        assert EXPECTED == reconfigure()
        new = get_session()
        assert EXPECTED == predict(X)  # runs under the new session
        assert new is not None
        assert new.force_flush(10.0)
        assert old is not None
        assert _wait_for(lambda: old.stats.snapshot()["exported"] == 1)
    assert new is not old
    assert ["reconfigure"] == [c.label for c in cap.calls]
    assert ["predict"] == [c.label for c in second.calls]
    assert "aten::mm" in {r.name for r in cap.calls[0].root.ops}
    assert _reconciled(old.stats.snapshot())
    assert autograd_profiler._is_profiler_enabled is False


@pytest.mark.usefixtures("swallow_internal_errors")
def test_shutdown_while_calls_are_in_flight() -> None:
    """shutdown() while 4 threads call away: no error, no profiler left on, counts add up."""
    exporter = CaptureExporter()
    profkit.configure(sample_every=2, exporters=(), extra_exporters=(exporter,))
    session = get_session()
    stop = threading.Event()
    done = collections.Counter[int]()
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            while not stop.is_set():
                assert EXPECTED == predict(X)
                done[i] += 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    try:
        assert _wait_for(lambda: session.stats.root_calls >= 200)
        profkit.shutdown(10.0)
        after = dict(done)
        assert _wait_for(lambda: all(done[i] >= after.get(i, 0) + 20 for i in range(4)))
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    stats = session.stats.snapshot()
    assert [] == errors
    assert get_session() is None
    assert autograd_profiler._is_profiler_enabled is False
    assert stats["windows"] > 0
    assert _reconciled(stats)
    assert len(exporter.calls) == stats["exported"]
    assert sum(done.values()) > stats["root_calls"]  # calls after shutdown were not counted


def test_calls_after_shutdown_run_unprofiled() -> None:
    """After shutdown() decorated calls run plain: no profiler, nothing counted."""
    seen: list[bool] = []

    @profkit.profiled("probe")
    def probe() -> int:
        seen.append(bool(autograd_profiler._is_profiler_enabled))
        return 5

    profkit.configure(sample_every=1, exporters=())
    session = get_session()
    assert 5 == probe()
    profkit.shutdown(5.0)
    assert [5] * 3 == [probe() for _ in range(3)]
    assert [True, False, False, False] == seen
    assert 1 == session.stats.root_calls
    assert 1 == profkit.stats()["root_calls"]  # the final counters, unchanged by later calls


def test_users_own_profiler_active() -> None:
    """With the user's own torch profiler running profkit opens no window and counts it."""
    with capture(sample_every=1) as cap:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            assert [EXPECTED] * 100 == [predict(X) for _ in range(100)]
        names = collections.Counter(e.name for e in prof.events())
    assert 100 == names["aten::mm"]
    assert 0 == names["predict"]  # profkit added nothing to the user's profile
    assert [] == cap.calls
    assert 0 == cap.stats["windows"]
    assert 100 == cap.stats["skipped_foreign"]
    assert _reconciled(cap.stats)


def test_bad_env_var_warns_and_uses_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """PROFKIT_SAMPLE_EVERY=abc warns, does not raise, and the default 1-in-100 applies."""
    monkeypatch.setenv("PROFKIT_SAMPLE_EVERY", "abc")
    with pytest.warns(profkit.ProfkitConfigWarning, match="PROFKIT_SAMPLE_EVERY"):
        config = profkit.configure(exporters=())
    assert config.sample_every is None
    assert 100 == config.every
    assert [EXPECTED] * 101 == [predict(X) for _ in range(101)]
    assert 2 == profkit.stats()["sampled"]
