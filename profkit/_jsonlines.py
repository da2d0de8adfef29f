"""One reading of profkit's JSON lines, shared by ``python -m profkit report`` and ``diff``.

The lines are the ``"json"`` exporter's (one ``profkit.profile`` object per call, its op rows
as ``top_ops``) or structlog's JSON rendering of the ``"log"`` exporter's events (a
``profkit.profile`` event per call, a ``profkit.op`` event per row), and the log exporter's
compact lines under an unconfigured structlog (:func:`profkit.exporters.logs.parse_compact`);
every other line (text logs, anything else) is skipped. A file (or stdin) is UTF-8, or what
its byte order mark says (UTF-16 with one: Windows PowerShell's ``>`` writes it).

Any input is read without raising: a line that looks like JSON but does not parse, and a
profkit event whose label, duration or op time is not what profkit writes (null, a string,
nan, inf, negative, out of range), is skipped and counted; bytes that are not UTF-8 are read
as U+FFFD. A call profiled while its label was cold (``cold`` or ``profkit.cold`` true) is
read as such (:attr:`Sample.cold`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import io
import json
import math
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import IO, Any

from ._text import clean
from .exporters.logs import parse_compact

__all__ = ["Sample", "dumps", "expand", "lines", "read", "read_samples", "write"]

#: the most characters of a path printed
_LIMIT = 200


@dataclasses.dataclass
class Sample:
    """One sampled call as read from a ``profkit.profile`` event (and its ``profkit.op`` ones)."""

    label: str
    duration_us: float
    verdict: str
    borderline: bool = False
    """The diagnosis said its confidence was low."""
    ops: dict[str, float] = dataclasses.field(default_factory=dict)
    """Self CPU µs per op name (the "other" row left out)."""
    other_us: float = 0.0
    """Self CPU µs of the "other" row (the ops past ``top_k``; 0: none)."""
    regions: dict[str, float] = dataclasses.field(default_factory=dict)
    """Duration µs per region label (regions of the same label in one call added up)."""
    cold: bool = False
    """The call was profiled while its label was cold (``cold`` / ``profkit.cold`` true)."""
    shares: list[float] = dataclasses.field(default_factory=list)
    """A batch (``profkit.batch``): each member's share of it (empty for any other call)."""
    compact: bool = False
    """Read from a compact log line (:func:`profkit.exporters.logs.parse_compact`): its ops
    are the call's top ``COMPACT_OPS`` only, with no "other" row and no regions, so an op or
    region it does not list is unknown rather than absent."""
    event: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)
    """Of the ``profkit.profile`` event as read, what the HTML page shows of it (start time,
    trace and span ids, regions)."""


_EVENTS = ("profkit.profile", "profkit.op")
#: what :attr:`Sample.event` keeps of its event (the HTML page's): the rest, ``top_ops`` the
#: largest, is read into the sample, so a large file is not held twice in memory
_PAGE_KEYS = ("start_time", "trace_id", "span_id", "regions")


def _events(lines: Iterable[str], bad: list[int]) -> Iterator[tuple[dict[str, Any], bool]]:
    """The JSON objects among ``lines`` whose ``event`` is one of profkit's, each with
    whether it was a compact log line; ``bad[0]`` counts the lines that look like JSON
    objects but do not parse."""
    for line in lines:
        text = line.strip()
        if not text.startswith("{"):
            compact = parse_compact(text) if "profkit.profile" in text else None
            if compact is not None:  # the log exporter's line under structlog's defaults
                yield compact, True
            continue
        try:
            event = json.loads(text)
        except (ValueError, RecursionError):  # RecursionError: nested past the limit
            bad[0] += 1
            continue
        if isinstance(event, dict) and event.get("event") in _EVENTS:
            yield event, False


def _number(value: Any) -> float | None:
    """A finite, non-negative JSON number as a float; None for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int past float's range
        return None
    return number if math.isfinite(number) and number >= 0 else None


def _key(value: Any) -> str | None:
    """A string (a label, a span id, a verdict) from a JSON string or number; else None."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return None


def _op_time(row: Mapping[str, Any]) -> tuple[str, float] | None:
    """An op row's name and self CPU µs; None for the "other" row or one that cannot be read."""
    name = row.get("op")
    self_us = _number(row.get("self_cpu_us", 0.0))
    if not isinstance(name, str) or name == "other" or self_us is None:
        return None
    return name, self_us


