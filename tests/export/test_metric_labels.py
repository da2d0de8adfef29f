"""A label as metrics record it: the string spans carry (encodable, escaped, cut at
``max_attribute_length``), one series per label whether the call was profiled or not, and a
Prometheus scrape that a label cannot break."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import profkit
from profkit.testing import capture

HOSTILE = {
    "surrogate": "bad\udcff label",  # a file name read with surrogateescape
    "newline": "pre\ndict",
    "long": "x" * 600,
}


def _label_values(reader: InMemoryMetricReader, name: str) -> dict[str, int]:
    """profkit.label value -> points' count summed, for metric ``name``."""
    data = reader.get_metrics_data()
    out: dict[str, int] = {}
    for rm in data.resource_metrics if data is not None else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == name:
                    for p in metric.data.data_points:
                        label = p.attributes["profkit.label"]
                        out[label] = out.get(label, 0) + p.count
    return out


def _run(label: str, meter_provider: Any, calls: int = 6) -> dict[str, Any]:
    @profkit.profiled(label)
    def predict(x: torch.Tensor) -> torch.Tensor:
        return torch.mm(x, x)

    with capture(sample_every=2, metrics=True, meter_provider=meter_provider) as cap:
        for _ in range(calls):
            predict(torch.ones(8, 8))
        assert profkit.force_flush(10.0)
        span_labels = {c.label for c in cap.calls}
        stats = profkit.stats()
    return {"span_labels": span_labels, "stats": stats}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_label_is_one_series_as_spans_carry_it(kind: str) -> None:
    reader = InMemoryMetricReader()
    run = _run(HOSTILE[kind], MeterProvider(metric_readers=[reader]))
    (span_label,) = run["span_labels"]
    durations = _label_values(reader, "profkit.call.duration")
    ops = _label_values(reader, "profkit.op.self_time")
    assert {span_label: run["stats"]["root_calls"]} == durations  # profiled or not: one series
    assert {span_label} == set(ops)  # the two instruments join on profkit_label
    assert len(span_label) <= 256
    span_label.encode("utf-8")  # (a lone surrogate raises here)


def test_a_hostile_label_does_not_break_a_prometheus_scrape() -> None:
    exporter = pytest.importorskip("opentelemetry.exporter.prometheus")
    prometheus_client = pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    registry = prometheus_client.CollectorRegistry()
    app = prometheus_client.Counter("app_requests", "the app's own metric", registry=registry)
    app.inc()
    provider = MeterProvider(metric_readers=[exporter.PrometheusMetricReader(registry=registry)])
    try:
        _run(HOSTILE["surrogate"], provider)
        text = prometheus_client.generate_latest(registry).decode()
    finally:
        provider.shutdown()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert "app_requests" in names  # the application's own series survive
    assert "profkit_call_duration_seconds" in names


def test_labels_from_user_input_keep_the_cache_bounded() -> None:
    """Past 256 labels every new one is recorded as ``other``; the labels remembered on the
    way stay bounded too (each distinct raw label used to be kept for ever)."""
    from profkit._export.bounds import MAX_LABELS, SeriesBounds

    bounds = SeriesBounds()
    values = {bounds.label(f"/item/{i}", 256)["profkit.label"] for i in range(20_000)}
    assert len(values) == MAX_LABELS + 1  # 256 labels and "other"
    assert len(bounds._labels) <= 4 * MAX_LABELS


def test_sessions_cutting_labels_differently_keep_one_series_each() -> None:
    """Two sessions on one MeterProvider with different ``max_attribute_length``: in each,
    the duration and the op rows of a label carry the cut its spans carry."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    label = "y" * 100
    for limit in (80, 30):

        @profkit.profiled(label)
        def predict(x: torch.Tensor) -> torch.Tensor:
            return torch.mm(x, x)

        with capture(
            sample_every=1, metrics=True, meter_provider=provider, max_attribute_length=limit
        ):
            predict(torch.ones(8, 8))
            assert profkit.force_flush(10.0)
    durations = _label_values(reader, "profkit.call.duration")
    ops = _label_values(reader, "profkit.op.self_time")
    assert {80, 30} == {len(v) for v in durations}
    assert set(durations) == set(ops)
