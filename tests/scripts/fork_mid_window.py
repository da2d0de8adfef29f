"""Issue 38 case 1: the main thread forks 5 children while another thread runs sampled
calls that sleep 50 ms inside their window; each child makes 20 calls, flushes, shuts down
and ends with ``sys.exit(0)``. Reports each child's exit status (None: killed, hung)."""

import os
import sys
import threading
import time

import torch
from _fresh import reap, report

import profkit

torch.set_num_threads(1)
X = torch.ones(8, 8)
profkit.configure(sample_every=2, cold_calls=0, exporters=())


@profkit.profiled("handler")
def handler() -> None:
    torch.mm(X, X)
    time.sleep(0.05)  # inside its window, when sampled
    torch.mm(X, X)


@profkit.profiled("child")
def child_call() -> None:
    torch.mm(X, X)


stop = threading.Event()


def serve() -> None:
    while not stop.is_set():
        handler()


threading.Thread(target=serve, daemon=True).start()
time.sleep(0.3)
pids = []
for _ in range(5):
    time.sleep(0.03)
    pid = os.fork()
    if pid == 0:
        for _ in range(20):
            child_call()
        profkit.force_flush()
        sys.exit(0 if profkit.shutdown() else 3)
    pids.append(pid)
deadline = time.monotonic() + 60.0  # (the children run at once: one deadline for all)
codes = [reap(pid, max(0.5, deadline - time.monotonic())) for pid in pids]
stop.set()
report(children=codes)
