"""Data hygiene: no argument values exported, bounded strings and counts, private trace files."""

from __future__ import annotations

import functools
import gzip
import io
import os
import re
import stat
import tempfile
import time
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import torch
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import profkit
from profkit import CallSummary, OpRow, ScopeSummary
from profkit.exporters.console import ConsoleExporter, JsonLinesExporter, render_call
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


# -- default labels, unencodable and control characters, error text -----------------------

ADDRESS = re.compile(r"0x[0-9a-fA-F]{4,}")


def call_api(payload: torch.Tensor, api_key: str) -> float:
    """A function whose partial binds a secret."""
    return float(torch.mm(payload, payload).sum())


class Scorer:
    """A callable instance whose repr shows a secret."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __repr__(self) -> str:
        return f"Scorer(key={self.key!r})"

    def __call__(self, x: torch.Tensor) -> float:
        return float(torch.mm(x, x).sum())


def test_default_labels_come_from_qualified_names_only() -> None:
    """partial and callable instances are labelled by qualified name: no value, no address."""
    bound = profkit.profiled(functools.partial(call_api, api_key=SECRET))
    nested = profkit.profiled(functools.partial(functools.partial(call_api), api_key=SECRET))
    scorer = profkit.profiled(Scorer(SECRET))
    with (
        structlog.testing.capture_logs() as logs,
        capture(sample_every=1, exporters=("otel", "log")) as cap,
    ):
        assert bound(X) == nested(X) == scorer(X)
    assert ["call_api", "call_api", "Scorer.__call__"] == [c.label for c in cap.calls]
    texts = [s.name for s in cap.spans()] + list(_strings(logs))
    texts += [t for s in cap.spans() for t in _strings(dict(s.attributes or {}))]
    assert [] == [t for t in texts if SECRET in t or ADDRESS.search(t)]


BAD_LABEL = "bad\ud800label\x1b[31m\x00\u009b"
BAD_VALUE = "val\udcff\x07ue\nline"


def test_unencodable_and_control_characters_are_cleaned() -> None:
    """Surrogates and control characters leave profkit cleaned; the OTLP batch encodes."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("app")
    console = io.StringIO()
    with (
        structlog.testing.capture_logs() as logs,
        capture(
            sample_every=1,
            tracer_provider=provider,
            exporters=("otel", "log"),
            extra_exporters=(ConsoleExporter(console), JsonLinesExporter(io.StringIO())),
        ),
    ):
        for _ in range(5):
            with (
                tracer.start_as_current_span("app-request"),
                profkit.region(BAD_LABEL, **{"key\ud801": BAD_VALUE}),
                torch.autograd.profiler.record_function("op\x1b[2J"),
            ):
                torch.mm(X, X)
    spans = memory.get_finished_spans()
    assert 10 == len(spans)
    encoded = encode_spans(spans).SerializeToString()  # the app's spans and profkit's together
    assert encoded
    attrs = [dict(s.attributes or {}) for s in spans]
    tables = [a.pop("profkit.ops.table") for a in attrs if "profkit.ops.table" in a]
    texts = [s.name for s in spans] + [t for a in attrs for t in _strings(a)]
    texts += list(_strings(logs))
    texts += [line for table in tables for line in str(table).split("\n")]
    assert len(tables) == 5
    assert [] == [t for t in texts if _unclean(t)]
    assert "\x1b" not in console.getvalue()
    assert "op\\x1b[2J" in console.getvalue()  # escaped, visible


def _unclean(text: str) -> bool:
    """Whether ``text`` holds a lone surrogate or a control character."""
    return any(0xD800 <= ord(c) <= 0xDFFF or (unicodedata.category(c) == "Cc") for c in text)


def test_bidi_controls_and_line_separators_are_escaped() -> None:
    """A label with a right-to-left override (it reorders a terminal line as it is shown,
    "Trojan Source") or a Unicode line separator (it splits a log line) leaves profkit with
    those characters as visible escapes, in spans, log events and the console alike."""
    label = "pay\u202eevil\u2066x\u2028y\u2029z\u200f"
    expected = "pay\\u202eevil\\u2066x\\u2028y\\u2029z\\u200f"
    console = io.StringIO()
    with (
        structlog.testing.capture_logs() as logs,
        capture(
            sample_every=1, exporters=("otel", "log"), extra_exporters=(ConsoleExporter(console),)
        ) as cap,
        profkit.region(label),
    ):
        torch.mm(X, X)
    assert [expected] == [s.name for s in cap.spans()]
    assert expected in [e.get("label") for e in logs]
    assert expected in console.getvalue()
    assert not any(c in console.getvalue() for c in "\u202e\u2066\u2028\u2029\u200f")


def test_console_exporter_escapes_control_characters_in_what_it_prints() -> None:
    """A summary built elsewhere (not cleaned by profkit) still prints no terminal escapes."""
    root = ScopeSummary(
        index=0,
        parent=-1,
        label="evil\x1b]0;title\x07",
        start_ns=0,
        end_ns=1000,
        attributes={},
        ops=(OpRow(name="op\x1b[31m", count=1, self_cpu_us=1.0, cpu_us=1.0),),
        op_count=1,
        self_cpu_us=1.0,
        self_device_us=0.0,
    )
    call = CallSummary(
        window_id=1,
        call_index=0,
        label=root.label,
        scopes=(root,),
        parent_span_context=None,
        policy="every:1",
        attribution="thread",
    )
    text = render_call(call)
    assert [] == [c for c in text if c != "\n" and unicodedata.category(c) == "Cc"]
    assert "evil\\x1b]0;title\\x07" in text


@profkit.profiled("explode")
def explode(n: int) -> None:
    """Raises an exception with a huge message, after a region whose label is huge too."""
    with profkit.region("R" * 5000):
        time.sleep(0.05)  # most of the call, by far: the diagnosis quotes this region's label
        torch.mm(X, X)
    raise ValueError("x" * n)


def test_error_text_is_bounded_and_the_exception_untouched() -> None:
    """A 1 MB exception message: span status, exception event and log fields stay bounded."""
    limit = 64
    with (
        structlog.testing.capture_logs() as logs,
        capture(sample_every=1, exporters=("otel", "log"), max_attribute_length=limit) as cap,
        pytest.raises(ValueError) as info,
    ):
        explode(1_000_000)
    assert 1_000_000 == len(str(info.value))
    (call,) = cap.calls
    assert call.diagnosis is not None
    assert "RRR" in call.diagnosis.reason + repr(call.diagnosis.amdahl)  # labels are quoted
    (span,) = [s for s in cap.spans() if s.name == "explode"]
    assert span.status.description is not None
    assert span.status.description.startswith("ValueError: xxx")
    (event,) = span.events
    assert "exception" == event.name
    assert "ValueError" == (event.attributes or {})["exception.type"]
    written = [s.name for s in cap.spans()] + [span.status.description]
    written += [t for e in span.events for t in _strings(dict(e.attributes or {}))]
    written += [
        t
        for s in cap.spans()
        for k, v in (s.attributes or {}).items()
        if k != "profkit.ops.table"
        for t in _strings(v)
    ]
    written += list(_strings(logs))
    assert [] == [t for t in written if len(t) > limit]
