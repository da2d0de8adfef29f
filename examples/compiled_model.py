"""Serving a ``torch.compile``d model with profkit regions inside its ``forward``.

Run: ``python examples/compiled_model.py`` (the summaries print on stderr). Inductor, the
default backend, needs a C++ compiler on a CPU; ``--backend aot_eager`` runs without one.

The model is compiled with ``fullgraph=True``: a graph break would be an error, so the run
itself shows that profkit's labels compile away. One call in 50 is profiled: the first one
compiles the model (its summary has a ``torch.compile`` row, not hundreds of compiler
events counted as ops), the later ones run the compiled graph (their summaries name the
labels it compiled away: ``encode`` and ``head``).
"""

from __future__ import annotations

import argparse

import torch

import profkit


class Classifier(torch.nn.Module):
    """A small MLP whose stages are labelled inside ``forward``."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Linear(32, 64)
        self.head = torch.nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with profkit.region("encode"):
            hidden = torch.relu(self.encoder(x))
        with profkit.region("head"):
            return self.head(hidden)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="inductor", help="torch.compile backend")
    parser.add_argument("-n", type=int, default=101, help="requests to serve")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    # cold_calls=0: the first call, which compiles, is a sample too, to show what a compile
    # looks like in a profile (by default a label's first 3 calls are never the sampler's)
    profkit.configure(sample_every=50, cold_calls=0, exporters=("console",))
    model = torch.compile(Classifier().eval(), backend=args.backend, fullgraph=True)

    @profkit.profiled("predict")
    def predict(batch: torch.Tensor) -> list[int]:
        with profkit.region("preprocess"):
            batch = (batch - batch.mean()) / (batch.std() + 1e-6)
        with torch.no_grad():
            logits = model(batch)
        with profkit.region("postprocess"):
            return logits.argmax(dim=1).tolist()

    for _ in range(args.n):
        predict(torch.randn(16, 32))
    profkit.force_flush()  # the sampled calls are printed (stderr) before this returns
    s = profkit.stats()
    print(f"root_calls={s['root_calls']} sampled={s['sampled']} exported={s['exported']}")
    profkit.shutdown()


if __name__ == "__main__":
    main()
