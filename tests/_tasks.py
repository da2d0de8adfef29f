"""Run a call as another task on this thread would: a root call, in the caller's context."""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import TypeVar

import profkit._label.scope

__all__ = ["as_another_task"]

T = TypeVar("T")


def as_another_task(fn: Callable[[], T]) -> T:
    """``fn`` as another task on this thread would run it: the caller's context (its OTel
    context, its baggage) without the caller's profkit scope, so its profkit call is a root."""

    def run() -> T:
        profkit._label.scope.FRAME.set(None)
        return fn()

    return contextvars.copy_context().run(run)