def read(lines: Iterable[str]) -> tuple[list[Sample], int]:
    """Samples from profkit's JSON lines, in file order, and how many lines were skipped
    because they could not be read.

    A ``profkit.profile`` event's ``top_ops`` gives its ops (rows that cannot be read are
    left out); ``profkit.op`` events (the log exporter's) are added to the profile with the
    same ``span_id``, or else to the latest profile of their label.
    """
    bad = [0]
    samples: list[Sample] = []
    by_span: dict[str, Sample] = {}
    latest: dict[str, Sample] = {}
    for event, compact in _events(lines, bad):
        label = _key(event.get("label", "?"))
        if event["event"] == "profkit.profile":
            duration = _number(event.get("duration_us", 0.0))
            if label is None or duration is None:
                bad[0] += 1
                continue
            verdict = _key(event.get("diagnosis")) or "none"
            sample = Sample(label, duration, verdict, event.get("diagnosis_confidence") == "low")
            sample.cold = event.get("cold") is True or event.get("profkit.cold") is True
            sample.compact = compact
            sample.event = {key: event[key] for key in _PAGE_KEYS if key in event}
            rows = event.get("top_ops")
            for row in rows if isinstance(rows, list) else ():
                _add_op(sample, row)
            regions = event.get("regions")
            for region in regions if isinstance(regions, list) else ():
                _add_region(sample, region)
            members = event.get("batch_members")
            for member in members if isinstance(members, list) else ():
                share = _number(member.get("share")) if isinstance(member, Mapping) else None
                if share is not None and share <= 1.0:
                    sample.shares.append(share)
            samples.append(sample)
            latest[label] = sample
            span = _key(event.get("span_id"))
            if span:
                by_span[span] = sample
            continue
        target = by_span.get(_key(event.get("span_id")) or "") or latest.get(label or "")
        if event.get("op") == "other":
            other = _number(event.get("self_cpu_us", 0.0))
            if target is not None and other is not None:
                target.other_us += other
            continue
        found = _op_time(event)
        if label is None or found is None:
            bad[0] += 1
            continue
        if target is not None:
            target.ops[found[0]] = target.ops.get(found[0], 0.0) + found[1]
    return samples, bad[0]


def read_samples(lines: Iterable[str]) -> list[Sample]:
    """:func:`read`'s samples, without the count of skipped lines."""
    return read(lines)[0]


def _add_region(sample: Sample, region: Any) -> None:
    if not isinstance(region, Mapping):
        return
    name, duration = _key(region.get("region")), _number(region.get("duration_us"))
    if name is not None and duration is not None:
        sample.regions[name] = sample.regions.get(name, 0.0) + duration


def _add_op(sample: Sample, row: Any) -> None:
    if isinstance(row, Mapping) and row.get("op") == "other":
        other = _number(row.get("self_cpu_us", 0.0))
        sample.other_us += other if other is not None else 0.0
        return
    found = _op_time(row) if isinstance(row, Mapping) else None
    if found is not None:
        name, self_us = found
        sample.ops[name] = sample.ops.get(name, 0.0) + self_us


def _open(path: str) -> contextlib.AbstractContextManager[IO[str]]:
    if path != "-":
        raw = open(path, "rb")  # noqa: SIM115 (the wrapper below owns and closes it)
        return io.TextIOWrapper(raw, encoding=_encoding(raw), errors="replace")
    return _stdin()


def _encoding(stream: IO[bytes]) -> str:
    """UTF-16 when ``stream`` starts with its byte order mark and an ASCII character in it
    (a line's first, ``{`` or a log's date: Windows PowerShell's ``>`` writes UTF-16), else
    UTF-8, a UTF-8 BOM skipped (bytes that only look like a BOM stay U+FFFD). Looked at
    without consuming it (``peek``: a pipe's bytes are read once)."""
    peek = getattr(stream, "peek", None)
    head = peek(4)[:4] if peek is not None else b""
    if (
        len(head) == 4
        and (
            (head[:2] == b"\xff\xfe" and head[2] and not head[3])  # LE: "{" is 7b 00
            or (head[:2] == b"\xfe\xff" and not head[2] and head[3])  # BE: 00 7b
        )
    ):
        return "utf-16"
    return "utf-8-sig"


@contextlib.contextmanager
def _stdin() -> Iterator[IO[str]]:
    """Standard input, bytes that are not UTF-8 read as U+FFFD; left open."""
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:  # a replaced stdin (a test's): read it as it is
        yield sys.stdin
        return
    wrapper = io.TextIOWrapper(buffer, encoding=_encoding(buffer), errors="replace")
    try:
        yield wrapper
    finally:
        wrapper.detach()  # not closing sys.stdin's buffer with it


def lines(paths: list[str], unreadable: list[str]) -> Iterator[str]:
    """Every line of every file; a file that cannot be opened or read is noted and skipped."""
    for path in paths:
        try:
            with _open(path) as stream:
                yield from stream
        except OSError as exc:
            unreadable.append(f"cannot read {clean(path, _LIMIT)}: {exc.strerror or exc}")


def write(stream: IO[str], text: str) -> None:
    """``text`` on ``stream``, with what its encoding cannot write as escapes."""
    try:
        stream.write(text)
    except UnicodeEncodeError:
        encoding = getattr(stream, "encoding", None) or "ascii"
        stream.write(text.encode(encoding, "backslashreplace").decode(encoding, "replace"))


def dumps(obj: Any) -> str:
    """Strict JSON of a report or diff: a number that overflowed (a sum, a median or a ratio
    of huge finite inputs) is ``null``, never the ``Infinity`` or ``NaN`` that no JSON
    parser but Python's reads."""
    return json.dumps(_finite(obj), indent=2, allow_nan=False)


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {key: _finite(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(value) for value in obj]
    return obj


def expand(patterns: Iterable[str]) -> list[str]:
    """Paths from paths or globs: a pattern that names no file but matches some is expanded
    (sorted); one that matches nothing is kept, so that reading it reports it."""
    out: list[str] = []
    for pattern in patterns:
        found = sorted(glob.glob(pattern)) if pattern != "-" and glob.has_magic(pattern) else []
        out.extend(found or [pattern])
    return out
