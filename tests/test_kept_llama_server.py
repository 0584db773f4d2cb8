"""``.ci/kept-llama-server``: the llama-server .ci/install keeps between venvs is checked
before it is used (it must run ``--version``) and built again otherwise, driven here with a
fake sdist whose "llama.cpp" is a CMake project that makes a shell-script llama-server in an
instant: the real cmake runs, no compiler does."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / ".ci" / "kept-llama-server"
SPEC = "llama-cpp-python==0.3.36"

FAKE_CMAKE_PROJECT = """cmake_minimum_required(VERSION 3.16)
project(fake NONE)
add_custom_target(llama-server ALL
  COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/bin
  COMMAND ${CMAKE_COMMAND} -E copy ${CMAKE_SOURCE_DIR}/llama-server ${CMAKE_BINARY_DIR}/bin/
  COMMAND ${CMAKE_COMMAND} -E echo "options: ${GGML_AVX2} ${GGML_AVX512}" >> $ENV{FAKE_LOG})
"""
SERVER = "#!/bin/sh\n[ \"$1\" = --version ] && echo 'version: 1 (fake)'\n"

FAKE_PYTHON = """#!/usr/bin/env bash
# `-m pip download ... -d DIR SPEC` writes the fake sdist there; anything else is Python.
if [ "$1 $2 $3" = "-m pip download" ]; then
  while [ $# -gt 0 ]; do [ "$1" = -d ] && dir=$2; shift; done
  mkdir -p "$dir" && cp "$FAKE_SDIST" "$dir/" && echo download >>"$FAKE_LOG"
  exit 0
fi
exec "$REAL_PYTHON" "$@"
"""


@pytest.fixture
def fake_sdist(tmp_path: Path) -> Path:
    source = tmp_path / "src" / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp"
    source.mkdir(parents=True)
    (source / "CMakeLists.txt").write_text(FAKE_CMAKE_PROJECT)
    (source / "llama-server").write_text(SERVER)
    (source / "llama-server").chmod(0o755)
    sdist = tmp_path / "llama_cpp_python-0.3.36.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(tmp_path / "src" / "llama_cpp_python-0.3.36", "llama_cpp_python-0.3.36")
    return sdist


def kept(tmp_path: Path, sdist: Path, folder: Path) -> subprocess.CompletedProcess[str]:
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    env = {**os.environ, "FAKE_SDIST": str(sdist), "FAKE_LOG": str(tmp_path / "log"),
           "REAL_PYTHON": sys.executable}
    return subprocess.run(
        ["bash", str(SCRIPT), str(python), SPEC, str(folder), "KEY TEXT",
         "-DGGML_AVX2=ON", "-DGGML_AVX512=OFF"],
        capture_output=True, text=True, env=env, check=False)


def log(tmp_path: Path) -> list[str]:
    path = tmp_path / "log"
    return path.read_text().splitlines() if path.exists() else []


def test_a_missing_server_is_built_with_the_cpu_options_and_kept(tmp_path: Path,
                                                                  fake_sdist: Path) -> None:
    folder = tmp_path / "kept" / "abc"
    done = kept(tmp_path, fake_sdist, folder)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(folder / "llama-server")
    assert (folder / "KEY").read_text() == "KEY TEXT\n"
    assert log(tmp_path) == ["download", "options: ON OFF"]
    assert not list(folder.parent.glob("abc.building.*"))  # the build folder is gone


def test_a_kept_server_that_runs_is_used_without_a_build(tmp_path: Path,
                                                         fake_sdist: Path) -> None:
    folder = tmp_path / "kept"
    assert kept(tmp_path, fake_sdist, folder).returncode == 0
    again = kept(tmp_path, fake_sdist, folder)
    assert again.returncode == 0
    assert log(tmp_path) == ["download", "options: ON OFF"]  # one build only


@pytest.mark.parametrize("damage", ["truncated", "not executable", "missing"])
def test_a_kept_server_that_does_not_run_is_built_again(tmp_path: Path, fake_sdist: Path,
                                                        damage: str) -> None:
    folder = tmp_path / "kept"
    assert kept(tmp_path, fake_sdist, folder).returncode == 0
    binary = folder / "llama-server"
    if damage == "truncated":
        binary.write_text("#!/bin/sh\nexit 1\n")
    elif damage == "not executable":
        binary.chmod(0o644)
    else:
        binary.unlink()
    again = kept(tmp_path, fake_sdist, folder)
    assert again.returncode == 0, again.stderr
    assert subprocess.run([again.stdout.strip(), "--version"], check=False).returncode == 0
    assert log(tmp_path).count("download") == 2
