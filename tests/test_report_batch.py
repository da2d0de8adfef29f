"""``profkit report`` and the diagnosis on batches: sizes, and each request's share of time."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from opentelemetry.sdk.trace import TracerProvider

import profkit
from profkit import __main__ as cli
from profkit import _report
from profkit.exporters.console import JsonLinesExporter
from profkit.testing import capture


def _batches(mlp: torch.nn.Module, sizes: list[int]) -> tuple[list[str], list[profkit.CallSummary]]:
    """One profiled batch of each size (members in spans of their own), as JSON lines."""
    out = io.StringIO()
    tracer = TracerProvider().get_tracer("requests")
    with capture(sample_every=1, extra_exporters=(JsonLinesExporter(out),)) as cap:
        for size in sizes:
            members = []
            for _ in range(size):
                with tracer.start_as_current_span("request"):
                    members.append(profkit.batch_member())
            with profkit.batch("forward", members), torch.inference_mode():
                mlp(torch.randn(size, 64))
    return out.getvalue().splitlines(), cap.calls


def test_report_gives_batch_sizes_and_time_per_request(mlp: torch.nn.Module) -> None:
    """Batches of 2, 4, 4: sizes {2: 1, 4: 2}; per request time is the share of each batch."""
    text, calls = _batches(mlp, [2, 4, 4])
    (rollup,) = _report.rollup(_report.read_samples(text))
    per_request = sorted(
        c.duration_us / 1000.0 / c.batch.size for c in calls if c.batch for _ in range(c.batch.size)
    )
    assert rollup.batch is not None
    assert {2: 1, 4: 2} == rollup.batch["sizes"]
    assert _report.percentile(per_request, 50) == pytest.approx(rollup.batch["request_p50_ms"])
    assert _report.percentile(per_request, 95) == pytest.approx(rollup.batch["request_p95_ms"])
    rendered = _report.render([rollup])
    assert "batch sizes (size: samples): 2: 1, 4: 2" in rendered
    assert "per request share of batch time p50" in rendered


def test_report_cli_json_has_the_batch_rollup(
    mlp: torch.nn.Module, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--json carries the batch rollup; a label with no batch has none."""
    text, _ = _batches(mlp, [3])
    path = tmp_path / "profiles.jsonl"
    plain = {"event": "profkit.profile", "label": "plain", "duration_us": 5.0}
    path.write_text("\n".join([*text, json.dumps(plain)]) + "\n")
    assert 0 == cli.main(["report", "--json", str(path)])
    by_label = {r["label"]: r for r in json.loads(capsys.readouterr().out)}
    assert {"3": 1} == by_label["forward"]["batch"]["sizes"]
    assert by_label["plain"]["batch"] is None


def test_report_skips_shares_it_cannot_read() -> None:
    """A share that is not a number in [0, 1] is left out, never raised."""
    event = {
        "event": "profkit.profile",
        "label": "forward",
        "duration_us": 1000.0,
        "batch_members": [{"share": 0.5}, {"share": "x"}, {"share": 7}, "junk", {"share": 0.5}],
    }
    (sample,) = _report.read_samples([json.dumps(event)])
    assert [0.5, 0.5] == sample.shares


def test_diagnosis_of_a_batch_says_the_time_per_request(mlp: torch.nn.Module) -> None:
    """A batch's diagnosis has its size and wall time per request, and says so."""
    _, calls = _batches(mlp, [4])
    (call,) = calls
    assert call.diagnosis is not None
    figures = call.diagnosis.figures
    assert 4 == figures["batch_member_count"]
    assert figures["wall_us"] / 4 == pytest.approx(figures["per_request_us"])
    assert "a batch of 4:" in call.diagnosis.reason
