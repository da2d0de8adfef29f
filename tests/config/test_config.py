"""configure(): strict ValueErrors naming the setting; env vars fill defaults leniently."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import structlog
import torch
from fresh_interpreter import run_fresh
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import profkit
from profkit._config import ENV_VARS, build_config
from profkit._global import get_session
from profkit.testing import CaptureExporter


@pytest.mark.parametrize(
    ("settings", "name"),
    [
        ({"sample_every": 0}, "sample_every"),
        ({"sample_rate": 1.5}, "sample_rate"),
        ({"sample_every": 10, "sample_rate": 0.1}, "sample_every"),
        ({"top_k": -1}, "top_k"),
        ({"window": 0}, "window"),
        ({"warmup": -1}, "warmup"),
        ({"activities": "tpu"}, "activities"),
        ({"exporters": ("nope",)}, "exporters"),
        ({"exporters": ("otel", "otel")}, "exporters"),  # every window twice
        ({"trace_dir": "/tmp/a\0b"}, "trace_dir"),  # no file can be written there
        ({"max_per_minute": 0}, "max_per_minute"),
        ({"max_overhead": 0}, "max_overhead"),
        ({"max_overhead": 1.5}, "max_overhead"),
        ({"enabled": "yes"}, "enabled"),
        ({"export_timeout": 0}, "export_timeout"),
        ({"export_timeout": 1e10}, "export_timeout"),
        ({"export_timeout": float("inf")}, "export_timeout"),
        ({"logger": 42}, "logger"),
        ({"tracer_provider": "x"}, "tracer_provider"),
        ({"no_such_setting": 1}, "no_such_setting"),
    ],
)
def test_bad_arguments_raise_value_error_naming_the_setting(settings: dict, name: str) -> None:
    """Each bad argument raises ValueError whose message names the setting."""
    with pytest.raises(ValueError, match=name):
        profkit.configure(**settings)
    assert get_session() is None


@pytest.mark.parametrize(
    ("settings", "name"),
    [
        ({"tracer_provider": TracerProvider}, "tracer_provider"),
        ({"meter_provider": MeterProvider}, "meter_provider"),
        ({"logger": structlog.stdlib.BoundLogger}, "logger"),
        ({"extra_exporters": (CaptureExporter,)}, "extra_exporters"),
    ],
    ids=["tracer_provider", "meter_provider", "logger", "extra_exporters"],
)
def test_a_class_given_for_an_object_setting_is_a_value_error(settings: dict, name: str) -> None:
    """The class where an instance belongs (its methods are there, unbound) is refused."""
    with pytest.raises(ValueError, match=name):
        profkit.configure(**settings)
    assert get_session() is None


def test_an_opentelemetry_span_exporter_in_extra_exporters_is_a_value_error() -> None:
    """An OTel SpanExporter (export(spans)) is not a profkit exporter: a ValueError says where"""
    with pytest.raises(ValueError, match="extra_exporters") as info:
        profkit.configure(extra_exporters=[InMemorySpanExporter()])
    assert "TracerProvider" in str(info.value)
    assert get_session() is None


def _otel_metric_and_log_exporters() -> list[Any]:
    from opentelemetry.sdk._logs import export as logs
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

    in_memory = getattr(logs, "InMemoryLogRecordExporter", None) or logs.InMemoryLogExporter
    return [ConsoleMetricExporter(), in_memory()]


@pytest.mark.parametrize("exporter", _otel_metric_and_log_exporters(), ids=type)
def test_an_opentelemetry_metric_or_log_exporter_in_extra_exporters_is_a_value_error(
    exporter: Any,
) -> None:
    """OTel metric and log exporters have an export() too, for their own data: a ValueError
    says where they go instead of a session that fails every window."""
    with pytest.raises(ValueError, match="extra_exporters") as info:
        profkit.configure(extra_exporters=[exporter])
    assert "MeterProvider" in str(info.value)
    assert get_session() is None


def test_bad_env_var_warns_and_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """PROFKIT_SAMPLE_EVERY=abc warns, does not raise, and the default applies."""
    monkeypatch.setenv("PROFKIT_SAMPLE_EVERY", "abc")
    with pytest.warns(profkit.ProfkitConfigWarning, match="PROFKIT_SAMPLE_EVERY"):
        config = profkit.configure(exporters=())
    assert 100 == config.every


def test_env_var_out_of_range_warns_and_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """PROFKIT_EXPORT_TIMEOUT=1e19 warns and the default applies (no window is then dropped)."""
    monkeypatch.setenv("PROFKIT_EXPORT_TIMEOUT", "1e19")
    with pytest.warns(profkit.ProfkitConfigWarning, match="PROFKIT_EXPORT_TIMEOUT"):
        config = profkit.configure(exporters=())
    assert 5.0 == config.export_timeout


def test_logger_and_provider_objects_are_accepted() -> None:
    """Objects with the methods profkit calls are accepted (a structlog logger, a provider)."""
    provider = TracerProvider()
    config = profkit.configure(logger=structlog.get_logger("svc"), tracer_provider=provider)
    assert provider is config.tracer_provider


def test_infinite_flush_and_shutdown_timeouts_wait() -> None:
    """force_flush(inf) and shutdown(inf) mean "wait": no OverflowError, exporters on."""
    exporter = CaptureExporter()
    with structlog.testing.capture_logs():
        profkit.configure(
            sample_every=1,
            exporters=("otel", "log"),
            tracer_provider=TracerProvider(),
            extra_exporters=(exporter,),
        )
        sampled()
        assert profkit.force_flush(float("inf"))
        sampled()
        assert profkit.shutdown(float("inf"))
    assert 2 == len(exporter.calls)
    assert 2 == profkit.stats()["exported"]


@profkit.profiled("sampled")
def sampled() -> int:
    """A call to sample."""
    return 1


def test_env_vars_fill_unset_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Valid env vars set defaults; explicit arguments win over them."""
    monkeypatch.setenv("PROFKIT_SAMPLE_EVERY", "7")
    monkeypatch.setenv("PROFKIT_TOP_K", "3")
    monkeypatch.setenv("PROFKIT_RECORD_SHAPES", "true")
    monkeypatch.setenv("PROFKIT_EXPORTERS", "log,json")
    cfg = build_config({"top_k": 5})
    assert (7, 5, True, ("log", "json")) == (
        cfg.sample_every,
        cfg.top_k,
        cfg.record_shapes,
        cfg.exporters,
    )


