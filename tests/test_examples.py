"""The examples run by their documented commands and print (or send) what they should.

Each one runs in a subprocess from the repository root, with ``PROFKIT_*`` and ``OTEL_*``
variables of the calling environment removed, under a time limit. The FastAPI service is
started for real on a free loopback port and its spans are checked on the wire (a real
OTLP/gRPC receiver) and in the JSON-lines file the example can write.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from otlp_receiver import GrpcReceiver, ReceivedSpan

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
REGIONS = ["inference", "postprocess", "preprocess"]


def example_env(**extra: str) -> dict[str, str]:
    """The current environment without PROFKIT_* / OTEL_* settings, plus ``extra``."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("PROFKIT_", "OTEL_", "EXAMPLE_"))
    }
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = "1"  # the models are tiny: spare a shared CI machine's cores
    env.update(extra)
    return env


def run_example(*args: str, timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
    """Run ``python <args>`` from the repository root; fail with its output if it fails."""
    result = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=example_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_quickstart_prints_summaries_with_addmm() -> None:
    """examples/quickstart.py prints 3 sampled calls with their regions and aten::addmm."""
    result = run_example("examples/quickstart.py")
    assert 3 == result.stderr.count("profkit ▸ predict")
    assert "aten::addmm" in result.stderr
    assert "region inference" in result.stderr
    assert "'root_calls': 300, 'sampled': 3" in result.stdout
    assert "'exported': 3" in result.stdout


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_torchserve_handler_runs_without_torchserve() -> None:
    """examples/torchserve_handler.py serves 20 batches; 4 are profiled with 3 stages each."""
    result = run_example("examples/torchserve_handler.py")
    assert 4 == result.stderr.count("profkit ▸ torchserve.handle")
    for stage in REGIONS:
        assert 4 == result.stderr.count(f"region {stage} ")
    assert "batch 0: [{'label':" in result.stdout
    assert "root_calls=20 sampled=4 exported=4" in result.stdout


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_training_loop_prints_sampled_windows() -> None:
    """examples/training_loop.py: 3 windows of 1 warm-up + 2 recorded train steps each."""
    if importlib.util.find_spec("gymnasium") is None:
        pytest.skip("gymnasium is not installed (pip install 'profkit[examples]')")
    result = run_example("examples/training_loop.py")
    assert 6 == result.stderr.count("profkit ▸ train_step")
    for region in ("env", "forward", "loss", "backward", "optimizer"):
        assert 6 == result.stderr.count(f"region {region} ")
    assert "root_calls=300 windows=3 warmup_calls=3 sampled=6 exported=6" in result.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_compiled_model_compiles_the_regions_away() -> None:
    """examples/compiled_model.py: one compile (a torch.compile row), labels compiled away."""
    result = run_example("examples/compiled_model.py", timeout=280)
    assert 3 == result.stderr.count("profkit ▸ predict")
    assert 1 == result.stderr.count("torch.compile compiled in this call")
    assert 3 == result.stderr.count("compiled away (no span): encode, head")
    assert 3 == result.stderr.count("region preprocess ")
    assert "dynamo_timed" not in result.stderr
    assert "root_calls=101 sampled=3 exported=3" in result.stdout


def _load_script() -> Any:
    spec = importlib.util.spec_from_file_location(
        "example_load", EXAMPLES / "fastapi_service/load.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:8000", True),
        ("http://localhost:9", True),
        ("http://[::1]:8000", True),
        ("http://10.0.0.1:8000", False),
        ("https://example.com", False),
    ],
)
def test_load_script_only_targets_loopback(url: str, expected: bool) -> None:
    """load.py's guard accepts loopback hosts only."""
    assert expected == _load_script().is_loopback(url)


def test_load_script_refuses_a_remote_url(capsys: pytest.CaptureFixture[str]) -> None:
    """load.py exits with a usage error, sending nothing, when pointed at a remote host."""
    with pytest.raises(SystemExit) as exc:
        _load_script().main(["--url", "http://example.com:8000", "-n", "1"])
    assert 2 == exc.value.code
    assert "loopback" in capsys.readouterr().err


# -- the FastAPI service, for real ----------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until_up(url: str, server: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"the server exited with {server.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    pytest.fail(f"the server did not come up in {timeout}s:\n{log.read_text()[-4000:]}")


def stop_gracefully(server: subprocess.Popen[bytes]) -> int:
    """SIGINT (uvicorn's graceful shutdown: profkit flushes), then kill after 60 s; the code."""
    server.send_signal(signal.SIGINT)
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
    return server.returncode


