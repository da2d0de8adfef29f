"""torch.compile sees through profkit: no graph breaks, and compile work is not a model op."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

import profkit
from profkit.testing import capture

dynamo = pytest.importorskip("torch._dynamo")


class CountingBackend:
    """A ``torch.compile`` backend that counts the graphs it is given and runs them as is."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        self.graphs += 1
        return gm.forward


@profkit.profiled
def activation(x: torch.Tensor) -> torch.Tensor:
    """A labelled helper the model calls."""
    return torch.relu(x)


class Labelled(torch.nn.Module):
    """A model with every kind of profkit label inside ``forward``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inner = torch.nn.Linear(8, 8)
        self.outer = torch.nn.Linear(8, 4)

    @profkit.profiled
    @staticmethod
    def scale(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @profkit.profiled
    @classmethod
    def shift(cls, x: torch.Tensor) -> torch.Tensor:
        return x + 1

    @profkit.profiled("forward")
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with profkit.region("inner"):
            x = activation(self.inner(x))
        return self.outer(self.shift(self.scale(x)))


@profkit.profiled("serve")
def serve(model: Any, x: torch.Tensor) -> torch.Tensor:
    """The request handler: an eager root call around the compiled model."""
    with torch.no_grad():
        out: torch.Tensor = model(x)
    return out


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    """Each test compiles from scratch (dynamo caches per code object)."""
    dynamo.reset()
    yield
    dynamo.reset()


@pytest.mark.parametrize("mode", ["unconfigured", "unsampled", "sampled"])
def test_labels_compile_into_one_graph(mode: str) -> None:
    """region(), @profiled helpers and a @profiled forward compile with fullgraph=True."""
    model, backend, x = Labelled().eval(), CountingBackend(), torch.randn(4, 8)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    expected = serve(model, x)
    if mode == "unconfigured":
        actual = serve(compiled, x)
    else:
        with capture(sample_every=1 if mode == "sampled" else 10**9) as cap:
            serve(model, x)  # the first root call (sampled by both settings) runs eagerly
            actual = serve(compiled, x)
        expected_calls = ["serve", "serve"] if mode == "sampled" else ["serve"]
        assert expected_calls == [c.label for c in cap.calls]
    assert 1 == backend.graphs
    torch.testing.assert_close(expected, actual, rtol=0, atol=0)


def test_compiled_graph_ops_show_in_the_sampled_call() -> None:
    """A warmed compiled model sampled: its ops are the call's, and no compile work is."""
    model, x = Labelled().eval(), torch.randn(4, 8)
    compiled = torch.compile(model, backend=CountingBackend(), fullgraph=True)
    serve(compiled, x)  # compiles, unconfigured
    with capture(sample_every=1, top_k=50) as cap:
        serve(compiled, x)
    (call,) = cap.calls
    names = {row.name for row in call.root.ops}
    assert {"aten::addmm", "aten::relu"} <= names
    assert not {n for n in names if "dynamo_timed" in n or n == "torch.compile"}
    assert 0.0 == call.compile_us
    assert ("serve",) == tuple(s.label for s in call.scopes)  # the labels were compiled away


def test_compiling_in_a_sampled_call_is_one_compile_row() -> None:
    """The first call of a fresh compiled model: compile work is one row, not model ops."""
    model, x = Labelled().eval(), torch.randn(4, 8)
    compiled = torch.compile(model, backend=CountingBackend(), fullgraph=True)
    with capture(sample_every=1, top_k=50) as cap:
        serve(compiled, x)  # compiles inside the sampled window
        serve(compiled, x)  # warmed
    first, warm = cap.calls
    compile_rows = [r for r in first.root.ops if r.name == "torch.compile"]
    assert [1] == [r.count for r in compile_rows]
    assert first.compile_us == pytest.approx(compile_rows[0].self_cpu_us)
    assert first.compile_us > 0.0
    # the same ops as the warmed call's (whose guards were looked up: a cache hit)
    model_ops = {r.name: r.count for r in warm.root.ops if r.name != "TorchDynamo Cache Lookup"}
    first_ops = {r.name: r.count for r in first.root.ops if r.name != "torch.compile"}
    assert model_ops == first_ops
    assert sum(first_ops.values()) == first.root.op_count


def test_compiled_labels_are_named_in_the_summary() -> None:
    """A sampled call that ran a compiled graph says which profkit labels it compiled away."""
    model, x = Labelled().eval(), torch.randn(4, 8)
    compiled = torch.compile(model, backend=CountingBackend(), fullgraph=True)
    serve(compiled, x)
    with capture(sample_every=1) as cap:
        serve(compiled, x)
    (call,) = cap.calls
    expected = ("Labelled.scale", "Labelled.shift", "activation", "forward", "inner")
    assert expected == call.compiled_labels


def test_compiled_calls_between_windows_run_as_without_profkit() -> None:
    """Windows come and go around a warmed compiled model: no recompile, and every call
    between two windows runs with no profiler on, so compiled code (Inductor's checks
    ``torch.autograd.profiler._is_profiler_enabled``) takes the path it takes without
    profkit (issue 22; docs/performance.md, "Compiled models between windows")."""
    model, backend, x = Labelled().eval(), CountingBackend(), torch.randn(4, 8)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    seen: list[tuple[bool, bool]] = []

    @profkit.profiled("serve_compiled")
    def handler(batch: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            out: torch.Tensor = compiled(batch)
        seen.append(
            (
                bool(torch.autograd.profiler._is_profiler_enabled),
                bool(torch._C._autograd._profiler_enabled()),
            )
        )
        return out

    handler(x)  # compiles, unconfigured
    assert 1 == backend.graphs
    seen.clear()
    with capture(sample_every=5, cold_calls=0) as cap:
        for _ in range(40):
            handler(x)
    assert 1 == backend.graphs  # the windows' start and stop made dynamo recompile nothing
    sampled = cap.stats["sampled"]
    assert sampled >= 7, cap.stats  # 1-in-5 of 40 calls, the first sampled too
    assert len(cap.calls) == sampled
    on = [s for s in seen if s[0] or s[1]]
    assert len(on) == sampled  # the sampled calls, where both flags are on together
    assert all(s == (True, True) for s in on)
    assert len(seen) - len(on) == 40 - sampled  # every other call: no profiler at all
