"""What the trigger_signal scripts share: a capture exporter, the settings, the policies the
exporter got, a handler's name, and a wait for a signal sent by another process."""

from __future__ import annotations

import signal
import time
from typing import Any

import profkit
from profkit._global import get_session
from profkit.testing import CaptureExporter

__all__ = ["SETTINGS", "cap", "handler_name", "policies", "wait_for_trigger"]

cap = CaptureExporter()
SETTINGS: dict[str, Any] = dict(
    sample_every=10**9, exporters=(), extra_exporters=(cap,), max_per_minute=None
)


def policies() -> list[str]:
    """The policies of the calls exported so far (after a flush)."""
    assert profkit.force_flush(30.0)
    return [c.policy for c in cap.calls]


def handler_name(signum: int = signal.SIGUSR1) -> str:
    """The name of the handler installed for ``signum`` (SIG_DFL, a function's name...)."""
    h = signal.getsignal(signum)
    return h.name if isinstance(h, signal.Handlers) else getattr(h, "__name__", repr(h))


def wait_for_trigger(timeout: float = 60.0) -> None:
    """Until a signal from another process (delivered asynchronously) left a trigger."""
    deadline = time.monotonic() + timeout
    session = get_session()
    assert session is not None
    while not session.triggered.pending and time.monotonic() < deadline:
        time.sleep(0.01)
