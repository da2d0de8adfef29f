"""trigger_signal=None restores the previous handler; another signal moves the handler."""

import signal
from types import FrameType

from _fresh import report
from _trigger_helpers import SETTINGS, handler_name

import profkit

profkit.configure(trigger_signal="SIGUSR1", **SETTINGS)
one = handler_name()
profkit.configure(trigger_signal="SIGUSR2", **SETTINGS)
two = (handler_name(), handler_name(signal.SIGUSR2))
profkit.configure(trigger_signal=None, **SETTINGS)
off = (handler_name(), handler_name(signal.SIGUSR2))
profkit.configure(trigger_signal="SIGUSR2", **SETTINGS)


def theirs(signum: int, frame: FrameType | None) -> None:
    pass


signal.signal(signal.SIGUSR2, theirs)  # the application replaced profkit's handler
profkit.shutdown()
report(one=one, two=two, off=off, kept=handler_name(signal.SIGUSR2))
