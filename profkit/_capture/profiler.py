"""Building torch profilers the way profkit starts them, and what recording costs.

Kept apart from :mod:`profkit._capture.window` (which drives a profiler through one capture): the
settings-to-``torch.profiler.profile`` mapping, the thread-local flag by which profkit's own
starts pass its foreign-profiler hook, and the once-per-process measurement of what the
profiler adds per recorded op (the overhead budget charges it per event).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from .._compat import hold_signals
from .._config import Config

#: the class whose ``start``/``stop`` profkit calls: the base class of
#: ``torch.profiler.profile`` (its start and stop are the same two calls in torch 2.3-2.13),
#: or None (then the profile's own); tests patch it to fault torch's start and stop
KINETO_BASE: Any = getattr(torch.profiler.profiler, "_KinetoProfile", None)

__all__ = [
    "cpu_only",
    "make_profiler",
    "measure_recording",
    "not_ours",
    "ours",
    "ours_starting",
    "recording",
    "resolve_activities",
    "start_profile",
    "stop_profile",
    "toggle",
]

#: one-event ops timed with and without the profiler to measure recording (a few ms in all)
_CAL_OPS = 500

#: set on a thread while profkit itself starts a profiler (so its hook lets it through)
_starting = threading.local()


def ours_starting() -> bool:
    """Whether profkit itself is starting a profiler on this thread."""
    return bool(getattr(_starting, "on", False))


@contextlib.contextmanager
def ours() -> Iterator[None]:
    """profkit starts a profiler on this thread: its own hook must not wait for itself."""
    _starting.on = True
    try:
        yield
    finally:
        _starting.on = False


def not_ours() -> None:
    """Clear the flag of :func:`ours` (after an exception that may have skipped its reset)."""
    _starting.on = False


def resolve_activities(spec: str) -> list[ProfilerActivity]:
    """Map the ``activities`` setting to torch's list ("auto": CPU, plus CUDA when present)."""
    if spec == "cpu":
        return [ProfilerActivity.CPU]
    if spec == "cuda":
        return [ProfilerActivity.CUDA]
    if spec == "cpu,cuda":
        return [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    acts = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(ProfilerActivity.CUDA)
    return acts


@functools.lru_cache(maxsize=8)
def cpu_only(spec: str) -> bool:
    """Whether the ``activities`` setting records the CPU only (no device events to expect)."""
    return resolve_activities(spec) == [ProfilerActivity.CPU]


def start_profile(prof: profile) -> None:
    """``prof.start()`` without the schedule step of ``torch.profiler.profile``.

    profkit's profiles have no schedule (torch's default records at once), no
    ``on_trace_ready`` and no step records, so torch's ``start()`` walks its action table
    from "none" to "record" only to call its base class's ``prepare_trace()`` and
    ``start_trace()``, and ``stop()`` back to call ``stop_trace()``: the walk hashes enum
    members in Python, about 50 µs a window on the request thread (torch 2.13, 2-core
    machine). Called here directly: the same preparation (through profkit's hook), the same
    kineto calls, the same trace metadata.
    """
    if KINETO_BASE is None:  # pragma: no cover
        prof.start()
    else:
        KINETO_BASE.start(prof)


def stop_profile(prof: profile) -> None:
    """``prof.stop()`` without the schedule step: see :func:`start_profile`."""
    if KINETO_BASE is None:  # pragma: no cover
        prof.stop()
    else:
        KINETO_BASE.stop(prof)


#: the activities a resident session toggles (it is kept for CPU-only profiles)
_CPU = (ProfilerActivity.CPU,)


def toggle(prof: profile, on: bool) -> None:
    """Turn a running profile's CPU collection on or off on this thread (torch 2.13:
    ``toggle_collection_dynamic``, µs; it logs one C++ warning on stderr each time, and only
    the thread that started a thread-local profile can toggle it)."""
    prof.toggle_collection_dynamic(on, _CPU)


def make_profiler(config: Config) -> profile:
    """A configured, not yet started ``torch.profiler.profile``."""
    experimental = None
    if config.all_threads:
        from torch._C._profiler import _ExperimentalConfig

        experimental = _ExperimentalConfig(profile_all_threads=True)
    return profile(
        activities=resolve_activities(config.activities),
        record_shapes=config.record_shapes,
        profile_memory=config.profile_memory,
        with_stack=config.with_stack,
        with_flops=config.with_flops,
        experimental_config=experimental,
    )


@contextlib.contextmanager
def recording(prof: profile) -> Iterator[None]:
    """``prof`` started by profkit, the block run under it, then stopped: with signals held
    throughout (a few ms; the process's first start, about a second), since a signal's
    exception raised between the start and the stop would leave the profiler on."""
    with hold_signals():
        with ours():
            start_profile(prof)
        try:
            yield
        finally:
            stop_profile(prof)


def measure_recording(config: Config) -> float:
    """CPU seconds the profiler adds per recorded op on this thread (a profile never parsed:
    parsed events sit in reference cycles that the first sampled call's GC would pay for)."""
    bare = _ops_cpu()
    prof = make_profiler(config)
    with recording(prof):
        recorded = _ops_cpu()
    prof.profiler = None  # its kineto results freed now, by reference counting
    return max(0.0, recorded - bare) / _CAL_OPS


def _ops_cpu() -> float:
    """This thread's CPU seconds for ``_CAL_OPS`` one-event ops (the least of 4 runs)."""
    x, one = torch.zeros(1), torch.ones(1)  # a tensor operand: add_ records one event
    best = float("inf")
    for _ in range(4):  # the first run warms the dispatcher up
        t0 = time.thread_time()
        for _ in range(_CAL_OPS):
            x.add_(one)
        best = min(best, time.thread_time() - t0)
    return best
