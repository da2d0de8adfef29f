"""Fidelity: profkit's op rows are torch's own ``key_averages()`` rows for the same profile."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

import profkit
from profkit._capture import window as _window
from profkit._capture.window import Window
from profkit._export import processing as _processing
from profkit.testing import capture

#: relative tolerance for self CPU times (float summation order differs)
REL = 1e-6


@pytest.fixture
def profiles(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Keep every window's torch profiler, which the session otherwise releases after export."""
    kept: list[Any] = []
    original = _processing.Processor.summarise

    def summarise(self: _processing.Processor, win: Window) -> Any:
        kept.append(win.prof)
        return original(self, win)

    monkeypatch.setattr(_processing.Processor, "summarise", summarise)
    return kept


def _torch_rows(prof: Any, labels: set[str], by_shapes: bool) -> dict[tuple[str, str], Any]:
    """torch's key_averages rows of the window, without profkit's own scope annotations."""
    rows = prof.key_averages(group_by_input_shape=by_shapes)
    out = {}
    for row in rows:
        if row.key in labels and row.is_user_annotation:
            continue
        shapes = str(row.input_shapes) if by_shapes and row.input_shapes else ""
        assert (row.key, shapes) not in out
        out[(row.key, shapes)] = row
    return out


def _close(expected: float, actual: float) -> bool:
    return abs(expected - actual) <= REL * max(abs(expected), 1.0)


def _run(mlp: torch.nn.Module, batch: torch.Tensor, **settings: Any) -> Any:
    @profkit.profiled("predict")
    def predict(x: torch.Tensor) -> torch.Tensor:
        with profkit.region("preprocess"):
            x = (x - x.mean()) / (x.std() + 1e-5)
        with profkit.region("forward"), torch.no_grad():
            out: torch.Tensor = mlp(x)
        return out.softmax(-1)

    with capture(sample_every=1, **settings) as cap:
        predict(batch)
    (call,) = cap.calls
    return call


