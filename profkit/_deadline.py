"""One deadline shared by every step of a flush or shutdown, infinite timeouts included."""

from __future__ import annotations

import math
import numbers
import threading
import time

__all__ = ["MAX_GIVEN_S", "Deadline", "timeout_s"]

#: the most seconds handed to an exporter's or a provider's flush/shutdown: ``None``
#: ("wait") is a day to it, a number every clock, lock and ``timeout_millis`` can take
MAX_GIVEN_S = 86_400.0


def timeout_s(timeout: object) -> float:
    """``force_flush``'s and ``shutdown``'s ``timeout``, checked before anything is done:
    seconds (a negative number is no time), or None to wait as long as it takes (like the
    standard library's ``timeout=None``); anything else raises a ValueError naming it."""
    if timeout is None:
        return math.inf
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise ValueError(f"timeout must be a number of seconds or None, not {timeout!r}")
    try:
        seconds = float(timeout)  # (numpy's numbers too)
    except OverflowError:  # an int past any float: as long as it takes
        return math.inf
    if math.isnan(seconds):
        raise ValueError("timeout must be a number of seconds or None, not nan")
    return max(0.0, seconds)


class Deadline:
    """A point in ``time.monotonic()`` time; ``timeout`` may be ``math.inf`` ("wait")."""

    __slots__ = ("_end",)

    def __init__(self, timeout: float) -> None:
        self._end = time.monotonic() + timeout if math.isfinite(timeout) else math.inf

    def left(self) -> float:
        """Seconds left (0.0 once passed; ``math.inf`` for an infinite deadline)."""
        return max(0.0, self._end - time.monotonic())

    def wait_arg(self) -> float | None:
        """What to pass as ``timeout=`` to a lock, event, condition or join: None means wait.

        The standard library raises ``OverflowError`` for a timeout beyond
        ``threading.TIMEOUT_MAX`` (about 292 years), infinity included.
        """
        left = self.left()
        return None if left > threading.TIMEOUT_MAX else left

    @property
    def passed(self) -> bool:
        return self._end <= time.monotonic()
