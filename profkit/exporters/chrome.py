"""Chrome / Perfetto trace files: one per window, owner-only, under a retention limit.

Files are written on the export worker with ``torch.profiler``'s own
``export_chrome_trace`` (handed in by the window, the one module that touches the profiler)
inside a private ``mkdtemp`` directory, optionally gzip-compressed,
set to mode 0600 and renamed into place as ``profkit-<epoch ns>-w<window id>.json[.gz]``.
After each write the oldest files beyond ``trace_max_files`` or ``trace_max_bytes`` are
removed. Nothing is written outside ``trace_dir``.
"""

from __future__ import annotations

import gzip
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable

__all__ = ["TraceFileWriter"]

_PREFIX = "profkit-"


class TraceFileWriter:
    """Writes and prunes the trace files of one session."""

    def __init__(self, directory: str, *, compress: bool, max_files: int, max_bytes: int) -> None:
        self.directory = os.path.abspath(directory)
        self.gzip = compress
        self.max_files = max_files
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    def write(self, write_trace: Callable[[str], None], window_id: int) -> str:
        """Have ``write_trace(path)`` write a window's trace; return its final path."""
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        suffix = ".json.gz" if self.gzip else ".json"
        final = os.path.join(self.directory, f"{_PREFIX}{time.time_ns()}-w{window_id}{suffix}")
        # torch (kineto) creates the file itself with the process umask: let it write inside a
        # private (0700) scratch directory, then make the file 0600 before it is moved into view
        scratch = tempfile.mkdtemp(prefix=".profkit-", dir=self.directory)
        try:
            path = os.path.join(scratch, "trace.json")
            write_trace(path)
            if self.gzip:
                packed = path + ".gz"
                fd = os.open(packed, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with (
                    os.fdopen(fd, "wb") as out,
                    open(path, "rb") as src,
                    gzip.GzipFile(fileobj=out, mode="wb") as gz,
                ):
                    shutil.copyfileobj(src, gz)
                path = packed
            os.chmod(path, 0o600)
            os.replace(path, final)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        self.prune()
        return final

    def files(self) -> list[str]:
        """This writer's trace files, oldest first."""
        names = sorted(
            (n for n in os.listdir(self.directory) if n.startswith(_PREFIX)),
            key=lambda n: int(n[len(_PREFIX) :].split("-", 1)[0]),
        )
        return [os.path.join(self.directory, n) for n in names]

    def prune(self) -> None:
        """Remove the oldest files until both the count and the byte limits hold."""
        with self._lock:
            files = self.files()
            sizes = [os.path.getsize(f) for f in files]
            total = sum(sizes)
            while files and (len(files) > self.max_files or total > self.max_bytes):
                if len(files) == 1 and len(files) <= self.max_files:
                    break  # always keep the newest one, even if it alone exceeds the bytes
                total -= sizes.pop(0)
                os.unlink(files.pop(0))
