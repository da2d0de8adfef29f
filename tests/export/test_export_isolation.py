"""Isolation: an exporter that raises or hangs stops neither the others nor the service."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from structlog.testing import capture_logs

import profkit
from profkit import WindowSummary
from profkit.testing import capture

#: seconds an exporter may take per window in these tests
TIMEOUT = 0.2

torch.manual_seed(0)
MODEL = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
BATCH = torch.randn(32, 64)
with torch.no_grad():
    EXPECTED = MODEL(BATCH)


@profkit.profiled("predict")
def predict(batch: torch.Tensor) -> torch.Tensor:
    """The model under a region."""
    with profkit.region("forward"), torch.no_grad():
        out: torch.Tensor = MODEL(batch)
    return out


class Raising:
    """Fails every export."""

    name = "boom"

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
        self.calls = 0

    def export(self, summary: WindowSummary) -> None:
        self.calls += 1
        raise self.exc


class Hanging:
    """Blocks every export until released (far longer than the export timeout)."""

    name = "hang"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = 0

    def export(self, summary: WindowSummary) -> None:
        self.entered += 1
        self.release.wait(30)


@pytest.fixture
def hanging() -> Iterator[Hanging]:
    """A hanging exporter whose stuck thread is released when the test ends."""
    exporter = Hanging()
    yield exporter
    exporter.release.set()


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.usefixtures("swallow_internal_errors")
def test_raising_and_hanging_exporters_do_not_stop_the_others(hanging: Hanging) -> None:
    """Spans and captured summaries arrive for every window; each failure is counted by name."""
    raising = Raising(RuntimeError("exporter bug"))
    n = 4
    with capture(
        sample_every=1,
        export_timeout=TIMEOUT,
        exporters=("otel",),
        extra_exporters=[raising, hanging],
    ) as cap:
        for _ in range(n):
            assert torch.equal(EXPECTED, predict(BATCH))
    assert len(cap.calls) == n
    assert len([s for s in cap.spans() if s.name == "predict"]) == n
    assert raising.calls == n
    assert hanging.entered == 1  # still stuck in the first window: later ones are skipped
    stats = cap.stats
    assert stats["error_reasons"]["export_error:boom"] == n
    assert stats["error_reasons"]["export_timeout:hang"] == n
    assert stats["errors"] == 2 * n
    assert stats["sampled"] == n
    # a window counts as exported only when every exporter took it
    assert stats["dropped_reasons"] == {"export_timeout:hang": n}
    assert stats["exported"] == 0


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("swallow_internal_errors")
@pytest.mark.parametrize("exc", [ValueError("bad"), KeyboardInterrupt(), SystemExit(3)], ids=type)
def test_any_exception_in_an_exporter_is_contained(exc: BaseException) -> None:
    """Even BaseExceptions raised by an exporter stay on its thread and are counted."""
    raising = Raising(exc)
    with capture(sample_every=1, extra_exporters=[raising]) as cap:
        assert torch.equal(EXPECTED, predict(BATCH))
    assert len(cap.calls) == 1
    assert cap.stats["error_reasons"] == {"export_error:boom": 1}
    assert cap.stats["dropped_reasons"] == {"export_error:boom": 1}


class HangingLogger:
    """A structlog-style logger that blocks (the built-in "log" exporter hangs)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def info(self, event: str, **fields: Any) -> None:
        self.release.wait(30)

    warning = info


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.usefixtures("swallow_internal_errors")
def test_hanging_builtin_log_exporter_is_cut_off() -> None:
    """A stuck logger times the "log" exporter out; the spans still go out for every call."""
    logger = HangingLogger()
    try:
        with capture(
            sample_every=1, export_timeout=TIMEOUT, exporters=("otel", "log"), logger=logger
        ) as cap:
            for _ in range(3):
                assert torch.equal(EXPECTED, predict(BATCH))
    finally:
        logger.release.set()
    assert len([s for s in cap.spans() if s.name == "predict"]) == 3
    assert len(cap.calls) == 3
    assert cap.stats["error_reasons"] == {"export_timeout:log": 3}