@contextlib.contextmanager
def running_service(tmp_path: Path, receiver: GrpcReceiver) -> Iterator[dict[str, Any]]:
    """The example service under uvicorn, exporting to ``receiver`` and a JSON-lines file.

    Yields a dict with ``url``, ``spans_file`` and ``log``; on exit the server is stopped
    with SIGINT (a graceful shutdown, which flushes profkit and the span processors) and its
    exit code is stored under ``returncode``.
    """
    port = free_port()
    state: dict[str, Any] = {
        "url": f"http://127.0.0.1:{port}",
        "spans_file": tmp_path / "spans.jsonl",
        "log": tmp_path / "server.log",
    }
    env = example_env(
        PROFKIT_SAMPLE_EVERY="1",
        EXAMPLE_SPANS_JSONL=str(state["spans_file"]),
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://{receiver.endpoint}",
        OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
    )
    command = ["-m", "uvicorn", "examples.fastapi_service.app:app", "--port", str(port)]
    with state["log"].open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, *command], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )
        try:
            wait_until_up(state["url"], server, state["log"], timeout=120.0)
            yield state
        finally:
            state["returncode"] = stop_gracefully(server)


def _check_nesting(spans: list[dict[str, str]]) -> int:
    """Assert every ``predict`` span is a child of a ``POST /predict`` server span and has the
    three regions as children; return the number of predict spans."""
    by_id = {s["span_id"]: s for s in spans}
    predicts = [s for s in spans if s["name"] == "predict"]
    for span in predicts:
        parent = by_id.get(span["parent"], {})
        assert ("POST /predict", span["trace_id"]) == (parent.get("name"), parent.get("trace_id"))
        children = sorted(s["name"] for s in spans if s["parent"] == span["span_id"])
        assert REGIONS == children
    return len(predicts)


def _from_wire(spans: list[ReceivedSpan]) -> list[dict[str, str]]:
    return [
        {"name": s.name, "trace_id": s.trace_id, "span_id": s.span_id, "parent": s.parent_span_id}
        for s in spans
    ]


def _from_jsonl(path: Path) -> list[dict[str, str]]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        span = json.loads(line)
        out.append(
            {
                "name": span["name"],
                "trace_id": span["context"]["trace_id"].removeprefix("0x"),
                "span_id": span["context"]["span_id"].removeprefix("0x"),
                "parent": (span["parent_id"] or "").removeprefix("0x"),
            }
        )
    return out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fastapi_service_profkit_spans_sit_inside_http_spans(tmp_path: Path) -> None:
    """Served for real, sampled requests' profkit spans nest in the HTTP spans (OTLP and file)."""
    with GrpcReceiver() as receiver:
        with running_service(tmp_path, receiver) as service:
            url = service["url"]
            load = subprocess.run(
                [sys.executable, "examples/fastapi_service/load.py", "--url", url, "-n", "12"],
                cwd=ROOT,
                env=example_env(),
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert "ok=12 errors=0" in load.stdout, load.stdout + load.stderr
            assert 422 == httpx.post(f"{url}/predict", json={"inputs": [[1.0]]}).status_code
            httpx.post(f"{url}/profkit/trigger", params={"n": 1}).raise_for_status()
            response = httpx.post(f"{url}/predict", json={"inputs": [[0.5] * 64]}, timeout=30)
            assert 1 == len(response.json()["classes"])
            stats = httpx.get(f"{url}/profkit/stats", timeout=10.0).json()
        log = service["log"].read_text(errors="replace")[-4000:]
        assert 0 == service["returncode"], log
        wire = _from_wire(receiver.spans())
    assert (13, 0) == (stats["root_calls"], stats["errors"])  # the 422 never reached predict
    assert stats["sampled"] >= 2  # the first request and the triggered one, at least
    assert _check_nesting(wire) >= 2, log
    assert _check_nesting(wire) == _check_nesting(_from_jsonl(service["spans_file"]))


def test_spans_nesting_check_rejects_an_orphan() -> None:
    """The nesting check fails on a predict span whose parent is not the HTTP server span."""
    spans = [
        {"name": "GET /other", "trace_id": "t", "span_id": "a", "parent": ""},
        {"name": "predict", "trace_id": "t", "span_id": "b", "parent": "a"},
    ]
    with pytest.raises(AssertionError):
        _check_nesting(spans)
