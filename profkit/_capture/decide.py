"""The one decision: whether a root call runs under the profiler, and why not.

:meth:`Decider.decide` is the only place that weighs a root call. It returns a
:data:`Decision`, one of three shapes, and counts a refusal once, under its own counter.

Precedence (also in docs/concepts.md and docs/reliability.md, which name the tests):

1. A window this thread holds is checked first (the checkpoint: cut short past
   ``max_window_s``, closed when done). A call in an unsampled trace never joins it
   (``skipped_unsampled_trace``); a call may join one with room: a ``window`` > 1 window as
   ``WINDOW``; a speculative one as ``TRIGGER`` (a pending trigger), ``BAGGAGE`` or
   ``SAMPLER`` (the label's 1 in N, or the ratio, picks it: a pick is not lost to a
   speculation; either if the rate cap and the budget allow), or ``SPECULATIVE`` (a
   generator never: its first yield would cut the window short; a generator's pick is then
   ``skipped_busy``).
2. A call in a trace that was not sampled: ``skipped_unsampled_trace`` (its spans would never
   be exported), before anything below is spent.

   Then the label's own answer for this call is read (``sample_every`` and ``cold_calls``
   count each label's root calls, :class:`profkit._sampling.LabelPicks`): picked, not, or
   *cold* (one of the label's first ``cold_calls``; none at ``sample_every=1`` or
   ``sample_rate=1.0``).
3. A pending ``trigger()`` (or trigger signal), while no window holds the slot and the queue
   has room: ``TRIGGER``. Not rate-capped nor budgeted; it waits for a free slot. A cold
   call is marked so (``CallRecord.cold``: ``profkit.cold=true``).
4. Baggage ``profkit.profile=1`` (``baggage_trigger``): ``BAGGAGE`` (cold ones marked); else
   the label's answer picks it (never a cold call): ``SAMPLER``. Either must then pass, in
   order: the export queue has room (``skipped_backlog``), the CPU budget
   (``skipped_budget``), the slot is free (``skipped_busy``), nobody else's profiler runs
   or starts (``skipped_foreign``), the rate cap has a token (``skipped_rate_limit``).
   A cold call nobody asked for stops here: ``OFF`` (neither timed nor speculative: it is
   not the label's baseline).
5. A control call (:class:`Controls`: after a pick under ``sample_every``, 1 in 4 picks once
   a baseline holds 5; at N=1 or a ratio, a call refused after a sampled one), a plain sync
   root (not a coroutine's, generator's or batch's, nor on a running asyncio loop's thread):
   ``(CONTROLLED, Control)``, not profiled but timed on its thread's CPU clock, the label's
   baseline that its sampled calls' CPU time is charged against (:mod:`profkit._overhead`).
   Its wall-clock time goes where a ``TIMED`` call's goes.
6. ``capture_slow``: a speculative window (``SPECULATIVE``) when the label has a baseline,
   the queue has room and profkit is within the budget (``max_overhead``, else the default
   :data:`profkit._capture.gate.SPECULATION_BUDGET`), the slot is free and nobody else's
   profiler runs (refusals are not counted: nothing was sampled), else the call is
   ``STAGED``: timed with its regions, a stage record if it turns out slow
   (:mod:`profkit._targeting.stages`). No rate-cap token: a window that keeps a slow call
   spends one as it closes (``max_per_minute`` caps the profiles exported), one released
   unread spends none.
7. Otherwise ``OFF``.

With ``metrics`` every ``OFF`` above is ``(TIMED, t0)`` instead, the clock read where the
decision ends (``profkit.call.duration`` counts every root call): inline on the usual path,
with no frame of its own; with ``metrics`` off the usual path reads one attribute, as before.

A trigger or a rate-cap token is spent only once a window opens for the call; the
sampler's pick is the sampling point (a picked call refused is counted under its reason).

One root call in 256 has its decision timed on its thread's CPU clock; left unprofiled, it is
charged 256 times that to the overhead budget (:func:`_timed`, docs/performance.md).
"""

from __future__ import annotations

import collections
import time
from asyncio import _get_running_loop
from typing import Any

from opentelemetry.trace import SpanContext, TraceFlags

from .._compat import BAGGAGE_KEY, SPAN_KEY, otel_current
from .._config import Config
from .._export.pipeline import ExportPipeline
from .._overhead import clock_cost_ns
from .._records import CallRecord, Policy
from .._sampling import ASK, COLD, CONTROL, EveryN, LabelPicks, Sampler, TraceIdRatio, Triggered
from .._stats import Stats
from .._targeting.slow import LatencyBook, Speculation
from .._targeting.stages import StageRecorder, Stages
from .controls import Controls
from .gate import Gate
from .keeper import WindowKeeper, held_here
from .kinds import CONTROLLED, OFF, PROFILED, STAGED, TIMED, Decision, Kind
from .slot import SLOT

