"""Data hygiene: no argument values exported, bounded strings and counts, private trace files."""

from __future__ import annotations

import gzip
import io
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import torch

import profkit
from profkit.exporters.console import ConsoleExporter, JsonLinesExporter
from profkit.testing import capture

pytestmark = pytest.mark.timeout(60)

SECRET = "s3cr3t-T0KEN-8c1f0a"
X = torch.full((8, 8), 0.01)


@profkit.profiled("authorize")
def authorize(token: str, x: torch.Tensor, *, api_key: str) -> float:
    """A handler whose arguments are secrets."""
    with profkit.region("check"):
        assert token == api_key
        return float(torch.mm(x, x).sum())


def _strings(value: Any) -> Iterator[str]:
    """Every string reachable in a span attribute, log event or nested container."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, (list, tuple, set)):
        for v in value:
            yield from _strings(v)
    else:
        yield repr(value)


def _trace_texts(directory: Path) -> list[str]:
    texts = []
    for path in directory.iterdir():
        data = path.read_bytes()
        raw = gzip.decompress(data) if path.suffix == ".gz" else data
        texts.append(raw.decode(errors="replace"))  # kineto may write stray non-UTF-8 bytes
    return texts


def test_argument_values_are_never_exported(tmp_path: Path) -> None:
    """A secret passed as an argument appears in no span, log event, summary, line or file."""
    json_out, console_out = io.StringIO(), io.StringIO()
    traces = tmp_path / "traces"
    with (
        structlog.testing.capture_logs() as logs,
        capture(
            sample_every=1,
            exporters=("otel", "log"),
            extra_exporters=(JsonLinesExporter(json_out), ConsoleExporter(console_out)),
            trace_dir=str(traces),
            trace_gzip=False,
            record_shapes=True,
            with_stack=True,
        ) as cap,
    ):
        assert authorize(SECRET, X, api_key=SECRET) > 0
        profkit.force_flush(10.0)
    spans = cap.spans()
    span_text = [s.name for s in spans] + [
        t for s in spans for t in _strings(dict(s.attributes or {}))
    ]
    outputs = {
        "spans": "\n".join(span_text),
        "logs": "\n".join(_strings(logs)),
        "summaries": repr(cap.windows),
        "json": json_out.getvalue(),
        "console": console_out.getvalue(),
        "trace files": "\n".join(_trace_texts(traces)),
    }
    for where, text in outputs.items():
        assert "authorize" in text, (
            where
        )  # the output is real, so the absence below means something
        assert SECRET not in text, where


def test_labels_and_attribute_values_are_length_bounded() -> None:
    """Labels, attribute keys and values are clipped to max_attribute_length everywhere."""
    attrs = {f"key{i}_" + "k" * 300: "v" * 5000 for i in range(3)}
    with (
        structlog.testing.capture_logs() as logs,
        capture(sample_every=1, exporters=("otel", "log"), max_attribute_length=64) as cap,
    ):
        with profkit.region("L" * 5000, **attrs), profkit.region("I" * 5000, note="n" * 5000):
            torch.mm(X, X)
        profkit.force_flush(10.0)
    (call,) = cap.calls
    assert 2 == len(call.scopes)
    for scope in call.scopes:
        assert 64 == len(scope.label)
        assert scope.attributes
        assert all(len(k) <= 64 and len(str(v)) <= 64 for k, v in scope.attributes.items())
    spans = cap.spans()
    assert 2 == len(spans)
    for span in spans:
        assert 64 == len(span.name)
        user = {k: v for k, v in (span.attributes or {}).items() if k.startswith(("key", "note"))}
        assert user
        assert all(len(k) <= 64 and len(str(v)) <= 64 for k, v in user.items())
    profile_events = [e for e in logs if e["event"] == "profkit.profile"]
    assert 1 == len(profile_events)
    assert 64 == len(profile_events[0]["label"])
    assert [64] == [len(r["region"]) for r in profile_events[0]["regions"]]


def test_attribute_counts_are_capped() -> None:
    """At most max_attributes user attributes per scope; a span never exceeds 128 attributes."""
    many = {f"a{i:03d}": i for i in range(300)}
    with capture(sample_every=1, max_attributes=8) as cap, profkit.region("capped", **many):
        torch.mm(X, X)
    with capture(sample_every=1, max_attributes=1000) as wide, profkit.region("wide", **many):
        torch.mm(X, X)
    assert 8 == len(cap.calls[0].root.attributes)
    (span,) = cap.spans()
    assert 8 == len([k for k in (span.attributes or {}) if k.startswith("a")])
    (wide_span,) = wide.spans()
    assert 300 == len(wide.calls[0].root.attributes)
    assert len(wide_span.attributes or {}) <= 128


def _profkit_names_in_tmp() -> set[str]:
    return {n for n in os.listdir(tempfile.gettempdir()) if "profkit" in n}


@pytest.mark.parametrize("gzipped", [True, False])
def test_trace_files_are_owner_only_and_stay_in_trace_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gzipped: bool
) -> None:
    """Trace files are 0600 in a 0700 directory; nothing else is written anywhere we watch."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    traces = tmp_path / "traces"
    in_tmp = _profkit_names_in_tmp()
    with capture(sample_every=1, trace_dir=str(traces), trace_gzip=gzipped) as cap:
        assert [authorize(SECRET, X, api_key=SECRET) for _ in range(3)]
    files = sorted(traces.iterdir())
    suffix = ".json.gz" if gzipped else ".json"
    assert 3 == len(files)
    assert all(f.name.startswith("profkit-") and f.name.endswith(suffix) for f in files)
    assert [0o600] * 3 == [stat.S_IMODE(f.stat().st_mode) for f in files]
    assert 0o700 == stat.S_IMODE(traces.stat().st_mode)
    assert sorted(str(f) for f in files) == sorted(str(c.trace_path) for c in cap.calls)
    assert [] == list(cwd.iterdir())
    assert {"cwd", "traces"} == {p.name for p in tmp_path.iterdir()}
    assert in_tmp == _profkit_names_in_tmp()
