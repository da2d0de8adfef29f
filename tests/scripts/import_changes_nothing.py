"""#20 hooks: ``import profkit`` changes nothing in torch, in signal handlers or fork hooks;
``configure()`` installs the profiler hooks and ``shutdown()`` removes them."""

from __future__ import annotations

import json
import os
import signal

import torch.autograd.profiler as p

prepare, start = p._prepare_profiler, p._run_on_profiler_start
handlers = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)}

import profkit  # noqa: E402

untouched = p._prepare_profiler is prepare and p._run_on_profiler_start is start
same_handlers = handlers == {s: signal.getsignal(s) for s in handlers}
profkit.configure(exporters=())
hooked = p._prepare_profiler is not prepare
profkit.shutdown()
unhooked = p._prepare_profiler is prepare and p._run_on_profiler_start is start
out = {
    "untouched": untouched,
    "same_handlers": same_handlers,
    "hooked": hooked,
    "unhooked": unhooked,
    "pid": os.getpid(),
}
print("REPORT " + json.dumps(out), flush=True)
