"""trigger_signal: a signal makes the process profile its next root call.

A signal handler is process-wide, so the end-to-end tests run in a fresh interpreter
(tests/fresh_interpreter.py); the settings' checks and the lock-free counter run here.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from fresh_interpreter import run_fresh

import profkit
from profkit import ProfkitConfigWarning
from profkit._config import build_config
from profkit._sampling import MAX_PENDING, Triggered

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="needs SIGUSR1")


def _fresh(script: str) -> dict[str, object]:
    """Run ``tests/scripts/<script>.py`` (helpers: ``_trigger_helpers.py`` there); its report."""
    code, report, stderr = run_fresh(script)
    assert (0, True) == (code, bool(report)), stderr[-3000:]
    return report


@pytest.fixture
def usr1_default() -> Iterator[None]:
    """In-process tests leave SIGUSR1 as they found it."""
    before = signal.getsignal(signal.SIGUSR1)
    yield
    profkit.shutdown(2.0)
    signal.signal(signal.SIGUSR1, before)


def test_signal_profiles_the_next_root_call_only() -> None:
    """A signal from the process itself or from `kill -USR1 <pid>` profiles one call each."""
    report = _fresh("signal_next_root_call")
    assert ["every:1000000000", "trigger", "trigger"] == report["policies"]
    assert 6 == report["roots"]
    assert "SIG_DFL" != report["installed"]
    assert "SIG_DFL" == report["after"]


def test_a_previous_handler_is_chained_then_restored() -> None:
    """The application's own handler still runs (once, also after a re-configure), and its
    exception is the application's; shutdown puts it back."""
    report = _fresh("signal_previous_handler_chained")
    expected = ["every:1000000000", "trigger"] * 2 + ["trigger"]  # two sessions: any order
    assert sorted(expected) == sorted(report["policies"])
    assert 3 == report["seen"]
    assert "the application's own" == report["raised"]
    assert "mine" == report["after"]
    assert 0 == report["errors"]


def test_reconfigure_switches_and_restores_signals() -> None:
    """trigger_signal=None restores the previous handler; another signal moves the handler."""
    report = _fresh("signal_reconfigure_switches")
    default = "SIG_DFL"
    assert default != report["one"]
    assert [default, report["one"]] == report["two"]
    assert [default, default] == report["off"]
    assert "theirs" == report["kept"]  # not profkit's any more: left alone


def test_configure_off_the_main_thread_counts_an_error_and_does_not_raise() -> None:
    """signal.signal() works only on the main thread: configure() there is not broken by it."""
    report = _fresh("signal_configure_off_main_thread")
    assert report["configured"] is True
    assert "SIG_DFL" == report["installed"]
    assert {"trigger_signal": 1} == report["reasons"]
    assert ["every:1000000000"] == report["policies"]


@pytest.mark.slow
def test_shutdown_off_the_main_thread_leaves_an_inert_handler() -> None:
    """A handler that cannot be removed does nothing; the next configure() takes it back."""
    report = _fresh("signal_shutdown_off_main_thread")
    assert "SIG_DFL" != report["stuck"]
    assert ["every:1000000000", "trigger"] == report["policies"]
    assert "SIG_DFL" == report["after"]


@pytest.mark.parametrize("name", ["SIGNOPE", "usr1", "SIGUSR1 ", "SIGKILL", "SIGSTOP", 10])
def test_invalid_signal_name_is_a_value_error(name: object) -> None:
    """configure() refuses a name that is not a signal it can catch, naming the setting."""
    with pytest.raises(ValueError, match="trigger_signal"):
        profkit.configure(trigger_signal=name)  # type: ignore[arg-type]
    assert profkit.get_config() is None


