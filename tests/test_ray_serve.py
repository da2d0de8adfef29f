"""Ray Serve for real: a local cluster, the example's two deployments, 400 requests through
Ray's HTTP proxy, spans over OTLP to a real receiver, the fleet's metrics scraped per replica.

Skipped where Ray Serve is not installed (``scripts/setup-ray``, run by ``scripts/test`` in
CI or with ``PROFKIT_WITH_RAY=1``).
"""

from __future__ import annotations

import json
import math
import secrets
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from otlp_receiver import HttpReceiver

pytest.importorskip(
    "ray.serve", reason="Ray Serve is not installed: scripts/setup-ray (pip install 'profkit[ray]')"
)
pytest.importorskip(
    "opentelemetry.exporter.prometheus", reason="needs profkit[prometheus] for the fleet view"
)

import ray
from prometheus_client.parser import text_string_to_metric_families
from ray import serve

from examples.ray_serve import app
from examples.ray_serve.load import send

REQUESTS = 400
SAMPLE_EVERY = 4


def _scrape(targets: Path, label: str) -> dict[str, float]:
    """``profkit_call_duration_seconds_count`` of ``label``, per replica target."""
    counts: dict[str, float] = {}
    for path in sorted(targets.glob("*.json")):
        (entry,) = json.loads(path.read_text())
        (target,) = entry["targets"]
        text = urllib.request.urlopen(f"http://{target}/metrics", timeout=5).read().decode()
        counts[path.stem] = sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "profkit_call_duration_seconds_count"
            and sample.labels.get("profkit_label") == label
        )
    return counts


def _fleet_sum(targets: Path, label: str, expected: float, within_s: float) -> float:
    """The fleet's count of ``label``, scraped until it reaches ``expected`` or ``within_s``
    pass (a profiled call's duration waits for its export: one scrape interval)."""
    deadline = time.monotonic() + within_s
    while True:
        total = sum(_scrape(targets, label).values())
        if total >= expected or time.monotonic() > deadline:
            return total
        time.sleep(0.5)


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A local Ray cluster on 127.0.0.1 serving the example, replicas exporting to a receiver."""
    targets, stats = tmp_path / "targets", tmp_path / "stats"
    targets.mkdir()
    stats.mkdir()
    with HttpReceiver() as rx:
        env = {
            "PROFKIT_SAMPLE_EVERY": str(SAMPLE_EVERY),
            "PROFKIT_COLD_CALLS": "0",
            "PROFKIT_MAX_PER_MINUTE": "none",
            "PROFKIT_MAX_OVERHEAD": "none",
            "PROFKIT_METRICS": "1",
            "PROFKIT_EXPORTERS": "otel",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": rx.endpoint,
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "EXAMPLE_TARGETS_DIR": str(targets),
            "EXAMPLE_STATS_DIR": str(stats),
        }
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        port = app.free_port()
        ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1")
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            serve.run(app.build_app(replicas=2, ingress_replicas=2), route_prefix="/")
            yield f"http://127.0.0.1:{port}/", rx, targets, stats
        finally:
            serve.shutdown()
            ray.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_requests_through_the_proxy_are_traced_batched_and_counted(cluster: Any) -> None:
    """Two replicas each: every sampled span in its request's trace, shares sum to 1 per
    batch, the replicas' counters and the fleet's metrics add up to the requests served."""
    url, rx, targets, stats_dir = cluster
    parents = {secrets.token_hex(16): secrets.token_hex(8) for _ in range(REQUESTS)}
    answers = send(url, list(parents.items()), concurrency=16)
    assert REQUESTS == sum(1 for a in answers if "class" in a)
    assert 2 == len({a["replica"] for a in answers})  # both ingress replicas served

    assert 4 == len(list(targets.glob("*.json")))  # a scrape target per replica
    served = _fleet_sum(targets, "classify", REQUESTS, within_s=10.0)
    serve.shutdown()  # each replica flushes profkit in __del__, then writes its counters
    replicas = [json.loads(p.read_text()) for p in sorted(stats_dir.glob("*.json"))]
    by_deployment: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in replicas:
        by_deployment[s["deployment"]].append(s)

    # the fleet view: every request counted once, across the replicas
    assert REQUESTS == served
    # the replicas' own counters add up, and nothing is left pending after shutdown
    assert [2, 2] == [len(by_deployment["Ingress"]), len(by_deployment["Classifier"])]
    assert REQUESTS == sum(s["root_calls"] for s in by_deployment["Ingress"])
    settled = [
        s["exported"] + s["dropped"] + s["skipped_busy"] + s["skipped_foreign"] for s in replicas
    ]
    assert [s["sampled"] for s in replicas] == settled, replicas
    assert [0, 0, 0, 0] == [s["errors"] for s in replicas]

    spans = rx.spans()
    exported = {d: sum(s["exported"] for s in ss) for d, ss in by_deployment.items()}
    roots = [s for s in spans if s.name == "classify"]
    batches = [
        s for s in spans if s.name == "classify_batch" and "profkit.batch.share" not in s.attributes
    ]
    members = [
        s for s in spans if s.name == "classify_batch" and "profkit.batch.share" in s.attributes
    ]
    assert exported["Ingress"] == len(roots) > 0
    assert exported["Classifier"] == len(batches) > 0
    # every sampled root span and member span is in its own request's trace, under its span
    assert [] == [s for s in roots if parents.get(s.trace_id) != s.parent_span_id]
    assert [] == [s for s in members if parents.get(s.trace_id) != s.parent_span_id]
    # each profiled batch: one member span per request in it, shares summing to 1
    shares: dict[str, list[float]] = defaultdict(list)
    for m in members:
        ((_, batch_span),) = m.links
        shares[batch_span].append(m.attributes["profkit.batch.share"])
    sizes = {b.span_id: b.attributes["profkit.batch.size"] for b in batches}
    assert sizes == {b: len(s) for b, s in shares.items()}
    # (each share is exported rounded to 6 decimals)
    assert [] == [b for b, s in shares.items() if not math.isclose(1.0, sum(s), abs_tol=1e-5)]
    assert sum(sizes.values()) > len(sizes)  # Ray Serve did batch requests together
