"""One replica of a model server with several workers, each a Prometheus scrape target.

Run it (from the repository root, in the environment ./scripts/test set up), and load it::

    mkdir -p /tmp/fleet-targets
    PROFKIT_SAMPLE_EVERY=10 FLEET_TARGETS_DIR=/tmp/fleet-targets \\
        python -m uvicorn examples.fleet.app:app --workers 2 --port 8000
    python -m examples.fleet.load --url http://127.0.0.1:8000 --requests 600

Each worker removes its target file when it stops.

Each worker process (uvicorn starts them apart, so each configures profkit itself):

* makes an OpenTelemetry ``MeterProvider`` whose resource names this process
  (``service.name`` "fleet-example", ``service.instance.id`` host-pid), read by the OTel
  Prometheus exporter (``PrometheusMetricReader``), served on a port of its own
  (``prometheus_client.start_http_server``; ``FLEET_METRICS_PORT``, 0: any free port);
* writes that port as a Prometheus file service-discovery target into ``FLEET_TARGETS_DIR``
  (one ``<pid>.json`` per worker; point ``file_sd_configs`` at ``FLEET_TARGETS_DIR/*.json``);
* calls ``profkit.configure(metrics=True, meter_provider=..., exporters=("log",))`` (no
  TracerProvider here, so no ``"otel"``; with ``FLEET_JSONL_DIR``, the JSON lines alone):
  ``profkit.call.duration``, ``profkit.op.self_time`` and the ``profkit.calls`` counters, as
  ``profkit_call_duration_seconds``, ``profkit_op_self_time_seconds`` and
  ``profkit_calls_total`` on the scrape endpoint. Prometheus tells the workers apart by their
  scrape target (``instance``); ``target_info`` carries ``service_instance_id``.

``FLEET_JSONL_DIR`` set: each worker also writes its exported calls as JSON lines
(``<pid>.jsonl``, the json exporter's lines), for ``python -m profkit report`` or ``diff``.
See docs/fleet.md for the PromQL.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from prometheus_client import start_http_server

import profkit
from profkit.exporters.console import JsonLinesExporter

torch.manual_seed(0)
MODEL = torch.nn.Sequential(
    torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
).eval()
BATCH = torch.randn(16, 64)


def meter_provider() -> MeterProvider:
    """This worker's MeterProvider, read by the Prometheus exporter."""
    resource = Resource.create(
        {
            "service.name": "fleet-example",
            "service.instance.id": f"{socket.gethostname()}-{os.getpid()}",
        }
    )
    return MeterProvider(resource=resource, metric_readers=[PrometheusMetricReader()])


def serve_metrics() -> tuple[int, Path | None]:
    """Serve this worker's metrics; announce the port to Prometheus's file discovery (the
    port, and the target file written, if any: the worker removes it when it stops).

    ``FLEET_METRICS_PORT`` is where the first worker listens; a worker that finds it taken
    (another worker's, or anyone's) takes any free port instead and says so: the port is
    announced to discovery either way, so no worker fails to start over it."""
    wanted = int(os.environ.get("FLEET_METRICS_PORT", "0"))
    try:
        server, _ = start_http_server(wanted, "127.0.0.1")
    except OSError as exc:
        server, _ = start_http_server(0, "127.0.0.1")
        print(f"fleet: metrics port {wanted} unavailable ({exc}); serving on {server.server_port}")
    port = int(server.server_port)
    targets = os.environ.get("FLEET_TARGETS_DIR")
    if not targets:
        return port, None
    entry = [{"targets": [f"127.0.0.1:{port}"], "labels": {"worker_pid": str(os.getpid())}}]
    path = Path(targets) / f"{os.getpid()}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(entry))
    tmp.replace(path)  # Prometheus never reads half a file
    return port, path


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    provider = meter_provider()
    extra: list[Any] = []
    jsonl = os.environ.get("FLEET_JSONL_DIR")
    if jsonl:
        out = open(Path(jsonl) / f"{os.getpid()}.jsonl", "w", encoding="utf-8")  # noqa: SIM115
        extra.append(JsonLinesExporter(out))
    try:
        # no TracerProvider in this example: structured logs (or the JSON lines alone), not
        # "otel", whose spans would go nowhere and count every sample span_not_recording
        exporters = () if jsonl else ("log",)
        profkit.configure(
            metrics=True, meter_provider=provider, exporters=exporters, extra_exporters=extra
        )
        _, target = serve_metrics()
        try:
            yield
        finally:  # a stopped worker is no target: Prometheus would scrape a dead port
            if target is not None:
                target.unlink(missing_ok=True)
    finally:
        profkit.shutdown(timeout=5.0)


app = FastAPI(title="profkit fleet example", lifespan=lifespan)


@profkit.profiled("predict")
def predict(x: torch.Tensor) -> list[int]:
    with torch.no_grad():
        return [int(i) for i in MODEL(x).argmax(dim=1)]


@app.post("/predict")
def predict_route() -> dict[str, Any]:
    return {"classes": predict(BATCH), "pid": os.getpid()}
