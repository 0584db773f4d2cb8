"""The core install (``pip install pytest-budgetbench``, no extra) runs a sweep.

A fresh virtual environment in tmp_path gets this source installed with no extra, from
the package registry as a user's would; pytest then runs a sweep in an empty project
directory against the fake endpoint on loopback (served by this process). It checks what
a new user sees: rows written, the summary printed, no traceback, one line on how to get
the HTML report, and a strategy whose extra is missing stopped before any cell with the
``pip install`` line. About 30 s (mostly pip); deselect with ``-m "not core_install"``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pytest_budgetbench
from tests.fake_openai import FakeOpenAI

pytestmark = pytest.mark.core_install

SOURCE = Path(pytest_budgetbench.__file__).resolve().parent.parent


def _environment() -> dict[str, str]:
    """This process's environment without what would point the fresh venv elsewhere."""
    dropped = ("PYTHONPATH", "VIRTUAL_ENV", "PYTEST_", "BUDGETBENCH_", "PIP_REQUIRE_VIRTUALENV")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    return {**env, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def _run(argv: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=_environment(), capture_output=True, text=True,
                          timeout=timeout, check=False)


def _core_venv(tmp: Path) -> Path:
    """A venv with this source installed, no extra; its ``bin`` directory."""
    source = tmp / "source"  # a copy: building in place would write into the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(SOURCE / name, source / name)
    shutil.copytree(SOURCE / "pytest_budgetbench", source / "pytest_budgetbench",
                    ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    bin_dir = venv / "bin"
    pip = _run([str(bin_dir / "python"), "-m", "pip", "install", "-q", str(source)], tmp, 600)
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    return bin_dir


def _sweep(bin_dir: Path, project: Path, fake: FakeOpenAI, *extra: str,
           ) -> subprocess.CompletedProcess[str]:
    return _run([str(bin_dir / "pytest"), "--budgets=1024,8192", "--budgetbench-items=2",
                 f"--budgetbench-endpoint={fake.base_url}", "-p", "no:cacheprovider", *extra],
                project, 300)


def test_the_core_install_runs_a_sweep_and_stops_a_missing_extra_before_any_cell(
    tmp_path: Path,
) -> None:
    bin_dir = _core_venv(tmp_path)
    installed = _run([str(bin_dir / "python"), "-m", "pip", "list", "--format=freeze"],
                     tmp_path, 120).stdout
    assert "numpy" not in installed and "chromadb" not in installed, installed
    fake = FakeOpenAI().start()
    fake.tokenize_routes = {"vllm"}  # the default tokenizer (auto) counts with it
    try:
        project = tmp_path / "project"
        project.mkdir()
        # The core strategies, with the default tokenizer and the report left on.
        swept = _sweep(bin_dir, project, fake,
                       "--budgetbench-strategies=full_context,truncation,summary_buffer")
        output = swept.stdout + swept.stderr
        assert swept.returncode == 0, output
        assert "Traceback" not in output and "INTERNALERROR" not in output, output
        (cells,) = project.glob("reports/*/cells.jsonl")
        rows = [json.loads(line) for line in cells.read_text().splitlines()]
        assert len(rows) == 2 * 3 * 2
        assert {row["status"] for row in rows} <= {"ok", "violation"}, rows
        assert "budgetbench summary" in swept.stdout
        assert "summary_buffer" in swept.stdout
        run = cells.parent.relative_to(project)
        notes = [line for line in swept.stdout.splitlines() if line.startswith("report:")]
        assert len(notes) == 1, swept.stdout
        assert "pip install 'pytest-budgetbench[reports]'" in notes[0]
        assert f"budgetbench report {run}" in notes[0]
        assert not (cells.parent / "report").exists()

        # The command that line points to names the extra too, in one line.
        report = _run([str(bin_dir / "budgetbench"), "report", str(run)], project, 120)
        assert report.returncode == 2, report.stdout + report.stderr
        assert report.stderr.strip().splitlines() == [
            "budgetbench: error: budgetbench report needs the 'numpy' package: "
            "pip install 'pytest-budgetbench[reports]'"]

        # rag needs the retrieval extra: one line, before any cell and any request.
        requests = len(fake.requests)
        runs = set(project.glob("reports/*"))
        rag = _sweep(bin_dir, project, fake, "--budgetbench-strategies=truncation,rag")
        assert rag.returncode == pytest.ExitCode.USAGE_ERROR, rag.stdout + rag.stderr
        errors = [line for line in rag.stderr.splitlines() if line.startswith("ERROR:")]
        assert errors == ["ERROR: strategy 'rag' needs the 'chromadb' package: "
                          "pip install 'pytest-budgetbench[retrieval]'"], rag.stderr
        assert "Traceback" not in rag.stdout + rag.stderr
        # So does a framework's policy, naming its framework's extra.
        framework = _sweep(bin_dir, project, fake,
                           "--budgetbench-strategies=langchain_trim_messages")
        assert framework.returncode == pytest.ExitCode.USAGE_ERROR, framework.stderr
        assert [line for line in framework.stderr.splitlines() if line.startswith("ERROR:")
                ] == ["ERROR: strategy 'langchain_trim_messages' needs the 'langchain-core' "
                      "package: pip install 'pytest-budgetbench[langchain]'"], framework.stderr
        assert len(fake.requests) == requests
        assert set(project.glob("reports/*")) == runs
    finally:
        fake.stop()
