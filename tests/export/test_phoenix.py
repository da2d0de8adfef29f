"""A real trace backend: profkit's spans over OTLP into Arize Phoenix, read back from its REST API.

Phoenix runs from a virtual environment of its own (``scripts/setup-phoenix`` creates
``.venv-phoenix``; ``PROFKIT_PHOENIX_VENV`` points elsewhere), started as ``phoenix serve`` on
free loopback ports with a temporary working directory. The spans are sent over OTLP/gRPC
and OTLP/HTTP with :func:`profkit.exporters.otlp.otlp_span_processor`, then read back from
``GET /v1/projects/default/spans``: the parent/child tree, the timing, the status and every
attribute must be stored as profkit made them. Skipped when Phoenix is not installed.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import torch
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import profkit
from profkit.exporters.otlp import otlp_span_processor

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("PROFKIT_PHOENIX_VENV", ROOT / ".venv-phoenix"))
PHOENIX = VENV / "bin" / "phoenix"
#: seconds Phoenix may take to start (database migrations on first start)
START_TIMEOUT = 120.0

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        not PHOENIX.exists(),
        reason=f"Arize Phoenix is not installed at {PHOENIX} (run scripts/setup-phoenix, "
        "or set PROFKIT_PHOENIX_VENV to a virtualenv with arize-phoenix)",
    ),
]

torch.manual_seed(0)
MODEL = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
BATCH = torch.randn(32, 64)


@profkit.profiled("predict")
def predict(batch: torch.Tensor) -> torch.Tensor:
    """Two regions, one with a label that is not valid UTF-8 (cleaned on the way out)."""
    with profkit.region("preprocess", stage="scale"):
        batch = batch * 2.0
    with profkit.region("forward\udcff"), torch.no_grad():
        out: torch.Tensor = MODEL(batch)
    return out


@profkit.profiled("explode")
def explode() -> None:
    """Runs an op, then raises."""
    torch.mm(BATCH, BATCH.T)
    raise ValueError("bad input")


class Phoenix:
    """A ``phoenix serve`` process on free loopback ports, and a reader of its REST API."""

    def __init__(self, workdir: Path) -> None:
        self.http_port, self.grpc_port = _free_port(), _free_port()
        self.log = workdir / "phoenix.log"
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(
            PHOENIX_HOST="127.0.0.1",
            PHOENIX_PORT=str(self.http_port),
            PHOENIX_GRPC_PORT=str(self.grpc_port),
            PHOENIX_WORKING_DIR=str(workdir / "phoenix"),
            PHOENIX_TELEMETRY_ENABLED="false",
        )
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [str(PHOENIX), "serve"], env=env, stdout=log, stderr=subprocess.STDOUT
            )

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def exporter_kwargs(self, protocol: str) -> dict[str, Any]:
        if protocol == "grpc":
            return {"endpoint": f"127.0.0.1:{self.grpc_port}", "insecure": True, "timeout": 10}
        return {"endpoint": f"{self.base}/v1/traces", "timeout": 10}

    def wait_until_up(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"phoenix serve exited ({self.process.returncode}):\n{self.tail()}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{self.base}/healthz", timeout=2) as reply,
            ):
                if reply.status == 200:
                    return
            time.sleep(0.5)
        pytest.fail(f"phoenix serve did not answer in {START_TIMEOUT}s:\n{self.tail()}")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def spans(self, trace_ids: Sequence[str], expected: int) -> list[dict[str, Any]]:
        """The stored spans of ``trace_ids``, once ``expected`` of them arrived (or 30 s)."""
        query = urllib.parse.urlencode([("trace_id", t) for t in trace_ids] + [("limit", 1000)])
        url = f"{self.base}/v1/projects/default/spans?{query}"
        deadline = time.monotonic() + 30
        while True:
            with urllib.request.urlopen(url, timeout=10) as reply:
                found: list[dict[str, Any]] = json.load(reply)["data"]
            if len(found) >= expected or time.monotonic() > deadline:
                return found
            time.sleep(0.5)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    """Phoenix, started once for this module's tests."""
    server = Phoenix(tmp_path_factory.mktemp("phoenix"))
    try:
        server.wait_until_up()
        yield server
    finally:
        server.stop()


