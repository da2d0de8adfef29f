"""The user starts their own torch profiler inside a sampled call and forks; the child makes
a root call, then stops the user's profiler and reads it (tests/capture/test_fork.py)."""

import contextvars
import json
import os

import torch
from _fresh import report

import profkit

enabled = torch._C._autograd._profiler_enabled
x = torch.ones(16, 16)
user = torch.profiler.profile()


@profkit.profiled("f")
def f() -> float:
    return float(torch.relu(x).sum())


def child() -> dict[str, object]:
    f()  # a root call in the child, the user's profiler on
    torch.ones(5).sin()
    on = enabled()
    user.stop()
    return {
        "on": on,
        "errors": profkit.stats()["error_reasons"],
        "sin": any(e.name == "aten::sin" for e in user.events()),
    }


@profkit.profiled("outer")
def outer() -> dict[str, object]:
    user.start()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            out = contextvars.Context().run(child)
        except BaseException as exc:
            out = {"error": repr(exc)}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    with os.fdopen(r) as got:
        return json.loads(got.read() or "{}")


profkit.configure(sample_every=1, cold_calls=0, exporters=())
result = outer()
torch.ones(3).cos()
user.stop()
result["parent"] = any(e.name == "aten::cos" for e in user.events())
report(**result)
