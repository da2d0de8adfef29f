"""The values of the scope's frame (:mod:`profkit._label.scope`): where the current context
stands, and the default session the hot path reads."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from .._records import CallRecord

__all__ = ["FRAME", "GLOBAL", "OFF", "Active"]


class _Off:
    __slots__ = ()
    __repr__ = lambda self: "<profkit unsampled>"  # noqa: E731


#: the frame value inside an unsampled root call
OFF: Any = _Off()


class Active:
    """Frame value inside a sampled call: the call, the innermost scope and the frame before.

    It is also what ``scope.enter`` returns for a sampled scope: ``scope.exit_`` closes that
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


class _Global:
    """Holder of the default session, so the hot path reads one attribute."""

    __slots__ = ("session",)

    def __init__(self) -> None:
        self.session: Any = None


GLOBAL = _Global()
