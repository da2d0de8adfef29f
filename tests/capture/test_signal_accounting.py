"""A signal handler's exception landing inside profkit's own steps: it reaches the caller,
whatever kind of callable the handler is, and the sampled call is counted exactly once.

The storms (tests/test_serving.py, random SIGALRM timeouts) find these places by chance;
here each one is hit on purpose: the step calls the installed SIGALRM handler itself, as
Python does when a signal arrives between two of its bytecodes.
"""

from __future__ import annotations

import functools
import signal
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import pytest
import torch

import profkit
from profkit._capture import window as _window
from profkit._sampling import Triggered
from profkit._stats import Stats
from profkit.testing import CaptureExporter

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGALRM"), reason="needs SIGALRM")


class RequestTimeout(Exception):
    """What the application's SIGALRM handler raises."""


def _alarm(signum: int, frame: FrameType | None, why: str = "timed out") -> None:
    raise RequestTimeout(why)


class _Alarm:
    def __call__(self, signum: int, frame: FrameType | None) -> None:
        raise RequestTimeout("timed out")


class _Owner:
    def on_alarm(self, signum: int, frame: FrameType | None) -> None:
        raise RequestTimeout("timed out")


#: every kind of callable signal.signal() takes as a handler
HANDLERS: dict[str, Callable[[int, FrameType | None], Any]] = {
    "function": _alarm,
    "partial": functools.partial(_alarm, why="deadline"),
    "object": _Alarm(),
    "method": _Owner().on_alarm,
}


@pytest.fixture(params=sorted(HANDLERS))
def handler(request: pytest.FixtureRequest) -> Iterator[Callable[[int, FrameType | None], Any]]:
    """The application's SIGALRM handler, installed for the test and then put back."""
    before = signal.signal(signal.SIGALRM, HANDLERS[request.param])
    yield HANDLERS[request.param]
    signal.signal(signal.SIGALRM, before)


def _signal_arrives() -> None:
    """What Python does when SIGALRM arrives here: run the installed handler."""
    installed = signal.getsignal(signal.SIGALRM)
    assert callable(installed)
    installed(signal.SIGALRM, None)


@profkit.profiled("handler")
def predict() -> float:
    return float(torch.ones(4, 4).mm(torch.ones(4, 4)).sum())


def _configure(**settings: Any) -> CaptureExporter:
    cap = CaptureExporter()
    settings = settings if "sample_rate" in settings else {"sample_every": 1, **settings}
    profkit.configure(max_per_minute=None, exporters=(), extra_exporters=(cap,), **settings)
    return cap


def _outcomes(s: profkit.StatsSnapshot) -> int:
    return s["exported"] + s["dropped"] + s["skipped_busy"] + s["skipped_foreign"]


