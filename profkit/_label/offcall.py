"""The frame of an unsampled coroutine root (:class:`OffCall`), beside
:mod:`profkit._label.scope`'s ``OFF``, which the other unsampled roots share."""

from __future__ import annotations

from typing import ClassVar

__all__ = ["OffCall"]


class OffCall(list):  # type: ignore[type-arg]  # (a list: made and marked in C, no __init__)
    """The frame of an unsampled coroutine root (``profkit._label.drivers.async_call``'s; the
    other unsampled roots share ``OFF``): empty while the call runs, one item once it ended.

    Nested scopes record nothing in it, as in ``OFF``. The tasks the call creates copy it
    with their context (a batcher or worker task started by a request): once the call has
    ended (``done``), their scopes are root calls again, as after a sampled call, rather
    than nested for ever in a call that is gone.
    """

    __slots__ = ()
    stopped: ClassVar[bool] = True  # (what a nested scope reads of ``frame.call``)
    policy: ClassVar[None] = None  # nothing asked for it to be profiled (batch_member)

    @property
    def call(self) -> OffCall:
        return self

    @property
    def done(self) -> bool:
        return bool(self)

    def __repr__(self) -> str:
        return f"<profkit unsampled call done={self.done}>"
