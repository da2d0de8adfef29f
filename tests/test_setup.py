"""scripts/setup: where torch comes from, and when pip runs at all (no real install here).

The choice logic lives in ``scripts/_setup.py``; the shell script is run end to end in a
copy of the repository whose ``.venv/bin/python`` is a stand-in that logs ``-m pip`` calls
instead of installing.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU = "https://download.pytorch.org/whl/cpu"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("profkit_setup", ROOT / "scripts/_setup.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


setup = _load()


def _executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def fake_pip(tmp_path: Path, fail_on: str = "--index-url") -> tuple[list[str], Path]:
    """A pip that logs its arguments and fails when they contain ``fail_on``."""
    log = tmp_path / "pip.log"
    script = _executable(
        tmp_path / "fake-pip",
        f'#!/bin/sh\necho "$*" >> "{log}"\ncase "$*" in *"{fail_on}"*) exit 1;; esac\n',
    )
    return [str(script)], log


def logged(log: Path) -> list[str]:
    return log.read_text(encoding="utf-8").splitlines() if log.exists() else []


@pytest.mark.parametrize(
    ("override", "has_gpu", "expected"),
    [
        ("", False, CPU),
        ("auto", False, CPU),
        ("", True, None),
        ("default", False, None),
        ("cpu", True, CPU),
        ("https://mirror.example/torch", True, "https://mirror.example/torch"),
    ],
)
def test_index_choice(override: str, has_gpu: bool, expected: str | None) -> None:
    """No GPU: the CPU index; a GPU or PROFKIT_TORCH_INDEX=default: the default index only."""
    assert expected == setup.index_choice({"PROFKIT_TORCH_INDEX": override}, has_gpu)


def test_cpu_attempt_is_quick_and_falls_back_to_the_default_index() -> None:
    """Without a GPU: the CPU index with a 5 s timeout and no retries, then the plain install."""
    expected = [
        ["install", "-q", "torch==2.13.0", "--index-url", CPU, "--timeout", "5", "--retries", "0"],
        ["install", "-q", "torch==2.13.0"],
    ]
    assert expected == setup.torch_attempts({}, False)


def test_version_override() -> None:
    """PROFKIT_TORCH_VERSION pins the version installed."""
    expected = [["install", "-q", "torch==2.5.1"]]
    assert expected == setup.torch_attempts({"PROFKIT_TORCH_VERSION": "2.5.1"}, True)


def test_nvidia_smi_on_path_means_a_gpu(tmp_path: Path) -> None:
    """An ``nvidia-smi`` executable on PATH counts as a GPU; an empty PATH does not."""
    _executable(tmp_path / "bin" / "nvidia-smi", "#!/bin/sh\nexit 0\n")
    expected = (True, False)
    actual = (
        setup.has_nvidia_gpu({"PATH": str(tmp_path / "bin")}),
        setup.has_nvidia_gpu({"PATH": str(tmp_path / "empty")}),
    )
    assert expected == actual


def test_unreachable_cpu_index_falls_back(tmp_path: Path) -> None:
    """The CPU index fails (unreachable): the default index is tried next, and setup goes on."""
    pip, log = fake_pip(tmp_path)
    status = setup.install_torch({}, False, pip)
    expected = [
        f"install -q torch==2.13.0 --index-url {CPU} --timeout 5 --retries 0",
        "install -q torch==2.13.0",
    ]
    assert (0, expected) == (status, logged(log))


def test_gpu_machine_installs_from_the_default_index_only(tmp_path: Path) -> None:
    """With a GPU the default index (CUDA wheels) is the only attempt."""
    pip, log = fake_pip(tmp_path)
    assert (0, ["install -q torch==2.13.0"]) == (setup.install_torch({}, True, pip), logged(log))


def test_both_indexes_failing_fails(tmp_path: Path) -> None:
    """When no index works setup fails with pip's status, after trying both."""
    pip, log = fake_pip(tmp_path, fail_on="install")
    assert (1, 2) == (setup.install_torch({}, False, pip), len(logged(log)))


