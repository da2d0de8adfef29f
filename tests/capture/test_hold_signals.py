"""``hold_signals()``: while torch's profiler starts or stops on the main thread, a signal's
handler waits, then runs, once per arrival, and the application's handlers come back.

Signals are raised with ``signal.raise_signal`` (to this thread, handled before it returns):
a signal raised inside a hold is noted there, deterministically. Found by a review of the
first cut: a second raising handler replaced the first and later signals were lost; asyncio
callbacks ran twice (a re-raise wrote the wakeup fd again); a fork during a hold left the
child's handlers dead; a hold left behind disarmed the next one.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from profkit import _compat
from profkit._capture.window import Window
from profkit._compat import hold_signals, profiler_enabled_here, profiler_flag
from profkit._config import Config

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGALRM"), reason="POSIX signals")


class Timeout(Exception):
    pass


@pytest.fixture
def handlers() -> Iterator[list[str]]:
    """SIGALRM and SIGUSR1 raise (``Timeout``), SIGUSR2 only notes; the old ones come back."""
    ran: list[str] = []
    saved = {s: signal.getsignal(s) for s in (signal.SIGALRM, signal.SIGUSR1, signal.SIGUSR2)}

    def raising(signum: int, frame: Any) -> None:
        ran.append(signal.Signals(signum).name)
        raise Timeout(signal.Signals(signum).name)

    def noting(signum: int, frame: Any) -> None:
        ran.append(signal.Signals(signum).name)

    signal.signal(signal.SIGALRM, raising)
    signal.signal(signal.SIGUSR1, raising)
    signal.signal(signal.SIGUSR2, noting)
    try:
        yield ran
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def _raise_held(reached: list[str], *signums: int) -> None:
    """Raise each signal inside a hold; note in ``reached`` what the block saw at its end."""
    with hold_signals():
        for signum in signums:
            signal.raise_signal(signum)
        reached.append(type(signal.getsignal(signums[0])).__name__)


def test_a_signal_in_a_hold_is_handled_as_the_hold_ends(handlers: list[str]) -> None:
    alarm = signal.getsignal(signal.SIGALRM)
    reached: list[str] = []
    with pytest.raises(Timeout, match="SIGALRM"):
        _raise_held(reached, signal.SIGALRM)
    assert ["_Hold"] == reached  # the block ran to its end, the note-taker installed
    assert ["SIGALRM"] == handlers
    assert signal.getsignal(signal.SIGALRM) is alarm  # the application's handler is back
    assert not _compat._holds


def test_every_noted_signal_runs_and_the_first_exception_propagates(
    handlers: list[str],
) -> None:
    reached: list[str] = []
    sigs = (signal.SIGALRM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGUSR2)
    with pytest.raises(Timeout, match="SIGALRM") as raised:
        _raise_held(reached, *sigs)
    assert ["_Hold"] == reached
    assert ["SIGALRM", "SIGUSR1", "SIGUSR2", "SIGUSR2"] == handlers  # in order, each arrival
    if sys.version_info >= (3, 11):
        assert any("SIGUSR1" in note for note in raised.value.__notes__)


def test_nested_holds_deliver_at_the_outer_end(handlers: list[str]) -> None:
    with hold_signals():
        with hold_signals():
            signal.raise_signal(signal.SIGUSR2)
        assert handlers == []
    assert ["SIGUSR2"] == handlers


def test_another_thread_holds_nothing(handlers: list[str]) -> None:
    seen: list[object] = []

    def run() -> None:
        with hold_signals():
            seen.append(signal.getsignal(signal.SIGUSR2))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert [signal.getsignal(signal.SIGUSR2)] == seen


def test_a_hold_left_behind_is_taken_for_the_applications_handler(
    handlers: list[str],
) -> None:
    """A restore cut short by a fresh exception leaves a spent hold installed: it heals at
    its next signal, and the next hold holds that signal as its own."""
    alarm = signal.getsignal(signal.SIGALRM)
    spent = _compat._Hold()
    spent.handlers[signal.SIGALRM] = alarm
    spent.over = True
    signal.signal(signal.SIGALRM, spent)
    reached: list[str] = []
    with pytest.raises(Timeout):
        _raise_held(reached, signal.SIGALRM)
    assert ["_Hold"] == reached  # held as its own: raised at the end, not inside
    assert signal.getsignal(signal.SIGALRM) is alarm


def test_a_handlers_own_exception_during_the_swap_reaches_the_caller() -> None:
    """A ValueError a handler raises while the hold swaps handlers is the application's."""
    saved = signal.getsignal(signal.SIGUSR1)

    def bad(signum: int, frame: Any) -> None:
        raise ValueError("the application's")

    signal.signal(signal.SIGUSR1, bad)
    try:
        real = _compat._signal

        class Pending:  # a SIGUSR1 due as the hold swaps: signal() runs it first
            getsignal = staticmethod(real.getsignal)

            @staticmethod
            def signal(signum: int, handler: Any) -> Any:
                if signum == signal.SIGUSR1 and isinstance(handler, _compat._Hold):
                    bad(signum, None)
                return real.signal(signum, handler)

        _compat._signal = Pending()
        reached: list[str] = []
        try:
            with pytest.raises(ValueError, match="the application's"):
                _raise_held(reached, signal.SIGUSR2)
        finally:
            _compat._signal = real
        assert [] == reached  # the block never ran
        assert signal.getsignal(signal.SIGUSR1) is bad
    finally:
        signal.signal(signal.SIGUSR1, saved)


