"""Strings that leave profkit: encodable, free of control characters, bounded.

Every label, op name, attribute key and value, error text and path that profkit writes to a
span, a log event or a terminal goes through :func:`clean` first:

* a lone surrogate (Python's stand-in for bytes that are not UTF-8, e.g. a file name read with
  ``surrogateescape``) becomes U+FFFD: OTLP's protobuf encoder fails a whole batch, the
  application's spans included, on one such string;
* a control character (C0, DEL, C1: ANSI escapes, NUL, newlines), a bidirectional control
  (U+202E and its kin) or a Unicode line separator becomes its visible escape (``\\x1b``,
  ``\\n``, ``\\u202e``), so a label cannot rewrite or reorder a terminal line or split a
  log line;
* the result is cut at ``limit`` characters, ending in "…" when cut.

Pure and torch-free. The common case (a printable string within the limit) costs one
``str.isprintable()`` call and returns the string itself.
"""

from __future__ import annotations

import re

__all__ = ["as_label", "clean", "clip", "escape"]

#: characters that never leave profkit as they are: C0 and C1 controls, DEL, lone surrogates,
#: bidirectional controls (they reorder a line as it is shown: "Trojan Source") and Unicode's
#: line and paragraph separators (they split a log line)
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\ud800-\udfff\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]"
)
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _replace(match: re.Match[str]) -> str:
    char = match.group()
    if "\ud800" <= char <= "\udfff":
        return "\ufffd"
    code = ord(char)
    return _ESCAPES.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def escape(text: str) -> str:
    """``text`` with lone surrogates as U+FFFD and control characters as visible escapes."""
    if text.isprintable():  # C fast path; also False for spaces other than " ", rarely seen
        return text
    return _UNSAFE.sub(_replace, text)


def clip(text: str, limit: int, *, keep_end: bool = False) -> str:
    """Bound a string's length: ``limit`` characters at most, "…" marking the cut.

    ``keep_end`` keeps the end instead of the start (a path's file name, a traceback's
    innermost frames).
    """
    if len(text) <= limit:
        return text
    if limit <= 1:
        return "…"[:limit]
    return "…" + text[-(limit - 1) :] if keep_end else text[: limit - 1] + "…"


def clean(text: str, limit: int | None = None, *, keep_end: bool = False) -> str:
    """:func:`escape` then :func:`clip`: what every string profkit writes goes through."""
    text = escape(text)
    return text if limit is None else clip(text, limit, keep_end=keep_end)


def as_label(name: object) -> str:
    """A label given as something other than a string (``region(123)``), made one with
    ``str()`` as :mod:`logging` does with a message; one whose ``str()`` raises is named by
    its type. Labelling never raises into the caller's code for it."""
    if isinstance(name, str):
        return name
    try:
        text = str(name)
    except Exception:
        return f"<{type(name).__qualname__}>"
    return text if isinstance(text, str) else f"<{type(name).__qualname__}>"