#: signals whose default action or meaning belongs to someone else: the kernel (SIGSEGV),
#: the shell and process managers (SIGTERM, SIGINT, SIGHUP), the runtime (SIGCHLD, SIGPIPE)
UNSAFE = [
    name
    for name in (
        *("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGABRT", "SIGSEGV", "SIGBUS", "SIGFPE"),
        *("SIGILL", "SIGALRM", "SIGCHLD", "SIGPIPE", "SIGPROF", "SIGWINCH", "SIGCONT", "SIGTRAP"),
    )
    if hasattr(signal, name)
]
HAS_RT = hasattr(signal, "SIGRTMIN") and hasattr(signal, "SIGRTMAX")


@pytest.mark.parametrize("name", UNSAFE)
def test_unsafe_signal_is_a_value_error(name: str) -> None:
    """Only SIGUSR1, SIGUSR2 and real-time signals may be taken over: others are refused."""
    with pytest.raises(ValueError, match="profkit setting 'trigger_signal'"):
        build_config({"trigger_signal": name}, environ={})


def test_configure_refuses_sigterm_and_installs_nothing() -> None:
    """configure(trigger_signal="SIGTERM") raises and leaves SIGTERM's handler alone."""
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(ValueError, match="trigger_signal"):
        profkit.configure(trigger_signal="SIGTERM")
    assert (None, before) == (profkit.get_config(), signal.getsignal(signal.SIGTERM))


def test_unsafe_signal_from_env_warns_and_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """PROFKIT_TRIGGER_SIGNAL=SIGTERM warns (ProfkitConfigWarning) and means no signal."""
    monkeypatch.setenv("PROFKIT_TRIGGER_SIGNAL", "SIGTERM")
    with pytest.warns(ProfkitConfigWarning, match="PROFKIT_TRIGGER_SIGNAL"):
        config = build_config({})
    assert config.trigger_signal is None


@pytest.mark.skipif(not HAS_RT, reason="needs real-time signals")
@pytest.mark.parametrize("name", ["SIGRTMIN", "SIGRTMAX", "SIGRTMIN+3", "SIGRTMAX-2"])
def test_real_time_signals_are_accepted(name: str) -> None:
    """The real-time range is free for applications: SIGRTMIN..SIGRTMAX, also as SIGRTMIN+n."""
    assert name == build_config({"trigger_signal": name}, environ={}).trigger_signal


@pytest.mark.skipif(not HAS_RT, reason="needs real-time signals")
@pytest.mark.parametrize(
    "name", ["SIGRTMIN-1", "SIGRTMAX+1", "SIGRTMIN+99", "SIGRTMIN+", "SIGRTMIN+-1"]
)
def test_outside_the_real_time_range_is_refused(name: str) -> None:
    """A name past either end of the real-time range is no signal."""
    with pytest.raises(ValueError, match="trigger_signal"):
        build_config({"trigger_signal": name}, environ={})


@pytest.mark.slow
@pytest.mark.skipif(not HAS_RT, reason="needs real-time signals")
def test_real_time_signal_profiles_the_next_root_call() -> None:
    """trigger_signal="SIGRTMIN+1": that signal profiles the next root call, end to end."""
    report = _fresh("signal_real_time")
    assert ["every:1000000000", "trigger"] == report["policies"]
    assert ("profkit_trigger_signal", "SIG_DFL") == (report["installed"], report["after"])


def test_bad_env_var_warns_and_installs_nothing(
    monkeypatch: pytest.MonkeyPatch, usr1_default: None
) -> None:
    """A malformed PROFKIT_TRIGGER_SIGNAL warns and falls back to no signal."""
    monkeypatch.setenv("PROFKIT_TRIGGER_SIGNAL", "SIGNOPE")
    before = signal.getsignal(signal.SIGUSR1)
    with pytest.warns(ProfkitConfigWarning, match="PROFKIT_TRIGGER_SIGNAL"):
        config = profkit.configure(exporters=())
    assert config.trigger_signal is None
    assert before == signal.getsignal(signal.SIGUSR1)


