"""docs/getting-started.md's complete FastAPI ``main.py``, served as the page says.

The block is written to a temporary ``main.py`` and run with ``uvicorn main:app`` against a
real OTLP/gRPC receiver: its sync and async handlers are profiled, profkit's spans arrive
inside the requests' SERVER spans, and stdout carries structlog's JSON lines with profkit's
events for the same traces.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from otlp_receiver import GrpcReceiver
from test_docs import file_block

ROOT = Path(__file__).resolve().parents[1]
ROWS = {"rows": [[0.5] * 64, [0.25] * 64]}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _env(receiver: GrpcReceiver) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PROFKIT_", "OTEL_"))}
    env.update(
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://{receiver.endpoint}",
        OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
        OTEL_SERVICE_NAME="getting-started",
        PROFKIT_SAMPLE_EVERY="1",
    )
    return env


def _wait_up(url: str, server: subprocess.Popen[str], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.poll() is None, "main.py exited early"
        try:
            if httpx.get(f"{url}/openapi.json", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    pytest.fail("main.py did not come up")


def _serve_and_call(tmp_path: Path, receiver: GrpcReceiver) -> tuple[list[dict[str, Any]], str]:
    """Serve main.py, call both handlers twice, stop it; (responses, its stdout)."""
    (tmp_path / "main.py").write_text(file_block("getting-started.md", "main.py"))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "uvicorn", "main:app", "--port", str(port)]
    server = subprocess.Popen(
        [*command, "--reset-contextvars"],
        cwd=tmp_path,
        env=_env(receiver),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_up(url, server)
        with httpx.Client(base_url=url, timeout=30.0) as client:
            responses = [client.post(p, json=ROWS).json() for p in ["/predict", "/embed"] * 2]
    finally:
        server.send_signal(signal.SIGINT)
        out, _ = server.communicate(timeout=60)
    assert 0 == server.returncode, out[-4000:]
    return responses, out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_main_py_serves_profiles_ships_spans_and_logs_json(tmp_path: Path) -> None:
    """Both handlers answer; their profkit spans sit under SERVER spans; logs are JSON."""
    with GrpcReceiver() as receiver:
        responses, out = _serve_and_call(tmp_path, receiver)
        spans = receiver.spans()
    assert [2, 2, 2, 2] == [len(next(iter(r.values()))) for r in responses]
    by_id = {s.span_id: s for s in spans}
    profkit_spans = [s for s in spans if s.name in ("/predict", "/embed")]
    parents = sorted((s.name, by_id[s.parent_span_id].name) for s in profkit_spans)
    expected = [("/embed", "POST /embed")] * 2 + [("/predict", "POST /predict")] * 2
    assert expected == parents
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    profiles = [e for e in events if e["event"] == "profkit.profile"]
    assert sorted(s.trace_id for s in profkit_spans) == sorted(e["trace_id"] for e in profiles)
    assert {"info"} == {e["level"] for e in profiles}