class BrokenProcessor(SpanProcessor):
    """A span processor that raises when a span ends: the "otel" exporter fails."""

    def on_end(self, span: ReadableSpan) -> None:
        raise RuntimeError("processor bug")


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("swallow_internal_errors")
def test_failing_span_exporter_does_not_stop_log_events() -> None:
    """When the "otel" exporter fails, the "log" events still go out, joined to the request."""
    provider = TracerProvider()
    provider.add_span_processor(BrokenProcessor())
    tracer = TracerProvider().get_tracer("test")
    with (
        capture_logs() as logs,
        capture(sample_every=1, exporters=("otel", "log"), tracer_provider=provider) as cap,
        tracer.start_as_current_span("request") as request,
    ):
        assert torch.equal(EXPECTED, predict(BATCH))
    (event,) = [e for e in logs if e["event"] == "profkit.profile"]
    assert f"{request.get_span_context().span_id:016x}" == event["span_id"]
    assert len(cap.calls) == 1
    assert cap.stats["error_reasons"] == {"export_error:otel": 1}


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("swallow_internal_errors")
def test_exporter_that_recovers_is_used_again() -> None:
    """A hang that ends lets the exporter take later windows again."""
    release, unstuck = threading.Event(), threading.Event()
    seen: list[int] = []

    class SlowOnce:
        name = "slow"

        def export(self, summary: WindowSummary) -> None:
            if not seen:
                release.wait(30)
            seen.append(summary.window_id)
            unstuck.set()

    with capture(sample_every=1, export_timeout=TIMEOUT, extra_exporters=[SlowOnce()]) as cap:
        predict(BATCH)
        assert not profkit.force_flush(5.0)  # the window timed out: it was not exported
        release.set()
        assert unstuck.wait(10)
        predict(BATCH)
        predict(BATCH)
    assert len(cap.calls) == 3
    assert seen == [1, 2, 3]
    assert cap.stats["error_reasons"] == {"export_timeout:slow": 1}
    assert cap.stats["dropped_reasons"] == {"export_timeout:slow": 1}
    assert cap.stats["exported"] == 2


class Named(profkit.Exporter):
    """Fails every export, under a name given at construction (or a name that raises)."""

    def __init__(self, name: Any) -> None:
        self._name = name

    @property
    def name(self) -> Any:  # type: ignore[override]
        if isinstance(self._name, BaseException):
            raise self._name
        return self._name

    def export(self, summary: WindowSummary) -> None:
        raise ValueError("bad")


class NamedDuck:
    """The same, duck-typed (no Exporter base class)."""

    def __init__(self, name: Any) -> None:
        self._inner = Named(name)

    @property
    def name(self) -> Any:
        return self._inner.name

    def export(self, summary: WindowSummary) -> None:
        self._inner.export(summary)


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("swallow_internal_errors")
@pytest.mark.parametrize("kind", [Named, NamedDuck], ids=["subclass", "duck"])
@pytest.mark.parametrize(
    ("name", "reason"),
    [
        (RuntimeError("no name"), "export_error:Named"),
        ("line\nbreak" + "x" * 500, "export_error:line\\nbreak" + "x" * 52 + "…"),
        (42, "export_error:42"),
    ],
    ids=["raising", "long-with-newline", "not-a-str"],
)
def test_an_exporter_s_name_is_read_safely_and_bounded(kind: Any, name: Any, reason: str) -> None:
    """An exporter whose name raises, is not a str, or is long or multi-line still gets a
    session; its reason keys in stats() are one bounded line."""
    exporter = kind(name)
    if isinstance(name, BaseException) and kind is NamedDuck:
        reason = "export_error:NamedDuck"
    with capture(sample_every=1, extra_exporters=[exporter]) as cap:
        assert torch.equal(EXPECTED, predict(BATCH))
    assert {reason: 1} == cap.stats["dropped_reasons"]
