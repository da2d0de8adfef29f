"""The default session that ``profkit.configure()`` installs, and the module-level API."""

from __future__ import annotations

import contextlib
import enum
import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from . import _errors
from ._capture import foreign as _foreign
from ._capture import hooks as _hooks
from ._capture import keeper as _keeper
from ._capture.window import started_before_fork
from ._config import Config, build_config
from ._deadline import Deadline, timeout_s
from ._label.owner import release_here
from ._label.scope import GLOBAL
from ._sampling import check_trigger
from ._session import Session
from ._stats import Stats, StatsSnapshot
from ._targeting import signals as _signals
from .exporters._counters import DEFAULT

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

    from .exporters import Exporter

__all__ = [
    "configure",
    "force_flush",
    "get_config",
    "get_session",
    "install",
    "shutdown",
    "stats",
    "trigger",
]

#: re-entrant: a signal handler's configure(), force_flush() or shutdown() may land while its
#: thread holds it (its sections are short and leave the state whole at every step)
_configure_lock = threading.RLock()
#: held while a session starts and is swapped in, and while shutdown() takes the hooks out (no
#: shutdown() takes out a starting session's hooks); reentrant for a signal handler's calls
_lifecycle = threading.RLock()


class _Last:
    """The most recently shut-down session, so stats() still reports its final counters."""

    session: Session | None = None


_last = _Last()
#: sessions taken out of the global slot (replaced, or being shut down) whose shutdown has
#: not answered a caller yet: force_flush() and shutdown() wait for them and answer for them
_closing: list[Session] = []
#: the most kept there (the oldest are let go first: their losses were counted and logged)
_MAX_CLOSING = 16
_RETIRE_TIMEOUT = 5.0
#: seconds the exit flush may take (before the atexit hooks), and the exit shutdown after it
_EXIT_FLUSH_S = 2.0


class _Unset(enum.Enum):
    """The default of every ``configure()`` parameter: "not given", so env vars may fill it."""

    UNSET = "UNSET"

    def __repr__(self) -> str:
        return "<not given>"


UNSET = _Unset.UNSET


def configure(
    *,
    enabled: bool | _Unset = UNSET,
    sample_every: int | _Unset | None = UNSET,
    sample_rate: float | _Unset | None = UNSET,
    cold_calls: int | _Unset = UNSET,
    max_per_minute: float | _Unset | None = UNSET,
    max_overhead: float | _Unset | None = UNSET,
    capture_slow: bool | _Unset = UNSET,
    slow_ms: float | _Unset | None = UNSET,
    baggage_trigger: bool | _Unset = UNSET,
    trigger_signal: str | _Unset | None = UNSET,
    window: int | _Unset = UNSET,
    warmup: int | _Unset = UNSET,
    activities: str | _Unset = UNSET,
    record_shapes: bool | _Unset = UNSET,
    profile_memory: bool | _Unset = UNSET,
    with_flops: bool | _Unset = UNSET,
    with_stack: bool | _Unset = UNSET,
    all_threads: bool | _Unset = UNSET,
    resident: bool | _Unset = UNSET,
    top_k: int | _Unset = UNSET,
    max_window_s: float | _Unset = UNSET,
    max_events: int | _Unset = UNSET,
    queue_size: int | _Unset = UNSET,
    export_timeout: float | _Unset = UNSET,
    exporters: Sequence[str] | str | _Unset = UNSET,
    trace_dir: str | os.PathLike[str] | _Unset | None = UNSET,
    trace_max_files: int | _Unset = UNSET,
    trace_max_bytes: int | _Unset = UNSET,
    trace_gzip: bool | _Unset = UNSET,
    max_attribute_length: int | _Unset = UNSET,
    max_attributes: int | _Unset = UNSET,
    launch_bound_op_us: float | _Unset = UNSET,
    launch_bound_min_ops: int | _Unset = UNSET,
    input_bound_share: float | _Unset = UNSET,
    compute_bound_top2_share: float | _Unset = UNSET,
    tracer_provider: TracerProvider | _Unset | None = UNSET,
    metrics: bool | _Unset = UNSET,
    meter_provider: MeterProvider | _Unset | None = UNSET,
    logger: Any = UNSET,
    extra_exporters: Sequence[Exporter] | _Unset = UNSET,
    **unknown: NoReturn,
) -> Config:
    """Install (or replace) the global session; settings not given come from ``PROFKIT_*``.

    Every parameter is a field of :class:`profkit.Config` (its docstring and the
    Configuration page say what each one does); one left out is read from its ``PROFKIT_*``
    environment variable, else takes the field's default.

    Returns:
        The settings in effect (also what :func:`get_config` returns).

    Raises:
        ValueError: a setting is unknown or out of range; the message names it.
    """
    passed = dict(locals())  # first: the parameters and nothing else
    extra = passed.pop("unknown")
    given = {name: value for name, value in passed.items() if value is not UNSET}
    config = build_config({**given, **extra})
    session = Session(config)
    old = install(session, closing=True)
    if old is not None:
        retire(old)
    return config


