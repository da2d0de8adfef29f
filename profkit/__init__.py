"""profkit: sampled torch.profiler summaries for production PyTorch services.

Label handlers and stages with :func:`profiled` and :func:`region`; :func:`configure` starts
a session that runs one root call in N under ``torch.profiler`` and exports a summary of it
as OpenTelemetry spans and structlog events.
"""

from ._config import Config, ProfkitConfigWarning
from ._global import configure, force_flush, get_config, shutdown, stats, trigger
from ._label.batch import BatchMember, batch, batch_member
from ._label.decorate import profiled, region
from ._model import (
    BatchMemberSummary,
    BatchSummary,
    CallSummary,
    CodeInfo,
    Diagnosis,
    ErrorText,
    OpRow,
    ScopeSummary,
    WindowSummary,
)
from ._stats import StatsSnapshot
from ._version import __version__
from .exporters import Exporter

__all__ = [
    "BatchMember",
    "BatchMemberSummary",
    "BatchSummary",
    "CallSummary",
    "CodeInfo",
    "Config",
    "Diagnosis",
    "ErrorText",
    "Exporter",
    "OpRow",
    "ProfkitConfigWarning",
    "ScopeSummary",
    "StatsSnapshot",
    "WindowSummary",
    "__version__",
    "batch",
    "batch_member",
    "configure",
    "force_flush",
    "get_config",
    "profiled",
    "region",
    "shutdown",
    "stats",
    "trigger",
]

_DEPRECATED = {
    "Session": "profkit.Session is internal since 0.2; use the module functions",
    "get_session": "profkit.get_session() is internal since 0.2; use get_config() and stats()",
}


def __getattr__(name: str) -> object:
    """``profkit.Session`` and ``profkit.get_session`` still resolve, with a warning."""
    if name in _DEPRECATED:
        import warnings

        warnings.warn(_DEPRECATED[name], DeprecationWarning, stacklevel=2)
        from . import _global, _session

        return _session.Session if name == "Session" else _global.get_session
    raise AttributeError(f"module 'profkit' has no attribute {name!r}")
