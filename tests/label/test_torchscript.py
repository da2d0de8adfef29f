"""TorchScript: scripting compiles the undecorated functions; profkit steps aside."""

from __future__ import annotations

import pytest
import torch

import profkit
from profkit.testing import capture


@profkit.profiled
def activation(x: torch.Tensor) -> torch.Tensor:
    """A labelled helper a scripted model calls."""
    return torch.relu(x)


class Decorated(torch.nn.Module):
    """Decorated forward, method, staticmethod and classmethod."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(8, 4)

    @profkit.profiled
    def double(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @profkit.profiled
    @staticmethod
    def shift(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    @profkit.profiled("forward")
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return activation(self.shift(self.double(self.linear(x))))


class WithRegion(torch.nn.Module):
    """``region()`` inside ``forward``, guarded for scripting as docs/concepts.md shows."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.jit.is_scripting():
            with profkit.region("double"):
                x = x * 2
        else:
            x = x * 2
        return x


def test_a_module_with_decorated_methods_scripts() -> None:
    """torch.jit.script compiles the undecorated code; outputs equal eager ones."""
    model, x = Decorated().eval(), torch.randn(3, 8)
    scripted = torch.jit.script(model)
    torch.testing.assert_close(model(x), scripted(x), rtol=0, atol=0)


def test_scripted_code_runs_inside_a_sampled_call() -> None:
    """A scripted model called from a sampled root call: its ops are the call's."""
    scripted = torch.jit.script(Decorated().eval())

    @profkit.profiled("serve")
    def serve(x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = scripted(x)
        return out

    with capture(sample_every=1) as cap:
        serve(torch.randn(3, 8))
    (call,) = cap.calls
    assert ["serve"] == [s.label for s in call.scopes]
    # the JIT's optimising executor may run Linear as its decomposition (aten::addmm)
    assert {"aten::linear", "aten::addmm"} & {r.name for r in call.root.ops}


def test_a_guarded_region_scripts() -> None:
    """``if not torch.jit.is_scripting():`` around a region lets the module script."""
    x = torch.randn(2, 2)
    torch.testing.assert_close(x * 2, torch.jit.script(WithRegion())(x), rtol=0, atol=0)


def test_an_unguarded_region_fails_to_script() -> None:
    """Scripting a bare region fails (documented: guard it, or label around the call)."""

    class Bare(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with profkit.region("double"):
                return x * 2

    with pytest.raises(Exception, match="region"):
        torch.jit.script(Bare())
