"""How busy the machine is, as the test's own thread saw it (for figures that need a CPU)."""

from __future__ import annotations

import threading
import time

import pytest


class CpuWait:
    """How long this thread has waited for a CPU (runnable, not running) since the fixture
    began, as a share of the wall time: a busy machine's mark (Linux schedstat)."""

    def __init__(self) -> None:
        self._t0, self._w0 = time.monotonic_ns(), self._waited()

    @staticmethod
    def _waited() -> int | None:
        try:
            with open(f"/proc/self/task/{threading.get_native_id()}/schedstat", "rb") as f:
                return int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            return None

    def share(self) -> float:
        now = self._waited()
        if now is None or self._w0 is None:
            return 0.0
        return (now - self._w0) / max(1, time.monotonic_ns() - self._t0)

    def skip_if_busy(self, what: str, limit: float = 0.25) -> None:
        """Skip the rest of a test whose figure needs the CPU this thread did not get."""
        share = self.share()
        if share > limit:
            pytest.skip(
                f"{what}: the machine was too busy (this thread waited for a CPU "
                f"{share:.0%} of the time, over {limit:.0%}); bench/slow_recall.py measures it"
            )


class PoolWait:
    """How long a pool's threads waited for a CPU, as a share of their wall time: pass
    :meth:`joined` as the pool's ``initializer``, read :meth:`share` before the pool ends."""

    def __init__(self) -> None:
        self._t0 = time.monotonic_ns()
        self._lock = threading.Lock()
        self._start: dict[int, int] = {}

    def joined(self) -> None:
        tid = threading.get_native_id()
        waited = _waited(tid)
        if waited is not None:
            with self._lock:
                self._start[tid] = waited

    def share(self) -> float:
        wall = max(1, time.monotonic_ns() - self._t0)
        with self._lock:
            start = dict(self._start)
        shares = [
            (now - w0) / wall for tid, w0 in start.items() if (now := _waited(tid)) is not None
        ]
        return max(shares, default=0.0)

    def skip_if_busy(self, what: str, limit: float = 0.1) -> None:
        """Skip the rest of a test whose figure needs the CPU the pool's threads did not get."""
        share = self.share()
        if share > limit:
            pytest.skip(
                f"{what}: the machine was too busy (a pool thread waited for a CPU "
                f"{share:.0%} of the time, over {limit:.0%})"
            )


def _waited(tid: int) -> int | None:
    try:
        with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
            return int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
