"""Diagnosis on real CPU workloads, end to end: profiler -> summary -> diagnosis -> exporters.

Each workload is profiled through the whole pipeline (``profkit.testing.capture``) and every
sampled call must get the expected verdict. The session is flushed after each call so that
the export worker (which holds the GIL while it parses a window) never runs beside the next
sampled call: on a 2-core box that contention alone stretches the Python between ops.
"""

from __future__ import annotations

import importlib.util
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from structlog.testing import capture_logs

import profkit
from profkit._global import get_session
from profkit._model import CallSummary, Diagnosis
from profkit.exporters.console import render_call
from profkit.testing import capture

CALLS = 3
"""Sampled calls per workload; each one must get the verdict."""

torch.manual_seed(0)
MODEL = torch.nn.Sequential(
    torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
).eval()
# One request's row: a single row keeps the model's ops on one intra-op thread. With a
# 32-row batch on a busy 2-core box, a tiny addmm can wait 20-40 ms at an OpenMP barrier for
# a descheduled worker thread, which the diagnosis then (rightly) reports as compute time.
REQUEST = torch.randn(1, 64)
# The input-bound handlers spend far longer outside torch ops than a descheduled op can
# stretch on a busy machine (one tiny addmm was seen taking 35 ms with both cores taken by
# other processes): the verdict compares wall-clock shares, so the margin must be wide.
PREPROCESS_S = 0.2
PARSED_INTS = 300_000
A = torch.randn(1024, 1024)
B = torch.randn(1024, 1024)

LAUNCH_REASON = re.compile(
    r"[\d,]+ ops with a median of \d+\.\d \u00b5s each: tiny ops \(\u2264 20 \u00b5s\) and the "
    r"gaps between them take \d+% of the time in and between ops, the host is busy launching them"
)


@profkit.profiled("launch_loop")
def launch_loop() -> torch.Tensor:
    """3,000 tiny adds on a 4-element tensor: the host does nothing but launch ops."""
    t = torch.zeros(4)
    for _ in range(3000):
        t = t + 1
    return t


@profkit.profiled("big_matmul")
def big_matmul() -> torch.Tensor:
    """One 1024 x 1024 matmul: a single op takes nearly the whole call."""
    return A @ B


@profkit.profiled("sleepy_handler")
def sleepy_handler() -> torch.Tensor:
    """Waits 200 ms (I/O, a queue) in 'preprocess', then runs a small model."""
    with profkit.region("preprocess"):
        time.sleep(PREPROCESS_S)
    with profkit.region("model"), torch.no_grad():
        out: torch.Tensor = MODEL(REQUEST)
    return out


@profkit.profiled("parsing_handler")
def parsing_handler() -> torch.Tensor:
    """Parses text in pure Python in 'preprocess', then runs a small model."""
    with profkit.region("preprocess"):
        text = " ".join(str(i) for i in range(PARSED_INTS))
        lengths = [float(len(word)) for word in text.split()]
        row = torch.tensor(lengths[:64]).unsqueeze(0)
    with profkit.region("model"), torch.no_grad():
        out: torch.Tensor = MODEL(row)
    return out