@pytest.mark.parametrize(
    ("by_shapes", "reader"), [(False, "raw"), (True, "raw"), (False, "torch"), (True, "torch")]
)
def test_every_row_matches_key_averages(
    profiles: list[Any],
    mlp: torch.nn.Module,
    batch: torch.Tensor,
    by_shapes: bool,
    reader: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With top_k large, each root row equals torch's row by name: count and self CPU time.

    Both event readers are checked: profkit's fast raw-kineto reader (the CPU default) and
    torch's own ``prof.events()`` (used for memory and device profiles).
    """
    if reader == "torch":
        monkeypatch.setattr(_window, "read_cpu_events", lambda *a, **k: None)
    call = _run(mlp, batch, top_k=10_000, record_shapes=by_shapes)
    (prof,) = profiles
    labels = {s.label for s in call.scopes}
    expected = _torch_rows(prof, labels, by_shapes)
    ours = {(r.name, r.shapes or ""): r for r in call.root.ops}
    assert not any(r.is_other for r in call.root.ops)
    assert sorted(expected) == sorted(ours)
    assert any(name == "aten::addmm" for name, _ in ours)
    for key, row in ours.items():
        torch_row = expected[key]
        assert torch_row.count == row.count, key
        assert _close(torch_row.self_cpu_time_total, row.self_cpu_us), key
        assert _close(torch_row.cpu_time_total, row.cpu_us), key
    assert sum(r.count for r in expected.values()) == call.root.op_count
    total = sum(r.self_cpu_time_total for r in expected.values())
    assert _close(total, call.root.self_cpu_us)


@pytest.mark.parametrize("top_k", [1, 3, 8])
def test_top_k_plus_other_adds_up_to_the_totals(
    profiles: list[Any], mlp: torch.nn.Module, batch: torch.Tensor, top_k: int
) -> None:
    """The top-K rows are torch's heaviest rows; "other" holds exactly the rest."""
    call = _run(mlp, batch, top_k=top_k)
    (prof,) = profiles
    expected = _torch_rows(prof, {s.label for s in call.scopes}, False)
    ops = call.root.ops
    head, other = ops[:-1], ops[-1]
    assert top_k == len(head)
    assert other.is_other
    assert other.name == "other"
    assert not any(r.is_other for r in head)
    heaviest = sorted(expected.values(), key=lambda r: (r.self_cpu_time_total, r.key), reverse=True)
    assert [r.key for r in heaviest[:top_k]] == [r.name for r in head]
    for row in head:
        assert expected[(row.name, "")].count == row.count
        assert _close(expected[(row.name, "")].self_cpu_time_total, row.self_cpu_us)
    rest = [r for k, r in expected.items() if k[0] not in {h.name for h in head}]
    assert sum(r.count for r in rest) == other.count
    assert _close(sum(r.self_cpu_time_total for r in rest), other.self_cpu_us)
    assert sum(r.count for r in expected.values()) == sum(r.count for r in ops)
    assert call.root.op_count == sum(r.count for r in ops)
    total = sum(r.self_cpu_time_total for r in expected.values())
    assert _close(total, sum(r.self_cpu_us for r in ops))
    assert _close(total, call.root.self_cpu_us)


def test_region_rows_match_key_averages_of_their_range(
    profiles: list[Any], mlp: torch.nn.Module, batch: torch.Tensor
) -> None:
    """A region's rows are torch's rows restricted to the ops inside the region's range."""
    call = _run(mlp, batch, top_k=10_000)
    (prof,) = profiles
    (forward,) = [s for s in call.scopes if s.label == "forward"]
    (mark,) = [e for e in prof.events() if e.name == "forward" and e.is_user_annotation]
    inside = [
        e
        for e in prof.events()
        if not e.is_user_annotation
        and mark.time_range.start <= e.time_range.start
        and e.time_range.end <= mark.time_range.end
    ]
    expected: dict[str, list[float]] = {}
    for e in inside:
        acc = expected.setdefault(e.name, [0, 0.0])
        acc[0] += 1
        acc[1] += e.self_cpu_time_total
    assert sorted(expected) == sorted(r.name for r in forward.ops)
    for row in forward.ops:
        assert expected[row.name][0] == row.count
        assert _close(expected[row.name][1], row.self_cpu_us)
    assert "aten::addmm" in expected
    assert "aten::softmax" not in expected


def test_raw_reader_folds_same_name_chains_like_torch() -> None:
    """Nested same-name ranges (a chain of three) and siblings: self times equal torch's."""
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile

    from profkit._summary.raw import read_cpu_events

    x = torch.ones(4, 4)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("dup"), record_function("dup"), record_function("dup"):
            x.mm(x)
            with record_function("inner"):
                x.add(1)
        with record_function("dup"):  # a sibling chain of one: nothing to fold
            x.relu()
            x.abs()
    raw = prof.profiler.kineto_results.events()
    events = read_cpu_events(raw, False)
    assert events is not None
    ours: dict[str, list[float]] = {}
    for ev in events:
        acc = ours.setdefault(ev.name, [0, 0.0, 0.0])
        acc[0] += 1
        acc[1] += ev.self_cpu_time_total
        acc[2] += ev.cpu_time_total
    expected = {row.key: row for row in prof.key_averages()}
    assert sorted(expected) == sorted(ours)
    for name, (count, self_us, total_us) in ours.items():
        assert expected[name].count == count, name
        assert _close(expected[name].self_cpu_time_total, self_us), name
        assert _close(expected[name].cpu_time_total, total_us), name
    assert 2 == ours["dup"][0]  # the chain of three folded into its outermost range


def test_raw_events_offer_every_field_of_the_summary_view() -> None:
    """The summary reads profkit's raw events as their own views: they have each view field."""
    from profkit._summary.events import EventView, RawEvent

    event = RawEvent("aten::mm", 1, 1_000, 3_000, False, False)
    missing = [field for field in EventView.__slots__ if not hasattr(event, field)]
    assert [] == missing
    assert (event, 2.0, 2.0) == (event.ev, event.cpu_time_total, event.self_cpu_time_total)


class _Kineto:
    """A raw kineto event with the methods profkit's reader calls."""

    def __init__(self, name: str, start: int, end: int, *, thread: int = 1) -> None:
        self._name, self._start, self._end, self._thread = name, start, end, thread

    def name(self) -> str:
        return self._name

    def start_ns(self) -> int:
        return self._start

    def end_ns(self) -> int:
        return self._end

    def start_thread_id(self) -> int:
        return self._thread

    def end_thread_id(self) -> int:
        return self._thread

    def is_async(self) -> bool:
        return False

    def is_user_annotation(self) -> bool:
        return False


def test_raw_reader_orders_equal_starts_outer_first() -> None:
    """Events that start on the same ns are nested outer first, whatever kineto's order."""
    from profkit._summary.raw import read_cpu_events

    raw = [
        _Kineto("aten::inner", 100, 200),
        _Kineto("aten::outer", 100, 500),
        _Kineto("aten::other", 50, 80, thread=2),
    ]
    events = read_cpu_events(raw, False, with_flops=False, cpu_only=True)
    assert events is not None
    assert ["aten::other", "aten::outer", "aten::inner"] == [e.name for e in events]
    assert [0.03, 0.3, 0.1] == [e.self_cpu_time_total for e in events]


@pytest.mark.parametrize("reader", ["raw", "torch"])
def test_with_stack_python_frames_are_not_op_rows(
    profiles: list[Any],
    mlp: torch.nn.Module,
    batch: torch.Tensor,
    reader: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """with_stack's Python frames are for the trace: the rows and op count are the torch ops'."""
    if reader == "torch":
        monkeypatch.setattr(_window, "read_cpu_events", lambda *a, **k: None)
    plain = _run(mlp, batch, top_k=10_000)
    stacked = _run(mlp, batch, top_k=10_000, with_stack=True)
    python = {e.name for e in profiles[-1].events() if e.is_python_function}
    assert python  # the profile did record Python frames
    assert {r.name: r.count for r in plain.root.ops} == {r.name: r.count for r in stacked.root.ops}
    assert plain.root.op_count == stacked.root.op_count


def test_with_stack_other_threads_python_frames_do_not_fill_max_events(
    mlp: torch.nn.Module, batch: torch.Tensor
) -> None:
    """Python frames torch records on other threads (with_stack) neither cut nor drop a window."""
    go, done = threading.Event(), threading.Event()

    def tick() -> int:
        return 1

    def busy() -> None:  # another thread running Python (say, the export worker) meanwhile
        go.wait(10)
        for _ in range(3000):
            tick()
        done.set()

    @profkit.profiled("predict")
    def predict(x: torch.Tensor) -> torch.Tensor:
        go.set()
        done.wait(10)
        with torch.no_grad():
            out: torch.Tensor = mlp(x)
        return out

    thread = threading.Thread(target=busy)
    thread.start()
    try:
        with capture(sample_every=1, with_stack=True, max_events=2000) as cap:
            predict(batch)
    finally:
        go.set()
        thread.join()
    assert done.is_set()
    assert [None] == [call.truncated for call in cap.calls]
    assert {} == cap.stats["dropped_reasons"]