def test_installed_torch_is_kept(tmp_path: Path) -> None:
    """``_setup.py torch`` in an interpreter that has torch runs no pip at all."""
    pip, log = fake_pip(tmp_path, fail_on="install")
    env = {**os.environ, "PROFKIT_PIP": " ".join(pip), "PATH": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts/_setup.py"), "torch"], env=env, check=False
    )
    assert (0, []) == (result.returncode, logged(log))


def _inputs(root: Path) -> None:
    for name in setup.INPUTS:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, root / name)


def test_stamp_covers_the_extras_installed(tmp_path: Path) -> None:
    """A dev installation satisfies the demo; a demo one does not satisfy dev."""
    _inputs(tmp_path)
    stamp = tmp_path / "stamp.json"
    before = (setup.is_fresh(tmp_path, stamp, "demo"), setup.is_fresh(tmp_path, stamp, "dev"))
    setup.write_stamp(tmp_path, stamp, "demo")
    demo_only = (setup.is_fresh(tmp_path, stamp, "demo"), setup.is_fresh(tmp_path, stamp, "dev"))
    setup.write_stamp(tmp_path, stamp, "dev")
    both = (setup.is_fresh(tmp_path, stamp, "demo"), setup.is_fresh(tmp_path, stamp, "dev"))
    assert [(False, False), (True, False), (True, True)] == [before, demo_only, both]


def test_stamp_goes_stale_when_pyproject_changes(tmp_path: Path) -> None:
    """Editing pyproject.toml (new dependency) makes setup run pip again."""
    _inputs(tmp_path)
    stamp = tmp_path / "stamp.json"
    setup.write_stamp(tmp_path, stamp, "dev")
    with (tmp_path / "pyproject.toml").open("a", encoding="utf-8") as f:
        f.write("\n# changed\n")
    assert not setup.is_fresh(tmp_path, stamp, "dev")


def test_a_corrupt_stamp_means_not_set_up(tmp_path: Path) -> None:
    """An unreadable stamp is treated as no stamp (pip runs), never as an error."""
    _inputs(tmp_path)
    stamp = tmp_path / "stamp.json"
    stamp.write_text("{not json", encoding="utf-8")
    assert not setup.is_fresh(tmp_path, stamp, "demo")


def _fake_checkout(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the setup inputs whose .venv/bin/python logs pip calls instead of running pip."""
    repo = tmp_path / "repo"
    _inputs(repo)
    log = tmp_path / "python.log"
    _executable(
        repo / ".venv/bin/python",
        f'#!/bin/sh\nif [ "$1" = "-m" ]; then echo "$*" >> "{log}"; exit 0; fi\n'
        f'exec "{sys.executable}" "$@"\n',
    )
    return repo, log


def run_setup(repo: Path, *args: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROFKIT_")}
    subprocess.run(["bash", str(repo / "scripts/setup"), *args], env=env, check=True, timeout=60)


def test_setup_runs_pip_once_then_nothing(tmp_path: Path) -> None:
    """First run: pip for the demo extras; second run: no pip; asking for dev: pip again."""
    repo, log = _fake_checkout(tmp_path)
    run_setup(repo, "demo")
    first = logged(log)
    run_setup(repo, "demo")
    second = logged(log)
    run_setup(repo, "dev")
    expected = [
        "-m pip install -q --upgrade pip",
        "-m pip install -q -e .[demo]",
    ]
    assert (expected, expected, [*expected, *expected[:1], "-m pip install -q -e .[dev]"]) == (
        first,
        second,
        logged(log),
    )


def test_ci_skips_the_cpu_index() -> None:
    """.ci/run exports PROFKIT_TORCH_INDEX=default (CI cannot reach PyTorch's index)."""
    text = (ROOT / ".ci/run").read_text(encoding="utf-8")
    assert "export PROFKIT_TORCH_INDEX=${PROFKIT_TORCH_INDEX:-default}" in text.splitlines()
