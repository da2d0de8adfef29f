"""What profkit's labels do while ``torch.compile`` traces them: nothing, and say so.

Dynamo cannot trace a ``ContextVar`` call, a ``record_function`` or a session lookup: a
label that ran its usual code inside a compiled ``forward`` would break the graph (or fail
``fullgraph=True``). So every label first asks :data:`compiling`, which dynamo folds to
``True`` while it traces and which is a plain ``return False`` in eager code (a Python call,
about 25 ns: the only cost the compiler support adds to an eager call).

While tracing, a label also calls :func:`compiled_away`, which dynamo runs once at trace
time (it is marked as a constant, the way ``torch.compiler.assume_constant_result`` marks a
function) to note the label under the compile id of the frame being compiled. When that
compiled frame later runs inside a sampled call, the profiler shows it as a
``Torch-Compiled Region: <compile id>`` event, and the summary names the labels it holds
(:attr:`profkit.CallSummary.compiled_labels`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .._summary.compiled import COMPILED

__all__ = ["compiled_away", "compiling"]


def _never() -> bool:  # pragma: no cover - a torch without torch.compiler (before 2.3)
    return False


_compiler = getattr(torch, "compiler", None)
#: True only while dynamo traces the calling code (a constant in the traced graph)
compiling: Callable[[], bool] = getattr(
    _compiler, "is_dynamo_compiling", getattr(_compiler, "is_compiling", _never)
)


def compiled_away(label: str) -> bool:
    """Note ``label`` under the compile id being traced; dynamo runs this at trace time only.

    Returns True so that ``compiling() and compiled_away(label)`` reads as one test. Never
    raises: a torch without compile ids leaves the label unnoted.
    """
    try:
        from torch._guards import CompileContext

        context = CompileContext.try_get()
    except Exception:  # pragma: no cover - a torch without compile contexts
        return True
    if context is not None and context.compile_id is not None:
        # ids restart after torch._dynamo.reset(): the context tells a new compile apart
        COMPILED.note(str(context.compile_id), label, compile=id(context))
    return True


# what torch.compiler.assume_constant_result(compiled_away) sets, without importing dynamo
# at import time: dynamo calls the function while tracing and keeps its result as a constant
compiled_away._dynamo_marked_constant = True  # type: ignore[attr-defined]
