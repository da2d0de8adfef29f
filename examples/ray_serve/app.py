"""Ray Serve: two deployments, a batched TransformerEncoder classifier, profkit in every replica.

Run it (from the repository root, ``pip install 'profkit[ray,otlp,prometheus]'``)::

    python -m examples.ray_serve.app            # a local cluster; serves until Ctrl-C
    python examples/ray_serve/load.py -n 200    # in another shell

Two deployments (``build_app()``):

* ``Ingress`` (``EXAMPLE_INGRESS_REPLICAS``, 1): takes ``POST /`` with ``{"tokens": [...]}``
  (ints below ``VOCAB``); its ``__call__`` is ``@profkit.profiled("classify")``, a root call
  in the trace of the request's ``traceparent``, and calls the classifier through a
  :func:`profkit.integrations.ray_serve.traced` handle.
* ``Classifier`` (``EXAMPLE_REPLICAS``, 2): a small ``torch.nn.TransformerEncoder`` (2 layers,
  d_model 32) over the tokens, one class of ``CLASSES`` out. ``forward`` is
  ``@ray_serve.batch(label="classify_batch", max_batch_size=8)``: Ray Serve batches up to 8
  requests; each batch is a ``profkit.batch``, and each request's trace gets a span with its
  share of it.

Both are ``@ray_serve.replica(setup=providers)``: each replica configures profkit (settings
from ``PROFKIT_*``, carried to the replicas by ``runtime_env``), with what
:func:`providers` builds in the replica:

* a ``TracerProvider`` shipping over OTLP (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` /
  ``OTEL_EXPORTER_OTLP_ENDPOINT``; without one, spans print on stdout);
* with ``PROFKIT_METRICS=1``, a ``MeterProvider`` read by the OTel Prometheus exporter,
  served on a free port of the replica's own and announced as a Prometheus file
  service-discovery target in ``EXAMPLE_TARGETS_DIR`` (``<deployment>-<pid>.json``): the
  fleet view of docs/fleet.md, one target per replica.

With ``EXAMPLE_STATS_DIR`` set, each replica writes its final ``profkit.stats()`` there as it
stops (``<deployment>-<pid>.json``, after profkit's own flush).
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import torch
from ray import serve
from ray.serve.handle import DeploymentHandle

import profkit
from profkit.integrations import ray_serve

VOCAB = 64
SEQ = 16
D_MODEL = 32
CLASSES = 4
#: forwarded to the replicas: profkit's settings, OTel's, and the example's own
ENV_PREFIXES = ("PROFKIT_", "OTEL_", "EXAMPLE_")

_PROVIDERS: dict[str, Any] = {}


class TinyClassifier(torch.nn.Module):
    """Embedding -> 2-layer TransformerEncoder -> mean pool -> linear, fixed random weights."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(VOCAB, D_MODEL)
        layer = torch.nn.TransformerEncoderLayer(
            D_MODEL, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True
        )
        self.encoder = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(D_MODEL, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


def _instance(deployment: str) -> str:
    return f"{deployment}-{os.getpid()}"


def providers() -> dict[str, Any]:
    """Build this replica's TracerProvider (and MeterProvider): run in the replica."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    deployment = serve.get_replica_context().deployment
    resource = Resource.create(
        {"service.name": "ray-serve-example", "service.instance.id": _instance(deployment)}
    )
    tracer_provider = TracerProvider(resource=resource)
    if os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    ):
        from profkit.exporters.otlp import otlp_span_processor

        tracer_provider.add_span_processor(otlp_span_processor())
    else:
        tracer_provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    out: dict[str, Any] = {"tracer_provider": tracer_provider}
    if os.environ.get("PROFKIT_METRICS", "").lower() in ("1", "true", "yes"):
        out["meter_provider"] = _meter_provider(resource, deployment)
    _PROVIDERS.update(out)
    return out


def _meter_provider(resource: Any, deployment: str) -> Any:
    """A MeterProvider read by the Prometheus exporter, served on a free port, announced."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import start_http_server

    provider = MeterProvider(resource=resource, metric_readers=[PrometheusMetricReader()])
    server, _ = start_http_server(0, "127.0.0.1")
    targets = os.environ.get("EXAMPLE_TARGETS_DIR")
    if targets:
        entry = [
            {
                "targets": [f"127.0.0.1:{server.server_port}"],
                "labels": {"deployment": deployment, "instance_id": _instance(deployment)},
            }
        ]
        path = Path(targets) / f"{_instance(deployment)}.json"
        path.with_suffix(".tmp").write_text(json.dumps(entry))
        path.with_suffix(".tmp").replace(path)  # Prometheus never reads half a file
    return provider


def _stopped(deployment: str) -> None:
    """After profkit's own shutdown: write the final counters, shut the providers down."""
    stats_dir = os.environ.get("EXAMPLE_STATS_DIR")
    if stats_dir:
        path = Path(stats_dir) / f"{_instance(deployment)}.json"
        path.write_text(json.dumps({"deployment": deployment, **profkit.stats()}))
    for provider in _PROVIDERS.values():
        provider.shutdown()
    _PROVIDERS.clear()


@ray_serve.replica(setup=providers)
class Classifier:
    """The model deployment: batched forwards of the TransformerEncoder classifier."""

    def __init__(self) -> None:
        torch.set_num_threads(1)
        self.model = TinyClassifier().eval()

    @ray_serve.batch(label="classify_batch", max_batch_size=8, batch_wait_timeout_s=0.01)
    def forward(self, batch: list[list[int]]) -> list[int]:
        """One forward for the batch (run where Ray Serve runs the batch, not awaited)."""
        with profkit.region("prepare"):
            tokens = torch.tensor([(row + [0] * SEQ)[:SEQ] for row in batch])
        with profkit.region("encode"), torch.inference_mode():
            classes = self.model(tokens).argmax(dim=1)
        return [int(c) for c in classes]

    def __del__(self) -> None:
        _stopped("Classifier")


@ray_serve.replica(setup=providers)
class Ingress:
    """The HTTP ingress: parse, then one call to the classifier through a traced handle."""

    def __init__(self, classifier: DeploymentHandle) -> None:
        self.classifier = ray_serve.traced(classifier)

    @profkit.profiled("classify")
    async def __call__(self, request: Any) -> dict[str, Any]:
        body = await request.json()
        tokens = [int(t) % VOCAB for t in body.get("tokens", [])][:SEQ]
        label = await self.classifier.forward.remote(tokens)
        return {"class": label, "replica": os.getpid()}

    def __del__(self) -> None:
        _stopped("Ingress")


def runtime_env() -> dict[str, Any]:
    """What each replica's process gets: the settings in this process's environment."""
    env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)}
    root = str(Path(__file__).resolve().parents[2])  # examples/ importable in the replicas
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    return {"env_vars": env}


def build_app(replicas: int | None = None, ingress_replicas: int | None = None) -> Any:
    """The application: ``Ingress`` -> ``Classifier``, each replica with the same env."""
    actor = {"num_cpus": 0, "runtime_env": runtime_env()}  # fits a 2-core machine
    model_replicas = replicas or int(os.environ.get("EXAMPLE_REPLICAS", "2"))
    front_replicas = ingress_replicas or int(os.environ.get("EXAMPLE_INGRESS_REPLICAS", "1"))
    model = serve.deployment(
        Classifier, num_replicas=model_replicas, ray_actor_options=actor, max_ongoing_requests=64
    )
    ingress = serve.deployment(
        Ingress, num_replicas=front_replicas, ray_actor_options=actor, max_ongoing_requests=64
    )
    return ingress.bind(model.bind())


def free_port() -> int:
    """A port free on 127.0.0.1 now (Ray's HTTP proxy takes no port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:  # pragma: no cover - interactive
    import time

    import ray

    port = int(os.environ.get("EXAMPLE_PORT", "8000"))
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(), name="classifier", route_prefix="/")
        print(f"serving on http://127.0.0.1:{port}/ (Ctrl-C stops)")
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
