"""Structured logs: ``profkit.profile`` / ``profkit.op`` events joined to the trace by their ids."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import structlog
import torch
from fresh_interpreter import ROOT, SCRIPTS
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from structlog.testing import capture_logs

import profkit
from profkit.testing import capture

torch.manual_seed(0)
MODEL = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
BATCH = torch.randn(32, 64)


@profkit.profiled("predict")
def predict(batch: torch.Tensor) -> torch.Tensor:
    """A region around the model."""
    with profkit.region("forward"), torch.no_grad():
        out: torch.Tensor = MODEL(batch)
    return out


@profkit.profiled("failing")
def failing() -> None:
    """Raises after an op."""
    torch.ones(4).sum()
    raise KeyError("missing")


def _events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == name]


def test_log_events_carry_the_span_ids() -> None:
    """profkit.profile and every profkit.op event carry the trace and span id of the call's span."""
    with capture_logs() as logs, capture(sample_every=1, exporters=("otel", "log")) as cap:
        for _ in range(2):
            predict(BATCH)
        assert profkit.force_flush(10.0)
    roots = [s for s in cap.spans() if s.name == "predict"]
    profiles = _events(logs, "profkit.profile")
    assert len(profiles) == 2
    for root, event, call in zip(roots, profiles, cap.calls, strict=True):
        trace_id = trace.format_trace_id(root.context.trace_id)
        span_id = trace.format_span_id(root.context.span_id)
        assert (trace_id, span_id) == (event["trace_id"], event["span_id"])
        ops = [e for e in _events(logs, "profkit.op") if e["span_id"] == span_id]
        assert len(call.root.ops) == len(ops)
        assert {trace_id} == {e["trace_id"] for e in ops}
        assert [r.name for r in call.root.ops] == [e["op"] for e in ops]
        assert list(range(1, len(ops) + 1)) == [e["rank"] for e in ops]
        assert root.attributes is not None
        assert list(root.attributes["profkit.ops.name"]) == [e["op"] for e in ops]  # type: ignore[arg-type]
    assert {e["log_level"] for e in logs if e["event"].startswith("profkit.")} == {"info"}


def test_profile_event_fields() -> None:
    """The profile event holds the call's label, regions and totals; the rows are op events."""
    with capture_logs() as logs, capture(sample_every=1, exporters=("otel", "log"), top_k=3) as cap:
        predict(BATCH)
        assert profkit.force_flush(10.0)
    (event,) = _events(logs, "profkit.profile")
    (call,) = cap.calls
    assert event["label"] == "predict"
    assert call.root.op_count == event["op_count"]
    assert [r["region"] for r in event["regions"]] == ["forward"]
    ops = _events(logs, "profkit.op")
    assert "top_ops" not in event  # not twice: the rows are the op events
    assert [r["op"] for r in ops] == [r.name for r in call.root.ops]
    assert ops[-1]["op"] == "other"
    assert sum(r.count for r in call.root.ops) == sum(r["count"] for r in ops)
    assert ops[0]["op"] == "aten::addmm"
    assert call.diagnosis is not None
    assert call.diagnosis.verdict == event["diagnosis"]
    assert len(ops) == 4


def test_log_only_events_carry_the_request_span_ids() -> None:
    """Without the span exporter the events point at the span that was active at call time."""
    tracer = TracerProvider().get_tracer("test")
    with capture_logs() as logs, capture(sample_every=1, exporters=("log",)):
        with tracer.start_as_current_span("request") as request:
            predict(BATCH)
        predict(BATCH)  # no active span: no ids to join on
        assert profkit.force_flush(10.0)
    ctx = request.get_span_context()
    first, second = _events(logs, "profkit.profile")
    assert (trace.format_trace_id(ctx.trace_id), trace.format_span_id(ctx.span_id)) == (
        first["trace_id"],
        first["span_id"],
    )
    assert "trace_id" not in second
    assert "span_id" not in second


