"""The application's own SIGUSR1 handler still runs (once, also after a re-configure), its
exception is the application's, and shutdown puts it back."""

import signal
import time
from types import FrameType

from _fresh import f, report
from _trigger_helpers import SETTINGS, handler_name, policies

import profkit

seen = []


def mine(signum: int, frame: FrameType | None) -> None:
    seen.append(signum)
    if len(seen) == 3:
        raise RuntimeError("the application's own")


signal.signal(signal.SIGUSR1, mine)
profkit.configure(trigger_signal="SIGUSR1", **SETTINGS)
f()
signal.raise_signal(signal.SIGUSR1)
f()  # triggered; mine ran once
profkit.configure(trigger_signal="SIGUSR1", **SETTINGS)  # same signal again
f()  # the new session's call 0
signal.raise_signal(signal.SIGUSR1)
f()  # triggered; mine ran once more, not twice
f()
raised = None
try:
    signal.raise_signal(signal.SIGUSR1)
    time.sleep(0.01)
except RuntimeError as exc:
    raised = str(exc)
f()  # triggered before mine raised
got = policies()
profkit.shutdown()
report(
    policies=got,
    seen=len(seen),
    raised=raised,
    after=handler_name(),
    errors=profkit.stats()["errors"],
)