@pytest.mark.usefixtures("swallow_internal_errors", "handler")
@pytest.mark.parametrize("step", ["start", "stop"])
def test_a_timeout_inside_the_profilers_start_or_stop_reaches_the_caller(
    monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """The profiler's start and stop run inside profkit's guard: a handler's exception there
    is the application's (a partial or a callable object too), and the call is counted
    once, as dropped ("interrupted"); the profiler is not left on."""
    _configure()
    original = getattr(_window.Window, step)
    hit = []

    def interrupted(self: Any, *args: Any) -> None:
        original(self, *args)
        if not hit:
            hit.append(step)
            _signal_arrives()

    monkeypatch.setattr(_window.Window, step, interrupted)
    with pytest.raises(RequestTimeout):
        predict()
    profkit.force_flush(10)
    monkeypatch.undo()
    assert 64.0 == predict()  # and sampling goes on
    assert profkit.force_flush(10)
    s = profkit.stats()
    assert 0 == s["errors"], s["error_reasons"]  # not profkit's error: the application's
    assert (2, 1, {"interrupted": 1}) == (s["sampled"], s["exported"], s["dropped_reasons"])
    assert s["sampled"] == _outcomes(s)
    assert not torch.autograd.profiler._is_profiler_enabled


@pytest.mark.usefixtures("handler")
def test_a_timeout_right_after_the_verdict_counts_the_call_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """capture_slow: the exception lands right after a speculative call's verdict was
    counted; the retry that follows does not judge (nor count) it again."""
    cap = _configure(capture_slow=True, sample_every=10**9, max_overhead=1.0)
    for _ in range(60):  # a baseline of timed calls for the label
        predict()
    original = Stats.judge
    hit = []

    def judged(self: Stats, call: Any, policy: Any, name: str) -> None:
        original(self, call, policy, name)
        if not hit:
            hit.append(name)
            _signal_arrives()

    monkeypatch.setattr(Stats, "judge", judged)
    caught = 0
    for _ in range(300):
        try:
            predict()
        except RequestTimeout:
            caught += 1
    monkeypatch.undo()
    assert profkit.force_flush(10)
    s = profkit.stats()
    assert (1, 1) == (len(hit), caught)
    slow = sum(1 for c in cap.calls if c.policy == "slow")
    assert s["speculative"] == s["speculative_released"] + slow
    # (call 0: the 1-in-N sampler's; a slow call no window watched: a stage record)
    assert s["sampled"] == _outcomes(s) == slow + s["stage_records"] + 1


@pytest.mark.usefixtures("handler")
def test_a_timeout_inside_profkits_trigger_handler_is_the_applications(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A SIGALRM arriving while profkit's own trigger-signal handler runs: its exception is
    raised through profkit's handler to the application, not swallowed there."""
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        _configure(trigger_signal="SIGUSR1")
        monkeypatch.setattr(Triggered, "signalled", lambda self: _signal_arrives())
        installed = signal.getsignal(signal.SIGUSR1)
        assert callable(installed)
        with pytest.raises(RequestTimeout):
            installed(signal.SIGUSR1, None)
    finally:
        profkit.shutdown(5)
        signal.signal(signal.SIGUSR1, previous)


def _root_call(entry: str) -> None:
    if entry == "sync":
        predict()
        return
    with profkit.region("handler"):
        pass


@pytest.mark.usefixtures("handler")
@pytest.mark.parametrize("entry", ["sync", "region"])
def test_a_timeout_right_after_the_window_opened_does_not_hold_it_open(
    monkeypatch: pytest.MonkeyPatch, entry: str
) -> None:
    """The exception lands after the call joined its new window, before the scope got its
    record: the call is ended there (not left holding the window until max_window_s), and
    counted once."""
    from profkit._capture.keeper import WindowKeeper
    from profkit._capture.slot import SLOT

    _configure(max_window_s=600.0)
    original = WindowKeeper.open
    hit = []

    def opened(self: WindowKeeper, *args: Any, **kwargs: Any) -> Any:
        call = original(self, *args, **kwargs)
        if not hit:
            hit.append(call)
            _signal_arrives()
        return call

    monkeypatch.setattr(WindowKeeper, "open", opened)
    with pytest.raises(RequestTimeout):
        _root_call(entry)
    assert SLOT.held is None  # the window closed with its call
    monkeypatch.undo()
    assert 64.0 == predict()
    profkit.force_flush(10)
    s = profkit.stats()
    assert 2 == s["sampled"] == _outcomes(s), s
    assert not torch.autograd.profiler._is_profiler_enabled


def test_nothing_of_profkits_runs_python_code_when_it_dies() -> None:
    """A weakref callback runs in a garbage collection, on whichever thread triggered it:
    a request thread, where a timeout landing in it is printed and lost ("Exception ignored
    in: WeakMethod._cb": one in 15,000 timeouts of the storms, before 0.3). No weak
    reference to profkit's objects, nor to the providers it watches, has a callback."""
    import gc
    import weakref

    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider

    tracer_provider = TracerProvider()
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    theirs = {  # the SDK's own (a TracerProvider's at-exit WeakMethod): not profkit's
        id(ref) for obj in (tracer_provider, meter_provider) for ref in weakref.getweakrefs(obj)
    }
    profkit.configure(
        sample_every=1,
        exporters=("otel",),
        tracer_provider=tracer_provider,
        metrics=True,
        meter_provider=meter_provider,
    )
    predict()
    assert profkit.force_flush(10)
    session = profkit._global.get_session()
    assert session is not None
    watched = [session, session.pipeline, session.metrics, tracer_provider, meter_provider]
    watched.append(tracer_provider._active_span_processor)
    gc.collect()
    with_callbacks = [
        (type(obj).__name__, ref.__callback__)
        for obj in watched
        for ref in weakref.getweakrefs(obj)
        if ref.__callback__ is not None and id(ref) not in theirs
    ]
    assert [] == with_callbacks


def _enter_then_signal(module: Any, name: str, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """``module.name`` (a scope's entry) runs, then the SIGALRM handler, once."""
    original = getattr(module, name)
    hit: list[Any] = []

    def entered(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        if not hit:
            hit.append(result)
            _signal_arrives()
        return result

    monkeypatch.setattr(module, name, entered)
    return hit


@profkit.profiled("coroutine")
async def _coroutine() -> float:
    return predict.__wrapped__()  # type: ignore[attr-defined, no-any-return]


def _region_root() -> None:
    with profkit.region("handler"):
        pass


def _batch_root() -> None:
    with profkit.batch("batch", [profkit.batch_member()]):
        pass


def _coroutine_root() -> None:
    import asyncio

    asyncio.run(_coroutine())


ENTRIES: dict[str, tuple[str, str, Callable[[], None]]] = {
    "region": ("profkit._label.decorate", "enter", _region_root),
    "batch": ("profkit._label.batch", "_enter_root", _batch_root),
    "coroutine": ("profkit._label.drivers", "enter", _coroutine_root),
}


@pytest.mark.usefixtures("handler")
@pytest.mark.parametrize("entry", sorted(ENTRIES))
@pytest.mark.parametrize("sampled", [True, False])
def test_a_timeout_right_after_a_scope_was_entered_leaves_no_frame_behind(
    monkeypatch: pytest.MonkeyPatch, entry: str, sampled: bool
) -> None:
    """A context manager's or a coroutine's entry interrupted after the scope was entered,
    before the caller kept it: its exit never runs, so the entry undoes it. Before, the
    frame stayed "inside an unsampled call" for good, and no later call was a root call
    (no sample, ever, on that thread: found by a storm)."""
    import importlib

    from profkit._capture.slot import SLOT
    from profkit._label.scope import FRAME

    module, name, run = ENTRIES[entry]
    _configure(**({"sample_every": 1} if sampled else {"sample_rate": 0.0}))
    hit = _enter_then_signal(importlib.import_module(module), name, monkeypatch)
    with pytest.raises(RequestTimeout):
        run()
    assert 1 == len(hit)
    assert FRAME.get() is None
    assert SLOT.held is None
    monkeypatch.undo()
    before = profkit.stats()["root_calls"]
    assert 64.0 == predict()
    profkit.force_flush(10)
    s = profkit.stats()
    assert before + 1 == s["root_calls"]  # a root call again
    assert s["sampled"] == _outcomes(s), s
