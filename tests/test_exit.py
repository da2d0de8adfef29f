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
    rc, report, err = run_fresh(
        """
        cap = CaptureExporter()
        profkit.configure(sample_every=1, window=3, exporters=(), extra_exporters=(cap,))
        old = profkit._global.get_session()
        results = [f(), f()]
        profkit.configure(sample_every=1000, exporters=())
        flushed = old.shutdown(10.0)
        report(results=results, flushed=flushed, calls=len(cap.calls),
               stats=old.stats.snapshot(), flag=torch.autograd.profiler._is_profiler_enabled)
        """
    )
    assert 0 == rc, err[-2000:]
    assert [6.0, 6.0] == report["results"]
    assert report["flushed"]
    assert 2 == report["calls"]
    assert 2 == report["stats"]["exported"]
    assert 0 == report["stats"]["dropped"]
    assert report["flag"] is False


def test_all_threads_window_closes_when_its_thread_ends() -> None:
    """An all-threads window still open when its thread ends is closed there and exported."""
    rc, report, err = run_fresh(
        """
        cap = CaptureExporter()
        profkit.configure(
            sample_every=1, window=3, all_threads=True, exporters=(), extra_exporters=(cap,)
        )
        session = profkit._global.get_session()
        worker = threading.Thread(target=lambda: (f(), f()))
        worker.start()
        worker.join()
        flushed = profkit.force_flush(10.0)
        report(flushed=flushed, calls=len(cap.calls), stats=session.stats.snapshot(),
               flag=torch.autograd.profiler._is_profiler_enabled)
        """
    )
    assert 0 == rc, err[-2000:]
    assert report["flushed"]
    assert 2 == report["calls"]
    assert {} == report["stats"]["dropped_reasons"]
    assert report["flag"] is False


def test_all_threads_window_stranded_by_an_exited_thread_is_stopped() -> None:
    """Where the thread-end hook did not run, the stranded all-threads profiler is stopped."""
    rc, report, err = run_fresh(
        """
        profkit._keeper._ThreadEndGuard.__del__ = lambda self: None  # a thread end unseen
        profkit.configure(sample_every=1, window=3, all_threads=True, exporters=())
        session = profkit._global.get_session()
        worker = threading.Thread(target=lambda: (f(), f()))
        worker.start()
        worker.join()
        session.close_idle_window()
        report(stats=session.stats.snapshot(), flag=torch.autograd.profiler._is_profiler_enabled)
        """
    )
    assert 0 == rc, err[-2000:]
    assert {"owner_exited": 2} == report["stats"]["dropped_reasons"]
    assert report["flag"] is False


def test_all_threads_window_idle_on_a_live_thread_at_exit() -> None:
    """A daemon thread holds an idle all-threads window when the interpreter exits."""
    rc, report, err = run_fresh(
        """
        profkit.configure(sample_every=1, window=3, all_threads=True, exporters=())
        session = profkit._global.get_session()
        started = threading.Event()
        def serve():
            f(); f()
            started.set()
            time.sleep(600)
        threading.Thread(target=serve, daemon=True).start()
        assert started.wait(60)
        report(stats=session.stats.snapshot(), flag=torch.autograd.profiler._is_profiler_enabled)
        """
    )
    assert 0 == rc, err[-2000:]
    assert 1 == report["stats"]["windows"]
    assert report["flag"] is True  # the window really was open when exit began


def test_window_in_flight_on_a_daemon_thread_at_exit() -> None:
    """Exit while a sampled call runs on a daemon thread (thread-local profiler): status 0."""
    rc, report, err = run_fresh(
        """
        profkit.configure(sample_every=1, exporters=())
        inside = threading.Event()
        @profkit.profiled("slow")
        def slow():
            inside.set()
            time.sleep(600)
        threading.Thread(target=slow, daemon=True).start()
        assert inside.wait(60)
        report(flag=torch.autograd.profiler._is_profiler_enabled)
        """
    )
    assert 0 == rc, err[-2000:]
    assert report["flag"] is True


def test_thread_per_request_with_open_windows_exports_and_exits_cleanly() -> None:
    """Threads that end with a window still open (``window`` > 1): it closes on that thread."""
    rc, report, err = run_fresh(
        """
        cap = CaptureExporter()
        profkit.configure(
            sample_every=1, window=3, exporters=(), extra_exporters=(cap,)
        )
        session = profkit._global.get_session()
        for _ in range(6):  # one thread per "request", two calls each: each window ends open
            worker = threading.Thread(target=lambda: (f(), f()))
            worker.start()
            worker.join()
        flushed = profkit.force_flush(10.0)
        report(flushed=flushed, calls=len(cap.calls), stats=session.stats.snapshot(),
               threads=sorted(t.name for t in threading.enumerate()))
        """
    )
    assert 0 == rc, err[-2000:]
    assert report["flushed"]
    assert 12 == report["calls"]
    assert 6 == report["stats"]["windows"]
    assert 12 == report["stats"]["exported"]
    assert 0 == report["stats"]["dropped"]
    assert not any(t.startswith("Dummy") for t in report["threads"])
    assert "callback" not in err  # torch's "Requested callback is not found" / "Leaked ..."
