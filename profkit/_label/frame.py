"""The context variable that says where the current context stands, and the frame value
inside a sampled call (:mod:`profkit._label.scope` reads and sets them)."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from .._records import CallRecord

__all__ = ["FRAME", "Active"]


class Active:
    """Frame value inside a sampled call: the call, the innermost scope and the frame before.

    It is also what :func:`enter` returns for a sampled scope: :func:`exit_` closes that
    scope, restores ``parent`` and, for the root (``session`` set), ends the root call.
    """

    __slots__ = ("call", "owner", "parent", "scope", "session")

    def __init__(self, call: CallRecord, scope: int, parent: Active | None, session: Any) -> None:
        self.call = call
        self.scope = scope
        self.parent = parent
        self.session = session
        #: (frame, thread) that entered a region's or batch's root: :mod:`.owner`
        self.owner: tuple[Any, int] | None = parent.owner if parent is not None else None


FRAME: ContextVar[Any] = ContextVar("profkit_frame", default=None)
