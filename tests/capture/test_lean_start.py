"""A window's profiler starts and stops without torch.profiler.profile's schedule step.

profkit's profiles have no schedule, so ``profile.start()``/``stop()`` only walk torch's
action table (enum hashing in Python, about 50 µs a window on the request thread) to reach
the base class's ``prepare_trace``/``start_trace``/``stop_trace``; profkit calls those
directly (issue 22: the request thread's share of a window). What must not change: the
events, the trace file and its metadata, the foreign-profiler hook, a user's own profiler.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from profkit.testing import capture


@pytest.mark.timeout(120)
def test_a_window_does_not_walk_torchs_schedule_table(
    monkeypatch: pytest.MonkeyPatch, predict: Any, batch: torch.Tensor
) -> None:
    walks: list[Any] = []
    original = profile._transit_action

    def counted(self: Any, prev: Any, cur: Any) -> None:
        walks.append((prev, cur))
        original(self, prev, cur)

    monkeypatch.setattr(profile, "_transit_action", counted)
    with capture(sample_every=1, record_shapes=True) as cap:
        for _ in range(3):
            predict(batch)
    assert walks == []
    assert cap.stats["exported"] == 3, cap.stats
    calls = cap.calls
    assert len(calls) == 3
    for call in calls:
        ops = {r.name for sc in call.scopes for r in sc.ops}
        assert "aten::addmm" in ops or "aten::linear" in ops, ops
        assert any(r.shapes for sc in call.scopes for r in sc.ops)  # record_shapes honoured


@pytest.mark.timeout(120)
def test_the_trace_file_keeps_torchs_metadata(
    tmp_path: Path, predict: Any, batch: torch.Tensor
) -> None:
    with capture(sample_every=1, record_shapes=True, trace_dir=str(tmp_path)) as cap:
        predict(batch)
    paths = [w.trace_path for w in cap.windows if w.trace_path]
    assert len(paths) == 1, cap.stats
    opener: Any = gzip.open if paths[0].endswith(".gz") else open
    with opener(paths[0], "rt", encoding="utf-8") as f:
        trace = json.load(f)
    assert trace.get("record_shapes") == 1  # start_trace's metadata, as torch writes it
    names = {e.get("name") for e in trace["traceEvents"]}
    assert "predict" in names
    assert "forward" in names


@pytest.mark.timeout(120)
def test_a_users_profiler_after_profkits_windows_records_as_usual(
    predict: Any, batch: torch.Tensor
) -> None:
    """The user's own ``torch.profiler.profile`` (with its schedule step) after and around
    profkit's windows: its events are all there, and profkit skips while it runs."""
    with capture(sample_every=1) as cap:
        predict(batch)
        with profile(activities=[ProfilerActivity.CPU]) as user:
            predict(batch)
        predict(batch)
    names = {e.key for e in user.key_averages()}
    assert {"aten::addmm", "aten::relu"} <= names
    assert cap.stats["exported"] == 2, cap.stats
    assert cap.stats["skipped_foreign"] == 1, cap.stats
