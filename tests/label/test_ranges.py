"""A scope's ``record_function`` range is opened and ended by torch's C ops, and no signal's
exception can drop it open: a range let go of unended was ended by a later collection,
maybe under the next window's profiler, writing into the first one's freed memory (torch
2.13: SIGSEGV; the storms of tests/test_serving.py crashed 4 runs in 18 with both cores
busy while ranges went through torch's Python ``record_function`` class)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from profkit._compat import range_enter, range_exit
from profkit._records import ScopeRecord


def _opened(label: str) -> ScopeRecord:
    record = ScopeRecord(label, -1, {}, None, 0, 0)
    box: list[Any] = [range_exit]
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


def test_an_exception_right_after_the_end_keeps_the_range_for_the_retry() -> None:
    """A signal's exception (here ``KeyboardInterrupt``) landing right after torch's exit op
    returned: the record still holds the range, the retry ends it again (which does
    nothing) and lets it go; the profile has it once."""
    prof = profile(activities=[ProfilerActivity.CPU])
    prof.start()
    record = _opened("profkit.test.retry")
    assert record.rf is not None

    def exit_then_interrupt(handle: Any) -> None:
        range_exit(handle)
        raise KeyboardInterrupt  # where a handler runs: as the C call returns

    record.rf[0] = exit_then_interrupt
    with pytest.raises(KeyboardInterrupt):
        record.close()
    assert record.rf is not None
    assert len(record.rf) == 2
    record.rf[0] = range_exit
    assert record.close() is None
    assert record.rf is None
    prof.stop()
    assert 1 == _ranges(prof, "profkit.test.retry")


def test_a_range_opening_cut_before_torchs_op_holds_nothing_to_end() -> None:
    """The box is the record's before the op runs: an exception before it leaves ``[exit]``,
    which the close lets go of without calling anything."""
    record = ScopeRecord("profkit.test.none", -1, {}, None, 0, 0)
    record.rf = [range_exit]
    assert record.close() is None
    assert record.rf is None
