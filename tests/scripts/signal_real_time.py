"""trigger_signal="SIGRTMIN+1": that real-time signal profiles the next root call."""

import signal

from _fresh import f, report
from _trigger_helpers import SETTINGS, handler_name, policies

import profkit

rt = signal.SIGRTMIN + 1
profkit.configure(trigger_signal="SIGRTMIN+1", **SETTINGS)
installed = handler_name(rt)
f()  # call 0: the sampler's own pick
signal.raise_signal(rt)
f()  # triggered
f()  # not
got = policies()
profkit.shutdown()
report(policies=got, installed=installed, after=handler_name(rt))
