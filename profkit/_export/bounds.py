"""The attribute sets of profkit's metrics, bounded per MeterProvider.

Labels come from the code and op names from torch, so both are bounded: past
:data:`MAX_LABELS` labels a new one is recorded as ``other``; per label, past
:data:`MAX_OPS` op names a new one is recorded as the label's ``other``; and the op
series with an op's own name are bounded in all, so that with one ``other`` series per label
``profkit.op.self_time`` never holds more than :data:`MAX_OP_SERIES` attribute sets, under
the SDK's own limit (2000 per instrument, past which it folds points into an overflow
series). Past that bound a label's new ops go to its ``other``: every label keeps a series.

The bounds belong to the provider's instruments, not to a session: every ``configure()`` on
one provider feeds the same instruments, so a new session must not count its labels anew.
"""

from __future__ import annotations

from .._text import clean
from .._weak import renewed_at_fork

__all__ = ["MAX_LABELS", "MAX_OPS", "MAX_OP_SERIES", "OTHER", "SeriesBounds"]

#: distinct ``profkit.label`` values; later labels are recorded as "other"
MAX_LABELS = 256
#: distinct ``profkit.op`` values per label; later op names are recorded as "other"
MAX_OPS = 64
#: ``(profkit.label, profkit.op)`` series of ``profkit.op.self_time`` in all
MAX_OP_SERIES = 1800
OTHER = "other"
#: labels as given (raw, or cleaned and cut) remembered: a few per recorded label; past it a
#: label is cleaned again at each drain (off the request path), never remembered
_MAX_KEYS = 4 * MAX_LABELS


class SeriesBounds:
    """A provider's labels and op series: attributes made once, looked up lock-free."""

    def __init__(self) -> None:
        self._lock = renewed_at_fork(self)  # only where a new attribute set is made
        self._labels: dict[tuple[str, int], dict[str, str]] = {}  # by the label as given
        self._values: dict[str, dict[str, str]] = {}  # by the label as recorded
        self._ops: dict[str, dict[str, dict[str, str]]] = {}
        self._named = 0  # op series with an op's own name (not a label's "other")

    def label(self, label: str, limit: int) -> dict[str, str]:
        """``label``'s ``profkit.label`` attributes (``other``'s past ``MAX_LABELS``): the
        label as spans carry it (:func:`profkit._text.clean`, cut at ``limit``), whether it
        comes raw (a call's duration) or cleaned already (its op rows), so both instruments
        share one series and no string the encoders refuse leaves (a lone surrogate fails a
        whole Prometheus scrape)."""
        key = (label, limit)  # (sessions on one provider may cut labels differently)
        attrs = self._labels.get(key)
        if attrs is not None:
            return attrs
        with self._lock:
            attrs = self._labels.get(key)
            if attrs is None:
                value = clean(label, limit)
                attrs = self._values.get(value)
                if attrs is None:
                    if len(self._values) >= MAX_LABELS:
                        value = OTHER
                    attrs = self._values.setdefault(value, {"profkit.label": value})
                if len(self._labels) < _MAX_KEYS:  # (labels from user input: bounded too)
                    self._labels[key] = attrs
            return attrs

    def op(self, label: str, op: str) -> dict[str, str]:
        """The ``profkit.op.self_time`` attributes of ``op`` under ``label`` (a bounded
        label, as :meth:`label` gives it), within the per-label and total bounds."""
        ops = self._ops.get(label)
        attrs = ops.get(op) if ops is not None else None
        if attrs is not None:
            return attrs
        with self._lock:
            ops = self._ops.setdefault(label, {})
            attrs = ops.get(op)
            if attrs is not None:
                return attrs
            named = len(ops) - (OTHER in ops)
            if op == OTHER or named >= MAX_OPS or self._named >= _named_limit():
                op = OTHER  # the label's own other series: one per label, always room
                attrs = ops.get(OTHER)
                if attrs is None:
                    attrs = ops[OTHER] = {"profkit.label": label, "profkit.op": OTHER}
                return attrs
            attrs = ops[op] = {"profkit.label": label, "profkit.op": op}
            self._named += 1
            return attrs


def _named_limit() -> int:
    """Op series with an op's own name, in all: what ``MAX_OP_SERIES`` leaves once every
    label (``MAX_LABELS`` and ``other``) has room for its ``other`` series."""
    return MAX_OP_SERIES - MAX_LABELS - 1
