"""What a sweep leaves for a CI job at its end (pytest_face.summary.write_ci_outputs): the
job summary appended to $GITHUB_STEP_SUMMARY (or --budgetbench-job-summary), the run
directory as the step's output, the trend files, and an ::error annotation per failed
gate in a GitHub Actions job; once, by the controller, under xdist too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_budgetbench.reports import ci

pytest.importorskip("pandas")

GATES = ("--budgetbench-min-retention=0.9", "--budgetbench-max-violation-rate=0.05")


def model_free(tmp: Path, *extra: str) -> list[str]:
    """A model-free sweep of 3 items at 2048 and 8192: truncation@2048 keeps none of the
    memory task's evidence, so its retention floor fails; the other 3 gates pass."""
    return ["--budgets=2048,8192", "--budgetbench-model=none", "--budgetbench-tokenizer=approx",
            "--budgetbench-items=3", "--budgetbench-strategies=full_context,truncation",
            "--budgetbench-report=off", f"--budgetbench-out={tmp / 'out'}",
            "-p", "no:cacheprovider", *extra]


@pytest.fixture
def github(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A GitHub Actions step's files, as its runner sets them."""
    files = {"summary": tmp_path / "step_summary.md", "output": tmp_path / "step_output"}
    files["summary"].write_text("## Earlier in this step\n", encoding="utf-8")
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(files["summary"]))
    monkeypatch.setenv("GITHUB_OUTPUT", str(files["output"]))
    return files


def test_a_sweep_on_github_actions_summarises_annotates_and_names_its_run(
    pytester: pytest.Pytester, tmp_path: Path, github: dict[str, Path]
) -> None:
    result = pytester.runpytest(*model_free(tmp_path, *GATES,
                                            f"--budgetbench-trend={tmp_path / 'trend'}"))
    result.assert_outcomes(passed=12, failed=1, xfailed=3)
    summary = github["summary"].read_text(encoding="utf-8")
    # Appended after what the step wrote before; the verdicts first, then the table.
    assert summary.startswith("## Earlier in this step\n## budgetbench: 1 of 4 gates failed\n")
    assert "| retention-floor truncation@2048 | ❌ failed | retention 0.000 | ≥ 0.900 |" in summary
    assert "| violation-rate truncation@8192 | ✅ passed | 0.0% (0/3) | ≤ 5.0% |" in summary
    assert summary.index("❌ failed") < summary.index("### Per strategy@budget")
    assert "| memory | truncation | 2048 | 3 / 3 | 0.000 | 0.0% |" in summary
    (run_dir,) = (tmp_path / "out").iterdir()
    assert "**model** none" in summary and "**tokenizer** approx-chars/4" in summary
    assert f"**runs** {run_dir.name}" in summary
    assert github["output"].read_text() == f"run_dir={run_dir}\n"
    errors = [line for line in result.outlines if line.startswith("::")]
    assert errors == [
        "::error title=budgetbench gate retention-floor truncation@2048 failed::"
        "truncation@2048: mean evidence retention 0.000 over the 3 admitted items that "
        "declare evidence is below the floor 0.900 (lowest: memory/0000 0.00, memory/0001 "
        "0.00, memory/0002 0.00)"]
    bigger = json.loads((tmp_path / "trend" / ci.TREND_FILES["customBiggerIsBetter"])
                        .read_text(encoding="utf-8"))
    assert {"name": "memory: truncation@2048 evidence retention", "unit": "share kept",
            "value": 0.0, "extra": "over 3 admitted items"} in bigger


def test_under_xdist_the_controller_writes_one_summary_with_every_workers_verdicts(
    pytester: pytest.Pytester, tmp_path: Path, github: dict[str, Path]
) -> None:
    pytest.importorskip("xdist")
    result = pytester.runpytest_subprocess(*model_free(tmp_path, *GATES, "-n", "2"))
    result.assert_outcomes(passed=12, failed=1, xfailed=3)
    summary = github["summary"].read_text(encoding="utf-8")
    assert summary.count("## budgetbench:") == 1
    assert summary.count("| retention-floor ") + summary.count("| violation-rate ") == 4
    assert "| retention-floor truncation@2048 | ❌ failed | retention 0.000 | ≥ 0.900 |" in summary
    assert len(github["output"].read_text().splitlines()) == 1
    assert sum(line.startswith("::error title=") for line in result.outlines) == 1


