"""The decisions behind ``scripts/setup``, kept here so that tests can check them.

``python scripts/_setup.py fresh EXTRAS``
    exit 0 when ``.venv`` was already set up for ``EXTRAS`` from the same ``pyproject.toml``
    and setup scripts (a stamp in ``.venv``), so setup has nothing to do; 1 otherwise.
``python scripts/_setup.py torch``
    keep a torch that is already installed; else install it, from PyTorch's CPU wheel index
    where no NVIDIA GPU is present (PyPI's Linux wheel is the CUDA build, which pulls
    gigabytes of ``nvidia-*`` wheels), falling back to the default index when the CPU index
    cannot be reached (5 s timeout, no retries).
``python scripts/_setup.py stamp EXTRAS``
    record that ``EXTRAS`` is installed.

Environment:

* ``PROFKIT_TORCH_INDEX``: ``auto`` (default: the CPU index first when ``nvidia-smi`` is not
  on ``PATH``), ``cpu`` (the CPU index first, always), ``default`` (the default index only:
  CI, and machines that cannot reach download.pytorch.org), or an index URL to try first.
* ``PROFKIT_TORCH_VERSION``: the torch version to install (default below).
* ``PROFKIT_PIP``: the pip command, split on spaces (tests use a fake one).

Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCH_VERSION = "2.13.0"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
QUICK = ("--timeout", "5", "--retries", "0")
"""An index that may be unreachable gets 5 s, once, instead of pip's long retries."""
COVERS = {"demo": ("demo", "dev"), "dev": ("dev",)}
"""Extras whose installation also satisfies the key's (dev includes the demo's)."""
INPUTS = ("pyproject.toml", "scripts/setup", "scripts/_setup.py")
"""Files whose change makes setup run pip again."""


# -- torch ------------------------------------------------------------------------------------


def index_choice(env: Mapping[str, str], has_gpu: bool) -> str | None:
    """The index URL to try first, or None for the default index only."""
    choice = env.get("PROFKIT_TORCH_INDEX", "").strip() or "auto"
    if choice == "default":
        return None
    if choice == "cpu":
        return CPU_INDEX
    if choice == "auto":
        return None if has_gpu else CPU_INDEX
    return choice


def torch_attempts(env: Mapping[str, str], has_gpu: bool) -> list[list[str]]:
    """The ``pip install`` argument lists to try in order; the first that succeeds wins."""
    spec = f"torch=={env.get('PROFKIT_TORCH_VERSION') or TORCH_VERSION}"
    plain = ["install", "-q", spec]
    index = index_choice(env, has_gpu)
    if index is None:
        return [plain]
    return [[*plain, "--index-url", index, *QUICK], plain]


def has_nvidia_gpu(env: Mapping[str, str]) -> bool:
    """Whether ``nvidia-smi`` is on ``PATH`` (the driver is installed)."""
    return shutil.which("nvidia-smi", path=env.get("PATH", os.defpath)) is not None


def pip_command(env: Mapping[str, str]) -> list[str]:
    """``PROFKIT_PIP`` split on spaces, else this interpreter's pip."""
    return env.get("PROFKIT_PIP", "").split() or [sys.executable, "-m", "pip"]


def say(message: str) -> None:
    """A progress line on stderr, prefixed like the script's own."""
    print(f"scripts/setup: {message}", file=sys.stderr, flush=True)


def install_torch(env: Mapping[str, str], has_gpu: bool, pip: Sequence[str]) -> int:
    """Run the attempts in order: 0 at the first success, else the last exit status."""
    plan = torch_attempts(env, has_gpu)
    status = 1
    for n, args in enumerate(plan, 1):
        if "--index-url" in args:
            url = args[args.index("--index-url") + 1]
            why = "asked for" if has_gpu else "no NVIDIA GPU (nvidia-smi not found)"
            say(f"{why}: installing {args[2]} from {url}")
        status = subprocess.run([*pip, *args], check=False).returncode
        if status == 0:
            return 0
        if n < len(plan):
            say("that index could not be used: installing torch from the default index")
    return status


def torch_installed() -> bool:
    """Whether this interpreter has torch already (found without importing it)."""
    return importlib.util.find_spec("torch") is not None


# -- the stamp --------------------------------------------------------------------------------


def stamp_key(root: Path, extras: str) -> str:
    """A hash of what decides an installation: the extras and the files in ``INPUTS``."""
    digest = hashlib.sha256(extras.encode())
    for name in INPUTS:
        path = root / name
        digest.update(path.read_bytes() if path.is_file() else b"")
    return digest.hexdigest()


def _read_stamp(stamp: Path) -> dict[str, str]:
    try:
        data = json.loads(stamp.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def is_fresh(root: Path, stamp: Path, extras: str) -> bool:
    """Whether ``stamp`` says that ``extras`` (or a superset) is installed from these inputs."""
    recorded = _read_stamp(stamp)
    return any(recorded.get(e) == stamp_key(root, e) for e in COVERS.get(extras, (extras,)))


def write_stamp(root: Path, stamp: Path, extras: str) -> None:
    """Record that ``extras`` is installed from the current inputs."""
    recorded = _read_stamp(stamp)
    recorded[extras] = stamp_key(root, extras)
    stamp.write_text(json.dumps(recorded, sort_keys=True) + "\n", encoding="utf-8")


def main(argv: Sequence[str]) -> int:
    """``fresh EXTRAS``, ``torch`` or ``stamp EXTRAS`` (see the module docstring)."""
    env = os.environ
    stamp = ROOT / ".venv" / ".profkit-setup.json"
    command, extras = [*argv, "", ""][:2]
    if command == "fresh":
        return 0 if is_fresh(ROOT, stamp, extras) else 1
    if command == "stamp":
        write_stamp(ROOT, stamp, extras)
        return 0
    if command == "torch":
        return 0 if torch_installed() else install_torch(env, has_nvidia_gpu(env), pip_command(env))
    say(f"usage: {Path(__file__).name} fresh|stamp EXTRAS | torch")
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