__all__ = [
    "CONTROLLED",
    "OFF",
    "PROFILED",
    "STAGED",
    "TIMED",
    "Controls",
    "Decider",
    "Decision",
    "Gate",
    "Kind",
    "asks_to_profile",
]

_SAMPLED = TraceFlags.SAMPLED
_YES = frozenset({"1", "true", "yes"})
#: the clock of a timed call (``TIMED``): ``perf_counter_ns``
_CLOCK = time.perf_counter_ns
#: one root call in ``_TIMED_EVERY`` (a power of two) left unprofiled has its decision timed
#: on its thread's CPU clock, each sample at most ``_TIMED_CAP_NS``, and is charged that many
#: times the median of the last ``_TIMED_KEPT`` samples (see :func:`_timed`)
_TIMED_EVERY, _TIMED_CAP_NS, _TIMED_KEPT = 256, 50_000, 9  # (decide's mask: a literal 255)
_thread_ns = time.thread_time_ns


def asks_to_profile(ctx: Any) -> bool:
    """Whether the OTel baggage in ``ctx`` holds ``profkit.profile`` = 1, true or yes.

    ``baggage.get_baggage("profkit.profile", ctx)`` without its three Python frames. W3C
    properties after the value (``1;ttl=30``, which OTel Java and Go send as metadata) are
    not the value: OTel Python's propagator keeps them in it, so they are cut off here.
    """
    bag = ctx.get(BAGGAGE_KEY)
    value = bag.get("profkit.profile") if isinstance(bag, dict) else None
    return isinstance(value, str) and value.partition(";")[0].strip().lower() in _YES


def make_sampler(config: Config) -> Sampler:
    if config.sample_rate is not None:
        return TraceIdRatio(config.sample_rate, cold=config.cold_calls)
    return EveryN(config.every or 100, cold=config.cold_calls)