class _SlowDataset(torch.utils.data.Dataset[torch.Tensor]):
    """Eight rows, each read slowly (a disk, a decoder, a remote store)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(PREPROCESS_S / 8)
        return torch.full((64,), float(i))


@profkit.profiled("loader_step")
def loader_step() -> list[torch.Tensor]:
    """A step fed by a DataLoader without workers: nearly all its time is reading rows."""
    loader = torch.utils.data.DataLoader(_SlowDataset(), batch_size=4)
    with torch.no_grad():
        return [MODEL(rows) for rows in loader]


def _run(fn: Callable[[], Any], calls: int = CALLS, **settings: Any) -> list[CallSummary]:
    """Profile ``calls`` calls of ``fn``, flushing after each; return their summaries."""
    with capture(sample_every=1, **settings) as cap:
        for _ in range(calls):
            fn()
            assert profkit.force_flush(30.0)
    assert calls == len(cap.calls)
    return cap.calls


def _diagnosis(call: CallSummary) -> Diagnosis:
    assert call.diagnosis is not None
    return call.diagnosis


# --- the three signatures ------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_tiny_op_loop_is_launch_bound() -> None:
    """Every sampled call of a 3,000-add loop is launch-bound, with a readable reason."""
    for call in _run(launch_loop):
        d = _diagnosis(call)
        assert (call.label, d.verdict) == ("launch_loop", "launch-bound"), d
        assert LAUNCH_REASON.fullmatch(d.reason), d.reason
        assert d.figures["op_count"] >= 3000
        assert "op:aten::add" in [what for what, _, _ in d.amdahl]


@pytest.mark.timeout(120)
def test_big_matmul_is_compute_bound() -> None:
    """Every sampled call of one 1024 x 1024 matmul is compute-bound, naming aten::mm first."""
    for call in _run(big_matmul):
        d = _diagnosis(call)
        assert (call.label, d.verdict) == ("big_matmul", "compute-bound"), d
        assert d.reason.startswith("aten::mm "), d.reason
        assert d.reason.endswith(" of op time"), d.reason
        assert d.amdahl[0][0] == "op:aten::mm"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("handler", [sleepy_handler, parsing_handler], ids=["sleep", "parse"])
def test_preprocess_handler_is_input_bound_naming_the_region(
    handler: Callable[[], torch.Tensor],
) -> None:
    """Every sampled call is input-bound; the reason and the top Amdahl entry name 'preprocess'."""
    for call in _run(handler):
        d = _diagnosis(call)
        assert d.verdict == "input-bound", d
        assert re.fullmatch(
            r"\d+% of the call outside torch ops, mostly in region 'preprocess'", d.reason
        ), d.reason
        assert d.amdahl[0][0] == "region:preprocess"
        assert d.amdahl[0][2] == pytest.approx(1 / (1 - d.amdahl[0][1]))


@pytest.mark.timeout(120)
def test_slow_dataloader_is_input_bound() -> None:
    """A call waiting on its DataLoader is input-bound: the loader's own time is not op time."""
    for call in _run(loader_step):
        d = _diagnosis(call)
        assert ("loader_step", "input-bound") == (call.label, d.verdict), d
        assert re.fullmatch(r"\d+% of the call outside torch ops", d.reason), d.reason


# --- the verdict on the span, in the log event and on the console --------------------------


def _root_span_attributes(spans: Any, call: CallSummary) -> dict[str, Any]:
    """The attributes of ``call``'s own span (matched by span id)."""
    (span,) = [s for s in spans if f"{s.context.span_id:016x}" == call.span_id]
    return dict(span.attributes)


