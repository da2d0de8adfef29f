"""A scope's ``record_function`` range is opened and ended by torch's C ops, and no signal's
exception can drop it open: a range let go of unended was ended by a later collection,
maybe under the next window's profiler, writing into the first one's freed memory (torch
2.13: SIGSEGV; the storms of tests/test_serving.py crashed 4 runs in 18 with both cores
busy while ranges went through torch's Python ``record_function`` class)."""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from profkit._compat import range_enter
from profkit._records import ScopeRecord


def _opened(label: str) -> ScopeRecord:
    record = ScopeRecord(label, -1, {}, None, 0, 0)
    box: list[Any] = []
    record.rf = box
    box.extend(map(range_enter, (label,), (None,)))  # as profkit._label.scope._open does
    return record


def _ranges(prof: profile, label: str) -> int:
    events = prof.profiler.kineto_results.events()  # type: ignore[union-attr]
    return sum(1 for e in events if e.name() == label and e.is_user_annotation())


def test_a_range_is_a_user_annotation_ended_once() -> None:
    prof = profile(activities=[ProfilerActivity.CPU])
    prof.start()
    record = _opened("profkit.test.range")
    torch.ones(4).add_(1)
    assert record.close() is None
    assert record.rf is None
    assert record.end_ns > 0
    prof.stop()
    assert 1 == _ranges(prof, "profkit.test.range")


def test_the_range_ends_as_the_record_lets_go_of_it_and_a_retry_ends_nothing() -> None:
    """The range's end is the handle's destruction, in the close's one ``clear()``: its end
    time is the close's, not a later collection's; a second close (a retry after a
    signal's exception) finds nothing to end, and the profile has the range once."""
    prof = profile(activities=[ProfilerActivity.CPU])
    prof.start()
    record = _opened("profkit.test.retry")
    assert record.rf is not None
    assert 1 == len(record.rf)
    record.close()
    time.sleep(0.02)
    record.close()  # the retry
    assert record.rf is None
    prof.stop()
    assert 1 == _ranges(prof, "profkit.test.retry")
    (event,) = [
        e for e in prof.profiler.kineto_results.events() if e.name() == "profkit.test.retry"
    ]
    assert event.is_user_annotation()
    assert event.end_ns() - event.start_ns() < 15_000_000  # ended at the close, not 20 ms on


def test_a_range_opening_cut_before_torchs_op_holds_nothing_to_end() -> None:
    """The box is the record's before the op runs: an exception before it leaves ``[]``,
    which the close lets go of."""
    record = ScopeRecord("profkit.test.none", -1, {}, None, 0, 0)
    record.rf = []
    assert record.close() is None
    assert record.rf is None
