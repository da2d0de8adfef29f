"""A signal handler that calls into profkit, run where a signal can land on the request path:
inside profkit's own critical sections (a window being closed, handed to the export queue,
the counters being read). CPython runs a handler between two bytecodes of the thread it
interrupts, so a handler is one nested call on that thread. Its timing is pinned here, once,
on this thread only: by a profile function (``sys.setprofile``) at a C call that ``where``
(a function of profkit's) makes, or by a trace function (``sys.settrace``) at one of its
lines; neither sees the calls the handler itself makes.

Arguments: ``where`` (``offer``: queueing a window, inside its locks; ``close_window``: a
window marked closing, still recording; ``snapshot``: ``stats()`` reading the counters
under their lock), ``what`` the handler does (``call``: a decorated function; ``flush``:
``force_flush(0.5)``; ``stats``: ``profkit.stats()``). The report says what each returned
and the counters after a flush.
"""

import inspect
import sys
from typing import Any

from _fresh import f, report

import profkit
import profkit._capture.slot
from profkit.exporters import Exporter

where, what = sys.argv[1], sys.argv[2]
window = int(sys.argv[3]) if len(sys.argv) > 3 else 1


class Null(Exporter):
    name = "null"

    def export(self, summary: Any) -> None:
        pass


profkit.configure(
    sample_every=1,
    cold_calls=0,
    exporters=(),
    extra_exporters=[Null()],
    max_per_minute=None,
    window=window,
)


@profkit.profiled("in_handler")
def in_handler(x: int) -> int:
    return x * 2


handled: dict[str, Any] = {}


def handler() -> None:
    if what == "call":
        handled["result"] = in_handler(3)
    elif what == "flush":
        handled["result"] = profkit.force_flush(0.5)
    else:
        handled["result"] = profkit.stats()["root_calls"]


#: where the handler runs: (profkit's function, the C function it calls there or its line)
PINS = {
    "offer": ("offer", "put"),
    "close_window": ("close_window", "thread_time"),
    "snapshot": ("snapshot", "dropped = dict("),
    "vacate": ("retry_once", "vacate"),  # the close's last step: freeing the slot
}
function, point = PINS[where]


def at_c_call(frame: Any, event: str, arg: Any) -> None:
    c_call = event == "c_call" and frame.f_code.co_name == function and arg.__name__ == point
    entry = (  # a Python function's entry (where Python checks for signals), called by close
        event == "call"
        and frame.f_code.co_name == function
        and frame.f_back.f_code.co_name == "close_window"
        and getattr(frame.f_locals.get("fn"), "__name__", "") == point
    )
    if c_call or entry:
        sys.setprofile(None)
        handler()


def at_line(frame: Any, event: str, arg: Any) -> Any:
    if frame.f_code.co_name != function:
        return None
    lines, first = inspect.getsourcelines(frame.f_code)
    target = first + next(i for i, text in enumerate(lines) if point in text)

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "line" and frame.f_lineno == target and "result" not in handled:
            sys.settrace(None)
            frame.f_trace = None
            handler()
        return local

    return local


def pin() -> None:
    if where == "snapshot":
        sys.settrace(at_line)
    else:
        sys.setprofile(at_c_call)


if where == "snapshot":  # a stats() on the request thread, interrupted while it reads
    f()
    pin()
    outer: Any = profkit.stats()["root_calls"]
else:  # a sampled call whose window is closed, then handed off, on this thread
    pin()
    outer = f() if window == 1 else [f() for _ in range(window)][-1]
slot = profkit._capture.slot.SLOT  # type: ignore[attr-defined]
consistent = slot.held is None or bool(slot._claims)  # a window in the slot has its claim
sys.setprofile(None)
sys.settrace(None)
after = f()  # the next call is a root call, sampled and exported as usual
flushed = profkit.force_flush(10.0)
s = profkit.stats()
report(
    outer=outer,
    handled=handled.get("result"),
    after=after,
    flushed=flushed,
    sampled=s["sampled"],
    settled=s["exported"] + s["dropped"] + s["skipped_busy"] + s["skipped_foreign"],
    exported=s["exported"],
    busy=s["skipped_busy"],
    foreign=s["skipped_foreign"],
    consistent=consistent,
)
