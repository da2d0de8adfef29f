"""A profiler profkit started and lost track of (a second signal's exception landing inside
the recovery from a first, in storms of timeouts) is stopped at the next window's open and
at exit, instead of being taken for someone else's for good (every later sample
``skipped_foreign``) and crashing the interpreter's exit (SIGSEGV, torch 2.13)."""

from __future__ import annotations

import torch

import profkit
from profkit._capture import window as window_module
from profkit._capture.window import Window
from profkit.testing import capture
from tests.fresh_interpreter import run_fresh


@profkit.profiled("work")
def work() -> float:
    return float(torch.ones(3).add_(1).sum())


def _leak() -> None:
    """What the storm left: a profile profkit started, on this thread, no window holding it
    (the recovery's ``finally`` forgot it after its stop was cut short)."""
    config = profkit.get_config()
    assert config is not None
    win = Window(10_000, config)
    win.start()
    win.prof = None
    assert torch._C._autograd._profiler_enabled()


def test_the_next_window_stops_a_leaked_profiler_and_samples_again() -> None:
    with capture(sample_every=1, cold_calls=0) as cap:
        _leak()
        assert [6.0, 6.0] == [work(), work()]
        assert profkit.force_flush(10.0)
    stats = cap.stats
    assert 0 == stats["skipped_foreign"]
    assert 2 == stats["exported"]
    assert 1 == stats["error_reasons"].get("leaked_profiler")
    assert not torch._C._autograd._profiler_enabled()
    assert {} == window_module._unstopped  # every profile it started was stopped: none kept


def test_a_users_profiler_is_never_taken_for_a_leaked_one() -> None:
    with capture(sample_every=1, cold_calls=0) as cap:
        with torch.profiler.profile() as prof:
            assert 6.0 == work()
        assert profkit.force_flush(10.0)
    assert 1 == cap.stats["skipped_foreign"]
    assert "leaked_profiler" not in cap.stats["error_reasons"]
    assert any(e.name == "aten::add_" for e in prof.events())


def test_an_exit_with_a_leaked_profiler_does_not_crash() -> None:
    rc, report, err = run_fresh("exit_leaked_profiler")
    assert rc == 0, err[-3000:]
    assert report == {"enabled": True}


def test_a_users_profiler_started_inside_a_sampled_call_keeps_running() -> None:
    """The user starts a profiler inside a sampled call ("profile the next requests"):
    torch replaces profkit's on that thread, so closing profkit's window must not stop it;
    the call is dropped with its reason and the user's profile records on."""
    user = torch.profiler.profile()

    @profkit.profiled("handler")
    def handler(start: bool) -> float:
        if start:
            user.start()
        return float(torch.ones(3).mul(2).sum())

    with capture(sample_every=1, cold_calls=0) as cap:
        assert 6.0 == handler(True)
        assert torch.autograd.profiler._is_profiler_enabled
        torch.ones(5).sin()
        user.stop()
        assert profkit.force_flush(10.0) is False  # the call could not be exported
    assert any(e.name == "aten::sin" for e in user.events())
    assert 1 == cap.stats["dropped_reasons"].get("foreign_profiler")
    assert {} == window_module._unstopped


def test_a_window_your_profiler_emptied_between_its_calls_takes_no_more_calls() -> None:
    """``window=3``: the first call opens a window; between calls the app runs a profiler of
    its own on that thread, which empties it. Only that call is lost (``foreign_profiler``);
    the next calls get windows of their own and are exported (2 more were dropped with it)."""
    with capture(sample_every=1, cold_calls=0, window=3) as cap:
        assert work() == 6.0
        with torch.profiler.profile() as user:
            torch.ones(4).cos()
        assert any(e.name == "aten::cos" for e in user.events())
        results = [work() for _ in range(6)]
        assert profkit.force_flush(10.0) is False  # (the first call could not be exported)
    assert results == [6.0] * 6
    assert {"foreign_profiler": 1} == cap.stats["dropped_reasons"]
    assert (7, 6) == (cap.stats["sampled"], cap.stats["exported"])
    assert not torch.autograd.profiler._is_profiler_enabled
