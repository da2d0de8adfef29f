"""Ray Serve for real: a local cluster, the example's two deployments, 400 requests through
Ray's HTTP proxy, spans over OTLP to a real receiver, the fleet's metrics scraped per replica.

Skipped where Ray Serve is not installed (``scripts/setup-ray``, run by ``scripts/test`` in
CI or with ``PROFKIT_WITH_RAY=1``).
"""

from __future__ import annotations

import contextlib
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
from ray.serve.schema import TracingConfig

from examples.ray_serve import app
from examples.ray_serve.load import post, send

REQUESTS = 400
#: requests sent after them in traces the caller did not sample
UNSAMPLED = 40
#: requests of the test with Ray Serve's own tracing on (every second one unsampled), and
#: requests without a traceparent there (Ray Serve's sampler decides)
TRACED_REQUESTS = 80
UNTRACED = 20
SAMPLE_EVERY = 4
ROOT = Path(__file__).resolve().parents[1]


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


@contextlib.contextmanager
def _cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, replicas: int, tracing: Any = None
) -> Iterator[Any]:
    """A local Ray cluster on 127.0.0.1 serving the example (``replicas`` of each
    deployment), replicas exporting to an OTLP receiver; ``tracing``: Ray Serve's own."""
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
        # (examples/ importable in Serve's own actors: the proxy loads the tracing exporter)
        job_env = {"env_vars": {"PYTHONPATH": str(ROOT)}}
        ray.init(
            num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", runtime_env=job_env
        )
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port}, tracing_config=tracing)
            serve.run(app.build_app(replicas=replicas, ingress_replicas=replicas), route_prefix="/")
            yield f"http://127.0.0.1:{port}/", rx, targets, stats
        finally:
            serve.shutdown()
            ray.shutdown()


def _traces(n: int, unsampled_every: int) -> tuple[dict[str, str], set[str]]:
    """``n`` (trace id -> parent span id), and the trace ids sent as not sampled (flag 00)."""
    parents = {secrets.token_hex(16): secrets.token_hex(8) for _ in range(n)}
    return parents, {t for i, t in enumerate(parents) if i % unsampled_every == 0}


