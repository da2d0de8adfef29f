"""profkit: sampled torch.profiler summaries for production PyTorch services.

Label handlers and stages with :func:`profiled` and :func:`region`; :func:`configure` starts
a session that runs one root call in N under ``torch.profiler`` and exports a summary of it
as OpenTelemetry spans and structlog events.
"""

__version__ = "0.1.0"

from ._api import profiled, region
from ._config import Config, ProfkitConfigWarning
from ._global import configure, force_flush, get_config, get_session, shutdown, stats, trigger
from ._model import CallSummary, CodeInfo, Diagnosis, OpRow, ScopeSummary, WindowSummary
from ._session import Session
from .exporters import Exporter

__all__ = [
    "CallSummary",
    "CodeInfo",
    "Config",
    "Diagnosis",
    "Exporter",
    "OpRow",
    "ProfkitConfigWarning",
    "ScopeSummary",
    "Session",
    "WindowSummary",
    "__version__",
    "configure",
    "force_flush",
    "get_config",
    "get_session",
    "profiled",
    "region",
    "shutdown",
    "stats",
    "trigger",
]
