"""Which profkit labels ``torch.compile`` traced into which compiled frame, process-wide.

Filled by the label at trace time, read by the summary. No torch.
"""

from __future__ import annotations

__all__ = ["COMPILED", "CompiledLabels"]


class CompiledLabels:
    """Which profkit labels ``torch.compile`` traced into which compiled frame, process-wide.

    Filled at trace time (:func:`profkit._label.compiler.compiled_away`), keyed by compile id
    (``"0/0"``: frame 0, first compile), read by the summary for the compiled regions a
    sampled call ran. Bounded: past ``limit`` compile ids, new ones are not noted.
    """

    def __init__(self, limit: int = 4096) -> None:
        self._limit = limit
        self._labels: dict[str, tuple[int, tuple[str, ...]]] = {}

    def note(self, compile_id: str, label: str, compile: int) -> None:
        """Note ``label`` under ``compile_id``; a new ``compile`` (token) of an id replaces it."""
        token, known = self._labels.get(compile_id, (compile, ()))
        if token != compile:
            known = ()  # the id was reused (after torch._dynamo.reset()): forget the old compile
        if label not in known and (compile_id in self._labels or len(self._labels) < self._limit):
            self._labels[compile_id] = (compile, (*known, label))  # one store: no lock needed

    def labels(self, compile_id: str) -> tuple[str, ...]:
        """The labels traced into ``compile_id``, in trace order (empty if none or unknown)."""
        return self._labels.get(compile_id, (0, ()))[1]


#: the process-wide registry of labels compiled away
COMPILED = CompiledLabels()
