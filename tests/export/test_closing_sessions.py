"""A session taken out of the global slot (shut down on another thread, replaced by a new
``configure()``, or its shutdown cut short by a signal's exception) is still answered for:
``force_flush()`` and ``shutdown()`` wait for its shutdown (within their own timeout) and
say False when it could not export everything, instead of True at once with nothing out."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest
from _fork import exit_code

import profkit
from profkit import WindowSummary
from profkit._global import get_session


@profkit.profiled("closing_work")
def work() -> int:
    return 1


class Slow:
    """An exporter that takes ``delay`` s a window (a slow collector, never hung)."""

    name = "slow"

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.windows = 0

    def export(self, summary: WindowSummary) -> None:
        time.sleep(self.delay)
        self.windows += 1


def _configure(sink: Slow) -> None:
    profkit.configure(
        sample_every=1, cold_calls=0, max_per_minute=None, exporters=(), extra_exporters=(sink,)
    )


@pytest.mark.timeout(60)
def test_a_shutdown_racing_another_waits_for_it_and_gives_its_answer() -> None:
    """Thread A shuts down with 1 s for ~1.6 s of exports; B's shutdown on another thread
    meanwhile waits for A's and says False as it does (it said True at once, mid-export);
    C's flush after that has nothing new to answer for."""
    sink = Slow(0.4)
    _configure(sink)
    session = get_session()
    assert session is not None
    for _ in range(4):
        assert work() == 1
    answers: dict[str, bool] = {}
    first = threading.Thread(target=lambda: answers.setdefault("A", profkit.shutdown(1.0)))
    first.start()
    while get_session() is not None:  # A has taken the session out
        time.sleep(0.005)
    answers["B"] = profkit.shutdown(10.0)
    answers["C"] = profkit.force_flush(10.0)
    first.join()
    assert answers == {"A": False, "B": False, "C": True}
    stats = session.stats.snapshot()
    assert stats["sampled"] == stats["exported"] + stats["dropped"] == 4
    assert stats["dropped"] > 0
    assert profkit.force_flush(1.0)  # answered once: nothing new since


@pytest.mark.timeout(60)
def test_a_replaced_sessions_losses_make_the_next_flush_false() -> None:
    """``configure()`` again while the first session's windows are still exporting: the
    next ``force_flush()`` waits for its shutdown (it said True at once, 0 of 8 out)."""
    slow = Slow(0.3)
    _configure(slow)
    old = get_session()
    assert old is not None
    for _ in range(8):
        assert work() == 1
    _configure(Slow(0.0))
    started = time.monotonic()
    assert profkit.force_flush(30.0) is (old.stats.snapshot()["dropped"] == 0)
    assert time.monotonic() - started < 20.0
    stats = old.stats.snapshot()
    assert stats["sampled"] == stats["exported"] + stats["dropped"] == 8
    assert slow.windows == stats["exported"]
    assert profkit.force_flush(1.0)  # answered once: nothing new since


@pytest.mark.timeout(60)
def test_a_replaced_session_that_cannot_finish_in_time_says_false() -> None:
    """The same with more export work than the flush's timeout: False, within the timeout."""
    _configure(Slow(0.5))
    for _ in range(8):
        assert work() == 1
    _configure(Slow(0.0))
    started = time.monotonic()
    assert profkit.force_flush(0.5) is False
    assert time.monotonic() - started < 5.0