class Decider:
    """One session's decision for each root call (see the module docstring)."""

    def __init__(
        self,
        config: Config,
        stats: Stats,
        pipeline: ExportPipeline,
        keeper: WindowKeeper,
        triggered: Triggered,
        book: LatencyBook | None,
        speculation: Speculation | None,
        time_all: bool = False,
    ) -> None:
        self._stats = stats
        self._pipeline = pipeline
        self._keeper = keeper
        self.triggered = triggered
        self._sampler = make_sampler(config)
        #: each label's answers (``sample_every`` and ``cold_calls`` count per label)
        self.picks = LabelPicks(self._sampler.picks)
        stats.shared_label_calls = self.picks.shared_calls
        #: read on every root call: one attribute each, not two
        self._roots, self._sample = stats.roots, self._sampler.decide
        self._unsampled = stats.unsampled_traces
        self._by_label, self._first = self.picks.by_label, self.picks.first
        self._baggage = config.baggage_trigger  # a plain attribute: one read when it is off
        self._book = book
        self._speculation = speculation
        #: what the timed decision's own clock reads cost (:func:`_timed` subtracts it),
        #: and the last timed decisions (each charge is their median)
        self.clock_ns = clock_cost_ns()
        self.timed_ns: collections.deque[int] = collections.deque(maxlen=_TIMED_KEPT)
        #: ``metrics``: the clock that times every root call left unprofiled (else None)
        self._clock: Any = _CLOCK if time_all else None
        #: what a call the sampler passed over gets: None, ``OFF`` (neither ``capture_slow``
        #: nor ``metrics``: one attribute read, as before either existed); ``_CLOCK``, timed
        #: (``metrics`` alone); else ``True``, speculated on (``capture_slow``)
        self._tail: Any = True if book is not None else self._clock
        gate = Gate(config, stats, pipeline)
        self._refused, self._spec_refused = gate.refused, gate.speculation_refused
        #: the control calls: each label's baseline, the labels due one (read: one attribute)
        self.controls = Controls(self._sampler)
        self.control_due = self.controls.due
        #: the sink of an unprofiled call's wall-clock time (the Session sets it: ``timed``)
        self.timed: Any = None
        #: ``capture_slow``: the stage records of calls left unprofiled (the Session sets it)
        self.staging: StageRecorder | None = None

    def decide(
        self,
        label: str,
        speculate: bool = True,
        sync: bool = True,
        counted: bool = False,
        asked: bool = False,
    ) -> Decision:
        """Count a root call of ``label`` and decide (``speculate=False``: a generator root,
        never timed nor speculative; ``sync=False``: a coroutine's or a generator's, whose
        thread's CPU time is not its own, never a control call nor timed for the budget;
        ``counted``: :func:`_timed`'s call, already counted; ``asked``: a batch one of whose
        requests asked for a profile, decided as a call whose baggage asks)."""
        # every off-sample call passes here: a C call, no lock, and one int operation
        if not counted and not next(self._roots) & 255:  # 1 in _TIMED_EVERY: a constant
            return _timed(self, label, speculate, sync, asked)
        otel = otel_current()  # empty (falsy) when no span is active: no lookup
        span: Any = otel.get(SPAN_KEY) if otel else None  # trace.get_current_span(), cheaper
        parent: SpanContext | None = span.get_span_context() if span is not None else None
        if SLOT.held is not None:
            win = held_here(self._keeper)
            if win is not None:
                return _join(self, win, label, parent, otel, speculate, asked, sync)
        # the sampled bit first: one int operation on the usual path (a sampled trace)
        if parent is not None and not parent.trace_flags & _SAMPLED and parent.is_valid:
            next(self._unsampled)  # lock-free, like the root count
            return OFF if self._clock is None else (TIMED, self._clock())
        # the label's answer for this call (its own 1 in N, or cold): a dict lookup, a next()
        pick = next(self._by_label.get(label) or self._first(label))
        if self.triggered.pending:
            call = self._triggered(label, parent, pick is COLD, speculate and sync)
            if call is not None:
                return (PROFILED, call)
        if asked or (self._baggage and otel and asks_to_profile(otel)):  # (empty: none)
            return self._open(Policy.BAGGAGE, parent, pick is COLD, speculate and sync)
        if pick is not False:  # the usual answer: one comparison
            if pick is True:
                return self._open(Policy.SAMPLER, parent, False, speculate and sync, label)
            if pick is ASK:
                if self._sample(parent.trace_id if parent and parent.is_valid else None):
                    return self._open(Policy.SAMPLER, parent, False, speculate and sync, label)
                if self.control_due and speculate and sync:
                    return self.controls.take_due(label, self.timed) or self._off()
            elif pick is COLD:  # not speculative, not the label's baseline (timed for metrics)
                return self._off()
            elif pick is CONTROL and speculate and sync:
                made = self.controls.make(label, self.timed)
                if made is not None:
                    return made
        tail = self._tail
        if tail is None:
            return OFF
        if tail is _CLOCK:  # metrics without capture_slow: timed from here, inline
            return (TIMED, tail())
        return self._speculate(label, parent, sync) if speculate else self._off()

    def _refused_call(self, label: str) -> Decision:
        """A picked call that gets no window: a control call if its label is due one."""
        return self.controls.take_due(label, self.timed) or self._off()

    def _off(self) -> Decision:
        """A call left unprofiled: ``OFF``, or timed from here with ``metrics`` (every root
        call's duration, whatever the reason it was not profiled)."""
        clock = self._clock
        return OFF if clock is None else (TIMED, clock())

    def _triggered(
        self, label: str, parent: SpanContext | None, cold: bool, sync: bool
    ) -> CallRecord | None:
        """A pending trigger for ``label``: a window, while the slot is free and the queue has
        room (a closure here, not in ``decide``: its cells would cost every root call)."""
        trig = self.triggered
        if not trig.applies(label) or SLOT.busy() or self._pipeline.full():
            return None
        call = self._keeper.open(Policy.TRIGGER, parent, spend=lambda: trig.take(label))
        if call is not None:
            call.cold = cold
            if sync and _get_running_loop() is None:
                call.cpu_start_ns = time.thread_time_ns()
        return call

    def refresh_after_fork(self) -> None:
        """The counters were made anew (a forked child): count into the new ones."""
        self._roots, self._unsampled = self._stats.roots, self._stats.unsampled_traces
        self._stats.shared_label_calls = self.picks.shared_calls

    def _open(
        self,
        policy: Policy,
        parent: SpanContext | None,
        cold: bool = False,
        sync: bool = False,
        label: str = "",
    ) -> Decision:
        """A sampled (or baggage-asked) call: the gates, then a window of its own (``sync``:
        a plain root, timed on its thread's CPU clock where no asyncio loop runs; refused,
        it may be its label's control call)."""
        refused = self._refused()
        if refused is not None:
            next(self._stats.refused[refused])
            return self._refused_call(label) if sync and self.control_due else self._off()
        call = self._keeper.open(policy, parent, sampler=self._sampler.description)
        if call is None:
            return self._refused_call(label) if sync and self.control_due else self._off()
        call.cold = cold
        if sync and _get_running_loop() is None:
            call.cpu_start_ns = time.thread_time_ns()
        return (PROFILED, call)

    def _speculate(self, label: str, parent: SpanContext | None, sync: bool = False) -> Decision:
        """capture_slow: a speculative window for this call, or else time it.

        A plain sync root (no asyncio loop on its thread) is timed on its thread's CPU clock
        too: a speculative one from its window's start, charged its CPU time beyond its
        label's baseline (what the profiler added: :meth:`Session._charge_own_cpu`); one of
        the unprofiled calls between windows is a control call, the baseline's (one call in
        four once it holds five: :meth:`Controls.make`), timed for the latency book too."""
        spec = self._speculation
        if spec is None:
            return OFF
        if spec.rest:
            spec.rest -= 1
            if sync:
                made = self.controls.make(label, self.timed)
                if made is not None:
                    return made
        elif SLOT.held is None and spec.want(label, self._spec_refused):
            call = self._keeper.open(Policy.SPECULATIVE, parent, speculative=spec.calls)
            if call is not None:
                if sync and _get_running_loop() is None:
                    call.cpu_start_ns = time.thread_time_ns()
                return (PROFILED, call)
            spec.refused()
        staging = self.staging
        if staging is not None:  # its regions timed too: a stage record if it is slow
            return (STAGED, Stages(staging, label, parent, time.perf_counter_ns()))
        return (TIMED, time.perf_counter_ns())


