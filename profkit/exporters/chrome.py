"""Chrome / Perfetto trace files: one per window, owner-only, under a retention limit.

Files are written on the export worker with ``torch.profiler``'s own
``export_chrome_trace`` (handed in by the window, the one module that touches the profiler)
inside a private ``mkdtemp`` directory, optionally gzip-compressed,
set to mode 0600 and renamed into place as ``profkit-<epoch ns>-w<window id>.json[.gz]``.
After each write the oldest files beyond ``trace_max_files`` or ``trace_max_bytes`` are
removed: only files named exactly that way, never the user's. Nothing is written outside
``trace_dir``; a ``trace_dir`` profkit creates (and its missing parents) is 0700. Argument
values that torch records with ``record_shapes`` (``"Concrete Inputs"``) are removed.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable

from .._weak import renewed_at_fork

__all__ = ["TraceFileWriter", "make_private_dirs", "strip_concrete_inputs"]

#: exactly the names profkit gives its files: retention touches nothing else
_NAME = re.compile(r"profkit-(\d+)-w(\d+)\.json(?:\.gz)?")
#: torch's per-op argument values under ``record_shapes`` (scalars passed to ops)
_VALUES = "Concrete Inputs"


def _check_complete(path: str) -> None:
    """Raise OSError unless torch wrote the whole trace: its writer ignores a failed write (a
    full disk, a file-size limit) and leaves half a file, which must never be moved into view.
    kineto ends a trace with its ``"traceName"`` and the closing brace; a file without them
    (another writer) must parse as JSON."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 1024))
        tail = f.read()
    if tail.rstrip().endswith(b"}") and b'"traceName"' in tail:
        return
    try:
        with open(path, "rb") as f:
            json.load(f)
    except ValueError as exc:
        raise OSError(f"the trace file was cut short at {size} bytes (is the disk full?)") from exc


class TraceFileWriter:
    """Writes and prunes the trace files of one session.

    Args:
        directory: where the files go; created (0700, missing parents too) if need be.
        compress: gzip the files.
        max_files: files kept (the oldest of profkit's own files are removed first).
        max_bytes: total bytes kept.
        strip_values: remove torch's ``"Concrete Inputs"`` (argument values recorded with
            ``record_shapes``) from each file before it is moved into view.
    """

    def __init__(
        self,
        directory: str,
        *,
        compress: bool,
        max_files: int,
        max_bytes: int,
        strip_values: bool = True,
    ) -> None:
        self.directory = os.path.abspath(directory)
        self.gzip = compress
        self.max_files = max_files
        self.max_bytes = max_bytes
        self.strip_values = strip_values
        self._lock = renewed_at_fork(self)

    def write(self, write_trace: Callable[[str], None], window_id: int) -> str:
        """Have ``write_trace(path)`` write a window's trace; return its final path."""
        make_private_dirs(self.directory)
        suffix = ".json.gz" if self.gzip else ".json"
        final = os.path.join(self.directory, f"profkit-{time.time_ns()}-w{window_id}{suffix}")
        # torch (kineto) creates the file itself with the process umask: let it write inside a
        # private (0700) scratch directory, then make the file 0600 before it is moved into view
        scratch = tempfile.mkdtemp(prefix=".profkit-", dir=self.directory)
        try:
            path = os.path.join(scratch, "trace.json")
            write_trace(path)
            _check_complete(path)
            if self.strip_values:
                strip_concrete_inputs(path)
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

    def files(self) -> list[tuple[str, int]]:
        """profkit's trace files here (exact names, regular files) and their sizes, oldest first.

        Anything else in the directory is skipped, never read or removed.
        """
        found = []
        for entry in os.scandir(self.directory):
            match = _NAME.fullmatch(entry.name)
            try:
                if match is None or not entry.is_file(follow_symlinks=False):
                    continue
                found.append(((int(match[1]), int(match[2])), entry.path, entry.stat().st_size))
            except OSError:  # gone meanwhile, or unreadable: not ours to worry about
                continue
        found.sort()
        return [(path, size) for _, path, size in found]

    def prune(self) -> None:
        """Remove the oldest files until both the count and the byte limits hold.

        The newest file is always kept, even alone over the byte limit. A file that cannot be
        removed is left (and still counted), never an error.
        """
        with self._lock:
            files = self.files()
            total = sum(size for _, size in files)
            while len(files) > 1 and (len(files) > self.max_files or total > self.max_bytes):
                path, size = files.pop(0)
                total -= size
                with contextlib.suppress(OSError):
                    os.unlink(path)


def make_private_dirs(directory: str) -> None:
    """Create ``directory`` and its missing parents, each 0700 whatever the umask."""
    missing = []
    path = os.path.abspath(directory)
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another writer made it meanwhile
            os.mkdir(path, 0o700)
            os.chmod(path, 0o700)  # mkdir's mode is masked by the umask


def strip_concrete_inputs(path: str) -> None:
    """Rewrite a Chrome trace at ``path`` without torch's ``"Concrete Inputs"`` arguments.

    With ``record_shapes`` torch records the scalar values passed to each op (a fill value, a
    size, an index) next to the shapes; profkit's trace files keep the shapes, not the
    values. Bytes that are not UTF-8 (kineto writes some) pass through unchanged.
    """
    with open(path, "rb") as f:
        raw = f.read()
    if _VALUES.encode() not in raw:
        return
    data = json.loads(raw.decode("utf-8", "surrogateescape"))
    for event in data.get("traceEvents", ()):
        args = event.get("args") if isinstance(event, dict) else None
        if isinstance(args, dict):
            args.pop(_VALUES, None)
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    with open(path, "wb") as f:
        f.write(text.encode("utf-8", "surrogateescape"))
