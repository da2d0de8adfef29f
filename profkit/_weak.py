"""Weak references that run no Python code when their object dies.

``weakref.WeakSet``, ``WeakKeyDictionary`` and ``WeakMethod`` each register a Python
callback on their references. It runs when the object dies: in a garbage collection, on
whichever thread's allocation triggered it, a request thread too. A signal handler's
exception (a request timeout) landing in that callback cannot reach the application: Python
prints it ("Exception ignored in: <function WeakMethod.__new__.<locals>._cb ...>") and goes
on. A storm of 1,500 SIGALRM timeouts lost one there (docs/reliability.md, "Signals and the
counters"). The references here have no callback; dead entries are pruned when one is added.
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from typing import Any, Generic, TypeVar

__all__ = ["WeakIdMap", "WeakIds", "at_fork_in_child_weakly", "renewed_at_fork"]

V = TypeVar("V")


class WeakIdMap(Generic[V]):
    """A mapping from objects, held weakly by identity, to values (held strongly)."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: dict[int, tuple[weakref.ref[Any], V]] = {}

    def get(self, obj: Any) -> V | None:
        item = self._items.get(id(obj))
        return item[1] if item is not None and item[0]() is obj else None

    def set(self, obj: Any, value: V) -> None:
        """Map ``obj`` (weakly referenceable, else TypeError) to ``value``."""
        ref = weakref.ref(obj)
        live = {k: v for k, v in self._items.items() if v[0]() is not None}
        live[id(obj)] = (ref, value)
        self._items = live  # one assignment: a reader sees the old dict or the new one


class WeakIds:
    """A set of objects held weakly by identity."""

    __slots__ = ("_map",)

    def __init__(self) -> None:
        self._map: WeakIdMap[bool] = WeakIdMap()

    def add(self, obj: Any) -> None:
        self._map.set(obj, True)

    def __contains__(self, obj: Any) -> bool:
        return self._map.get(obj) is not None


def at_fork_in_child_weakly(obj: Any, method: str) -> None:
    """In a forked child, call ``obj.<method>()`` if ``obj`` is still alive then."""
    os.register_at_fork(after_in_child=functools.partial(_call_alive, weakref.ref(obj), method))


def _call_alive(ref: weakref.ref[Any], method: str) -> None:
    obj = ref()
    if obj is not None:
        getattr(obj, method)()


def renewed_at_fork(obj: Any, attr: str = "_lock") -> threading.Lock:
    """A new lock for ``obj.<attr>``, replaced by another new one in each forked child (one
    another thread held at ``fork()`` would stay held there for ever: the child's exports,
    or whatever waits on it, would hang). Set it: ``self._lock = renewed_at_fork(self)``."""
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=functools.partial(_renew, weakref.ref(obj), attr))
    return threading.Lock()


def _renew(ref: weakref.ref[Any], attr: str) -> None:
    obj = ref()
    if obj is not None:
        setattr(obj, attr, threading.Lock())