def install(session: Session | None, closing: bool = False) -> Session | None:
    """Make ``session`` the global one (started first); returns the one it replaced.

    Where a session starts, its hooks are installed: the exit flush (ahead of every
    ``atexit`` hook, a TracerProvider's own shutdown included), the exit shutdown and the
    fork reset (here), torch's profiler hooks (``Session.start``) and the trigger signal (on the
    caller's thread: Python installs handlers on the main thread only), which also puts back
    what an earlier ``trigger_signal`` replaced. ``None`` takes the signal handler back.
    ``closing``: the one replaced is being shut down (``configure()``, ``shutdown()``): it is
    kept in ``_closing`` from the same instant, so no flush misses it.
    """
    with _lifecycle:  # one configure() or shutdown() changes the process's hooks at a time
        if session is not None:
            _hooks.at_exit(_at_exit)
            _hooks.before_exit(_before_exit)
            _hooks.at_fork_in_child("global", _after_fork_in_child)
            session.start()
        try:
            return _swap(session, closing)
        finally:
            if session is not None:
                signal_name = session.config.trigger_signal if session.config.enabled else None
                _signals.apply(signal_name, session, session.stats)
            else:
                _signals.apply(None, None, Stats())


def _swap(session: Session | None, closing: bool) -> Session | None:
    with _configure_lock:
        old: Session | None = GLOBAL.session
        GLOBAL.session = session
        if closing and old is not None:
            _closing.append(old)
            del _closing[:-_MAX_CLOSING]
        if session is not None:
            DEFAULT.counters = session.stats
        elif old is not None:
            # stats() keeps reporting the shut-down session: OTLP failures of its spans,
            # during its shutdown's flush or later, are counted there too
            _last.session = old
            DEFAULT.counters = old.stats
    return old


def retire(old: Session) -> None:
    """Stop a replaced session without holding up the caller.

    An idle window of it on this thread closes now (and is exported); one in flight closes
    when its call ends, one idle on another thread at that thread's next root call; the
    old session is flushed and shut down on a background thread.
    """
    with _errors.guard(old.stats, "retire"):
        old.close_idle_window()
    threading.Thread(target=_retire, args=(old,), name="profkit-retire", daemon=True).start()


def _retire(old: Session) -> None:
    """The retire thread: shut ``old`` down; a False answer waits for the next flush's."""
    old.shutdown(_RETIRE_TIMEOUT, answering=False)
    _answered()


def _answered() -> None:
    """Let go of the closing sessions whose answer was told (or was True), one by one (an
    append by a handler's configure() meanwhile is kept)."""
    with _configure_lock:
        for session in [s for s in _closing if s.answered]:
            with contextlib.suppress(ValueError):
                _closing.remove(session)


def _answer_for_closing(deadline: Deadline, answering: bool = True, run: bool = False) -> bool:
    """Every closing session's shutdown answer, waited for until ``deadline``; True when each
    said True. ``run`` (``shutdown()``, the exit hooks): a shutdown not started yet, or cut
    short, is run here; else (a flush) only waited for: a short flush must not become a
    short shutdown of a replaced session, dropping what its retire thread would export."""
    with _configure_lock:
        closing = list(_closing)
    answers = []
    for s in closing:
        left = deadline.left()
        answer = (
            s.shutdown(left, answering=answering) if run else s.shutdown_answer(left, answering)
        )
        if not answer and s.answered and s is not _last.session:  # (stats() shows not it)
            _errors.log.warning(
                "profkit: a replaced session could not export every sampled call: %s",
                dict(s.stats.snapshot()["dropped_reasons"]) or "its shutdown timed out",
            )
        answers.append(answer)
    _answered()
    return all(answers)


def get_session() -> Session | None:
    """The global session, or None before ``configure()`` (internal: tests and helpers)."""
    session: Session | None = GLOBAL.session
    return session


def get_config() -> Config | None:
    """The global session's settings, or None before ``configure()``."""
    session = get_session()
    return session.config if session is not None else None


def trigger(n: int = 1, *, label: str | None = None) -> int:
    """Profile the next ``n`` root calls whatever the sampler says; how many were added (0
    before ``configure()``, after ``shutdown()`` or with ``enabled=False``: nothing to
    profile them).

    With ``label``, the next ``n`` root calls of that label only (others are not counted).
    At most 1000 triggers are pending at once, any label and per label together: a trigger
    beyond that keeps the 1000, adds fewer (the return value says how many) and does not
    raise.

    Raises:
        ValueError: ``n`` is not an int >= 1, or ``label`` is not a str (with a session or
            without one).
    """
    check_trigger(n, label)
    session = get_session()
    if session is None or not session.config.enabled:  # (enabled=False: calls run plain)
        return 0
    return session.trigger(n, label)


def stats() -> StatsSnapshot:
    """Counters of the global session.

    After ``shutdown()`` they stay those of the session that was shut down (its final
    figures) until the next ``configure()``; before any ``configure()`` they are all zero.
    """
    session = get_session() or _last.session
    return (session.stats if session is not None else Stats()).snapshot()


