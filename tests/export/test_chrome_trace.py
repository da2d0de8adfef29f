"""Chrome / Perfetto trace files: one per window, owner-only, parseable, under retention limits."""

from __future__ import annotations

import gzip
import json
import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

import profkit
from profkit import WindowSummary
from profkit.testing import capture
from tests.fresh_interpreter import run_fresh


class SizeRecorder:
    """An exporter that notes each window's trace file and its size when it was written."""

    name = "sizes"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.files: list[tuple[str, int]] = []

    def export(self, summary: WindowSummary) -> None:
        assert summary.trace_path is not None
        with self._lock:
            self.files.append((summary.trace_path, os.path.getsize(summary.trace_path)))


def _load(path: str) -> dict[str, Any]:
    opener: Any = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    return data


def _listing(directory: Path) -> list[str]:
    return sorted(str(p) for p in directory.iterdir())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("gzipped", [True, False])
def test_count_retention_keeps_the_newest_files(
    tmp_path: Path, predict: Any, batch: torch.Tensor, gzipped: bool
) -> None:
    """After 50 windows with trace_max_files=5 exactly the 5 newest remain, 0600, parseable."""
    directory = tmp_path / "traces"
    with capture(
        sample_every=1,
        trace_dir=str(directory),
        trace_max_files=5,
        trace_gzip=gzipped,
        queue_size=64,
    ) as cap:
        for _ in range(50):
            predict(batch)
    paths = [c.trace_path for c in cap.calls]
    assert cap.stats["exported"] == 50
    assert len(set(paths)) == 50
    assert sorted(str(p) for p in paths[-5:]) == _listing(directory)
    suffix = ".json.gz" if gzipped else ".json"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    roots = {s.attributes["profkit.trace.path"]: s for s in cap.spans() if s.name == "predict"}  # type: ignore[index]
    assert set(paths) == set(roots)
    for path in paths[-5:]:
        assert path is not None
        assert path.endswith(suffix)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        names = {e.get("name") for e in _load(path)["traceEvents"]}
        assert {"aten::addmm", "aten::linear", "aten::relu", "predict", "forward"} <= names


@pytest.mark.timeout(60)
def test_trace_path_is_on_the_span_and_the_summary(
    tmp_path: Path, predict: Any, batch: torch.Tensor
) -> None:
    """Each call's span names the trace file of its window; the file holds the call's ops."""
    with capture(sample_every=1, trace_dir=str(tmp_path), trace_gzip=False) as cap:
        predict(batch)
    (call,) = cap.calls
    (root,) = [s for s in cap.spans() if s.name == "predict"]
    assert root.attributes is not None
    assert call.trace_path == root.attributes["profkit.trace.path"]
    assert call.trace_path == cap.windows[0].trace_path
    assert os.path.dirname(str(call.trace_path)) == str(tmp_path)
    events = _load(str(call.trace_path))["traceEvents"]
    assert sum(1 for e in events if e.get("name") == "aten::addmm") == 2


@pytest.mark.timeout(60)
def test_byte_retention_keeps_the_newest_that_fit(
    tmp_path: Path, predict: Any, batch: torch.Tensor
) -> None:
    """With trace_max_bytes the newest files whose sizes add up to at most the limit remain."""
    probe = SizeRecorder()
    with capture(
        sample_every=1, trace_dir=str(tmp_path / "probe"), trace_gzip=False, extra_exporters=[probe]
    ):
        predict(batch)
    limit = int(probe.files[0][1] * 3.5)
    sizes = SizeRecorder()
    directory = tmp_path / "traces"
    with capture(
        sample_every=1,
        trace_dir=str(directory),
        trace_gzip=False,
        trace_max_bytes=limit,
        extra_exporters=[sizes],
    ) as cap:
        for _ in range(10):
            predict(batch)
    assert cap.stats["exported"] == 10
    assert len(sizes.files) == 10
    kept: list[str] = []
    total = 0
    for path, size in reversed(sizes.files):
        if total + size > limit:
            break
        kept.append(path)
        total += size
    assert 2 <= len(kept) <= 4
    assert sorted(kept) == _listing(directory)
    assert sum(os.path.getsize(p) for p in kept) <= limit


@pytest.mark.timeout(60)
def test_newest_file_is_kept_even_over_the_byte_limit(
    tmp_path: Path, predict: Any, batch: torch.Tensor
) -> None:
    """A limit smaller than one file still keeps the newest file (and only it)."""
    with capture(
        sample_every=1, trace_dir=str(tmp_path), trace_gzip=False, trace_max_bytes=1
    ) as cap:
        for _ in range(3):
            predict(batch)
    assert [str(cap.calls[-1].trace_path)] == _listing(tmp_path)


