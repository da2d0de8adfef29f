"""A signal handler that calls into profkit on the thread it interrupts, landing inside
profkit's own critical sections: no deadlock, no second profiler beside the window being
closed, the user's results untouched, every sampled call counted
(``tests/scripts/signal_handler_reentry.py`` pins where the handler runs)."""

from __future__ import annotations

import signal
import sys
import time

import pytest
import torch

import profkit
from profkit.testing import capture
from tests.fresh_interpreter import run_fresh


@pytest.mark.timeout(120)
def test_a_handler_opening_a_window_as_a_close_frees_the_slot_keeps_its_claim() -> None:
    """``window=2``: the handler's call lands as the full window's close frees the slot,
    opens a window of its own and leaves it waiting; the close's last step must not free
    that window's claim (another thread could then start a second profiler beside it)."""
    rc, report, err = run_fresh("signal_handler_reentry", "vacate", "call", "2", timeout=60.0)
    assert rc == 0, err[-3000:]
    assert report["consistent"] is True
    assert report["handled"] == 6
    assert report["sampled"] == report["settled"]
    assert report["flushed"] is True


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("where", "what", "handled"),
    [
        ("offer", "call", 6),  # a decorated function, while the window is queued (two locks)
        ("offer", "flush", False),  # force_flush: that window cannot be counted in 0.5 s
        ("close_window", "call", 6),  # a decorated function while the window is closing
        ("snapshot", "stats", 1),  # stats() while stats() reads the counters under their lock
    ],
)
@pytest.mark.slow
def test_a_handler_calling_profkit_inside_its_critical_sections(
    where: str, what: str, handled: object
) -> None:
    rc, report, err = run_fresh("signal_handler_reentry", where, what, timeout=60.0)
    assert rc == 0, err[-3000:]
    assert handled == report["handled"]
    assert report["after"] == 6.0
    assert report["outer"] == (1 if where == "snapshot" else 6.0)
    assert report["flushed"] is True
    assert report["sampled"] == report["settled"]
    # the handler's call, if any, ran unprofiled beside the window of the call it interrupted
    # (the slot still held by it): counted busy, never a second profiler seen as foreign
    assert report["foreign"] == 0
    assert report["busy"] == (1 if what == "call" else 0)


@pytest.mark.timeout(120)
def test_a_handler_call_during_a_windows_stop_joins_nothing() -> None:
    """A signal arriving during torch's stop is handed to its handler right after it, still
    inside the window's close: the handler's decorated call must not join the stopped window
    (it would be exported with no ops, as if recorded)."""

    @profkit.profiled("handler")
    def handler(slow: bool = False) -> float:
        if slow:
            time.sleep(0.05)
        return float(torch.ones(8, 8).mm(torch.ones(8, 8)).sum())

    seen: dict[str, float] = {}

    def on_usr1(signum: int, frame: object) -> None:
        seen["handler"] = handler(slow=True)

    def at_stop(frame: object, event: str, arg: object) -> None:
        if event == "c_call" and getattr(arg, "__name__", "") == "_disable_profiler":
            sys.setprofile(None)
            signal.raise_signal(signal.SIGUSR1)  # a real signal, arriving during the stop

    previous = signal.signal(signal.SIGUSR1, on_usr1)
    try:  # capture_slow: each call runs in a speculative window, closed as the call ends
        with capture(sample_every=10**9, capture_slow=True, cold_calls=0) as cap:
            for _ in range(200):  # the label's unprofiled baseline
                assert 64.0 * 8 == handler()
            assert profkit.force_flush(10.0)
            sys.setprofile(at_stop)
            assert 64.0 * 8 == handler()
            sys.setprofile(None)
            assert profkit.force_flush(10.0)
    finally:
        sys.setprofile(None)
        signal.signal(signal.SIGUSR1, previous)
    assert 64.0 * 8 == seen["handler"]
    stats = cap.stats
    assert stats["sampled"] == stats["exported"] + stats["skipped_busy"] + stats["dropped"]
    # none exported as if recorded (the slow handler call is a stage record: none watched it)
    assert [] == [c for c in cap.calls if not c.root.ops and c.policy != "slow_stages"]


def test_a_handlers_configure_landing_while_the_profiler_primes_does_not_hang() -> None:
    """A SIGHUP-style handler calls configure() (new profiler settings) while the main
    thread primes the profiler in its first configure(): no wait on the priming lock its
    own thread holds (the process hung for ever); the session left in place samples."""
    rc, report, err = run_fresh("signal_configure_during_prime")
    assert 0 == rc, err[-3000:]
    assert {"reloaded": [True], "result": 6.0, "sampled": 1} == report
