"""A real Prometheus scrapes a real 2-worker uvicorn server's profkit metrics (docs/fleet.md).

Each worker (examples/fleet/app.py) serves its own OTel Prometheus exporter endpoint and
announces it through Prometheus's file service discovery; Prometheus scrapes both every
second. The per-op self time summed over the workers, read back through Prometheus's HTTP
API, must equal what the workers exported (their JSON lines), and call.duration must count
every request.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from examples.fleet import load
from profkit import _jsonlines

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = shutil.which("prometheus")
REQUESTS = 300
ADDMM = 'profkit_label="predict",profkit_op="aten::addmm"'

if PROMETHEUS is None:
    pytest.skip(
        "prometheus is not installed (apt-get install -y prometheus; "
        "scripts/setup-system installs it in CI)",
        allow_module_level=True,
    )


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(httpx.HTTPError, OSError, ValueError):
            value = check()
            if value:
                return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.25)


@contextlib.contextmanager
def _process(args: list[str], log: Path, **kwargs: Any) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, **kwargs)
        try:
            yield proc
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _prometheus(tmp: Path, targets: Path) -> tuple[list[str], int]:
    port = _port()
    config = tmp / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: fleet\n"
        "    scrape_interval: 1s\n"
        "    scrape_timeout: 1s\n"
        "    file_sd_configs:\n"
        f"      - files: ['{targets}/*.json']\n"
        "        refresh_interval: 1s\n"
    )
    args = [
        str(PROMETHEUS),
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    return args, port


def _query(base: str, promql: str) -> float | None:
    reply = httpx.get(f"{base}/api/v1/query", params={"query": promql}, timeout=5.0).json()
    result = reply["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def _stable_files(directory: Path) -> list[Path]:
    """The workers' JSON lines files once no byte was added for two seconds."""
    last: dict[Path, int] = {}
    still = 0.0
    while still < 2.0:
        sizes = {p: p.stat().st_size for p in directory.glob("*.jsonl")}
        still = still + 0.25 if sizes == last else 0.0
        last = sizes
        time.sleep(0.25)
    return sorted(last)


def test_prometheus_sums_the_workers_op_self_time(tmp_path: Path) -> None:
    """2 uvicorn workers under load: Prometheus's per-op sum equals what the workers exported."""
    targets, jsonl = tmp_path / "targets", tmp_path / "jsonl"
    targets.mkdir()
    jsonl.mkdir()
    prom_args, prom_port = _prometheus(tmp_path, targets)
    prom = f"http://127.0.0.1:{prom_port}"
    app_port = _port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PROFKIT_SAMPLE_EVERY": "4",
        "PROFKIT_MAX_PER_MINUTE": "none",
        "FLEET_TARGETS_DIR": str(targets),
        "FLEET_JSONL_DIR": str(jsonl),
    }
    server_args = [
        sys.executable, "-m", "uvicorn", "examples.fleet.app:app", "--workers", "2",
        "--host", "127.0.0.1", "--port", str(app_port), "--log-level", "warning",
    ]  # fmt: skip
    with (
        _process(prom_args, tmp_path / "prometheus.log"),
        _process(server_args, tmp_path / "server.log", env=env, cwd=ROOT),
    ):
        _wait("Prometheus to be ready", lambda: httpx.get(f"{prom}/-/ready").status_code == 200)
        _wait("both workers' targets", lambda: len(list(targets.glob("*.json"))) == 2, 120.0)
        url = f"http://127.0.0.1:{app_port}/predict"
        _wait("the server", lambda: httpx.post(url, timeout=5.0).status_code == 200)
        served = load.run(f"http://127.0.0.1:{app_port}", REQUESTS, 8)  # the page's load
        pids = set(served)
        assert (2, REQUESTS) == (len(pids), sum(served.values())), "both workers served"

        files = _stable_files(jsonl)
        samples = [s for p in files for s in _jsonlines.read(p.read_text().splitlines())[0]]
        exported = [s.ops["aten::addmm"] for s in samples if "aten::addmm" in s.ops]
        assert len(exported) >= REQUESTS // 8
        count = _wait(
            "Prometheus to scrape every exported call",
            lambda: (
                _query(prom, f"sum(profkit_op_self_time_seconds_count{{{ADDMM}}})") == len(exported)
            ),
        )
        assert count
        total = _query(prom, f"sum(profkit_op_self_time_seconds_sum{{{ADDMM}}})")
        assert total == pytest.approx(sum(exported) / 1e6, rel=1e-6, abs=1e-6)
        per_worker = f"count(count by (instance) (profkit_op_self_time_seconds_count{{{ADDMM}}}))"
        assert 2 == _query(prom, per_worker)
        instances = _query(prom, "count(count by (service_instance_id) (target_info))")
        assert 2 == instances
        calls = 'sum(profkit_call_duration_seconds_count{profkit_label="predict"})'
        # every request (and the one readiness probe that got through) is a root call
        _wait("every root call", lambda: _query(prom, calls) == REQUESTS + 1)
        outcome = 'sum(profkit_calls_total{profkit_outcome="exported"})'
        assert len(samples) == _query(prom, outcome)
        assert _query(prom, "sum(profkit_errors_total)") in (None, 0.0)  # the example, as is
    assert [] == sorted(targets.glob("*.json")), "a stopped worker removes its target file"
    print(json.dumps({"exported": len(exported), "workers": sorted(pids)}))


def test_a_taken_metrics_port_does_not_stop_a_worker(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """FLEET_METRICS_PORT taken (by another worker of the same server, or anyone): the worker
    serves on a free port and announces that one, instead of failing its start-up."""
    from examples.fleet import app

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setenv("FLEET_METRICS_PORT", str(taken.getsockname()[1]))
        monkeypatch.setenv("FLEET_TARGETS_DIR", str(tmp_path))
        port, written = app.serve_metrics()
        assert port != taken.getsockname()[1]
    assert tmp_path / f"{os.getpid()}.json" == written
    (target,) = json.loads((tmp_path / f"{os.getpid()}.json").read_text())
    assert [f"127.0.0.1:{port}"] == target["targets"]
    assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5.0).status_code == 200