def force_flush(timeout: float | None = 5.0) -> bool:
    """Export everything sampled so far; True when it all went out within ``timeout`` s
    (None: however long it takes; a timeout that is not a number raises ValueError)."""
    return _flush(timeout_s(timeout), True)


def flush_ahead(timeout: float) -> bool:
    """:func:`force_flush` whose answer is left to the next ``force_flush()`` or ``shutdown()``
    (the FastAPI integration's, run ahead of the app's own shutdown code, which then asks)."""
    return _flush(timeout, False)


def write_off(reason: str, grace_s: float) -> int:
    """Count what the global session and any closing one did not export yet as dropped."""
    with _configure_lock:
        sessions = [s for s in (get_session(), *_closing) if s is not None]
    return sum(s.pipeline.write_off(reason, Deadline(grace_s)) for s in sessions)


def close_idle_here() -> None:
    """Close the window waiting on this thread for more calls (``window`` > 1), of the global
    session or one still closing, so a flush on another thread exports it (FastAPI's: its
    flush runs in the thread pool, the window waits on the event loop's thread)."""
    with _configure_lock:
        sessions = [s for s in (get_session(), *_closing) if s is not None]
    for session in sessions:
        session.close_idle_window()


def _flush(seconds: float, answering: bool) -> bool:
    release_here()  # a call left behind by a scope that never exits: exported now
    deadline = Deadline(seconds)
    session = get_session()
    flushed = True if session is None else session.force_flush(seconds, answering)
    return _answer_for_closing(deadline, answering) and flushed


def shutdown(timeout: float | None = 5.0) -> bool:
    """Flush and stop the global session; later calls run unprofiled. True when all exported.

    Puts back the signal handler that ``trigger_signal`` replaced. ``timeout`` as for
    :func:`force_flush`, checked before anything is stopped.
    """
    deadline = Deadline(timeout_s(timeout))
    release_here()  # a call left behind by a scope that never exits: exported now
    install(None, closing=True)
    flushed = _answer_for_closing(deadline, run=True)  # this session's, and any still closing
    with _lifecycle:  # (a configure() that started meanwhile has its session in by now)
        if get_session() is None:  # the last session: profkit's hooks come out of the process
            _foreign.remove_hooks()
            if not _foreign.window_held():  # (else the exit still has a window to stop)
                _hooks.cancel_at_exit(_at_exit)
            _hooks.cancel_at_exit(_before_exit)
    return flushed


def forget() -> None:
    """Drop the shut-down session whose final counters ``stats()`` still reports."""
    with _configure_lock:
        _last.session = None
        if GLOBAL.session is None:
            DEFAULT.counters = None


#: the session and its sampled calls when the exit flush last ran, if it left no window open:
#: run again once the non-daemon threads ended, it is skipped if they sampled nothing since
_exit_flushed: list[tuple[Session, int]] = []


def _before_exit() -> None:
    """As the interpreter begins to exit, and again once the non-daemon threads have ended:
    export what is queued while the span exporters and TracerProviders still run (their own
    exit hooks shut them down later)."""
    session = get_session()
    try:
        if session is not None:
            seen = (session, session.stats.snapshot()["sampled"])
            if seen in _exit_flushed:
                return  # nothing sampled since it last ran (a hung exporter: no 2 s more)
            session.close_idle_window()
            session.force_flush(_EXIT_FLUSH_S)
            _exit_flushed[:] = [] if _foreign.window_held() else [seen]
        _answer_for_closing(Deadline(_EXIT_FLUSH_S), run=True)  # (replaced, still exporting)
    except Exception as exc:  # never turn interpreter exit into a traceback
        _errors.log.debug("profkit: flush at exit failed: %r", exc)


def _at_exit() -> None:
    session = get_session()
    try:
        if session is not None:
            session.shutdown(2.0)
        _answer_for_closing(Deadline(2.0), run=True)
    except Exception as exc:  # never turn interpreter exit into a traceback
        _errors.log.debug("profkit: shutdown at exit failed: %r", exc)
    try:
        _keeper.stop_left_at_exit()
    except Exception as exc:
        _errors.log.debug("profkit: stopping a leftover profiler at exit failed: %r", exc)
    if started_before_fork() and not _hooks.native_exit_armed():
        _errors.log.warning(
            "profkit: this process was forked after a torch profiler ran in its parent; its exit "
            "may hang in kineto's teardown (ConfigLoader). Configure profkit after fork (gunicorn:"
            " post_fork hook) or end forked children with os._exit (reliability docs, 'fork()')."
        )


def _after_fork_in_child() -> None:
    """Fresh locks (another thread's configure() held them at fork: the child would wait for
    ever), no closing sessions (the parent's to export), the session's counters re-init."""
    global _configure_lock, _lifecycle
    _configure_lock, _lifecycle = threading.RLock(), threading.RLock()
    _closing.clear()
    session = get_session()
    if session is not None:
        session.at_fork_reinit()
