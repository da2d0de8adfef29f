"""A TorchServe-style handler instrumented with profkit; runs without TorchServe installed.

The class has TorchServe's ``BaseHandler`` shape (``initialize``, ``preprocess``,
``inference``, ``postprocess``, ``handle(data, context)``) and subclasses the real
``BaseHandler`` when ``ts`` is importable. ``handle`` is the root call (the sampling point);
the three stages are regions under it, so a sampled request shows where its time went.

Run the demo: ``python examples/torchserve_handler.py`` (a few batches through a fake
context; summaries print on stderr). In TorchServe, point the model archive's ``--handler``
at this file: the module-level :func:`handle` is the entry point TorchServe calls.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch

import profkit

try:  # pragma: no cover - only when TorchServe is installed
    from ts.torch_handler.base_handler import BaseHandler  # type: ignore[import-not-found]
except ImportError:
    BaseHandler = object

FEATURES = 16
LABELS = ("cat", "dog", "bird", "fish")


class ProfiledHandler(BaseHandler):  # type: ignore[misc]
    """Classifies JSON feature vectors; one request in N runs under the profiler."""

    def __init__(self) -> None:
        self.model: torch.nn.Module | None = None
        self.initialized = False

    def initialize(self, context: Any) -> None:
        """Build the model (in code here; TorchServe would load ``context.manifest``'s file)."""
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, len(LABELS))
        ).eval()
        self.initialized = True

    @profkit.profiled("preprocess")
    def preprocess(self, data: list[dict[str, Any]]) -> torch.Tensor:
        """TorchServe hands a list of requests, each ``{"body": bytes | str | dict}``."""
        rows = []
        for request in data:
            body: Any = request.get("body") or request.get("data")
            if isinstance(body, (bytes, bytearray)):
                body = body.decode("utf-8")
            if isinstance(body, str):
                body = json.loads(body)
            rows.append([float(x) for x in body["features"]])
        return torch.tensor(rows, dtype=torch.float32)

    @profkit.profiled("inference")
    def inference(self, batch: torch.Tensor) -> torch.Tensor:
        assert self.model is not None, "initialize() first"
        with torch.inference_mode():
            logits: torch.Tensor = self.model(batch)
        return logits

    @profkit.profiled("postprocess")
    def postprocess(self, logits: torch.Tensor) -> list[dict[str, Any]]:
        """One response per request, in order, as TorchServe requires."""
        probs = logits.softmax(dim=1)
        scores, index = probs.max(dim=1)
        return [
            {"label": LABELS[i], "score": round(s, 4)}
            for i, s in zip(index.tolist(), scores.tolist(), strict=True)
        ]

    @profkit.profiled("torchserve.handle")
    def handle(self, data: list[dict[str, Any]], context: Any) -> list[dict[str, Any]]:
        """The root call: preprocess, inference and postprocess become its child scopes."""
        return self.postprocess(self.inference(self.preprocess(data)))


_service = ProfiledHandler()


def handle(data: list[dict[str, Any]] | None, context: Any) -> list[dict[str, Any]] | None:
    """TorchServe's module-level entry point (also called once with ``data=None`` at load)."""
    if not _service.initialized:
        _service.initialize(context)
    if data is None:
        return None
    return _service.handle(data, context)


class FakeContext:
    """The parts of TorchServe's ``Context`` a handler usually reads."""

    def __init__(self) -> None:
        self.system_properties = {"model_dir": ".", "gpu_id": None, "batch_size": 4}
        self.manifest = {"model": {"modelName": "profkit-demo", "handler": "torchserve_handler.py"}}


def main() -> int:
    profkit.configure(sample_every=5, exporters=("console",))
    context = FakeContext()
    generator = torch.Generator().manual_seed(1)
    for step in range(20):
        batch = [
            {"body": json.dumps({"features": torch.randn(FEATURES, generator=generator).tolist()})}
            for _ in range(4)
        ]
        result = handle(batch, context)
        if step % 5 == 0:
            print(f"batch {step}: {result}")
    profkit.force_flush()
    stats = profkit.stats()
    print(
        f"root_calls={stats['root_calls']} sampled={stats['sampled']} exported={stats['exported']}"
    )
    profkit.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
