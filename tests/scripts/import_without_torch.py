"""Import one profkit module (argv[2]) without running profkit/__init__.py (which imports
torch): a stand-in package module with the real ``__path__`` (argv[1]). Reports ``ok``,
``imports torch``, or the import's exception (not through ``_fresh``: that imports torch)."""

import importlib
import json
import sys
import types

pkg = types.ModuleType("profkit")
pkg.__path__ = [sys.argv[1]]
sys.modules["profkit"] = pkg
try:
    importlib.import_module(sys.argv[2])
except Exception as exc:
    result = repr(exc)
else:
    result = "imports torch" if "torch" in sys.modules else "ok"
print("REPORT " + json.dumps({"result": result}), flush=True)
