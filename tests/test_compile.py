"""torch.compile sees through profkit: labels inside a compiled model break no graph."""

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
