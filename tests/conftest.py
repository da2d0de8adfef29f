"""Shared fixtures: every test starts with no global session and internal errors raised."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest
import torch

import profkit
from profkit.testing import raise_internal_errors, reset

# Most tests count which root calls are sampled from the first one on: the cold rule (each
# label's first ``cold_calls`` calls are never the sampler's) is off for them, here and in
# the fresh interpreters and servers they start. Its own tests set it (tests/capture/
# test_representative.py) or drop this variable.
os.environ.setdefault("PROFKIT_COLD_CALLS", "0")


@pytest.fixture(autouse=True)
def _fresh_profkit() -> Iterator[None]:
    """Reset the global session around each test; profkit bugs raise instead of hiding."""
    reset()
    old = raise_internal_errors(True)
    yield
    reset()
    raise_internal_errors(old)


@pytest.fixture
def swallow_internal_errors() -> Iterator[None]:
    """For fault tests: profkit must contain the injected fault, as in production."""
    old = raise_internal_errors(False)
    yield
    raise_internal_errors(old)


@pytest.fixture
def mlp() -> torch.nn.Module:
    """A small MLP, the model most tests profile."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
    ).eval()


@pytest.fixture
def batch() -> torch.Tensor:
    """A batch for the MLP."""
    return torch.randn(32, 64)


@pytest.fixture
def predict(mlp: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """The MLP behind a ``@profiled("predict")`` handler with one ``region("forward")``."""

    @profkit.profiled("predict")
    def predict(batch: torch.Tensor) -> torch.Tensor:
        with profkit.region("forward"), torch.no_grad():
            out: torch.Tensor = mlp(batch)
        return out

    return predict


__all__ = ["profkit"]