def _epoch_us(stamp: str) -> int:
    return (datetime.fromisoformat(stamp) - _EPOCH) // timedelta(microseconds=1)


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _assert_stored_as_made(made: Sequence[ReadableSpan], stored: Sequence[dict[str, Any]]) -> None:
    """Every span arrived once: same trace, parent, name, times, status and attributes."""
    by_id = {s["context"]["span_id"]: s for s in stored}
    assert len(made) == len(stored) == len(by_id)
    for span in made:
        got = by_id[f"{span.context.span_id:016x}"]
        parent = f"{span.parent.span_id:016x}" if span.parent is not None else None
        assert (span.name, f"{span.context.trace_id:032x}", parent) == (
            got["name"],
            got["context"]["trace_id"],
            got["parent_id"],
        )
        assert span.start_time is not None
        assert span.end_time is not None
        # Phoenix keeps microseconds (rounded): within 1 µs of the ns the span was made with
        stored_us = (_epoch_us(got["start_time"]), _epoch_us(got["end_time"]))
        assert abs(span.start_time / 1000 - stored_us[0]) <= 1, span.name
        assert abs(span.end_time / 1000 - stored_us[1]) <= 1, span.name
        assert {k: _plain(v) for k, v in (span.attributes or {}).items()} == got["attributes"]
        assert (span.status.status_code.name, span.status.description or "") == (
            got["status_code"],
            got["status_message"],
        )


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_profkit_spans_round_trip_through_phoenix(phoenix: Phoenix, protocol: str) -> None:
    """Spans sent over OTLP are stored by Phoenix with their tree, timing and attributes."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "profkit-phoenix"}))
    provider.add_span_processor(otlp_span_processor(protocol, **phoenix.exporter_kwargs(protocol)))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    app = provider.get_tracer("app")
    profkit.configure(sample_every=1, tracer_provider=provider, exporters=("otel",))
    for _ in range(3):
        with app.start_as_current_span("request"):
            predict(BATCH)
    with app.start_as_current_span("request"), pytest.raises(ValueError, match="bad input"):
        explode()
    assert profkit.shutdown(30.0)
    provider.shutdown()
    assert 0 == profkit.stats()["otlp_spans_failed"]
    made = memory.get_finished_spans()
    trace_ids = sorted({f"{s.context.trace_id:032x}" for s in made})
    stored = phoenix.spans(trace_ids, expected=len(made))
    _assert_stored_as_made(made, stored)

    by_id = {s["context"]["span_id"]: s for s in stored}
    roots = [s for s in stored if s["name"] == "predict"]
    assert 3 == len(roots)
    for root in roots:
        request = by_id[root["parent_id"]]
        assert ("request", request["context"]["trace_id"]) == (
            request["name"],
            root["context"]["trace_id"],
        )
        children = sorted(s["name"] for s in stored if s["parent_id"] == root["context"]["span_id"])
        assert ["forward\ufffd", "preprocess"] == children
        attrs = root["attributes"]
        assert "aten::addmm" in attrs["profkit.ops.name"]
        assert attrs["profkit.ops.table"].splitlines()[0].split() == [
            "op",
            "count",
            "self_cpu_us",
            "cpu_us",
        ]
        assert attrs["profkit.diagnosis.verdict"] in (
            "input-bound",
            "launch-bound",
            "compute-bound",
            "balanced",
        )
        assert isinstance(attrs["profkit.diagnosis.op_count"], int)
    (failed,) = [s for s in stored if s["name"] == "explode"]
    assert ("ERROR", "ValueError: bad input") == (failed["status_code"], failed["status_message"])
    (event,) = failed["events"]
    assert ("exception", "ValueError") == (event["name"], event["attributes"]["exception.type"])
