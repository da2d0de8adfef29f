"""configure(metrics=True): OpenTelemetry histograms and counters, read by an in-memory reader."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import profkit
from profkit.testing import capture


@pytest.fixture
def reader() -> InMemoryMetricReader:
    """An in-memory reader (cumulative) on a private MeterProvider."""
    return InMemoryMetricReader()


def _provider(reader: InMemoryMetricReader) -> MeterProvider:
    return MeterProvider(metric_readers=[reader])


def _metrics(reader: InMemoryMetricReader) -> dict[str, Any]:
    """Every metric the reader collected, by name."""
    data = reader.get_metrics_data()
    out: dict[str, Any] = {}
    for rm in data.resource_metrics if data is not None else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                out[metric.name] = metric
    return out


def _points(metric: Any, **attrs: str) -> list[Any]:
    return [
        p
        for p in metric.data.data_points
        if all(p.attributes.get(k.replace("_", ".", 1)) == v for k, v in attrs.items())
    ]


def _predictor(mlp: torch.nn.Module) -> Any:
    @profkit.profiled("predict")
    def predict(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return mlp(x)

    return predict


def test_op_self_time_counts_exported_calls_and_duration_every_call(
    reader: InMemoryMetricReader, mlp: torch.nn.Module, batch: torch.Tensor
) -> None:
    """(predict, aten::addmm) self-time points count exported calls; call.duration every call."""
    predict = _predictor(mlp)
    with capture(sample_every=3, metrics=True, meter_provider=_provider(reader)) as cap:
        for _ in range(30):
            predict(batch)
        assert profkit.force_flush(10.0)
        stats = profkit.stats()
        metrics = _metrics(reader)
    assert 10 == stats["exported"] == len(cap.calls)
    self_time = metrics["profkit.op.self_time"]
    (addmm,) = _points(self_time, profkit_label="predict", profkit_op="aten::addmm")
    assert stats["exported"] == addmm.count
    assert addmm.sum > 0
    (duration,) = _points(metrics["profkit.call.duration"], profkit_label="predict")
    assert 30 == duration.count == stats["root_calls"]
    assert "s" == metrics["profkit.op.self_time"].unit == metrics["profkit.call.duration"].unit
    assert max(duration.explicit_bounds) == 10.0  # seconds, not the SDK's millisecond bounds
    assert min(addmm.explicit_bounds) == 1e-6
    ops = {p.attributes["profkit.op"] for p in metrics["profkit.op.self_time"].data.data_points}
    assert "other" in ops or len(ops) <= 10  # the top_k rows and "other": bounded


def test_no_profkit_instrument_while_metrics_is_off(
    reader: InMemoryMetricReader, mlp: torch.nn.Module, batch: torch.Tensor
) -> None:
    """metrics off (the default): the provider given holds no profkit metric at all."""
    predict = _predictor(mlp)
    with capture(sample_every=2, meter_provider=_provider(reader)):
        for _ in range(10):
            predict(batch)
        assert profkit.force_flush(10.0)
        assert {} == _metrics(reader)


def test_no_instrument_on_the_global_provider_while_off(
    mlp: torch.nn.Module, batch: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """metrics off: the global MeterProvider is never asked for a meter."""
    from opentelemetry import metrics as otel_metrics

    asked: list[str] = []

    class Spy:
        def get_meter(self, name: str, *args: Any, **kwargs: Any) -> Any:
            asked.append(name)
            return otel_metrics.NoOpMeter(name)

    monkeypatch.setattr(otel_metrics, "get_meter_provider", lambda: Spy())
    predict = _predictor(mlp)
    with capture(sample_every=2):
        predict(batch)
    assert [] == asked
    with capture(sample_every=2, metrics=True):
        predict(batch)
    assert ["profkit"] == asked


def test_counters_mirror_stats(
    reader: InMemoryMetricReader, mlp: torch.nn.Module, batch: torch.Tensor
) -> None:
    """profkit.calls by outcome (and dropped by reason) equals stats()."""
    predict = _predictor(mlp)
    with capture(sample_every=4, metrics=True, meter_provider=_provider(reader)):
        for _ in range(20):
            predict(batch)
        assert profkit.force_flush(10.0)
        stats = profkit.stats()
        calls = _metrics(reader)["profkit.calls"]
    by_outcome = {p.attributes["profkit.outcome"]: p.value for p in calls.data.data_points}
    assert calls.data.is_monotonic
    assert stats["root_calls"] == by_outcome["root_calls"] == 20
    assert stats["exported"] == by_outcome["exported"] == 5
    assert stats["skipped_busy"] == by_outcome["skipped_busy"]


def test_every_stats_counter_is_a_metric(reader: InMemoryMetricReader) -> None:
    """Each integer counter of stats() is on one instrument (DESIGN: "the stats() counters
    as OTel counters"): an outcome of ``profkit.calls``, ``profkit.windows``, the sums of
    ``profkit.errors`` and of dropped calls, or ``profkit.counts`` by name."""

    @profkit.profiled("work")
    def work() -> int:
        return 1

    with capture(sample_every=2, metrics=True, meter_provider=_provider(reader)):
        for _ in range(6):
            work()
        members = [profkit.batch_member() for _ in range(3)]  # no span: unsampled members
        with profkit.batch("step", members):
            pass
        assert profkit.force_flush(10.0)
        stats = profkit.stats()
        metrics = _metrics(reader)
    seen: dict[str, int] = {"windows": metrics["profkit.windows"].data.data_points[0].value}
    seen["dropped"] = 0  # (its points are by reason)
    for point in metrics["profkit.calls"].data.data_points:
        outcome = point.attributes["profkit.outcome"]
        seen[outcome] = seen.get(outcome, 0) + point.value
    for point in metrics.get("profkit.counts", _Empty).data.data_points:
        seen[point.attributes["profkit.counter"]] = point.value
    seen["errors"] = sum(p.value for p in metrics.get("profkit.errors", _Empty).data.data_points)
    counters = {k: v for k, v in stats.items() if isinstance(v, int) and not isinstance(v, bool)}
    assert counters == {k: seen.get(k) for k in counters}
    assert stats["batch_members_unsampled"] == 3


class _Empty:
    class data:  # shaped like a metric with no points
        data_points: tuple[Any, ...] = ()


def test_dropped_calls_counted_by_reason(
    reader: InMemoryMetricReader, mlp: torch.nn.Module, batch: torch.Tensor
) -> None:
    """A call no exporter delivers (spans to a no-op provider) is counted dropped by reason."""
    from opentelemetry.trace import NoOpTracerProvider

    predict = _predictor(mlp)
    with capture(
        sample_every=1,
        metrics=True,
        meter_provider=_provider(reader),
        tracer_provider=NoOpTracerProvider(),
        extra_exporters=(),
    ) as cap:
        cap.exporter.export = lambda summary: None  # type: ignore[method-assign]
        predict(batch)
        profkit.force_flush(10.0)
        stats = profkit.stats()
        metrics = _metrics(reader)
    dropped = {
        p.attributes.get("profkit.reason"): p.value
        for p in metrics["profkit.calls"].data.data_points
        if p.attributes["profkit.outcome"] == "dropped"
    }
    assert stats["dropped_reasons"] == dropped
    (duration,) = _points(metrics["profkit.call.duration"], profkit_label="predict")
    assert 1 == duration.count  # a dropped call is a root call all the same


def test_exemplar_carries_the_profiled_calls_span(
    reader: InMemoryMetricReader, mlp: torch.nn.Module, batch: torch.Tensor
) -> None:
    """A profiled call's duration carries its own span's trace and span ids as the exemplar."""
    predict = _predictor(mlp)
    with capture(sample_every=5, metrics=True, meter_provider=_provider(reader)) as cap:
        for _ in range(10):
            predict(batch)
        assert profkit.force_flush(10.0)
        metrics = _metrics(reader)
    spans = {(f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}") for s in cap.spans()}
    (duration,) = _points(metrics["profkit.call.duration"], profkit_label="predict")
    exemplars = {(f"{e.trace_id:032x}", f"{e.span_id:016x}") for e in duration.exemplars}
    assert exemplars
    assert exemplars <= spans


def test_every_root_call_with_capture_slow_and_generators(
    reader: InMemoryMetricReader, mlp: torch.nn.Module, batch: torch.Tensor
) -> None:
    """capture_slow's timed calls, regions as roots and generator roots are all counted."""
    predict = _predictor(mlp)

    @profkit.profiled("stream")
    def stream() -> Iterator[int]:
        yield 1
        yield 2

    with capture(sample_every=7, capture_slow=True, metrics=True, meter_provider=_provider(reader)):
        for _ in range(21):
            predict(batch)
            with profkit.region("pre"):
                pass
            assert [1, 2] == list(stream())
        assert profkit.force_flush(10.0)
        stats = profkit.stats()
        metrics = _metrics(reader)
    counts = {
        p.attributes["profkit.label"]: p.count
        for p in metrics["profkit.call.duration"].data.data_points
    }
    assert {"predict": 21, "pre": 21, "stream": 21} == counts
    assert 63 == stats["root_calls"]


def test_metrics_setting_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """PROFKIT_METRICS=1 turns it on; configure() refuses a meter_provider without get_meter."""
    monkeypatch.setenv("PROFKIT_METRICS", "1")
    assert profkit.configure(exporters=()).metrics
    with pytest.raises(ValueError, match="meter_provider"):
        profkit.configure(meter_provider=object())


def test_a_second_configure_on_the_same_provider_feeds_the_same_instruments(
    reader: InMemoryMetricReader, mlp: torch.nn.Module, batch: torch.Tensor
) -> None:
    """configure() twice on one provider: the counters add both sessions' calls up."""
    provider = _provider(reader)
    predict = _predictor(mlp)
    profkit.configure(sample_every=5, exporters=("log",), metrics=True, meter_provider=provider)
    for _ in range(10):
        predict(batch)
    assert profkit.force_flush(10.0)
    profkit.configure(sample_every=5, exporters=("log",), metrics=True, meter_provider=provider)
    for _ in range(15):
        predict(batch)
    assert profkit.force_flush(10.0)
    profkit.shutdown(10.0)
    metrics = _metrics(reader)
    by_outcome = {
        p.attributes["profkit.outcome"]: p.value
        for p in metrics["profkit.calls"].data.data_points
        if "profkit.reason" not in p.attributes
    }
    assert 25 == by_outcome["root_calls"]
    assert 5 == by_outcome["exported"]
    (duration,) = _points(metrics["profkit.call.duration"], profkit_label="predict")
    assert 25 == duration.count


def test_every_root_call_in_an_unsampled_trace_and_cold(
    reader: InMemoryMetricReader, mlp: torch.nn.Module, batch: torch.Tensor
) -> None:
    """Root calls in an unsampled trace, cold calls and refused picks are all counted."""
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    unsampled = NonRecordingSpan(SpanContext(1, 2, is_remote=True, trace_flags=TraceFlags(0)))
    predict = _predictor(mlp)
    with capture(
        sample_every=2,
        cold_calls=3,
        max_per_minute=1,
        metrics=True,
        meter_provider=_provider(reader),
    ):
        for _ in range(12):
            predict(batch)
        with trace.use_span(unsampled):
            for _ in range(5):
                predict(batch)
        assert profkit.force_flush(10.0)
        stats = profkit.stats()
        metrics = _metrics(reader)
    assert 5 == stats["skipped_unsampled_trace"]
    assert stats["skipped_rate_limit"] >= 1
    (duration,) = _points(metrics["profkit.call.duration"], profkit_label="predict")
    assert 17 == duration.count == stats["root_calls"]


def test_op_and_label_attributes_are_bounded(
    reader: InMemoryMetricReader,
    mlp: torch.nn.Module,
    batch: torch.Tensor,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past MAX_OPS op names (and MAX_LABELS labels) the rest is recorded as "other"."""
    from profkit._export import bounds

    monkeypatch.setattr(bounds, "MAX_OPS", 3)
    monkeypatch.setattr(bounds, "MAX_LABELS", 1)
    predict = _predictor(mlp)
    other = profkit.profiled("second")(predict.__wrapped__)
    with capture(sample_every=1, metrics=True, meter_provider=_provider(reader)) as cap:
        for _ in range(4):
            predict(batch)
            other(batch)
        assert profkit.force_flush(10.0)
        metrics = _metrics(reader)
    self_time = metrics["profkit.op.self_time"]
    rows = {c.label: len(c.root.ops) for c in cap.calls}
    assert rows["predict"] > 4  # more ops than the bound
    points = _points(self_time, profkit_label="predict")
    by_op = {p.attributes["profkit.op"]: p.count for p in points}
    assert 4 == len(by_op)  # 3 op names, then "other"
    assert "other" in by_op
    assert 4 * rows["predict"] == sum(by_op.values())  # every row recorded
    labels = {p.attributes["profkit.label"] for p in self_time.data.data_points}
    assert {"predict", "other"} == labels  # "second" came past MAX_LABELS
    counts = {
        p.attributes["profkit.label"]: p.count
        for p in metrics["profkit.call.duration"].data.data_points
    }
    assert {"predict": 4, "other": 4} == counts


def test_op_series_in_all_stay_under_the_bound_and_the_sdk_s_limit(
    reader: InMemoryMetricReader,
    mlp: torch.nn.Module,
    batch: torch.Tensor,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Many labels, each within its own bounds, would make more op series than the SDK
    keeps (2000 per instrument, then an overflow series): the series in all stay within
    MAX_OP_SERIES, and every label keeps at least its "other" series."""
    from profkit._export import bounds

    monkeypatch.setattr(bounds, "MAX_OP_SERIES", 12)
    monkeypatch.setattr(bounds, "MAX_LABELS", 8)  # 12 - 8 - 1: 3 named series in all
    predict = _predictor(mlp)
    labelled = [profkit.profiled(f"label{i}")(predict.__wrapped__) for i in range(6)]
    with capture(sample_every=1, metrics=True, meter_provider=_provider(reader)) as cap:
        for fn in labelled:
            fn(batch)
        assert profkit.force_flush(10.0)
        metrics = _metrics(reader)
    points = metrics["profkit.op.self_time"].data.data_points
    series = {(p.attributes["profkit.label"], p.attributes["profkit.op"]) for p in points}
    assert len(series) <= 12
    assert 3 == sum(1 for _, op in series if op != "other")
    assert {f"label{i}" for i in range(6)} == {label for label, _ in series}
    assert not any(p.attributes.get("otel.metric.overflow") for p in points)
    assert sum(len(c.root.ops) for c in cap.calls) == sum(p.count for p in points)


def test_label_bounds_hold_across_configure_on_one_provider(
    reader: InMemoryMetricReader,
    mlp: torch.nn.Module,
    batch: torch.Tensor,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The instruments are the provider's, so are their bounds: three sessions with new
    labels each still hold at most MAX_LABELS labels, then "other"."""
    from profkit._export import bounds

    monkeypatch.setattr(bounds, "MAX_LABELS", 4)
    provider = _provider(reader)
    predict = _predictor(mlp)
    for cycle in range(3):
        fns = [profkit.profiled(f"c{cycle}l{i}")(predict.__wrapped__) for i in range(3)]
        with capture(sample_every=1, metrics=True, meter_provider=provider):
            for fn in fns:
                fn(batch)
            assert profkit.force_flush(10.0)
    metrics = _metrics(reader)
    labels = {
        p.attributes["profkit.label"] for p in metrics["profkit.call.duration"].data.data_points
    }
    assert {"c0l0", "c0l1", "c0l2", "c1l0", "other"} == labels


def test_batches_are_root_calls_and_an_asking_member_still_profiles_its_batch(
    reader: InMemoryMetricReader,
) -> None:
    """With metrics on, every profkit.batch() is counted, and baggage still opens one."""
    from opentelemetry import baggage
    from opentelemetry import context as otel_context

    def forward(asked: bool) -> None:
        token = otel_context.attach(baggage.set_baggage("profkit.profile", "1")) if asked else None
        try:
            member = profkit.batch_member()
        finally:
            if token is not None:
                otel_context.detach(token)
        with profkit.batch("forward", [member]):
            torch.mm(torch.randn(8, 8), torch.randn(8, 8))

    with capture(
        sample_every=10**9, baggage_trigger=True, metrics=True, meter_provider=_provider(reader)
    ) as cap:
        for asked in (False, False, False, True):  # the first: the sampler's pick
            forward(asked)
        assert profkit.force_flush(10.0)
        metrics = _metrics(reader)
    assert 2 == len(cap.calls)  # the sampler's pick, then the one a member asked for
    assert "baggage" == cap.calls[1].policy
    (duration,) = _points(metrics["profkit.call.duration"], profkit_label="forward")
    assert 4 == duration.count


def test_a_backlog_past_a_seconds_worth_is_shed_and_counted(reader: InMemoryMetricReader) -> None:
    """More unprofiled durations waiting than the thread hands the SDK in a second (each
    ``record()`` holds the GIL for microseconds): the oldest are shed, each one counted, and
    what the SDK got plus what was shed is every call."""
    from profkit._export.metrics import MAX_DURATIONS_PER_S
    from profkit._global import get_session

    @profkit.profiled("flood")
    def flood() -> None:
        pass

    calls = MAX_DURATIONS_PER_S + 5_000
    with capture(sample_every=10**9, cold_calls=0, metrics=True, meter_provider=_provider(reader)):
        session = get_session()
        assert session is not None
        assert session.metrics is not None
        session.metrics._stop.set()  # no drain thread: the backlog builds as under overload
        for _ in range(calls):
            flood()
        session.metrics.drain()
        stats = profkit.stats()
        metrics = _metrics(reader)
    (duration,) = _points(metrics["profkit.call.duration"], profkit_label="flood")
    # call 0 was profiled: its duration waited for its export, not in the backlog
    assert stats["metrics_shed"] == calls - 1 - MAX_DURATIONS_PER_S
    assert duration.count + stats["metrics_shed"] == calls == stats["root_calls"]
    assert duration.count == MAX_DURATIONS_PER_S + 1
    (shed,) = _points(metrics["profkit.calls"], profkit_outcome="metrics_shed")
    assert shed.value == stats["metrics_shed"]


def test_flush_and_shutdown_hand_the_sdk_no_more_than_their_timeout_allows(
    reader: InMemoryMetricReader,
) -> None:
    """``force_flush(0)`` and ``shutdown(0)`` with thousands of durations waiting: no time
    left, so none is handed to the SDK on the caller's thread (0.3-0.8 s of ``record()``
    calls before); the flush leaves them to the drain thread, the shutdown counts them
    ``metrics_shed``: what the SDK got plus what was shed is every call. Both say False
    (True before, with 15,000 still waiting, or shed)."""
    from profkit._global import get_session

    @profkit.profiled("burst")
    def burst() -> None:
        pass

    calls = 5_000
    profkit.configure(
        sample_every=10**9,
        cold_calls=0,
        exporters=(),
        metrics=True,
        meter_provider=_provider(reader),
    )
    session = get_session()
    assert session is not None
    assert session.metrics is not None
    session.metrics._stop.set()  # no drain thread: the durations wait for the flush
    for _ in range(calls):
        burst()
    waiting = len(session.metrics._pending) + len(session.metrics._held)
    assert waiting == calls  # (call 0 was sampled: its duration is held for its export)
    assert profkit.force_flush(0) is False  # (measurements still waiting: not all out)
    assert len(session.metrics._pending) + len(session.metrics._held) == waiting
    assert profkit.shutdown(0) is False  # (shed)
    stats = profkit.stats()
    assert stats["metrics_shed"] == waiting
    duration = _metrics(reader).get("profkit.call.duration")  # (none recorded: not there)
    points = _points(duration, profkit_label="burst") if duration is not None else []
    assert sum(p.count for p in points) + stats["metrics_shed"] == calls
