"""A signal handler that calls into profkit on the thread it interrupts, landing inside
profkit's own critical sections: no deadlock, no second profiler beside the window being
closed, the user's results untouched, every sampled call counted
(``tests/scripts/signal_handler_reentry.py`` pins where the handler runs)."""

from __future__ import annotations

import pytest

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
