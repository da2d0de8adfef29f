"""Module-level API: the default session that ``profkit.configure()`` installs."""

from __future__ import annotations

import atexit
import os
import threading
from typing import Any

from . import _errors
from ._config import Config, build_config
from ._errors import Stats
from ._scope import GLOBAL
from ._session import Session, stop_left_at_exit
from ._window import started_before_fork

__all__ = [
    "configure",
    "force_flush",
    "get_session",
    "shutdown",
    "stats",
    "trigger",
]

_configure_lock = threading.Lock()


class _Last:
    """The most recently shut-down session, so stats() still reports its final counters."""

    session: Session | None = None


_last = _Last()
_RETIRE_TIMEOUT = 5.0


def configure(**settings: Any) -> Session:
    """Install (or replace) the global session; settings not given come from ``PROFKIT_*``.

    Raises:
        ValueError: a setting is unknown or out of range; the message names it.
    """
    config = build_config(settings)
    return install(Session(config))


def install(session: Session) -> Session:
    """Make ``session`` the global one: warm it up, then retire the previous one."""
    session.start()
    with _configure_lock:
        old, GLOBAL.session = GLOBAL.session, session
    if old is not None:
        # an idle window of the old session on this thread closes now (it is exported); one in
        # flight closes when its call ends, one idle on another thread at that thread's next
        # root call; the old session is flushed off-thread
        with _errors.guard(old.stats, "retire"):
            old.release_idle_window()
        threading.Thread(
            target=old.shutdown, args=(_RETIRE_TIMEOUT,), name="profkit-retire", daemon=True
        ).start()
    return session


def get_session() -> Session | None:
    """The global session, or None before ``configure()``."""
    session: Session | None = GLOBAL.session
    return session


def get_config() -> Config | None:
    """The global session's settings, or None before ``configure()``."""
    session = get_session()
    return session.config if session is not None else None


def trigger(n: int = 1) -> None:
    """Profile the next ``n`` root calls whatever the sampler says (no-op before configure)."""
    session = get_session()
    if session is not None:
        session.trigger(n)


def stats() -> dict[str, Any]:
    """Counters of the global session.

    After ``shutdown()`` they stay those of the session that was shut down (its final
    figures) until the next ``configure()``; before any ``configure()`` they are all zero.
    """
    session = get_session() or _last.session
    return (session.stats if session is not None else Stats()).snapshot()


def force_flush(timeout: float = 5.0) -> bool:
    """Export everything sampled so far; True when it all went out within ``timeout`` s."""
    session = get_session()
    return True if session is None else session.force_flush(timeout)


def shutdown(timeout: float = 5.0) -> bool:
    """Flush and stop the global session; later calls run unprofiled. True when all exported."""
    with _configure_lock:
        session, GLOBAL.session = GLOBAL.session, None
        if session is not None:
            _last.session = session
    return True if session is None else session.shutdown(timeout)


def forget() -> None:
    """Drop the shut-down session whose final counters ``stats()`` still reports."""
    _last.session = None


def _at_exit() -> None:
    session = get_session()
    if session is not None:
        try:
            session.shutdown(2.0)
        except Exception as exc:  # never turn interpreter exit into a traceback
            _errors.log.debug("profkit: shutdown at exit failed: %r", exc)
    try:
        stop_left_at_exit()
    except Exception as exc:
        _errors.log.debug("profkit: stopping a leftover profiler at exit failed: %r", exc)
    if started_before_fork():
        _errors.log.warning(
            "profkit: this process was forked after a torch profiler ran in its parent; its "
            "exit may hang in torch's kineto teardown (ConfigLoader). Configure profkit after "
            "fork (gunicorn: post_fork hook) or end forked children with os._exit; see "
            "profkit's reliability docs, 'fork()'."
        )


def _after_fork_in_child() -> None:
    session = get_session()
    if session is not None:
        session.after_fork()


atexit.register(_at_exit)
os.register_at_fork(after_in_child=_after_fork_in_child)
