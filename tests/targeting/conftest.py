"""Fixtures of the targeted-capture tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from _load import CpuWait


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Intra-op threads off: the test's timing is then the handler's, not the scheduler's."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def cpu_wait() -> CpuWait:
    """The test thread's wait for a CPU from here on (see :class:`CpuWait`)."""
    return CpuWait()
