"""The resident session (``resident=True``, issue 37): on an event loop's thread the profiler
stays on between speculative windows with its collection off; every guarantee of windows
still holds with it on (the crash-prone ones in fresh interpreters)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import torch
from fresh_interpreter import run_fresh

import profkit
from profkit._capture import resident as _resident
from profkit._capture import window as _window
from profkit._capture.slot import SLOT
from profkit.testing import capture

SLOW_FORWARDS = 20
SETTINGS: dict[str, Any] = {
    "sample_every": 10**9,
    "capture_slow": True,
    "slow_ms": 15.0,
    "max_per_minute": None,
    "max_overhead": 1.0,  # every speculative window opens (none refused by the budget)
    "exporters": (),
}

_model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
_x = torch.randn(8, 16)


@profkit.profiled("predict")
async def predict(slow: bool) -> int:
    """~0.1 ms; a slow call runs 20 forwards and waits 30 ms (over ``slow_ms``)."""
    with profkit.region("forward", slow=slow), torch.no_grad():
        for _ in range(SLOW_FORWARDS if slow else 1):
            _model(_x)
    if slow:
        time.sleep(0.03)
    await asyncio.sleep(0)
    return 1


async def _serve(calls: int, slow_every: int = 25) -> int:
    return sum([await predict(i % slow_every == slow_every - 1) for i in range(calls)])


@pytest.fixture
def starts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts torch profiler starts made by profkit's windows."""
    seen: list[int] = []
    real = _window.start_profile

    def counting(prof: Any) -> None:
        seen.append(1)
        real(prof)

    monkeypatch.setattr(_window, "start_profile", counting)
    return seen


def _profiler_on() -> bool:
    return bool(torch.autograd.profiler._is_profiler_enabled) or bool(
        torch._C._autograd._profiler_enabled()
    )


@pytest.mark.parametrize("resident", [False, True])
def test_speculative_windows_on_a_loop_share_one_session(resident: bool, starts: list[int]) -> None:
    """With it on, a loop's speculative windows toggle one session: few profiler starts."""
    with capture(resident=resident, **SETTINGS):
        assert 200 == asyncio.run(_serve(200))
        windows = profkit.stats()["windows"]
    assert windows >= 150
    assert (len(starts) <= windows // 10) == resident


def test_a_slow_call_on_a_resident_session_has_only_its_own_ops() -> None:
    """An exported call holds its own ops, none of the released windows' before it."""
    with capture(resident=True, **SETTINGS) as cap:
        asyncio.run(_serve(200))
    profiled = [c for c in cap.calls if c.policy != "slow_stages"]  # (stage records: no ops)
    assert profiled
    for call in profiled:
        forwards = SLOW_FORWARDS if call.scopes[1].attributes["slow"] else 1
        rows = {r.name: r.count for s in call.scopes for r in s.ops}
        assert 2 * forwards == rows["aten::addmm"]


def test_the_counters_add_up_with_it_on() -> None:
    """Every root call is counted once; every speculative one is released or exported."""
    with capture(resident=True, **SETTINGS) as cap:
        asyncio.run(_serve(200))
        assert profkit.force_flush(30)
        stats = profkit.stats()
    assert 200 == stats["root_calls"]
    assert stats["exported"] == len(cap.calls) == stats["sampled"]
    assert 0 == stats["errors"]


def test_a_resident_session_closes_after_its_idle_timeout() -> None:
    """A loop that goes on without windows: no profiler is on after the idle timeout."""

    async def main() -> tuple[bool, bool]:
        await _serve(60)
        kept = SLOT.resident is not None
        await asyncio.sleep(_resident.IDLE_S + 0.5)  # the loop runs, no profkit call comes
        return kept, _profiler_on()

    with capture(resident=True, **SETTINGS):
        assert (True, False) == asyncio.run(main())
    assert SLOT.resident is None


def test_a_resident_session_closes_with_its_loop() -> None:
    """``asyncio.run`` returned: the session went with its loop, the slot is free."""
    with capture(resident=True, **SETTINGS):
        asyncio.run(_serve(60))
        assert (None, False, False) == (SLOT.resident, SLOT.claimed, _profiler_on())


def test_a_pool_thread_never_keeps_one() -> None:
    """Plain calls on threads with no loop: windows start and stop as without it."""

    @profkit.profiled("sync")
    def handler() -> None:
        _model(_x)

    seen: list[bool] = []

    def work() -> None:
        for _ in range(50):
            handler()
            seen.append(SLOT.resident is not None or torch._C._autograd._profiler_enabled())

    with capture(resident=True, **SETTINGS):
        threads = [threading.Thread(target=work) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        windows = profkit.stats()["windows"]
    assert windows > 0
    assert not any(seen)


def test_your_profiler_on_the_loop_thread_starts_after_it_steps_aside() -> None:
    """Your profiler inside a coroutine, with the session resident: it records your ops."""

    async def main() -> tuple[bool, int]:
        await _serve(60)
        kept = SLOT.resident is not None
        with torch.profiler.profile() as prof:
            torch.mm(torch.ones(3, 3), torch.ones(3, 3))
        await _serve(30)
        return kept, sum(e.name == "aten::mm" for e in prof.events())

    with capture(resident=True, **SETTINGS):
        assert (True, 1) == asyncio.run(main())
        assert 0 == profkit.stats()["errors"]


def test_your_profiler_on_another_thread_waits_for_the_loop_to_close_it() -> None:
    """A loop on its own thread keeps a session; your profiler elsewhere starts once the
    loop closed it (never both at once), and records your ops."""
    loop = asyncio.new_event_loop()
    ready, done = threading.Event(), threading.Event()

    async def serve() -> None:
        await _serve(60)
        ready.set()
        while not done.is_set():
            await asyncio.sleep(0.01)

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),))
    with capture(resident=True, **SETTINGS):
        thread.start()
        assert ready.wait(60)
        kept = SLOT.resident is not None
        with torch.profiler.profile() as prof:
            torch.mm(torch.ones(3, 3), torch.ones(3, 3))
        done.set()
        thread.join(30)
    loop.close()
    assert (True, 1) == (kept, sum(e.name == "aten::mm" for e in prof.events()))