@pytest.mark.timeout(120)
def test_verdict_and_amdahl_on_every_span_and_log_event() -> None:
    """Each sampled call's root span and profkit.profile event carry verdict, figures, Amdahl."""
    with capture_logs() as logs, capture(sample_every=1, exporters=("otel", "log")) as cap:
        for fn in (sleepy_handler, big_matmul, sleepy_handler):
            fn()
            assert profkit.force_flush(30.0)
    profiles = [e for e in logs if e["event"] == "profkit.profile"]
    assert ["sleepy_handler", "big_matmul", "sleepy_handler"] == [c.label for c in cap.calls]
    assert [c.label for c in cap.calls] == [e["label"] for e in profiles]
    for call, event in zip(cap.calls, profiles, strict=True):
        d = _diagnosis(call)
        attrs = _root_span_attributes(cap.spans(), call)
        expected_span = {
            "profkit.diagnosis.verdict": d.verdict,
            "profkit.diagnosis.reason": d.reason,
            "profkit.diagnosis.confidence": d.confidence,
            **{f"profkit.diagnosis.{k}": _as_written(k, v) for k, v in d.figures.items()},
            "profkit.amdahl.what": [w for w, _, _ in d.amdahl],
            "profkit.amdahl.fraction": [round(f, 4) for _, f, _ in d.amdahl],
            "profkit.amdahl.max_speedup": [round(s, 3) for _, _, s in d.amdahl],
        }
        actual_span = {k: list(v) if isinstance(v, tuple) else v for k, v in attrs.items()}
        assert expected_span == {k: actual_span.get(k) for k in expected_span}
        expected_event = {
            "span_id": call.span_id,
            "diagnosis": d.verdict,
            "diagnosis_reason": d.reason,
            "diagnosis_confidence": d.confidence,
            "amdahl": [
                {"what": w, "fraction": round(f, 4), "max_speedup": round(s, 3)}
                for w, f, s in d.amdahl
            ],
        }
        assert expected_event == {k: event.get(k) for k in expected_event}
    nested = [s for s in cap.spans() if s.name in ("preprocess", "model")]
    assert 4 == len(nested)
    assert not any("profkit.diagnosis.verdict" in (s.attributes or {}) for s in nested)


def _as_written(name: str, value: float) -> float:
    """A figure as the span carries it: counts as ints, µs to 0.001, shares to 0.0001."""
    if name.endswith("_count"):
        return int(value)
    return round(value, 3 if name.endswith("_us") else 4)


@pytest.mark.timeout(120)
def test_console_block_shows_the_diagnosis() -> None:
    """The console exporter's block has a 'diagnosis:' line and the best Amdahl entry."""
    (call,) = _run(sleepy_handler, calls=1)
    d = _diagnosis(call)
    text = render_call(call)
    sure = "" if d.confidence == "high" else f" ({d.confidence} confidence)"
    assert f"  diagnosis: {d.verdict}{sure} \u2014 {d.reason}" in text.splitlines()
    assert "region:preprocess" in text


# --- thresholds are settings ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "name"),
    [
        ({"input_bound_share": 0}, "input_bound_share"),
        ({"input_bound_share": 1.5}, "input_bound_share"),
        ({"launch_bound_min_ops": 0}, "launch_bound_min_ops"),
        ({"launch_bound_op_us": -1}, "launch_bound_op_us"),
        ({"compute_bound_top2_share": "x"}, "compute_bound_top2_share"),
    ],
)
def test_bad_threshold_raises_value_error_naming_it(settings: dict[str, Any], name: str) -> None:
    """A bad diagnosis threshold is rejected by configure() like any other setting."""
    with pytest.raises(ValueError, match=f"'{name}'"):
        profkit.configure(**settings)
    assert get_session() is None


def test_bad_threshold_env_var_warns_and_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """PROFKIT_INPUT_BOUND_SHARE=abc warns and the default 0.5 applies."""
    monkeypatch.setenv("PROFKIT_INPUT_BOUND_SHARE", "abc")
    with pytest.warns(profkit.ProfkitConfigWarning, match="PROFKIT_INPUT_BOUND_SHARE"):
        config = profkit.configure(exporters=())
    assert 0.5 == config.input_bound_share


@pytest.mark.timeout(120)
def test_threshold_setting_reaches_the_diagnosis() -> None:
    """A configured threshold is the one the worker diagnoses with (an input share of 1)."""
    (call,) = _run(sleepy_handler, calls=1, input_bound_share=1.0)
    d = _diagnosis(call)
    assert (d.verdict != "input-bound", d.figures["input_share"] < 1.0) == (True, True)


# --- the GPU check script on a machine without CUDA ----------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present: run bench/gpu_check.py")
def test_gpu_check_without_cuda_says_so_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    """bench/gpu_check.py on a CPU-only machine prints "CUDA not available" and returns 2."""
    path = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    status = module.main([])
    assert (2, True) == (status, capsys.readouterr().out.startswith("CUDA not available"))
