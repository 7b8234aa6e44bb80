"""Only the product ships: the wheel pyproject.toml builds holds the package `tiered_memory` and its
metadata, nothing of bench/ (the measuring instruments, run from a checkout) nor of tests/, and of
the eval data only the set `tiered-memory eval` reads."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

import tiered_memory
from tiered_memory.eval.command import shipped_set

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "tiered_memory"


def _sources(directory: str, names: list[str]) -> set[str]:
    """What the copy of the checkout leaves out: git, caches and a previous build at the top (the
    wheel is built from the rest), and compiled files everywhere."""
    left_out = {"__pycache__", "node_modules"}
    if Path(directory).resolve() == ROOT:
        left_out |= {n for n in names if n.startswith(".") or n.endswith(".egg-info")}
        left_out |= {"build", "dist", "data"}
    return left_out & set(names)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel `pip wheel` builds from a copy of the checkout (a build writes build/ and an
    egg-info beside pyproject.toml: not into the checkout under test), in pip's isolated build
    environment, as a user's `pip install .` builds it."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    shutil.copytree(ROOT, source, ignore=_sources)
    out = work / "out"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (built,) = out.glob("*.whl")
    return built


@pytest.mark.timeout(150)
def test_the_wheel_holds_the_package_alone(wheel: Path) -> None:
    """Every file is under tiered_memory/ or the dist-info: no bench/ (nor its old name tools/),
    no tests/, scripts/ or docs/ installed beside the package."""
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/", 1)[0] for name in names}
    (dist_info,) = {top for top in tops if top.endswith(".dist-info")}
    assert tops == {PACKAGE, dist_info}, sorted(tops)
    top_level = zipfile.ZipFile(wheel).read(f"{dist_info}/top_level.txt").decode().split()
    assert top_level == [PACKAGE]
    assert f"{PACKAGE}/cli.py" in names
    assert f"{PACKAGE}/migrations/env.py" in names


@pytest.mark.timeout(150)
def test_the_wheel_carries_only_the_eval_data_the_eval_command_reads(wheel: Path) -> None:
    """`tiered-memory eval` with no dataset reads the shipped set (eval/command.py's shipped_set);
    that file is the eval data in the wheel, and its writer's source (bench/data/) is not."""
    names = zipfile.ZipFile(wheel).namelist()
    read = shipped_set().resolve().relative_to(Path(tiered_memory.__file__).resolve().parent.parent)
    data = {name for name in names if name.startswith(f"{PACKAGE}/eval/") and not name.endswith(".py")}
    assert data == {read.as_posix()}
    assert not [name for name in names if "bilingual_source" in name or name.endswith("/bilingual.py")]


@pytest.mark.timeout(150)
def test_installed_the_wheel_brings_no_other_top_level_package(wheel: Path, tmp_path: Path) -> None:
    """Installed into a fresh environment (without its dependencies: only where it lands is
    looked at), the wheel makes `tiered_memory` importable and neither `bench` nor `tools`; asked
    from outside the checkout, whose folders `python` would find in its current directory."""
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env)
    python = env / "bin" / "python"
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--quiet", str(wheel)]
    done = subprocess.run(install, capture_output=True, text=True, timeout=100, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    names = ("tiered_memory", "bench", "tools")
    probe = f"import importlib.util as u; print(*(u.find_spec(n) is not None for n in {names!r}))"
    found = subprocess.run(
        [str(python), "-I", "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=30, check=True
    )
    assert found.stdout.split() == ["True", "False", "False"], found.stdout + found.stderr
