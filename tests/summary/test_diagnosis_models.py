"""The verdict agrees with where the op time is, on real models at batch sizes 1 to 256.

Each case profiles one warm call of a real model (an MLP behind a handler with regions, a
``torch.nn.TransformerEncoder``, a small conv net) through the whole pipeline, keeps the
window's torch profiler, and checks the verdict against torch's own rows for that window
(``key_averages`` by name, profkit's annotations left out), not against profkit's: the rule
is in docs/diagnosis.md ("The rule the verdict never breaks").

* launch-bound: the op rows of more than ``launch_bound_op_us`` per event ("heavy") never
  carry most of the time in and between ops (op time plus launch glue), and the share the
  reason quotes is torch's;
* compute-bound: the rows the reason names are torch's heaviest, with the share it quotes,
  and the top two take at least ``compute_bound_top2_share`` of the op time;
* input-bound: most of the call is outside torch ops.

One intra-op thread (``torch.set_num_threads(1)``): the verdict is then about the model,
not about OpenMP barriers on a busy machine.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import profkit
from profkit._export import processing as _processing
from profkit._model import CallSummary
from profkit._summary.diagnosis import Thresholds
from profkit.testing import capture

BATCHES = (1, 4, 16, 64, 256)
TH = Thresholds()
TOL = 0.05
"""Slack for the "other" row: profkit reads the rows past ``top_k`` as one row of their mean."""


def _mlp() -> Callable[[int], Callable[[], Any]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    ).eval()

    def make(batch: int) -> Callable[[], Any]:
        rows = torch.randn(batch, 256).tolist()

        def handler() -> list[int]:
            with profkit.region("preprocess"):
                x = torch.tensor(rows)
            with profkit.region("inference"), torch.inference_mode():
                logits = model(x)
            with profkit.region("postprocess"):
                return [int(i) for i in logits.argmax(dim=1)]

        return handler

    return make


def _transformer() -> Callable[[int], Callable[[], Any]]:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(128, 4, 512)  # (tokens, batch, features)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()

    def make(batch: int) -> Callable[[], Any]:
        x = torch.randn(32, batch, 128)

        def handler() -> torch.Tensor:
            with torch.inference_mode():
                out: torch.Tensor = model(x)
            return out

        return handler

    return make


def _convnet() -> Callable[[int], Callable[[], Any]]:
    torch.manual_seed(0)
    blocks: list[torch.nn.Module] = [torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU()]
    for _ in range(8):  # 8 blocks: over 200 op events a call, as many as a launch-bound call
        blocks += [torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU()]
    blocks += [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 10)]
    model = torch.nn.Sequential(*blocks).eval()

    def make(batch: int) -> Callable[[], Any]:
        x = torch.randn(batch, 3, 16, 16)

        def handler() -> torch.Tensor:
            with torch.inference_mode():
                out: torch.Tensor = model(x)
            return out

        return handler

    return make


MODELS = {"mlp": _mlp(), "transformer": _transformer(), "convnet": _convnet()}


@pytest.fixture
def one_thread() -> Iterator[None]:
    """torch runs one intra-op thread for the test."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture
def profiles(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Keep every window's torch profiler, which the session otherwise releases after export."""
    kept: list[Any] = []
    original = _processing.Processor.summarise

    def summarise(self: _processing.Processor, win: Any) -> Any:
        kept.append(win.prof)
        return original(self, win)

    monkeypatch.setattr(_processing.Processor, "summarise", summarise)
    return kept


def _torch_rows(prof: Any) -> dict[str, tuple[int, float]]:
    """torch's (count, self CPU µs) per op name in the window, profkit's annotations left out."""
    rows: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for ev in prof.events():
        if not ev.is_user_annotation:
            rows[ev.key][0] += 1
            rows[ev.key][1] += ev.self_cpu_time_total
    return {name: (int(count), self_us) for name, (count, self_us) in rows.items()}


def _quoted(reason: str, before: str) -> float:
    """The share the reason quotes just before ``before`` ("85% of op time" -> 0.85); -1: none."""
    match = re.search(rf"(\d+)% {re.escape(before)}", reason)
    return int(match.group(1)) / 100 if match else -1.0


def _contradictions(call: CallSummary, prof: Any) -> list[str]:
    """What in the call's verdict contradicts torch's own op-time shares (nothing: [])."""
    d = call.diagnosis
    assert d is not None
    rows = _torch_rows(prof)
    op_us = sum(self_us for _, self_us in rows.values())
    heavy = sum(s for n, s in rows.values() if s > TH.launch_bound_op_us * n)
    wall = call.root.duration_us
    glue = wall * (d.figures["outside_ops_share"] - d.figures["input_share"])
    ranked = sorted(rows, key=lambda name: rows[name][1], reverse=True)
    top2 = sum(rows[name][1] for name in ranked[:2]) / op_us
    wrong = []
    if d.verdict == "launch-bound":
        if heavy > (0.5 + TOL) * (op_us + glue):
            wrong.append(f"launch-bound while heavy ops take {heavy / (op_us + glue):.0%}")
        share = (op_us - heavy + glue) / (op_us + glue)
        if abs(share - _quoted(d.reason, "of the time in and between ops")) > TOL:
            wrong.append(f"the reason quotes a launch share other than torch's {share:.0%}")
    if d.verdict == "compute-bound":
        if top2 < TH.compute_bound_top2_share - 0.01:
            wrong.append(f"compute-bound while the top two ops take {top2:.0%}")
        named = d.reason.split(" take")[0].split(" and ")
        if named != ranked[: len(named)]:
            wrong.append(f"the reason names {named}, torch's heaviest are {ranked[:2]}")
        share = sum(rows[name][1] for name in named) / op_us
        if abs(share - _quoted(d.reason, "of op time")) > 0.01:
            wrong.append(f"the reason quotes a share other than torch's {share:.0%}")
    if d.verdict == "input-bound" and wall - op_us < TH.input_bound_share * wall:
        wrong.append(f"input-bound with {(wall - op_us) / wall:.0%} outside torch ops")
    return wrong


@pytest.mark.timeout(120)
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_verdict_agrees_with_where_the_op_time_is(
    name: str, batch: int, one_thread: None, profiles: list[Any]
) -> None:
    """A warm call's verdict never contradicts torch's own op-time shares for its window."""
    handler = MODELS[name](batch)
    handler()  # warm: the first call of a model allocates and picks kernels
    with capture(sample_every=1) as cap:
        profkit.profiled(name)(handler)()
        assert profkit.force_flush(30.0)
    (call,), (prof,) = cap.calls, profiles
    assert call.diagnosis is not None
    assert [] == _contradictions(call, prof), (call.diagnosis, _torch_rows(prof))
