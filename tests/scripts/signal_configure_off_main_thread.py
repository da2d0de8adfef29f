"""configure(trigger_signal=...) on a thread that is not the main one (signal.signal()
works only there): counted as an error, nothing raised, sampling works."""

import threading

from _fresh import f, report
from _trigger_helpers import SETTINGS, handler_name, policies

import profkit

out = {}


def configure() -> None:
    out["config"] = profkit.configure(trigger_signal="SIGUSR1", **SETTINGS)


t = threading.Thread(target=configure)
t.start()
t.join()
stats = profkit.stats()
f()
f()
got = policies()
report(
    configured="config" in out,
    installed=handler_name(),
    reasons=stats["error_reasons"],
    policies=got,
)
