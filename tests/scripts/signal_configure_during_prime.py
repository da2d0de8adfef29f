"""A signal handler that calls ``configure()`` lands while the main thread primes the
profiler (the longest step of the process's first ``configure()``, about a second, under a
lock): a SIGHUP "reload" at start-up. The handler's ``configure()`` (new profiler settings:
it primes too) must not wait on the lock its own thread holds; the session left in place samples.

A thread sends the signal once the priming has begun. A hang is dumped and ends the process
with status 1 after 60 s.
"""

import faulthandler
import os
import signal
import sys
import threading
import time
from types import FrameType

from _fresh import f, report

import profkit
from profkit._capture import window

faulthandler.dump_traceback_later(60, exit=True, file=sys.stderr)
settings = {"sample_every": 1, "cold_calls": 0, "max_per_minute": None, "exporters": ()}
reloaded: list[bool] = []


def reload(signum: int, frame: FrameType | None) -> None:
    profkit.configure(all_threads=True, **settings)  # type: ignore[arg-type]
    reloaded.append(True)


signal.signal(signal.SIGUSR2, reload)


def send_once_priming() -> None:
    deadline = time.monotonic() + 30
    while window._prime_lock.acquire(blocking=False) and time.monotonic() < deadline:
        window._prime_lock.release()  # free: the main thread is not priming yet
        time.sleep(0.0002)
    os.kill(os.getpid(), signal.SIGUSR2)


sender = threading.Thread(target=send_once_priming)
sender.start()
profkit.configure(**settings)  # type: ignore[arg-type]
sender.join()
deadline = time.monotonic() + 10
while not reloaded and time.monotonic() < deadline:  # (it landed after the priming)
    time.sleep(0.01)
result = f()
report(reloaded=reloaded, result=result, sampled=profkit.stats()["sampled"])
profkit.shutdown()