def test_no_op_tracer_provider_never_logs_zero_ids() -> None:
    """With a no-op provider (no OTel SDK) events keep the request's ids, or carry none."""
    tracer = TracerProvider().get_tracer("test")
    with (
        capture_logs() as logs,
        capture(
            sample_every=1, exporters=("otel", "log"), tracer_provider=trace.NoOpTracerProvider()
        ) as cap,
    ):
        with tracer.start_as_current_span("request") as request:
            predict(BATCH)
        predict(BATCH)
        assert not profkit.force_flush(10.0)  # logged, but the span step recorded nothing
    first, second = _events(logs, "profkit.profile")
    ctx = request.get_span_context()
    assert f"{ctx.span_id:016x}" == first["span_id"]
    assert f"{ctx.trace_id:032x}" == first["trace_id"]
    assert "trace_id" not in second
    assert cap.calls[1].trace_id == ""
    assert cap.spans() == ()


def test_failed_call_logs_a_warning() -> None:
    """A call that raised is logged at warning level with the exception's type."""
    with capture_logs() as logs, capture(sample_every=1, exporters=("otel", "log")):
        with pytest.raises(KeyError, match="missing"):
            failing()
        assert profkit.force_flush(10.0)
    (event,) = _events(logs, "profkit.profile")
    assert event["log_level"] == "warning"
    assert event["error"] == "KeyError"


class RecordingLogger:
    """A structlog-style logger that keeps (level, event, fields)."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str, dict[str, Any]]] = []

    def info(self, event: str, **fields: Any) -> None:
        self.records.append(("info", event, fields))

    def warning(self, event: str, **fields: Any) -> None:
        self.records.append(("warning", event, fields))


def test_configured_logger_is_used() -> None:
    """configure(logger=...) sends the events there instead of structlog.get_logger()."""
    logger = RecordingLogger()
    with capture_logs() as logs, capture(sample_every=1, exporters=("otel", "log"), logger=logger):
        predict(BATCH)
        assert profkit.force_flush(10.0)
    assert [e for e in logs if e["event"].startswith("profkit.")] == []
    assert logger.records[0][:2] == ("info", "profkit.profile")
    assert {r[1] for r in logger.records[1:]} == {"profkit.op"}
    span_ids = {r[2]["span_id"] for r in logger.records}
    assert len(span_ids) == 1


class _Records(logging.Handler):
    """Keeps every record a stdlib logger handles."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.parametrize("adapter", [False, True])
def test_a_stdlib_logger_given_as_logger_gets_every_event(adapter: bool) -> None:
    """configure(logger=logging.getLogger(...)) delivers the events there, none dropped."""
    handler = _Records()
    stdlib = logging.getLogger("profkit-test.stdlib-logger")
    stdlib.addHandler(handler)
    stdlib.setLevel(logging.INFO)
    given: Any = logging.LoggerAdapter(stdlib, {}) if adapter else stdlib
    try:
        with capture(sample_every=1, exporters=("log",), logger=given, top_k=3) as cap:
            predict(BATCH)
            flushed = profkit.force_flush(10.0)
    finally:
        stdlib.removeHandler(handler)
    assert (True, 1, {}) == (flushed, cap.stats["exported"], cap.stats["dropped_reasons"])
    messages = [r.getMessage() for r in handler.records]
    assert 1 == sum("profkit.profile" in m for m in messages)
    assert 4 == sum("profkit.op" in m for m in messages)  # top 3 and "other"


