"""Bounded memory: a short soak in a fresh process, and finished windows' events set free."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch.autograd.profiler_util import FunctionEvent

import profkit
from profkit._capture import window as _window
from profkit._export import worker as _worker
from profkit._summary.events import RawEvent
from profkit.testing import capture

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_short_soak_memory_is_bounded() -> None:
    """3,000 calls at 1-in-20 on the MLP (bench/soak.py): RSS after warm-up grows < 30 MB."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "soak.py"), "--calls", "3000", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert 3000 == result["root_calls"]
    assert 150 == result["sampled"]
    assert 150 == result["exported"] + result["dropped"]
    assert result["exported"] == result["summaries"]
    assert 2 * result["exported"] == result["spans"]  # predict + its forward region
    assert 0 == result["errors"]
    assert result["growth_after_warmup_mb"] < 30.0, result["curve"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_soak_at_every_call_makes_a_window_of_every_call() -> None:
    """``bench/soak.py --every 1``: every call is a window (the loop waits for the worker)."""
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "soak.py"),
            "--calls",
            "600",
            "--every",
            "1",
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert (600, 600, 0) == (result["windows"], result["exported"], result["skipped_backlog"])


@pytest.fixture
def automatic_gc_off() -> Iterator[None]:
    """Only explicit collections run, so what profkit itself frees is what gets freed."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


def _live_function_events() -> int:
    return sum(1 for o in gc.get_objects() if type(o) in (FunctionEvent, RawEvent))


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("automatic_gc_off")
@pytest.mark.parametrize("reader", ["raw", "torch"])
def test_finished_windows_do_not_keep_their_events_alive(
    mlp: torch.nn.Module, reader: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Events of exported windows are freed (profkit's raw reader and torch's parser alike)."""
    if reader == "torch":
        monkeypatch.setattr(_window, "read_cpu_events", lambda *a, **k: None)
    windows = 75
    x = torch.randn(32, 64)

    @profkit.profiled("predict")
    def predict() -> torch.Tensor:
        with torch.inference_mode():
            return mlp(x)

    before = _live_function_events()
    with capture(sample_every=1, exporters=()) as cap:
        for _ in range(windows):
            predict()
            assert profkit.force_flush(10.0)  # one window at a time: none dropped
        per_window = max(c.events_total for c in cap.calls)
    live = _live_function_events() - before
    assert windows == len(cap.calls)
    assert per_window > 0
    # at most the windows since the last periodic collection are still waiting to be freed
    assert _worker._GC_EVERY <= 30
    assert live <= 30 * per_window