def test_an_asyncio_signal_callback_runs_once() -> None:
    """asyncio's handlers work through the wakeup fd: handing a signal over calls the
    handler (a no-op), it does not raise the signal again (a second fd write)."""

    async def main() -> int:
        loop = asyncio.get_running_loop()
        calls: list[int] = []
        loop.add_signal_handler(signal.SIGUSR2, calls.append, 1)
        try:
            with hold_signals():
                signal.raise_signal(signal.SIGUSR2)
            for _ in range(20):
                await asyncio.sleep(0.01)
        finally:
            loop.remove_signal_handler(signal.SIGUSR2)
        return len(calls)

    assert 1 == asyncio.run(main())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_fork_during_a_hold_gives_the_child_its_handlers(handlers: list[str]) -> None:
    ready, forked = threading.Event(), threading.Event()
    pid: list[int] = []

    def fork() -> None:
        ready.wait(5)
        child = os.fork()
        if child == 0:  # the child: is SIGUSR2's handler the application's, and does it run?
            ok = getattr(signal.getsignal(signal.SIGUSR2), "__name__", "") == "noting"
            signal.raise_signal(signal.SIGUSR2)
            os._exit(0 if ok and handlers == ["SIGUSR2"] else 3)
        pid.append(child)
        forked.set()

    thread = threading.Thread(target=fork)
    thread.start()
    with hold_signals():
        ready.set()
        assert forked.wait(10)
    thread.join()
    _, status = os.waitpid(pid[0], 0)
    assert 0 == os.waitstatus_to_exitcode(status)


def test_a_signal_in_torchs_start_is_raised_after_it_with_the_profiler_off(
    handlers: list[str], capfd: pytest.CaptureFixture[str]
) -> None:
    """The timeout lands inside torch's start (its Python code, between preparation and
    start); it is raised once the start is complete, and the window's cleanup stops the
    profiler it finds fully on: nothing half started, nothing left on."""
    from profkit._capture.profiler import KINETO_BASE as profile  # torch's start, as called

    cfg = Config()
    win = Window(1, cfg)
    original = profile.start

    def start(self: Any) -> None:
        self.prepare_trace()
        signal.raise_signal(signal.SIGALRM)  # where the storms' timeouts crashed kineto
        self.start_trace()

    profile.start = start  # type: ignore[method-assign]
    try:
        with pytest.raises(Timeout):
            win.start()
    finally:
        profile.start = original  # type: ignore[method-assign]
    assert ["SIGALRM"] == handlers
    assert win.prof is None
    assert not profiler_enabled_here()
    assert not profiler_flag()
    # the next window starts, records and stops cleanly (no prepared session left behind)
    import torch

    after = Window(2, cfg)
    after.start()
    torch.ones(4).add_(1)
    after.stop()
    assert after.read().raw_count > 0
    after.release()
    assert "no active profiling session" not in capfd.readouterr().err
