"""The quickstart from the README: a decorated predict with regions, one call in 100 profiled.

Run: ``python examples/quickstart.py`` (the summaries print on stderr).
"""

import torch

import profkit

profkit.configure(sample_every=100, exporters=("console",))
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


@profkit.profiled("predict")
def predict(batch: torch.Tensor) -> list[int]:
    with profkit.region("preprocess"):
        batch = (batch - batch.mean()) / (batch.std() + 1e-6)
    with profkit.region("inference"), torch.inference_mode():
        logits = model(batch)
    with profkit.region("postprocess"):
        return logits.argmax(dim=1).tolist()


for _ in range(300):
    predict(torch.randn(32, 64))
profkit.force_flush()  # the 3 sampled calls are printed (stderr) before this returns
print(profkit.stats())  # root_calls 300, sampled 3, exported 3
profkit.shutdown()