@pytest.mark.timeout(60)
@pytest.mark.skipif(sys.platform == "win32", reason="needs SIGALRM")
def test_a_shutdown_cut_short_by_a_signal_is_run_again_by_the_next() -> None:
    """A request timeout's signal interrupts ``shutdown()``: the retry shuts the session
    down (it said True at once, and the 6 queued windows were never exported nor counted)."""
    sink = Slow(0.2)
    _configure(sink)
    session = get_session()
    assert session is not None
    for _ in range(6):
        assert work() == 1

    class Timeout(Exception):
        pass

    def on_alarm(signum: int, frame: object) -> None:
        raise Timeout

    previous = signal.signal(signal.SIGALRM, on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with pytest.raises(Timeout):
            profkit.shutdown(10.0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert profkit.shutdown(30.0)
    stats = session.stats.snapshot()
    assert stats["sampled"] == stats["exported"] == sink.windows == 6


def _fork_holding(hold: Callable[[], AbstractContextManager[Any]], child: Callable[[], int]) -> int:
    """Fork while another thread is inside ``hold()`` (profkit's locks held); the child runs
    ``child()`` (its exit status) and the parent returns that status, or raises if it hung."""
    held, release = threading.Event(), threading.Event()

    def holding() -> None:
        with hold():
            held.set()
            release.wait(10)

    other = threading.Thread(target=holding)
    other.start()
    assert held.wait(10)
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            code = child()
        finally:
            os._exit(code)
    release.set()
    other.join()
    return exit_code(pid, hung="the child hung on a lock held at fork")


@pytest.mark.timeout(60)
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_fork_while_another_thread_configures_leaves_the_child_working() -> None:
    """Another thread is inside ``configure()`` (its locks held) at fork: in the child,
    ``configure()`` and ``shutdown()`` still work (they waited for ever on the copied locks)."""
    from profkit import _global

    @contextlib.contextmanager
    def configuring() -> Iterator[None]:
        with _global._lifecycle, _global._configure_lock:
            yield

    def child() -> int:
        _configure(Slow(0.0))
        return 0 if profkit.shutdown(5.0) else 2

    _configure(Slow(0.0))
    assert _fork_holding(configuring, child) == 0


@pytest.mark.timeout(120)
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_fork_while_another_thread_primes_the_profiler_leaves_the_child_working() -> None:
    """Another thread is priming the profiler (the longest step of a process's first
    ``configure()``, about a second; its lock held) at fork: in the child, ``configure()``
    still samples, exports and shuts down (it waited for ever on the copied lock)."""
    from profkit._capture import window

    def child() -> int:
        sink = Slow(0.0)
        _configure(sink)
        work()
        return 0 if (profkit.shutdown(5.0), sink.windows) == (True, 1) else 2

    _configure(Slow(0.0))
    assert _fork_holding(lambda: window._prime_lock, child) == 0


@pytest.mark.timeout(60)
def test_a_short_flush_after_configure_does_not_cut_the_replaced_sessions_export_short(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A health check's ``force_flush(0.01)`` right after a ``configure()``, before the retire
    thread has begun: it only waits for the replaced session's shutdown (the retire thread's,
    5 s), never runs it with its own 10 ms (which would drop the windows still queued)."""
    from profkit import _global

    begin = threading.Event()
    retire = _global._retire

    def held_back(old: object) -> None:
        begin.wait(10)
        retire(old)  # type: ignore[arg-type]

    monkeypatch.setattr(_global, "_retire", held_back)
    slow = Slow(0.2)
    _configure(slow)
    old = get_session()
    assert old is not None
    for _ in range(4):
        assert work() == 1
    _configure(Slow(0.0))
    assert profkit.force_flush(0.01) is False  # not all out yet: said so, nothing cut short
    begin.set()
    assert profkit.force_flush(30.0) is True  # the retire thread's shutdown exported them all
    stats = old.stats.snapshot()
    assert (stats["sampled"], stats["exported"], stats["dropped"]) == (4, 4, 0)
    assert slow.windows == 4


@pytest.mark.timeout(60)
def test_a_replaced_sessions_losses_are_logged_where_stats_does_not_show_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``stats()`` reports the current session; the False answer for a replaced one's losses
    comes with a warning that says what it dropped and why."""

    class Broken:
        name = "broken"

        def export(self, summary: WindowSummary) -> None:
            raise ConnectionError("down")

    profkit.configure(sample_every=1, cold_calls=0, exporters=(), extra_exporters=(Broken(),))
    for _ in range(3):
        assert work() == 1
    _configure(Slow(0.0))
    with caplog.at_level("WARNING", logger="profkit"):
        assert profkit.force_flush(30.0) is False
    assert "a replaced session could not export every sampled call" in caplog.text
    assert "'export_error:broken': 3" in caplog.text
    assert profkit.stats()["dropped"] == 0  # (the current session's)


@pytest.mark.timeout(30)
def test_calls_nested_on_a_thread_inside_the_lifecycle_do_not_wait_on_themselves() -> None:
    """A signal handler's ``force_flush()``/``shutdown()`` landing while its thread holds the
    configure lock, or a session's shutdown lock before it noted itself there: each returns
    (they waited for ever on a lock their own thread held)."""
    from profkit import _global

    _configure(Slow(0.0))
    assert work() == 1
    with _global._configure_lock:  # (as inside _answered or _swap when the signal lands)
        assert profkit.force_flush(None) is True
    session = get_session()
    assert session is not None
    with session._shut._lock:  # (as between its acquire and the owner noted)
        assert profkit.shutdown(None) is True
    assert session.shut_down
    from profkit._capture import hooks

    with hooks._lock:  # (as inside configure()'s or shutdown()'s hook bookkeeping)
        _configure(Slow(0.0))
        assert profkit.shutdown(5.0) is True
