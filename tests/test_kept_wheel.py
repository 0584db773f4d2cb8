"""``.ci/kept-wheel``: the llama-cpp-python wheel .ci/install keeps between venvs is checked
before it is used, and anything else is built again, driven here with a fake ``pip wheel``
(a PYTHON that makes a wheel in an instant) in scratch folders: no real build runs."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / ".ci" / "kept-wheel"
SPEC = "llama-cpp-python==0.3.36"
WHEEL = "llama_cpp_python-0.3.36-cp312-cp312-linux_x86_64.whl"

FAKE_PYTHON = """#!/usr/bin/env bash
# `-m pip wheel ... -w DIR SPEC` makes the wheel FAKE_BUILD says; anything else is Python.
if [ "$1 $2 $3" = "-m pip wheel" ]; then
  while [ $# -gt 0 ]; do [ "$1" = -w ] && dir=$2; shift; done
  echo "build FORCE_CMAKE=${FORCE_CMAKE:-}" >>"$FAKE_LOG"
  exec "$REAL_PYTHON" -c "$MAKE_WHEEL" "$dir" "$FAKE_BUILD"
fi
exec "$REAL_PYTHON" "$@"
"""

MAKE_WHEEL = f"""
import sys, zipfile
folder, kind = sys.argv[1:]
if kind != "none":
    with zipfile.ZipFile(folder + "/{WHEEL}", "w") as wheel:
        wheel.writestr("llama_cpp/__init__.py", "")
        wheel.writestr("llama_cpp_python-0.3.36.dist-info/METADATA",
                       "Metadata-Version: 2.1\\nName: llama_cpp_python\\nVersion: 0.3.36\\n")
"""


def kept(tmp_path: Path, wheels: Path, build: str = "good") -> subprocess.CompletedProcess[str]:
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    env = {**os.environ, "REAL_PYTHON": sys.executable, "MAKE_WHEEL": MAKE_WHEEL,
           "FAKE_BUILD": build, "FAKE_LOG": str(tmp_path / "builds.log")}
    return subprocess.run(["bash", str(SCRIPT), str(python), SPEC, str(wheels), "key text",
                           "FORCE_CMAKE=1"], env=env, capture_output=True, text=True,
                          timeout=60, check=False)


def builds(tmp_path: Path) -> list[str]:
    log = tmp_path / "builds.log"
    return log.read_text().splitlines() if log.exists() else []


def opens(path: Path) -> bool:
    with zipfile.ZipFile(path) as wheel:
        return wheel.testzip() is None


@pytest.fixture
def wheels(tmp_path: Path) -> Path:
    return tmp_path / "cache" / "wheels" / "0123456789abcdef"


def test_a_missing_wheel_is_built_kept_with_its_key_and_then_reused(
    tmp_path: Path, wheels: Path
) -> None:
    first = kept(tmp_path, wheels)
    assert first.returncode == 0, first.stderr
    assert first.stdout == f"{wheels / WHEEL}\n" and opens(wheels / WHEEL)
    assert (wheels / "KEY").read_text() == "key text\n"
    assert builds(tmp_path) == ["build FORCE_CMAKE=1"]  # the flags reach the build
    again = kept(tmp_path, wheels)
    assert again.stdout == first.stdout and len(builds(tmp_path)) == 1
    assert sorted(p.name for p in wheels.parent.iterdir()) == [wheels.name]


@pytest.mark.parametrize("kept_folder", ["key without a wheel", "truncated wheel",
                                         "two wheels", "another version"])
def test_a_kept_folder_that_does_not_check_is_built_again(
    tmp_path: Path, wheels: Path, kept_folder: str
) -> None:
    """Each of these broke every later install: pip was handed no file ("Invalid
    requirement"), a file it could not read, or two; or the rename of a fresh build onto the
    folder failed and threw the build away."""
    wheels.mkdir(parents=True)
    (wheels / "KEY").write_text("key text\n")
    if kept_folder == "truncated wheel":
        subprocess.run([sys.executable, "-c", MAKE_WHEEL, str(wheels), "good"], check=True)
        whole = (wheels / WHEEL).read_bytes()
        (wheels / WHEEL).write_bytes(whole[: len(whole) // 2])
    elif kept_folder == "two wheels":
        (wheels / WHEEL).write_bytes(b"")
        (wheels / WHEEL.replace("cp312", "cp311")).write_bytes(b"")
    elif kept_folder == "another version":
        with zipfile.ZipFile(wheels / WHEEL, "w") as wheel:
            wheel.writestr("llama_cpp_python-0.3.35.dist-info/METADATA", "Version: 0.3.35\n")
    before = len(builds(tmp_path))
    result = kept(tmp_path, wheels)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{wheels / WHEEL}\n" and opens(wheels / WHEEL)
    assert sorted(p.name for p in wheels.iterdir()) == ["KEY", WHEEL]
    assert len(builds(tmp_path)) == before + 1
    assert sorted(p.name for p in wheels.parent.iterdir()) == [wheels.name]


def test_folders_of_interrupted_builds_are_removed_once_no_build_could_still_be_running(
    tmp_path: Path, wheels: Path
) -> None:
    wheels.parent.mkdir(parents=True)
    stale = wheels.parent / f"{wheels.name}.building.AAAAAA"
    running = wheels.parent / f"{wheels.name}.building.BBBBBB"
    for folder in (stale, running):
        folder.mkdir()
    os.utime(stale, (0, 0))  # interrupted long ago
    assert kept(tmp_path, wheels).returncode == 0
    assert sorted(p.name for p in wheels.parent.iterdir()) == sorted([running.name, wheels.name])


def test_a_build_that_leaves_no_wheel_fails_with_a_line_and_leaves_nothing(
    tmp_path: Path, wheels: Path
) -> None:
    result = kept(tmp_path, wheels, build="none")
    assert result.returncode == 1 and result.stdout == ""
    assert (f"kept-wheel: pip wheel {SPEC} left no wheel that opens and names version "
            "0.3.36 in") in result.stderr
    assert list(wheels.parent.iterdir()) == []
