"""A root call's decision (:meth:`profkit._capture.decide.Decider.decide`): its kind, and the
one shape every decision has."""

from __future__ import annotations

import enum
from typing import Any, TypeAlias

__all__ = ["CONTROLLED", "OFF", "PROFILED", "STAGED", "TIMED", "Decision", "Kind"]


class Kind(enum.Enum):
    """What a root call does: nothing, get timed (``capture_slow``), or run profiled."""

    OFF = "off"
    TIMED = "timed"
    STAGED = "staged"
    CONTROLLED = "control"
    PROFILED = "profiled"


#: ``(Kind.OFF, None)``, ``(Kind.TIMED, start perf_counter_ns)``, ``(Kind.STAGED, Stages)``
#: (``capture_slow``: timed, its regions too), ``(Kind.CONTROLLED, Control)`` or
#: ``(Kind.PROFILED, CallRecord)``: a tuple, so that the off-sample path
#: returns one shared constant and a timed call builds no object of its own
Decision: TypeAlias = tuple[Kind, Any]
OFF: Decision = (Kind.OFF, None)
TIMED = Kind.TIMED
STAGED = Kind.STAGED
CONTROLLED = Kind.CONTROLLED
PROFILED = Kind.PROFILED
