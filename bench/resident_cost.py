"""A resident profiler session toggled per window, against torch's start and stop (issue 37).

torch 2.13 can keep one profiler session on and switch its CPU collection on and off
(``profile.toggle_collection_dynamic(enable, [CPU])``). This script measures, in one process
with the variants interleaved round by round (this thread's CPU time, ``time.thread_time``):

* per window around the light handler (the MLP's forward, as in ``window_cost.py``):
  torch's ``profile(); start(); op; stop()`` (what profkit pays today); a toggle on, the
  op, a toggle off on a resident session (a window whose events are not read: a released
  speculative window); and a toggled window that must be read,
  which needs the session stopped and a new one started and toggled off for the next
  windows (reading events needs a stop); and toggled windows whose session is stopped and
  restarted every 50 windows (a resident session keeps what it recorded until it stops);
* between windows (collection off, ``torch.autograd.profiler._is_profiler_enabled`` true),
  what code that checks that flag pays: a ``record_function`` enter/exit in user code, an
  eager forward of the benchmarks' MLP, and the same forward compiled with
  ``torch.compile`` (inductor: its compiled graph is wrapped in a record-function range
  whenever the flag is set), each with no profiler and with a resident session;
* how many lines torch writes to stderr per toggled window (a C++ ``LOG(WARNING)`` at every
  CPU toggle, unless ``TORCH_CPP_LOG_LEVEL`` hides warnings for the whole process).

    PYTHONPATH=bench .venv/bin/python bench/resident_cost.py [--quick] [--json]

stderr is sent to /dev/null while measuring (the toggle's warnings would flood it), so the
numbers include writing each warning to a file, not to a terminal or a log collector.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.autograd.profiler as autograd_profiler
from _util import emit, fmt_spread, interleaved, machine, parse_args, seeded_mlp, spread
from torch.profiler import ProfilerActivity, profile

CPU = [ProfilerActivity.CPU]


@contextlib.contextmanager
def _stderr_to(path: str) -> Iterator[None]:
    """fd 2 to ``path`` (torch's C++ warnings go there, not through Python)."""
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(fd)
        os.close(saved)


class Resident:
    """One resident session, collection off between windows."""

    def __init__(self) -> None:
        self.prof = self._started()

    @staticmethod
    def _started() -> profile:
        prof = profile(activities=CPU)
        prof.start()
        prof.toggle_collection_dynamic(False, CPU)
        return prof

    def window(self, body: Callable[[], Any]) -> None:
        self.prof.toggle_collection_dynamic(True, CPU)
        body()
        self.prof.toggle_collection_dynamic(False, CPU)

    def read_window(self, body: Callable[[], Any]) -> None:
        """A window whose events must be read: stop, then a new session for the next."""
        self.window(body)
        self.prof.stop()
        self.prof = self._started()

    def window_cycled(self, body: Callable[[], Any], every: int = 50) -> None:
        """A toggled window; the session is stopped and restarted every ``every`` windows
        (what it keeps recording must be freed now and then: the stop pays per event)."""
        self.window(body)
        self.count = getattr(self, "count", 0) + 1
        if self.count % every == 0:
            self.prof.stop()
            self.prof = self._started()

    def close(self) -> None:
        self.prof.stop()


def _per_call_us(fn: Callable[[], Any]) -> Callable[[int], float]:
    def batch(n: int) -> float:
        t0 = time.thread_time_ns()
        for _ in range(n):
            fn()
        return (time.thread_time_ns() - t0) / n / 1000

    return batch


def _window_costs(rounds: int, n: int, op: Callable[[], Any]) -> dict[str, list[float]]:
    def startstop() -> None:
        p = profile(activities=CPU)
        p.start()
        op()
        p.stop()

    res = Resident()
    try:
        return interleaved(
            {
                "op alone": _per_call_us(op),
                "start/op/stop": _per_call_us(startstop),
                "toggle/op/toggle": _per_call_us(lambda: res.window(op)),
                "toggle/op/toggle, restarted every 50": _per_call_us(lambda: res.window_cycled(op)),
                "toggle/op/toggle + stop + restart": _per_call_us(lambda: res.read_window(op)),
            },
            rounds=rounds,
            n=n,
        )
    finally:
        res.close()


def _between_costs(rounds: int, n: int) -> dict[str, list[float]]:
    model, x = seeded_mlp()
    compiled = torch.compile(model)  # inductor, as a service would use it

    def user_range() -> None:
        with autograd_profiler.record_function("user.range"):
            pass

    def eager() -> None:
        with torch.inference_mode():
            model(x)

    def comp() -> None:
        with torch.inference_mode():
            compiled(x)

    comp()  # compile (seconds) before anything is timed
    fns = {"record_function": user_range, "eager forward": eager, "compiled forward": comp}
    out: dict[str, list[float]] = {}
    for label, on in (("no profiler", False), ("resident, off", True)):
        res = Resident() if on else None
        try:
            if on and not autograd_profiler._is_profiler_enabled:
                raise RuntimeError("a resident session should leave the flag set")
            got = interleaved({k: _per_call_us(f) for k, f in fns.items()}, rounds=rounds, n=n)
        finally:
            if res is not None:
                res.close()
        for k, v in got.items():
            out[f"{k}, {label}"] = v
    return out


def _warning_lines(windows: int) -> float:
    """Lines torch writes to stderr per toggled window (a file catches them)."""
    res = Resident()
    with tempfile.NamedTemporaryFile(suffix=".log", delete=False) as fh:
        path = fh.name
    try:
        with _stderr_to(path):
            for _ in range(windows):
                res.window(lambda: None)
        with open(path, encoding="utf-8", errors="replace") as log:
            lines = [line for line in log if "Toggling CPU activity" in line]
    finally:
        res.close()
        os.unlink(path)
    return len(lines) / windows


def measure(quick: bool) -> dict[str, Any]:
    torch.set_num_threads(1)
    rounds, n = (3, 50) if quick else (11, 200)
    model, x = seeded_mlp()

    def op() -> None:  # the light handler of window_cost.py: the MLP's forward (~10 ops)
        with torch.inference_mode():
            model(x)

    warnings = _warning_lines(20)
    with _stderr_to(os.devnull):
        with profile(activities=CPU):  # the process's first start (about a second)
            op()
        window = _window_costs(rounds, n, op)
        between = _between_costs(rounds, n * 10)
    base = window["op alone"]
    per = {k: [a - b for a, b in zip(v, base, strict=True)] for k, v in window.items()}
    del per["op alone"]
    raw = per["start/op/stop"]
    ratios = {k: spread([a / b for a, b in zip(v, raw, strict=True)]) for k, v in per.items()}
    added: dict[str, Any] = {}
    for key in ("record_function", "eager forward", "compiled forward"):
        on, off = between[f"{key}, resident, off"], between[f"{key}, no profiler"]
        added[key] = spread([a - b for a, b in zip(on, off, strict=True)])
    return {
        "machine": machine(),
        "rounds": rounds,
        "windows": n,
        "window_us": {k: spread(v) for k, v in per.items()},
        "window_ratio": ratios,
        "between_us": {k: spread(v) for k, v in between.items()},
        "between_added_us": added,
        "stderr_lines_per_window": warnings,
    }


def render(result: dict[str, Any]) -> str:
    w, r = result["window_us"], result["window_ratio"]
    b, a = result["between_us"], result["between_added_us"]
    lines = [
        f"resident session vs start/stop, {result['rounds']} rounds of {result['windows']} "
        "windows (this thread's CPU, median [q1-q3], µs, the handler itself taken off)",
        "",
        "| a window around the light handler | CPU | / start+stop |",
        "|---|---|---|",
        *(f"| {k} | {fmt_spread(v, 1)} | {fmt_spread(r[k], 3)} |" for k, v in w.items()),
        "",
        "between windows (collection off), per call, µs:",
        "",
        "| code | no profiler | resident, off | added |",
        "|---|---|---|---|",
        *(
            f"| {k} | {fmt_spread(b[f'{k}, no profiler'], 2)} | "
            f"{fmt_spread(b[f'{k}, resident, off'], 2)} | {fmt_spread(v, 2)} |"
            for k, v in a.items()
        ),
        "",
        f"stderr lines per toggled window: {result['stderr_lines_per_window']:.1f}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    args = parse_args(__doc__ or "")
    emit(measure(args.quick), args.json, render)
