"""``python -m profkit report``: per-label rollups of profkit's JSON lines, checked against the
events they are computed from."""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import profkit
from profkit import __main__ as cli
from profkit import _report
from profkit.exporters.console import JsonLinesExporter
from profkit.testing import capture


def profile(label: str, duration_us: float, verdict: str, **ops: float) -> dict[str, Any]:
    """A ``profkit.profile`` event as the json exporter writes it."""
    return {
        "event": "profkit.profile",
        "label": label,
        "duration_us": duration_us,
        "diagnosis": verdict,
        "top_ops": [
            {"op": name.replace("_", "::", 1), "self_cpu_us": us} for name, us in ops.items()
        ],
    }


def lines(*events: dict[str, Any]) -> list[str]:
    return [json.dumps(e) for e in events]


def test_percentile_is_nearest_rank() -> None:
    """p50 of 1..10 is 5, p95 is 10, p25 is 3; one value is every percentile."""
    values = [float(v) for v in range(10, 0, -1)]
    expected = (5.0, 10.0, 3.0, 7.0)
    actual = tuple(_report.percentile(values, p) for p in (50, 95, 25, 100 * 0.7))
    assert (expected, 7.0) == (actual, _report.percentile([7.0], 95))


def test_percentile_of_nothing_raises() -> None:
    """No values: a ValueError, not a silent zero."""
    with pytest.raises(ValueError, match="no values"):
        _report.percentile([], 50)


def test_rollup_counts_durations_verdicts_and_ops() -> None:
    """Two labels, noise lines skipped: samples, p50/p95, verdict counts, ops by median."""
    text = [
        "USDT:2026-12-01 profiler_start",  # kineto's stderr line, if mixed in
        "not json at all",
        '{"event": "request done", "status": 200}',  # the host app's own structlog event
        *lines(
            profile("/predict", 1000.0, "compute-bound", aten_addmm=600.0, aten_t=5.0),
            profile("/predict", 3000.0, "balanced", aten_addmm=900.0, aten_relu=100.0),
            profile("/predict", 2000.0, "compute-bound", aten_addmm=700.0, other=50.0),
            profile("/health", 10.0, "no-ops"),
        ),
    ]
    (predict, health) = _report.rollup(_report.read_samples(text))
    expected_predict = _report.LabelRollup(
        label="/predict",
        samples=3,
        p50_ms=2.0,
        p95_ms=3.0,
        verdicts={"compute-bound": 2, "balanced": 1},
        borderline={},
        ops=[
            _report.OpRollup("aten::addmm", 3, 600.0, 700.0, 900.0),
            _report.OpRollup("aten::relu", 1, 100.0, 100.0, 100.0),
            _report.OpRollup("aten::t", 1, 5.0, 5.0, 5.0),
        ],
    )
    assert (expected_predict, "/health", 1, {"no-ops": 1}) == (
        predict,
        health.label,
        health.samples,
        health.verdicts,
    )


def test_log_exporter_events_join_op_events_by_span_id() -> None:
    """structlog's JSON of the log exporter: op events attach to their profile by span id."""

    def op(span_id: str, self_cpu_us: float) -> dict[str, Any]:
        return {
            "event": "profkit.op",
            "label": "a",
            "span_id": span_id,
            "op": "aten::mm",
            "self_cpu_us": self_cpu_us,
        }

    text = lines(
        {"event": "profkit.profile", "label": "a", "duration_us": 10.0, "span_id": "s1",
         "diagnosis": "balanced", "diagnosis_confidence": "low"},
        {"event": "profkit.profile", "label": "a", "duration_us": 20.0, "span_id": "s2",
         "diagnosis": "balanced", "diagnosis_confidence": "high"},
        op("s1", 4.0),
        op("s2", 8.0),
    )  # fmt: skip
    samples = _report.read_samples(text)
    (rollup,) = _report.rollup(samples)
    expected = ([{"aten::mm": 4.0}, {"aten::mm": 8.0}], {"balanced": 1}, 6.0)
    assert expected == ([s.ops for s in samples], rollup.borderline, rollup.ops[0].median_us)


def test_render_shows_each_label_block() -> None:
    """The text report has a header line, a verdicts line and one row per op for each label."""
    text = lines(profile("/p", 1500.0, "compute-bound", aten_mm=10.0))
    out = _report.render(_report.rollup(_report.read_samples(text)))
    assert [
        "/p  1 samples  duration p50 1.500 ms  p95 1.500 ms",
        "  verdicts: compute-bound 1",
    ] == out.splitlines()[:2]
    assert "aten::mm" in out.splitlines()[3]


def test_report_cli_on_a_missing_file_fails_cleanly(capsys: pytest.CaptureFixture[str]) -> None:
    """An unreadable file: exit 1 and one line on stderr, no traceback."""
    assert 1 == cli.main(["report", "/nonexistent/profkit.jsonl"])
    assert "cannot read" in capsys.readouterr().err


