"""Diagnosis thresholds, and how far a call's figures are from the nearest one (confidence).

Pure, like :mod:`profkit._summary.diagnosis`: no torch. A verdict's *margin*, in [0, 1], is how
far the figures are from the nearest threshold that would change it, relative to that
threshold's room (the deciding figure past its own threshold, and every rule checked before
it short of holding; for balanced, every rule short of holding). Under 0.1 the confidence is
"low" (a borderline call: the same code sampled again may read otherwise), under 0.25
"medium", else "high".
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Protocol

__all__ = [
    "HALF",
    "LAUNCH_SHARE",
    "Confidence",
    "Figures",
    "ThresholdSource",
    "Thresholds",
    "Verdict",
    "confidence",
    "margin",
]

Verdict = Literal["input-bound", "launch-bound", "compute-bound", "balanced", "no-ops"]
Confidence = Literal["low", "medium", "high"]
Figures = dict[str, float]

HALF = 0.5
"""On a device, an input share of a half is enough when the device is idle long enough."""

LAUNCH_SHARE = 0.5
"""Launch share (tiny ops and the glue between ops, over the time in and between ops) at or
above which a call with many tiny ops is launch-bound: they take most of that time."""

_LOW, _MEDIUM = 0.1, 0.25
"""Margins under which a verdict's confidence is "low", then "medium"."""


class ThresholdSource(Protocol):
    """Anything carrying the four diagnosis settings (a :class:`profkit._config.Config`)."""

    @property
    def launch_bound_op_us(self) -> float: ...

    @property
    def launch_bound_min_ops(self) -> int: ...

    @property
    def input_bound_share(self) -> float: ...

    @property
    def compute_bound_top2_share(self) -> float: ...


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """The diagnosis thresholds; names and defaults match the ``Config`` fields.

    Values are not validated here: :mod:`profkit._config` validates them.
    """

    launch_bound_op_us: float = 20.0
    launch_bound_min_ops: int = 200
    input_bound_share: float = 0.5
    compute_bound_top2_share: float = 0.6

    @classmethod
    def from_config(cls, config: ThresholdSource) -> Thresholds:
        """Read the four thresholds off ``config``.

        Args:
            config: Any object with the four threshold attributes, such as a ``Config``.

        Returns:
            The thresholds, copied from ``config``.
        """
        return cls(
            launch_bound_op_us=float(config.launch_bound_op_us),
            launch_bound_min_ops=int(config.launch_bound_min_ops),
            input_bound_share=float(config.input_bound_share),
            compute_bound_top2_share=float(config.compute_bound_top2_share),
        )


def _past(value: float, threshold: float) -> float:
    """How far ``value`` is past ``threshold`` (a rule that holds), over the room above it."""
    room = 1.0 - threshold
    return 1.0 if room <= 0.0 else min(1.0, max(0.0, (value - threshold) / room))


def _short(value: float, threshold: float) -> float:
    """How far ``value`` is short of ``threshold`` (a rule that fails), relative to it."""
    return 1.0 if threshold <= 0.0 else min(1.0, max(0.0, (threshold - value) / threshold))


def _input_margin(figures: Figures, th: Thresholds, holds: bool) -> float:
    """Rule 1's distance from flipping: past its thresholds if it holds, else short of them."""
    share = figures["input_share"]
    needed = th.input_bound_share
    checks = [(share, needed)]
    if "device_idle_share" in figures:
        checks = [(share, min(needed, HALF)), (figures["device_idle_share"], needed)]
    if holds:
        return min(_past(v, t) for v, t in checks)
    return max(_short(v, t) for v, t in checks)


def _launch_margin(figures: Figures, th: Thresholds, holds: bool) -> float:
    """Rule 2's distance from flipping (many ops, a small median, a launch share of most)."""
    ops, median = figures["op_count"], figures["median_op_us"]
    min_ops, op_us = float(th.launch_bound_min_ops), th.launch_bound_op_us
    share = figures["launch_share"]
    if holds:
        more = min(1.0, (ops - min_ops) / min_ops) if min_ops > 0 else 1.0
        faster = 1.0 if op_us <= 0 else min(1.0, max(0.0, (op_us - median) / op_us))
        return min(more, faster, _past(share, LAUNCH_SHARE))
    fewer = _short(ops, min_ops)
    slower = 1.0 if op_us <= 0 else min(1.0, max(0.0, (median - op_us) / op_us))
    return max(fewer, slower, _short(share, LAUNCH_SHARE))


def margin(verdict: Verdict, figures: Figures, th: Thresholds) -> float:
    """How far the figures are from the nearest threshold that would change ``verdict``."""
    if verdict == "no-ops" or figures["wall_us"] <= 0.0:
        return 1.0
    margins = [_input_margin(figures, th, verdict == "input-bound")]
    if verdict != "input-bound":
        margins.append(_launch_margin(figures, th, verdict == "launch-bound"))
    if verdict in ("compute-bound", "balanced"):
        top2, needed = figures["top2_share"], th.compute_bound_top2_share
        compute = verdict == "compute-bound"
        margins.append(_past(top2, needed) if compute else _short(top2, needed))
    return min(margins)


def confidence(margin: float) -> Confidence:
    if margin < _LOW:
        return "low"
    return "medium" if margin < _MEDIUM else "high"