def test_another_threads_sample_asks_the_loop_to_step_aside() -> None:
    """A call sampled on another thread while a loop keeps a session: skipped, and the loop
    is asked; a later one there is profiled."""
    loop = asyncio.new_event_loop()
    ready, done = threading.Event(), threading.Event()

    async def serve() -> None:
        await _serve(60)
        ready.set()
        while not done.is_set():
            await asyncio.sleep(0.01)

    @profkit.profiled("elsewhere")
    def elsewhere() -> None:
        torch.mm(torch.ones(3, 3), torch.ones(3, 3))

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),))
    with capture(resident=True, **SETTINGS) as cap:
        thread.start()
        assert ready.wait(60)
        profkit.trigger(1, label="elsewhere")
        deadline = time.monotonic() + 30
        while not [c for c in cap.calls if c.label == "elsewhere"]:
            assert time.monotonic() < deadline
            elsewhere()
            profkit.force_flush(10)
            time.sleep(0.02)
        done.set()
        thread.join(30)
    loop.close()
    assert 1 == len([c for c in cap.calls if c.label == "elsewhere"])


def test_max_window_s_cuts_a_window_on_a_resident_session() -> None:
    """A call recording past ``max_window_s`` on a resident session is cut short."""

    async def main() -> None:
        await _serve(60)
        assert SLOT.resident is not None
        await predict_long()

    @profkit.profiled("long")
    async def predict_long() -> None:
        for _ in range(30):
            _model(_x)
            await asyncio.sleep(0.01)

    settings = {**SETTINGS, "slow_ms": 100.0, "max_window_s": 0.05}
    with capture(resident=True, **settings):
        asyncio.run(main())
        stats = profkit.stats()
    assert 0 == stats["errors"]
    assert SLOT.resident is None


@pytest.mark.parametrize(
    "case",
    [
        "fork_loop_thread",
        "fork_other_thread",
        "exit_open_loop",
        "thread_ends",
        "compiled",
        "signal_storm",
    ],
)
@pytest.mark.slow
def test_in_a_fresh_interpreter(case: str) -> None:
    """Fork (from the loop's thread, from another), exit with the loop still open, the
    loop's thread ending, a compiled model, SIGALRM timeouts in the handlers' bodies: exit 0
    and the script's checks hold (every timeout caught, the counters, no profiler left)."""
    rc, report, err = run_fresh("resident_cases", case, timeout=240)
    assert (0, True) == (rc, report.get("ok")), (report, err[-2000:])