def test_env_var_installs_the_handler_and_shutdown_removes_it(
    monkeypatch: pytest.MonkeyPatch, usr1_default: None
) -> None:
    """PROFKIT_TRIGGER_SIGNAL=SIGUSR1 installs it; shutdown() puts back what was there."""
    monkeypatch.setenv("PROFKIT_TRIGGER_SIGNAL", "SIGUSR1")
    before = signal.getsignal(signal.SIGUSR1)
    config = profkit.configure(exporters=())
    assert "SIGUSR1" == config.trigger_signal
    assert before != signal.getsignal(signal.SIGUSR1)
    profkit.shutdown()
    assert before == signal.getsignal(signal.SIGUSR1)


def test_enabled_false_installs_nothing(usr1_default: None) -> None:
    """A disabled profkit has no side effects: no handler either."""
    before = signal.getsignal(signal.SIGUSR1)
    profkit.configure(enabled=False, trigger_signal="SIGUSR1", exporters=())
    assert before == signal.getsignal(signal.SIGUSR1)


# -- the counter a handler bumps: no lock -------------------------------------------------


def test_signalled_needs_no_lock() -> None:
    """A handler can run while its own thread holds Triggered's lock (it runs between two
    bytecodes of whatever the main thread was doing): signalled() must not wait for it."""
    t = Triggered()
    done = threading.Event()

    def in_handler() -> None:
        t.signalled()
        done.set()

    with t._lock:  # what take() or add() may hold when the signal lands
        runner = threading.Thread(target=in_handler, daemon=True)
        runner.start()
        assert done.wait(5.0), "signalled() waited for the lock"
    assert [True, False] == [t.take("any"), t.take("any")]
    assert 0 == t.pending


@pytest.mark.timeout(60)
def test_signals_landing_inside_take_are_neither_lost_nor_deadlocked() -> None:
    """Signals sent from another thread land wherever the main thread is, inside take() and
    add() holding the lock too; every handled signal is taken exactly once, nothing hangs."""
    t = Triggered()
    handled = [0]
    taken = [0, 0]
    stop = threading.Event()

    def handler(signum: int, frame: object) -> None:
        handled[0] += 1
        t.signalled()

    def sender() -> None:
        for _ in range(1000):
            if stop.is_set():
                return
            os.kill(os.getpid(), signal.SIGUSR2)
            taken[1] += t.take("x")  # another thread takes them too
            time.sleep(0.0002)

    previous = signal.signal(signal.SIGUSR2, handler)
    thread = threading.Thread(target=sender, daemon=True)
    labelled = 0
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.0002)  # the sender gets the GIL back soon after each sleep
    try:
        thread.start()
        while thread.is_alive():
            if labelled < MAX_PENDING // 2:  # under the cap: every signal still counts
                labelled += t.add(1, label="y")  # the lock, from the main thread
            taken[0] += t.take("x")  # the lock too
        thread.join(10.0)
        time.sleep(0.05)  # a last signal in flight
    finally:
        stop.set()
        thread.join(10.0)  # no signal may arrive once the default action (exit) is back
        signal.signal(signal.SIGUSR2, previous)
        sys.setswitchinterval(interval)
    while t.take("x"):
        taken[0] += 1
    assert handled[0] > 100  # the test did exercise the handler
    assert handled[0] == sum(taken)
    assert labelled == sum(t.take("y") for _ in range(labelled))
    assert (False, 0) == (t.take("y"), t.pending)


@pytest.mark.parametrize("at", [1, 2])
def test_a_signal_landing_after_any_drain_is_not_lost(at: int) -> None:
    """A handler that runs right after either drain of take() (the main thread was inside
    take(), holding the lock; the second drain comes after take() stored what is left): its
    trigger is still there for the next call."""
    t = Triggered()
    t.add(1, label="a")
    real = t._drain
    drains = [0]

    def drain_then_signal() -> int:
        n = real()
        drains[0] += 1
        if drains[0] == at:
            t.signalled()  # between two bytecodes, just after the drain
        return n

    t._drain = drain_then_signal  # type: ignore[method-assign]
    assert t.take("a")
    assert drains[0] >= at  # the signal did land
    assert [True, False] == [t.take("b"), t.take("b")], f"lost after drain {at}"
    assert 0 == t.pending
