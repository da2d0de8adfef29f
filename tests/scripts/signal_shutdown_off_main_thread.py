"""shutdown() off the main thread cannot remove the handler: it is left inert, and the next
configure() takes it back."""

import signal
import threading

from _fresh import f, report
from _trigger_helpers import SETTINGS, handler_name, policies

import profkit

profkit.configure(trigger_signal="SIGUSR1", **SETTINGS)
t = threading.Thread(target=profkit.shutdown)
t.start()
t.join()
stuck = handler_name()
signal.raise_signal(signal.SIGUSR1)  # no session: nothing happens, nothing raises
profkit.configure(trigger_signal="SIGUSR1", **SETTINGS)
f()
signal.raise_signal(signal.SIGUSR1)
f()
got = policies()
profkit.shutdown()
report(stuck=stuck, policies=got, after=handler_name())