def _sampled_json_lines(path: Path, mlp: torch.nn.Module, batch: torch.Tensor) -> None:
    """Six real sampled calls of two labels written by the json exporter to ``path``."""

    @profkit.profiled("predict")
    def predict(x: torch.Tensor) -> torch.Tensor:
        return mlp(x)

    @profkit.profiled("embed")
    def embed(x: torch.Tensor) -> torch.Tensor:
        return x @ x.T

    with (
        path.open("w", encoding="utf-8") as out,
        capture(sample_every=1, extra_exporters=(JsonLinesExporter(out),)),
    ):
        for _ in range(4):
            predict(batch)
        for _ in range(2):
            embed(batch)
        assert profkit.force_flush(30.0)


@pytest.mark.timeout(120)
def test_report_numbers_match_the_events(
    tmp_path: Path,
    mlp: torch.nn.Module,
    batch: torch.Tensor,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Over real json-exporter output, the report's figures are those of the events."""
    path = tmp_path / "profkit.jsonl"
    _sampled_json_lines(path, mlp, batch)
    events = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert 0 == cli.main(["report", str(path), "--json"])
    report = {r["label"]: r for r in json.loads(capsys.readouterr().out)}
    for label, n in (("predict", 4), ("embed", 2)):
        mine = [e for e in events if e["label"] == label]
        durations = sorted(e["duration_us"] / 1000.0 for e in mine)
        addmm = [
            row["self_cpu_us"] for e in mine for row in e["top_ops"] if row["op"] == "aten::addmm"
        ]
        verdicts: dict[str, int] = {}
        for e in mine:
            verdicts[e["diagnosis"]] = verdicts.get(e["diagnosis"], 0) + 1
        got = report[label]
        assert (n, durations[(n + 1) // 2 - 1], durations[-1], verdicts) == (
            got["samples"],
            got["p50_ms"],
            got["p95_ms"],
            got["verdicts"],
        )
        if label == "predict":
            (row,) = [op for op in got["ops"] if op["name"] == "aten::addmm"]
            assert (4, statistics.median(addmm)) == (row["samples"], row["median_us"])


# -- robustness (issue #26): skip and count what cannot be read, escape what is printed -----

BROKEN_LINES = [
    '{"event": "profkit.profile", "label": "p", "duration_us": null}',
    '{"event": "profkit.profile", "label": "p", "duration_us": "slow"}',
    '{"event": "profkit.profile", "label": "p", "duration_us": 1e400}',
    '{"event": "profkit.profile", "label": "p", "duration_us": NaN}',
    '{"event": "profkit.profile", "label": "p", "duration_us": -5}',
    '{"event": "profkit.profile", "label": "p", "duration_us": ' + "9" * 400 + "}",
    '{"event": "profkit.op", "label": "p", "op": "aten::mm", "self_cpu_us": "x"}',
    '{"event": "profkit.profile", "label": "p", "dur',  # cut short
    '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}",  # nested past the recursion limit
]


def test_broken_lines_are_skipped_and_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Good lines give the rollup; the broken ones are skipped, counted once on stderr."""
    path = tmp_path / "mixed.jsonl"
    good = lines(
        profile("p", 1000.0, "compute-bound", aten_mm=10.0),
        profile("p", 3000.0, "compute-bound", aten_mm=30.0),
    )
    junk = [
        "not json at all",  # another program's line: skipped silently, as before
        json.dumps({"event": "something.else", "duration_us": None}),
        json.dumps({**profile("p", 2000.0, "compute-bound"), "top_ops": "junk"}),
    ]
    path.write_text("\n".join([good[0], *BROKEN_LINES, *junk, good[1]]) + "\n", "utf-8")
    assert 0 == cli.main(["report", str(path)])
    out, err = capsys.readouterr()
    assert out.startswith("p  3 samples  duration p50 2.000 ms  p95 3.000 ms\n"), out
    assert f"skipped {len(BROKEN_LINES)} lines that could not be read" in err


def test_labels_and_op_names_are_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A label or op name with ANSI escapes or control characters is printed escaped."""
    evil = "\x1b[2J\x1b[31mred\x07\r\nfake\ud800"
    path = tmp_path / "evil.jsonl"
    event = profile(evil, 1000.0, "io\x1b[0m-bound")
    event["top_ops"] = [{"op": "op\x1b]0;title\x07", "self_cpu_us": 5.0}]
    path.write_text(json.dumps(event) + "\n", "utf-8")
    assert 0 == cli.main(["report", str(path)])
    out, err = capsys.readouterr()
    assert "\x1b" not in out + err
    assert "\x07" not in out
    assert "\r" not in out
    assert "\\x1b[2J\\x1b[31mred\\x07\\r\\nfake\ufffd  1 samples" in out
    assert "op\\x1b]0;title\\x07" in out
    assert "io\\x1b[0m-bound 1" in out


def test_odd_inputs_do_not_raise(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Bytes that are not UTF-8, a directory, an empty file, several files: never a raise."""
    raw = tmp_path / "raw.jsonl"
    raw.write_bytes(b"\xff\xfe\x00garbage\n" + json.dumps(profile("p", 1.0, "v")).encode() + b"\n")
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    assert 0 == cli.main(["report", str(raw)])
    assert "p  1 samples" in capsys.readouterr().out
    assert 1 == cli.main(["report", str(empty)])
    assert "no profkit.profile events" in capsys.readouterr().out
    assert 1 == cli.main(["report", str(tmp_path)])
    assert "cannot read" in capsys.readouterr().err
    assert 1 == cli.main(["report", str(raw), str(tmp_path / "missing\x1b.jsonl"), str(raw)])
    out, err = capsys.readouterr()
    assert "p  2 samples" in out  # the files that could be read, together
    assert "cannot read" in err
    assert "\x1b" not in err
    assert 0 == cli.main(["report", "--json", str(raw)])
    assert json.loads(capsys.readouterr().out)[0]["samples"] == 1


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=20)
    | st.sampled_from(["profkit.profile", "profkit.op", "other", "\x1b[31m"]),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "event",
                    "label",
                    "duration_us",
                    "top_ops",
                    "op",
                    "self_cpu_us",
                    "span_id",
                    "diagnosis",
                    "diagnosis_confidence",
                    "x",
                ]
            ),
            children,
            max_size=8,
        )
    ),
    max_leaves=20,
)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(
        st.one_of(
            st.text(max_size=80),
            _JSON.map(json.dumps),
            st.dictionaries(st.just("event"), st.sampled_from(["profkit.profile", "profkit.op"]))
            .flatmap(lambda d: _JSON.map(lambda j: {**d, **j} if isinstance(j, dict) else d))
            .map(json.dumps),
        ),
        max_size=12,
    ),
    st.booleans(),
)
def test_any_lines_never_raise(text_lines: list[str], as_json: bool) -> None:
    """Whatever the lines hold, the report reads, rolls up and prints without raising."""
    samples = _report.read_samples(text_lines)
    rollups = _report.rollup(samples)
    out = json.dumps([dataclasses.asdict(r) for r in rollups]) if as_json else None
    text = _report.render(rollups)
    assert "\x1b" not in text
    assert out is None or isinstance(out, str)


@pytest.mark.timeout(120)
def test_reading_a_large_file_does_not_hold_its_events_twice(
    tmp_path: Path, mlp: torch.nn.Module, batch: torch.Tensor
) -> None:
    """What ``read`` keeps of a file of real profile lines is well under twice its size: each
    event's op rows are read into the sample, not also kept as parsed JSON (5.2x before)."""
    import tracemalloc

    from profkit._jsonlines import read

    one = tmp_path / "one.jsonl"
    _sampled_json_lines(one, mlp, batch)
    text = one.read_text(encoding="utf-8") * 300
    tracemalloc.start()
    try:
        samples, bad = read(text.splitlines())
        kept, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (len(samples), bad) == (6 * 300, 0)
    assert kept < 2.0 * len(text), kept / len(text)
    first = samples[0]
    assert first.ops
    assert first.event["span_id"]
    assert first.event["start_time"]


def test_cold_samples_left_out_are_said_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The text report leaves cold samples out, as the HTML page does, and says so on stderr
    (it said only "4 samples"); with ``--include-cold`` nothing is left out."""
    src = tmp_path / "cold.jsonl"
    events = [profile("predict", 1000.0 + i, "compute_bound") for i in range(4)]
    events += [{**profile("predict", 9000.0, "compute_bound"), "cold": True}] * 2
    src.write_text("\n".join(lines(*events)) + "\n", encoding="utf-8")
    assert 0 == cli.main(["report", str(src)])
    out, err = capsys.readouterr()
    assert "predict  4 samples" in out
    assert "2 cold samples left out (--include-cold counts them)" in err
    assert 0 == cli.main(["report", str(src), "--include-cold"])
    out, err = capsys.readouterr()
    assert "predict  6 samples" in out
    assert "cold" not in err


@pytest.mark.parametrize(
    ("encoding", "bom"),
    [("utf-8", b"\xef\xbb\xbf"), ("utf-16-le", b"\xff\xfe"), ("utf-16-be", b"\xfe\xff")],
)
def test_a_file_with_a_byte_order_mark_is_read_whole(
    encoding: str, bom: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file that starts with a byte order mark (an editor's UTF-8 BOM; Windows
    PowerShell's ``>`` writes UTF-16) is read in its encoding: every sample, the first one
    too (the BOM once hid the first line silently, and UTF-16 read as "no profkit.profile
    events found")."""
    event = {"event": "profkit.profile", "label": "predict", "duration_us": 1000.0}
    path = tmp_path / "run.jsonl"
    path.write_bytes(bom + ((json.dumps(event) + "\n") * 3).encode(encoding))
    assert 0 == cli.main(["report", str(path)])
    assert "predict  3 samples" in capsys.readouterr().out