@pytest.mark.timeout(60)
def test_other_files_in_the_directory_are_left_alone(
    tmp_path: Path, predict: Any, batch: torch.Tensor
) -> None:
    """Retention only removes profkit's own trace files."""
    keep = tmp_path / "notes.json"
    keep.write_text("{}")
    with capture(sample_every=1, trace_dir=str(tmp_path), trace_max_files=1) as cap:
        for _ in range(3):
            predict(batch)
    assert sorted([str(keep), str(cap.calls[-1].trace_path)]) == _listing(tmp_path)


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("swallow_internal_errors")
def test_failed_trace_write_is_counted_and_spans_still_go_out(
    tmp_path: Path, predict: Any, batch: torch.Tensor
) -> None:
    """A trace directory that cannot be created costs the file only: counted, spans exported."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with capture(sample_every=1, trace_dir=str(blocker)) as cap:
        for _ in range(2):
            predict(batch)
    assert [None, None] == [c.trace_path for c in cap.calls]
    roots = [s for s in cap.spans() if s.name == "predict"]
    assert len(roots) == 2
    assert all("profkit.trace.path" not in (s.attributes or {}) for s in roots)
    assert cap.stats["error_reasons"] == {"trace_file": 2}
    assert cap.stats["exported"] == 2


@pytest.mark.timeout(60)
def test_retention_keeps_lookalike_files_and_ignores_stray_ones(
    tmp_path: Path, predict: Any, batch: torch.Tensor
) -> None:
    """Only files named exactly as profkit names them are pruned; others never break pruning."""
    user_files = [
        tmp_path / "profkit-notes.txt",
        tmp_path / "profkit-1-my-important-notes.json",
        tmp_path / "profkit-2-w1.json.bak",
        tmp_path / "profkit-x-w1.json",
    ]
    for f in user_files:
        f.write_text("mine")
    (tmp_path / "profkit-3-w2.json").mkdir()  # a directory with a profkit-like name
    with capture(sample_every=1, trace_dir=str(tmp_path), trace_max_files=3) as cap:
        for _ in range(6):
            predict(batch)
    paths = [c.trace_path for c in cap.calls]
    assert None not in paths
    assert {} == cap.stats["error_reasons"]
    assert all(f.read_text() == "mine" for f in user_files)
    assert sorted(
        [str(p) for p in paths[-3:]]
        + [str(f) for f in user_files]
        + [str(tmp_path / "profkit-3-w2.json")]
    ) == _listing(tmp_path)


@pytest.mark.timeout(60)
def test_directories_profkit_creates_are_owner_only(
    tmp_path: Path, predict: Any, batch: torch.Tensor
) -> None:
    """A trace_dir that does not exist is created 0700, parents included; existing ones stay."""
    tmp_path.chmod(0o755)
    directory = tmp_path / "a" / "b" / "traces"
    with capture(sample_every=1, trace_dir=str(directory)):
        predict(batch)
    modes = [
        stat.S_IMODE(p.stat().st_mode)
        for p in (tmp_path, directory.parents[1], directory.parent, directory)
    ]
    assert [0o755, 0o700, 0o700, 0o700] == modes


@pytest.mark.timeout(60)
@pytest.mark.parametrize("gzipped", [True, False])
def test_trace_files_hold_no_scalar_argument_values(tmp_path: Path, gzipped: bool) -> None:
    """With record_shapes the file keeps shapes but not torch's "Concrete Inputs" values."""

    @profkit.profiled("fill")
    def fill() -> torch.Tensor:
        return torch.full((2, 3), 7331.25)

    with capture(
        sample_every=1, trace_dir=str(tmp_path), trace_gzip=gzipped, record_shapes=True
    ) as cap:
        fill()
    path = str(cap.calls[0].trace_path)
    events = _load(path)["traceEvents"]
    full = [e for e in events if e.get("name") == "aten::full"]
    assert full
    assert "Input Dims" in full[0]["args"]  # shapes are kept
    text = json.dumps(events)
    assert "7331.25" not in text
    assert "Concrete Inputs" not in text


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("packing", ["gzip", "plain"])
def test_a_trace_write_cut_short_is_counted_and_never_moved_into_view(
    tmp_path: Path, packing: str
) -> None:
    """torch's trace writer ignores a failed write (a full disk): the half file must not be
    renamed into place, and a span must not point at it."""
    rc, report, err = run_fresh("chrome_trace_cut_short", str(tmp_path), packing)
    assert rc == 0, err[-3000:]
    assert {
        "value": 64.0,
        "paths": [True, False],
        "trace_file": 1,
        "exported": 2,
        "files": 1,
    } == report