def test_a_logger_adapter_under_structlogs_stdlib_formatter_gets_structured_events() -> None:
    """A ``LoggerAdapter`` given as ``logger``, with structlog's stdlib integration (its
    ``ProcessorFormatter`` renders JSON): each event is rendered with its fields, the
    adapter's ``extra`` among them, not as the repr of a dict in ``event``."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(processor=structlog.processors.JSONRenderer())
    )
    stdlib = logging.getLogger("profkit-test.adapter-formatter")
    stdlib.addHandler(handler)
    stdlib.setLevel(logging.INFO)
    stdlib.propagate = False
    structlog.configure(
        processors=[structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
    )
    try:
        given = logging.LoggerAdapter(stdlib, {"service": "ranker"})
        with capture(sample_every=1, exporters=("log",), logger=given, top_k=1):
            predict(BATCH)
            profkit.force_flush(10.0)
    finally:
        structlog.reset_defaults()
        stdlib.removeHandler(handler)
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    head = [(e["event"], e.get("label"), e.get("service")) for e in events]
    assert ("profkit.profile", "predict", "ranker") == head[0]


def test_json_lines_exporter(capsys: pytest.CaptureFixture[str]) -> None:
    """The "json" exporter writes one parseable line per call, with the span's ids."""
    with capture(sample_every=1, exporters=("otel", "json")) as cap:
        predict(BATCH)
        predict(BATCH)
        assert profkit.force_flush(10.0)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [c.span_id for c in cap.calls] == [line["span_id"] for line in lines]
    assert {line["event"] for line in lines} == {"profkit.profile"}
    assert [r.name for r in cap.calls[0].root.ops] == [r["op"] for r in lines[0]["top_ops"]]


def test_json_lines_without_spans_carry_the_request_spans_ids(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Without "otel" the call has no span of its own: its JSON line carries the ids of the
    request span it ran under, as its log event does, so it still joins the trace."""
    tracer = TracerProvider().get_tracer("test")
    with capture_logs() as logs, capture(sample_every=1, exporters=("log", "json")):
        with tracer.start_as_current_span("request") as request:
            predict(BATCH)
        assert profkit.force_flush(10.0)
    context = request.get_span_context()
    expected = {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}
    (line,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    (event,) = [e for e in logs if e["event"] == "profkit.profile"]
    assert expected == {k: line.get(k) for k in expected}
    assert expected == {k: event.get(k) for k in expected}


def test_console_exporter(capsys: pytest.CaptureFixture[str]) -> None:
    """The "console" exporter prints a readable block with the regions and top ops on stderr."""
    with capture(sample_every=1, exporters=("otel", "console")) as cap:
        predict(BATCH)
        assert profkit.force_flush(10.0)
    err = capsys.readouterr().err
    (call,) = cap.calls
    assert f"profkit ▸ predict  {call.root.duration_us / 1000:.3f} ms" in err
    assert f"trace {call.trace_id} span {call.span_id}" in err
    assert "region forward" in err
    assert "aten::addmm" in err


def test_log_events_carry_the_call_start_time() -> None:
    """Both events say when the call began (the span's start, ISO 8601 UTC), not when logged."""
    with capture_logs() as logs, capture(sample_every=1, exporters=("otel", "log")) as cap:
        predict(BATCH)
        assert profkit.force_flush(10.0)
    (root,) = [s for s in cap.spans() if s.name == "predict"]
    assert root.start_time is not None
    seconds, rest = divmod(root.start_time, 1_000_000_000)
    expected = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{rest // 1000:06d}Z"
    events = _events(logs, "profkit.profile") + _events(logs, "profkit.op")
    assert {expected} == {e["start_time"] for e in events}


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_unconfigured_structlog_gets_one_compact_line_per_call_that_report_reads(
    tmp_path: Path,
) -> None:
    """structlog not configured: one ``profkit.profile`` line per call (label, duration,
    diagnosis, top ops, ids; no op rows), and ``profkit report`` rolls those lines up (#25)."""
    out = tmp_path / "stdout.log"
    # a fresh interpreter (structlog never configured); its stdout, as a service's log holds it
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "log_exporter_unconfigured.py")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=150,
        check=True,
    )
    out.write_text(proc.stdout, encoding="utf-8")
    assert proc.stdout.endswith('REPORT {"flushed": true, "exported": 5}\n'), proc.stderr
    lines = [line for line in proc.stdout.splitlines() if "profkit." in line]
    assert 5 == len(lines)
    assert all(" profkit.profile " in line and len(line) < 400 for line in lines), lines
    assert all("label=predict" in line and "aten::" in line for line in lines)
    report = subprocess.run(
        [sys.executable, "-m", "profkit", "report", str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
        check=False,
    )
    assert (0, "") == (report.returncode, report.stderr)
    assert report.stdout.startswith("predict  5 samples  duration p50 ")
    assert "aten::mm" in report.stdout
