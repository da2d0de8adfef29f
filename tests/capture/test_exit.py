"""Interpreter exit: no profiler that profkit started may be left running when Python exits.

torch tears a still-enabled profiler down during exit, after its callbacks are gone, and the
process dies with SIGSEGV (a thread-local profiler on the main thread, or an all-threads one
started anywhere). Each case runs in a fresh interpreter and must exit with status 0.
"""

from __future__ import annotations

import pytest
from fresh_interpreter import run_fresh

pytestmark = pytest.mark.timeout(180)


def test_idle_window_of_a_replaced_session_is_closed_and_exported() -> None:
    """configure() again with a window half full on this thread: it is exported, exit is clean."""
    rc, report, err = run_fresh("exit_replaced_session_window")
    assert 0 == rc, err[-2000:]
    assert [6.0, 6.0] == report["results"]
    assert report["flushed"]
    assert 2 == report["calls"]
    assert 2 == report["stats"]["exported"]
    assert 0 == report["stats"]["dropped"]
    assert report["flag"] is False


@pytest.mark.slow
def test_all_threads_window_closes_when_its_thread_ends() -> None:
    """An all-threads window still open when its thread ends is closed there and exported."""
    rc, report, err = run_fresh("exit_all_threads_window_thread_ends")
    assert 0 == rc, err[-2000:]
    assert report["flushed"]
    assert 2 == report["calls"]
    assert {} == report["stats"]["dropped_reasons"]
    assert report["flag"] is False


@pytest.mark.slow
def test_all_threads_window_stranded_by_an_exited_thread_is_stopped() -> None:
    """Where the thread-end hook did not run, the stranded all-threads profiler is stopped."""
    rc, report, err = run_fresh("exit_all_threads_window_stranded")
    assert 0 == rc, err[-2000:]
    assert {"owner_exited": 2} == report["stats"]["dropped_reasons"]
    assert report["flag"] is False


@pytest.mark.slow
def test_all_threads_window_idle_on_a_live_thread_at_exit() -> None:
    """A daemon thread holds an idle all-threads window when the interpreter exits."""
    rc, report, err = run_fresh("exit_all_threads_window_idle_daemon")
    assert 0 == rc, err[-2000:]
    assert 1 == report["stats"]["windows"]
    assert report["flag"] is True  # the window really was open when exit began


@pytest.mark.slow  # (10 s: a daemon thread's window in flight as the interpreter exits)
def test_window_in_flight_on_a_daemon_thread_at_exit() -> None:
    """Exit while a sampled call runs on a daemon thread (thread-local profiler): status 0."""
    rc, report, err = run_fresh("exit_window_in_flight_daemon")
    assert 0 == rc, err[-2000:]
    assert report["flag"] is True


@pytest.mark.slow
def test_thread_per_request_with_open_windows_exports_and_exits_cleanly() -> None:
    """Threads that end with a window still open (``window`` > 1): it closes on that thread."""
    rc, report, err = run_fresh("exit_thread_per_request_windows")
    assert 0 == rc, err[-2000:]
    assert report["flushed"]
    assert 12 == report["calls"]
    assert 6 == report["stats"]["windows"]
    assert 12 == report["stats"]["exported"]
    assert 0 == report["stats"]["dropped"]
    assert not any(t.startswith("Dummy") for t in report["threads"])
    assert "callback" not in err  # torch's "Requested callback is not found" / "Leaked ..."