def test_a_summary_over_its_limit_is_cut_with_a_line_saying_so(
    pytester: pytest.Pytester, tmp_path: Path, github: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ci, "STEP_SUMMARY_LIMIT", 900)  # GitHub's is 1 MiB
    pytester.runpytest(*model_free(tmp_path, *GATES))
    summary = github["summary"].read_text(encoding="utf-8")
    assert len(summary.encode()) <= 900
    assert summary.startswith("## Earlier in this step\n## budgetbench: 1 of 4 gates failed\n")
    assert "the summary was cut here to stay within GitHub's 1 MiB job summary limit" in summary
    (run_dir,) = (tmp_path / "out").iterdir()
    assert summary.endswith(f"the whole report is in {run_dir}_\n")


def test_a_chosen_file_off_and_outside_github_actions(
    pytester: pytest.Pytester, tmp_path: Path, github: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--budgetbench-job-summary=FILE writes there (a GitLab artifact), =off nowhere; off
    GitHub Actions no workflow command is printed."""
    monkeypatch.delenv("GITHUB_ACTIONS")
    chosen = tmp_path / "budgetbench-summary.md"
    result = pytester.runpytest(*model_free(tmp_path, f"--budgetbench-job-summary={chosen}"))
    result.assert_outcomes(passed=9, xfailed=3)
    assert chosen.read_text(encoding="utf-8").startswith(
        "## budgetbench: no gate was asked for\n")
    assert not any(line.startswith("::") for line in result.outlines)
    pytester.runpytest(*model_free(tmp_path, "--budgetbench-job-summary=off"))
    assert github["summary"].read_text(encoding="utf-8") == "## Earlier in this step\n"


def test_a_trend_of_a_budget_search_is_refused_before_any_cell(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    result = pytester.runpytest("--budgets=search:512..4096", "--budgetbench-min-retention=0.9",
                                f"--budgetbench-trend={tmp_path / 'trend'}",
                                f"--budgetbench-out={tmp_path / 'out'}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --budgets=search:512..4096 cannot run with "
                                 "--budgetbench-trend, which charts fixed budgets across "
                                 "commits; *"])
    assert not (tmp_path / "out").exists()


def test_a_summary_or_trend_path_that_cannot_be_written_is_refused_before_any_cell(
    pytester: pytest.Pytester, tmp_path: Path, github: dict[str, Path]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for flag in (f"--budgetbench-job-summary={blocker / 'summary.md'}",
                 f"--budgetbench-trend={blocker / 'trend'}"):
        result = pytester.runpytest(*model_free(tmp_path, flag))
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        name = flag.split("=")[0]
        result.stderr.fnmatch_lines([f"ERROR: {name}=*: cannot be written (*a-file is not a "
                                     "writable directory); pass a path you can write"])
        assert not (tmp_path / "out").exists()


def test_a_budget_search_summarises_its_answer_and_annotates_its_gate(
    pytester: pytest.Pytester, tmp_path: Path, github: dict[str, Path]
) -> None:
    """A search's verdicts are its records': the summary holds its table (the terminal's)
    and its failed gate, which is also the annotation."""
    result = pytester.runpytest(
        "--budgets=search:512..4096", "--budgetbench-min-retention=0.9",
        "--budgetbench-max-violation-rate=0.05", "--budgetbench-tokenizer=approx",
        "--budgetbench-items=2", "--budgetbench-strategies=full_context,truncation",
        "--budgetbench-max-safe-budget=2048,full_context=4096", "--budgetbench-report=off",
        f"--budgetbench-out={tmp_path / 'out'}", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    summary = github["summary"].read_text(encoding="utf-8")
    assert "## budgetbench: 1 of 1 gates failed\n" in summary
    assert "| memory: truncation: safe budget 2" in summary
    assert "### Smallest safe budget\n\n````text\nsmallest safe budget, search:512..4096" \
        in summary
    assert "### Per strategy@budget" not in summary  # the probes' cells are not the answer
    (error,) = [line for line in result.outlines if line.startswith("::")]
    assert error.startswith("::error title=budgetbench gate failed::memory: truncation: "
                            "safe budget 2")