def test_explicit_rate_ignores_env_every(monkeypatch: pytest.MonkeyPatch) -> None:
    """sample_rate given explicitly is not contradicted by PROFKIT_SAMPLE_EVERY."""
    monkeypatch.setenv("PROFKIT_SAMPLE_EVERY", "7")
    cfg = build_config({"sample_rate": 0.5})
    assert (None, 0.5, None) == (cfg.sample_every, cfg.sample_rate, cfg.every)


def test_every_setting_but_objects_has_an_env_var() -> None:
    """Every value setting has a PROFKIT_<NAME> variable."""
    names = {f.name for f in dataclasses.fields(profkit.Config)}
    objects = {"tracer_provider", "meter_provider", "logger", "extra_exporters"}
    assert names - objects == set(ENV_VARS)
    assert all(v == f"PROFKIT_{k.upper()}" for k, v in ENV_VARS.items())


def test_import_with_bad_env_does_not_crash() -> None:
    """A bad PROFKIT_* variable never breaks `import profkit` in a fresh interpreter."""
    env = {"PROFKIT_SAMPLE_EVERY": "abc", "PROFKIT_TOP_K": "-4", "PATH": ""}
    rc, report, err = run_fresh("import_with_env", env=env, timeout=120)
    assert (0, {"root_calls": 0}) == (rc, report), err


# -- no setting can break the process later (issue #26) --------------------------------------

HUGE = [1e308, 10**400, 2**63]
"""Numbers past every bound: each once reached an OverflowError (or a hang) later."""


@pytest.mark.parametrize("value", HUGE, ids=["1e308", "10**400", "2**63"])
@pytest.mark.parametrize(
    "name",
    [
        "sample_every",
        "max_per_minute",
        "slow_ms",
        "window",
        "warmup",
        "top_k",
        "max_window_s",
        "max_events",
        "queue_size",
        "export_timeout",
        "trace_max_files",
        "trace_max_bytes",
        "max_attribute_length",
        "max_attributes",
        "launch_bound_op_us",
        "launch_bound_min_ops",
    ],
)
def test_huge_numbers_are_value_errors(name: str, value: float) -> None:
    """A number past the setting's upper bound is a ValueError naming it, not an
    OverflowError later (slow_ms=1e308 became int(slow_ms * 1e6) in the session)."""
    with pytest.raises(ValueError, match=f"profkit setting '{name}'"):
        profkit.configure(**{name: value})
    assert get_session() is None