def _join(
    decider: Decider,
    win: Any,
    label: str,
    parent: SpanContext | None,
    otel: Any,
    speculate: bool,
    asked: bool,
    sync: bool = True,
) -> Decision:
    """Join the window this thread holds (it has room), or not (see rule 1): the decision of
    ``decider`` for a root call made while it is open (a generator's: neither ``speculate``
    nor ``sync``; a batch is never speculative, yet has no yield: its pick joins)."""
    if parent is not None and not parent.trace_flags & _SAMPLED and parent.is_valid:
        next(decider._stats.unsampled_traces)
        return decider._off()
    keeper = decider._keeper
    if not win.speculative:  # the window's later calls: not the sampler's, not counted
        return (PROFILED, keeper.join(win, Policy.WINDOW, parent))
    pick = next(decider._by_label.get(label) or decider._first(label))
    cold = pick is COLD
    if decider.triggered.take(label):
        return _joined(keeper.join(win, Policy.TRIGGER, parent), cold)
    baggage = asked or (decider._baggage and otel and asks_to_profile(otel))
    # the label's 1 in N (or the ratio) picks it: the sampler's sample, not a speculation
    trace_id = parent.trace_id if parent is not None and parent.is_valid else None
    picked = not baggage and (pick is True or (pick is ASK and decider._sample(trace_id)))
    if picked and not speculate and not sync:  # a generator: its first yield would cut
        # the window short, so the window of another task of its thread keeps the pick out
        busy = CallRecord.begin(Policy.SAMPLER, parent, decider._sampler.description)
        decider._stats.skip("skipped_busy", busy)
        return decider._off()
    if baggage or picked:
        refused = decider._refused()  # then a rate-cap token, spent only past the gate
        if refused is None and not keeper.spend_rate_token():
            refused = "skipped_rate_limit"
        if refused is not None:
            next(decider._stats.refused[refused])
            return decider._off()  # recorded by the window's profiler all the same, never read
        if picked:
            sampler = decider._sampler.description
            return (PROFILED, keeper.join(win, Policy.SAMPLER, parent, sampler))
        return _joined(keeper.join(win, Policy.BAGGAGE, parent), cold)
    if not speculate or cold:  # a generator: its first yield would cut the window short;
        return decider._off()  # a cold call is not judged against the label's warm calls
    return (PROFILED, keeper.join(win, Policy.SPECULATIVE, parent))


def _joined(call: CallRecord, cold: bool) -> Decision:
    call.cold = cold
    return (PROFILED, call)


def _timed(decider: Decider, label: str, speculate: bool, sync: bool, asked: bool) -> Decision:
    """One root call in ``_TIMED_EVERY``: its decision timed on this thread's CPU clock and,
    left unprofiled, charged for all of them (the budget's share of the calls it does not
    profile: a refused pick, an off-sample call; docs/performance.md)."""
    t0 = _thread_ns()
    decision = decider.decide(label, speculate, sync, True, asked)
    if decision[0] is not PROFILED:
        took = min(_thread_ns() - t0 - decider.clock_ns, _TIMED_CAP_NS)  # less the clock's
        samples = decider.timed_ns
        samples.append(max(0, took))
        # the median (a GC pass inside one is not typical); the least while fewer are known
        # than kept, and nothing before three are (their periods are charged with the
        # third): a new pool thread's first decisions run cold (~25 µs beside ~4 µs), and
        # 256 times one of them was most of what the gauge read in its first seconds
        if len(samples) < 3:
            return decision
        ordered = sorted(samples)
        typical = ordered[len(ordered) // 2 if len(ordered) == _TIMED_KEPT else 0]
        periods = 3 if len(samples) == 3 else 1
        decider._stats.cpu.charge_fixed(periods * typical * _TIMED_EVERY / 1e9)
    return decision
