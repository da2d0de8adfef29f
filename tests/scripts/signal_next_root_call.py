"""A signal from the process itself or from `kill -USR1 <pid>` profiles one call each."""

import os
import signal
import subprocess

from _fresh import f, report
from _trigger_helpers import SETTINGS, handler_name, policies, wait_for_trigger

import profkit

profkit.configure(trigger_signal="SIGUSR1", **SETTINGS)
installed = handler_name()
f()  # call 0: the sampler's own pick
f()
signal.raise_signal(signal.SIGUSR1)
f()  # triggered
f()  # not
subprocess.run(["kill", "-USR1", str(os.getpid())], check=True)
wait_for_trigger()
f()  # triggered
f()  # not
got = policies()
roots = profkit.stats()["root_calls"]
profkit.shutdown()
report(policies=got, roots=roots, installed=installed, after=handler_name())
