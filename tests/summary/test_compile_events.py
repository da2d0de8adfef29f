"""torch.compile's own events on synthetic windows: one row per scope, never the model's ops."""

from __future__ import annotations

import types

from test_summary_device import event, summarise

from profkit._summary.compile_events import fold_compiles
from profkit._summary.compiled import CompiledLabels


def _compiling_call() -> list[object]:
    """Two compiles (torch 2.13 and older names) with their work, and the model's own ops."""
    return [
        event("dynamo", 0, 400, self_cpu=10),
        event("dynamo_data: compile_id=0/0", 1, 2, user=True),
        event("bytecode_tracing (dynamo_timed)", 5, 300, self_cpu=100),
        event("aten::empty_strided", 10, 20, self_cpu=10),  # fake-tensor tracing
        event("Torch-Compiled Region: 0/0", 410, 500, self_cpu=20),
        event("aten::addmm", 420, 480, self_cpu=60),
        event("_compile.compile_inner (dynamo_timed)", 600, 700, self_cpu=50),
        event("aten::detach", 610, 620, self_cpu=10),
        event("aten::relu", 800, 810, self_cpu=10),
    ]


def test_compiles_are_one_row_and_no_ops() -> None:
    """Each outermost compile counts once in one row; what ran inside it is no op."""
    call = summarise("predict", 1000, _compiling_call())
    rows = {r.name: (r.count, r.self_cpu_us) for r in call.root.ops}
    expected = {
        "torch.compile": (2, 500.0),
        "Torch-Compiled Region: 0/0": (1, 20.0),
        "aten::addmm": (1, 60.0),
        "aten::relu": (1, 10.0),
    }
    assert expected == rows
    assert (3, 500.0) == (call.root.op_count, call.compile_us)


def test_a_call_without_compiles_has_no_compile_row() -> None:
    """No compile event: no row, ``compile_us`` 0, every op counted."""
    call = summarise("predict", 1000, _compiling_call()[4:6])
    assert (0.0, 2) == (call.compile_us, call.root.op_count)
    assert "torch.compile" not in {r.name for r in call.root.ops}


def _view(name: str, thread: int, start: int, end: int) -> types.SimpleNamespace:
    return types.SimpleNamespace(name=name, thread=thread, start_ns=start, end_ns=end)


def test_only_the_compiling_thread_loses_its_events() -> None:
    """An op of another thread running during a compile is kept."""
    dynamo = _view("dynamo", 1, 0, 100)
    inside, elsewhere = _view("aten::mul", 1, 10, 20), _view("aten::mul", 2, 10, 20)
    ops, kept = fold_compiles([dynamo, inside, elsewhere], [dynamo])  # type: ignore[list-item]
    assert ([dynamo, elsewhere], {id(dynamo)}) == (ops, kept)


def test_compiled_labels_forget_a_reused_compile_id() -> None:
    """After torch._dynamo.reset() ids restart: a new compile of "0/0" replaces the old one."""
    labels = CompiledLabels(limit=2)
    labels.note("0/0", "encode", compile=1)
    labels.note("0/0", "head", compile=1)
    labels.note("0/0", "head", compile=1)
    assert ("encode", "head") == labels.labels("0/0")
    labels.note("0/0", "other", compile=2)
    labels.note("1/0", "a", compile=3)
    labels.note("2/0", "b", compile=4)  # past the limit: not noted
    assert (("other",), ("a",), ()) == tuple(labels.labels(i) for i in ("0/0", "1/0", "2/0"))
