"""A signal lands at every line of an exporter runner's ``submit`` and ``wait`` on the main
thread (a ``force_flush()`` there), pinned by a trace function; its handler either raises
(a Ctrl-C, a request timeout) or flushes itself (``force_flush(2)``). Each case runs twice:
a flush that finishes at once (``submit`` and the fast path of ``wait``) and one that
outlasts its caller's timeout (the path that gives up). After each, the runner must still
work: the next window is exported and ``force_flush()`` says True within its timeout; no
exception but the handler's own reaches the caller. The report lists what failed.

Argument: ``raise`` or ``flush`` (what the handler does).
"""

import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from _fresh import f, report

import profkit
from profkit._export import runner as runner_module

what = sys.argv[1]


class Interrupt(BaseException):
    """The handler's exception (as KeyboardInterrupt is)."""


class Exporter:
    name = "mine"

    def __init__(self) -> None:
        self.slow = 0.0
        self.calls = 0

    def export(self, summary: Any) -> None:
        self.calls += len(summary.calls)

    def force_flush(self, timeout: float) -> bool:
        time.sleep(self.slow)
        return True


exporter = Exporter()
profkit.configure(
    sample_every=1, cold_calls=0, max_per_minute=None, exporters=(), extra_exporters=[exporter]
)
handled: list[Any] = []


def on_signal(signum: int, frame: Any) -> None:
    if what == "raise":
        raise Interrupt
    started = time.monotonic()
    handled.append((profkit.force_flush(2.0), time.monotonic() - started))


signal.signal(signal.SIGUSR1, on_signal)
codes = {runner_module.Runner.submit.__code__, runner_module.Runner.wait.__code__}
lines = sorted(
    {(code, line) for code in codes for _, _, line in code.co_lines() if line is not None},
    key=lambda cl: (cl[0].co_name, cl[1]),
)


def pinned(code: Any, line: int) -> Any:
    fired = threading.Event()

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code is not code or fired.is_set():
            return None

        def local(frame: Any, event: str, arg: Any) -> Any:
            if event == "line" and frame.f_lineno == line and not fired.is_set():
                fired.set()
                signal.raise_signal(signal.SIGUSR1)
            return local

        return local

    return trace, fired


failures: list[str] = []
hit: set[tuple[str, int]] = set()
for code, line in lines:
    for slow, timeout in ((0.0, 5.0), (0.15, 0.02)):
        where = f"{code.co_name}:{line} slow={slow}"
        exporter.slow = slow
        f()
        handled.clear()
        trace, fired = pinned(code, line)
        sys.settrace(trace)
        try:
            profkit.force_flush(timeout)
        except Interrupt:
            pass
        except BaseException as exc:  # reported, not raised
            failures.append(f"{where}: force_flush raised {exc!r}")
        finally:
            sys.settrace(None)
        if fired.is_set():
            hit.add((code.co_name, line))
        exporter.slow = 0.0
        if any(seconds > 1.9 for _, seconds in handled):
            failures.append(f"{where}: the handler's flush waited {handled}")
        time.sleep(slow)  # (a flush given up on is still running: let it end)
        before = exporter.calls
        f()
        started = time.monotonic()
        ok = profkit.force_flush(5.0) or profkit.force_flush(5.0)  # (a loss: once False)
        if not ok or exporter.calls <= before or time.monotonic() - started > 4.0:
            calls = f"{before}->{exporter.calls}"
            failures.append(f"{where}: afterwards force_flush {ok}, calls {calls}")
source = Path(runner_module.__file__).read_text(encoding="utf-8").splitlines()
key = ("self._jobs.put(job)", "live.append(job)", "job.waiters -= 1")  # where it wedged
key_lines = {n for n, text in enumerate(source, 1) if any(k in text for k in key)}
hit_lines = {n for _, n in hit}
report(failures=failures, key_missed=sorted(key_lines - hit_lines), shutdown=profkit.shutdown(5.0))