def _stopped(stats_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Each replica's final counters (written as it stopped), by deployment."""
    by_deployment: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for path in sorted(stats_dir.glob("*.json")):
        s = json.loads(path.read_text())
        by_deployment[s["deployment"]].append(s)
    return by_deployment


def _settled(s: dict[str, Any]) -> int:
    """What a sampled call may end as (nothing pending)."""
    return int(s["exported"] + s["dropped"] + s["skipped_busy"] + s["skipped_foreign"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_requests_through_the_proxy_are_traced_batched_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two replicas each: every sampled span in its request's trace, shares sum to 1 per
    batch, the replicas' counters and the fleet's metrics add up to the requests served."""
    with _cluster(tmp_path, monkeypatch, replicas=2) as (url, rx, targets, stats_dir):
        _check_two_replicas(url, rx, targets, stats_dir)


def _check_two_replicas(url: str, rx: Any, targets: Path, stats_dir: Path) -> None:
    parents, _ = _traces(REQUESTS, unsampled_every=REQUESTS + 1)
    answers = send(url, list(parents.items()), concurrency=16)
    # then requests whose trace the caller did not sample (traceparent flags 00)
    unsampled, _ = _traces(UNSAMPLED, unsampled_every=1)
    answers += send(url, list(unsampled.items()), concurrency=16, unsampled=set(unsampled))
    served_requests = REQUESTS + UNSAMPLED
    assert served_requests == sum(1 for a in answers if "class" in a)
    assert 2 == len({a["replica"] for a in answers})  # both ingress replicas served

    assert 4 == len(list(targets.glob("*.json")))  # a scrape target per replica
    served = _fleet_sum(targets, "classify", served_requests, within_s=10.0)
    serve.shutdown()  # each replica flushes profkit in __del__, then writes its counters
    by_deployment = _stopped(stats_dir)
    replicas = [*by_deployment["Ingress"], *by_deployment["Classifier"]]

    # the fleet view: every request counted once, across the replicas
    assert served_requests == served
    # the replicas' own counters add up, and nothing is left pending after shutdown
    assert [2, 2] == [len(by_deployment["Ingress"]), len(by_deployment["Classifier"])]
    ingress = by_deployment["Ingress"]
    assert served_requests == sum(s["root_calls"] for s in ingress)
    assert UNSAMPLED == sum(s["skipped_unsampled_trace"] for s in ingress)
    assert [s["sampled"] for s in replicas] == [_settled(s) for s in replicas], replicas
    assert [0, 0, 0, 0] == [s["errors"] for s in replicas]

    spans = rx.spans()
    exported = {d: sum(s["exported"] for s in ss) for d, ss in by_deployment.items()}
    roots = [s for s in spans if s.name == "classify"]
    of_batch = [s for s in spans if s.name == "classify_batch"]
    batches = [s for s in of_batch if "profkit.batch.share" not in s.attributes]
    members = [s for s in of_batch if "profkit.batch.share" in s.attributes]
    assert exported["Ingress"] == len(roots) > 0
    assert exported["Classifier"] == len(batches) > 0
    # every sampled root span and member span is in its own request's trace, under its span
    assert [] == [s for s in roots if parents.get(s.trace_id) != s.parent_span_id]
    assert [] == [s for s in members if parents.get(s.trace_id) != s.parent_span_id]
    # each profiled batch of sampled requests: a member span per request, shares summing to
    # 1 (the unsampled requests' batches, sent after, have no member spans)
    shares: dict[str, list[float]] = defaultdict(list)
    for m in members:
        ((_, batch_span),) = m.links
        shares[batch_span].append(m.attributes["profkit.batch.share"])
    sizes = {b.span_id: b.attributes["profkit.batch.size"] for b in batches if b.span_id in shares}
    assert sizes == {b: len(s) for b, s in shares.items()}
    # (each share is exported rounded to 6 decimals)
    assert [] == [b for b, s in shares.items() if not math.isclose(1.0, sum(s), abs_tol=1e-5)]
    assert sum(sizes.values()) > len(sizes)  # Ray Serve did batch requests together


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_under_ray_serves_own_tracing_its_sampling_and_the_callers_are_honoured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray Serve's tracing on (sampling ratio 0): a request with a sampled traceparent is
    profiled in its trace; one the caller did not sample, and one Ray Serve decides on (no
    traceparent: its ratio says no), are profiled in neither replica."""
    tracing = TracingConfig(
        enabled=True,
        exporter_import_path="examples.ray_serve.serve_tracing:no_serve_spans",
        sampling_ratio=0.0,
    )
    monkeypatch.setenv("PROFKIT_SAMPLE_EVERY", "2")
    parents, unsampled = _traces(TRACED_REQUESTS, unsampled_every=2)
    with _cluster(tmp_path, monkeypatch, 1, tracing) as (url, rx, _, stats_dir):
        answers = send(url, list(parents.items()), concurrency=8, unsampled=unsampled)
        answers += [post(url, "", "", [1, 2, 3], traceparent=False) for _ in range(UNTRACED)]
        serve.shutdown()
    assert TRACED_REQUESTS + UNTRACED == sum(1 for a in answers if "class" in a)
    by_deployment = _stopped(stats_dir)
    ((ingress,), (model,)) = by_deployment["Ingress"], by_deployment["Classifier"]
    assert (TRACED_REQUESTS + UNTRACED, len(unsampled) + UNTRACED) == (
        ingress["root_calls"],
        ingress["skipped_unsampled_trace"],
    )
    assert [ingress["sampled"], model["sampled"]] == [_settled(ingress), _settled(model)]

    spans = rx.spans()
    roots = [s for s in spans if s.name == "classify"]
    members = [s for s in spans if "profkit.batch.share" in s.attributes]
    assert ingress["exported"] == len(roots) > 0
    assert len(members) > 0
    # only in the sampled requests' traces, each under a span of its request (the caller's,
    # or Ray Serve's own where Ray Serve's span is in the request's trace)
    sampled = set(parents) - unsampled
    assert [] == [s for s in roots + members if s.trace_id not in sampled]
    assert [] == [s for s in roots + members if not s.parent_span_id]
