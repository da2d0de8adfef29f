"""A stage record's summary (``capture_slow``, :mod:`profkit._summary.stages`): its regions on
the epoch clock, nested by containment, bounded, cleaned; no op rows."""

from __future__ import annotations

from profkit._model import CodeInfo
from profkit._records import CallRecord, Policy, StageWindow
from profkit._summary.stages import MAX_STAGES, stage_summary


def _record(stages: list[tuple[str, int, int]], offset: int = 1_000_000) -> StageWindow:
    call = CallRecord.begin(Policy.SLOW_STAGES, None)
    call.slow_threshold_ms = 8.0
    code = CodeInfo("handle", "app.py", 3)
    record = StageWindow(call, "handle", {"route": "/x"}, code, 100, 10_000, offset)
    record.stages = [(label, {"n": 1}, None, start, end) for label, start, end in stages]
    record.calls.append(call)
    return record


def test_regions_nest_by_containment_in_start_order() -> None:
    """Regions appended as they ended (inner first) come out in start order, each a child
    of the region whose time holds it, on the epoch clock (perf + offset)."""
    record = _record([("inner", 300, 400), ("outer", 200, 900), ("after", 1000, 2000)])
    (call,) = stage_summary(record, 256, 64).calls
    assert ["handle", "outer", "inner", "after"] == [s.label for s in call.scopes]
    assert [-1, 0, 1, 0] == [s.parent for s in call.scopes]
    assert (1_000_100, 1_010_000) == (call.root.start_ns, call.root.end_ns)
    assert (1_000_300, 1_000_400) == (call.scopes[2].start_ns, call.scopes[2].end_ns)
    assert "slow_stages" == call.policy
    assert 8.0 == call.slow_threshold_ms
    assert {"route": "/x"} == dict(call.root.attributes)
    assert all(s.ops == () and s.timing == "python" for s in call.scopes)
    assert call.truncated is None


def test_a_record_keeps_its_first_regions_and_says_it_was_cut() -> None:
    """More than MAX_STAGES regions: the earliest are kept, ``truncated = "max_stages"``."""
    record = _record([(f"r{i}", 200 + 2 * i, 201 + 2 * i) for i in range(MAX_STAGES + 10)])
    (call,) = stage_summary(record, 256, 64).calls
    assert MAX_STAGES + 1 == len(call.scopes)
    assert "r0" == call.scopes[1].label
    assert "max_stages" == call.truncated


def test_labels_are_cleaned_and_bounded() -> None:
    """A label with control characters is escaped and cut at the attribute limit."""
    record = _record([("a\tb" + "x" * 50, 200, 300)])
    (call,) = stage_summary(record, 10, 64).calls
    assert call.scopes[1].label.startswith("a\\tb")
    assert len(call.scopes[1].label) <= 10