@pytest.mark.parametrize(
    ("name", "value"),
    [("slow_ms", 3_600_001), ("max_window_s", 3601), ("queue_size", 1_000_001)],
)
def test_just_past_the_documented_bound_is_refused(name: str, value: float) -> None:
    """The bounds are where the docs say: slow_ms 1 h, max_window_s 1 h, queue_size 1M."""
    with pytest.raises(ValueError, match=f"profkit setting '{name}'"):
        build_config({name: value}, environ={})


def test_the_largest_values_configure_and_shut_down() -> None:
    """Every numeric setting at its upper bound: configure() builds a session that runs."""
    top = {
        "sample_every": 2**31 - 1,
        "max_per_minute": 1_000_000,
        "capture_slow": True,
        "slow_ms": 3_600_000,
        "window": 2**31 - 1,
        "warmup": 2**31 - 1,
        "top_k": 2**31 - 1,
        "max_window_s": 3600,
        "max_events": 2**31 - 1,
        "queue_size": 1_000_000,
        "export_timeout": 3600,
        "trace_max_files": 2**31 - 1,
        "trace_max_bytes": 2**40,
        "max_attribute_length": 2**31 - 1,
        "max_attributes": 2**31 - 1,
        "launch_bound_op_us": 1_000_000,
        "launch_bound_min_ops": 2**31 - 1,
    }
    config = profkit.configure(exporters=(), **top)
    assert top == {name: getattr(config, name) for name in top}
    assert 1 == sampled()
    assert profkit.shutdown(10.0)


def test_env_var_past_its_bound_warns_and_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """PROFKIT_SLOW_MS=1e308 warns and slow_ms stays None (the label's p95)."""
    monkeypatch.setenv("PROFKIT_SLOW_MS", "1e308")
    with pytest.warns(profkit.ProfkitConfigWarning, match="PROFKIT_SLOW_MS"):
        config = build_config({"capture_slow": True})
    assert config.slow_ms is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="the rule is for hosts without CUDA")
def test_cuda_alone_without_a_device_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """``activities="cuda"`` where torch sees no CUDA device would fail every window's start
    (each sample dropped ``profiler_start_failed``): a ValueError naming the setting, or,
    from the environment, a warning and the default."""
    with pytest.raises(ValueError, match="activities"):
        profkit.configure(activities="cuda")
    monkeypatch.setenv("PROFKIT_ACTIVITIES", "cuda")
    with pytest.warns(profkit.ProfkitConfigWarning, match="PROFKIT_ACTIVITIES"):
        profkit.configure()
    config = profkit.get_config()
    assert config is not None
    assert "auto" == config.activities


@pytest.mark.parametrize(
    ("var", "raw"),
    [
        ("PROFKIT_SAMPLE_EVERY", "5_0"),  # int() reads 50
        ("PROFKIT_SAMPLE_EVERY", "\u0663"),  # int() reads ARABIC-INDIC DIGIT THREE as 3
        ("PROFKIT_SAMPLE_RATE", "1e-400"),  # float() reads 0.0: sampling off, silently
        ("PROFKIT_EXPORT_TIMEOUT", "1_0"),
        ("PROFKIT_EXPORTERS", ""),  # every sample dropped no_exporter
        ("PROFKIT_EXPORTERS", " , "),
    ],
)
def test_env_values_python_reads_loosely_warn_and_fall_back(
    monkeypatch: pytest.MonkeyPatch, var: str, raw: str
) -> None:
    """What a person would not have meant (a separator, another script's digit, a rate that
    underflows, an empty list) is a bad value: warned about, and the default applies."""
    monkeypatch.setenv(var, raw)
    with pytest.warns(profkit.ProfkitConfigWarning, match=var):
        config = build_config({})
    default = build_config({}, environ={})
    name = var.removeprefix("PROFKIT_").lower()
    assert getattr(default, name) == getattr(config, name)


def test_none_in_the_environment_means_no_exporter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROFKIT_EXPORTERS", "none")
    assert () == build_config({}).exporters


class RaisingPath:
    def __fspath__(self) -> str:
        raise RuntimeError("no path for you")


@pytest.mark.parametrize("bad", ["", RaisingPath()], ids=["empty", "fspath-raises"])
def test_a_bad_trace_dir_is_a_value_error_naming_it(bad: object) -> None:
    with pytest.raises(ValueError, match="trace_dir"):
        profkit.configure(trace_dir=bad)  # type: ignore[arg-type]
