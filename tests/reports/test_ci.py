"""What a CI job shows of a run (:mod:`pytest_budgetbench.reports.ci`): the workflow
commands and their escaping, the job summary and its cut to GitHub's limit, the
pull-request comment's marker, the trend files of github-action-benchmark, and
``budgetbench report --job-summary/--trend`` and ``budgetbench diff --format=comment``."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from pytest_budgetbench.commands.cli import main
from pytest_budgetbench.reports import ci
from pytest_budgetbench.reports.gates.verdicts import (
    REGRESSION_GATE,
    RETENTION_GATE,
    VIOLATION_GATE,
    GateSpec,
    GateVerdict,
)
from pytest_budgetbench.reports.render import md_escape
from pytest_budgetbench.reports.synthetic import make_row, synthetic_rows, write_run

pytest.importorskip("pandas")


def _verdict(kind: str, strategy: str = "rag", budget: int = 2048, **fields: object
             ) -> GateVerdict:
    return GateVerdict(GateSpec(kind, strategy, budget), **fields)  # type: ignore[arg-type]


def test_workflow_commands_are_escaped_as_the_runner_reads_them() -> None:
    assert ci.escape_data("50% kept\r\nnext") == "50%25 kept%0D%0Anext"
    assert ci.escape_property("a: b, 5%\n") == "a%3A b%2C 5%25%0A"
    assert ci.workflow_command("error", "x\ny", title="t: 1, 2") == \
        "::error title=t%3A 1%2C 2::x%0Ay"


def test_only_failed_gates_are_errors_and_warnings_are_warnings() -> None:
    failed = _verdict(RETENTION_GATE, reasons=("rag@2048: mean 50% kept\nlow", "second"))
    passed = _verdict(VIOLATION_GATE, rate=0.0, notes=("too small, 100%",))
    lines = ci.gate_annotations([failed, passed], failures=["regression gate: no baseline"])
    assert lines == [
        "::error title=budgetbench gate retention-floor rag@2048 failed::"
        "rag@2048: mean 50%25 kept%0Alow; second",
        "::warning title=budgetbench gate violation-rate rag@2048 warning::too small, 100%25",
        "::error title=budgetbench gate failed::regression gate: no baseline",
    ]
    assert all("\n" not in line for line in lines)


def test_a_step_output_is_one_line_of_the_steps_file(tmp_path: Path) -> None:
    output = tmp_path / "output"
    assert ci.set_step_output("run_dir", "out/r1", {}) is None  # not in a GitHub step
    assert ci.set_step_output("run_dir", "out/r1", {"GITHUB_OUTPUT": str(output)}) == output
    assert output.read_text() == "run_dir=out/r1\n"
    with pytest.raises(ValueError, match="must be one line"):
        ci.set_step_output("run_dir", "out/r1\nevil=1", {"GITHUB_OUTPUT": str(output)})
    assert output.read_text() == "run_dir=out/r1\n"


def test_the_verdict_table_gives_each_value_beside_its_threshold() -> None:
    verdicts = [
        _verdict(VIOLATION_GATE, rate=0.25, n_violation=1, n_judged=4, threshold=0.05,
                 reasons=("rag@2048: violation rate 25.0%",)),
        _verdict(RETENTION_GATE, retention=0.95, threshold=0.9),
        _verdict(REGRESSION_GATE, delta=-0.02, interval=(-0.04, 0.0), threshold=0.05),
    ]
    markdown = ci.job_summary(verdicts)
    assert markdown.startswith("## budgetbench: 1 of 3 gates failed\n")
    rows = [line for line in markdown.splitlines() if line.startswith("| ")]
    assert rows[1:] == [
        "| violation-rate rag@2048 | ❌ failed | 25.0% (1/4) | ≤ 5.0% |",
        "| retention-floor rag@2048 | ✅ passed | retention 0.950 | ≥ 0.900 |",
        "| regression rag@2048 | ✅ passed | change -0.020 \\[-0.040, +0.000\\] "
        "| drop of at most 0.05 |",
    ]
    assert "- **violation-rate rag@2048**: rag@2048: violation rate 25.0%" in markdown
    assert ci.job_summary([]).startswith("## budgetbench: no gate was asked for\n")


def test_many_gates_keep_the_failures_in_sight_and_fold_the_passes() -> None:
    verdicts = [_verdict(RETENTION_GATE, budget=b, retention=1.0, threshold=0.9)
                for b in range(1, 13)]
    verdicts.append(_verdict(RETENTION_GATE, budget=99, retention=0.1, threshold=0.9,
                             reasons=("low",)))
    markdown = ci.job_summary(verdicts)
    failed, folded = markdown.split("<details>", 1)
    assert "| retention-floor rag@99 | ❌ failed |" in failed and "passed" not in failed.split(
        "\n", 1)[1].split("- **")[0]
    assert "<summary>12 gates passed</summary>" in folded


def _report(tmp_path: Path, budgets: tuple[int, ...] = (512, 4096)):  # type: ignore[no-untyped-def]
    from pytest_budgetbench.reports import compute_report

    rows = synthetic_rows(items=20, strategies=("full_context", "truncation", "rag"),
                          budgets=budgets, categories=())
    run = write_run(tmp_path / "run", rows)
    return compute_report([run], run / "report", resamples=200)


def test_the_job_summary_is_verdicts_then_facts_then_the_reports_tables(tmp_path: Path) -> None:
    report = _report(tmp_path)
    verdict = _verdict(VIOLATION_GATE, "truncation", 512, rate=0.0, n_violation=0,
                       n_judged=20, threshold=0.05)
    markdown = ci.job_summary([verdict], report, facts=[("run directory", "out/r1")])
    order = [markdown.index(part) for part in (
        "## budgetbench: all 1 gates passed", "| violation-rate truncation@512 | ✅ passed",
        "**runs** synthetic", "**model**", "**run directory** out/r1",
        "### Per strategy@budget", "### Paired against the reference")]
    assert order == sorted(order)
    summary = markdown.split("### Per strategy@budget", 1)[1].split("### Paired", 1)[0]
    header = next(line for line in summary.splitlines() if line.startswith("| task"))
    # The report's numbers in the narrow view; a column no row fills (retention) is left out.
    assert header == ("| task | strategy | budget | admitted / items | quality \\[95% CI\\] "
                      "| violation rate | tokens mean / max |")
    row = report.summary.set_index(["strategy", "budget"]).loc[("rag", 4096)]
    assert (f"| memory | rag | 4096 | {int(row['n_admitted'])} / 20 | "
            f"{row['quality_mean']:.3f} [") .replace("[", "\\[") in summary
    assert "| memory | full\\_context (ref) | 4096 |" in summary
    assert "<details>" not in markdown  # 6 rows: nothing to fold
    many = ci.job_summary([], _report(tmp_path / "many", (256, 512, 1024, 4096)))
    assert "<details><summary>12 rows</summary>" in many


def test_a_summary_over_the_limit_is_cut_at_a_line_with_its_details_closed(
    tmp_path: Path,
) -> None:
    markdown = ci.job_summary([], _report(tmp_path, (256, 512, 1024, 4096)))
    path = tmp_path / "summary.md"
    path.write_text("earlier step\n", encoding="utf-8")
    limit = len(markdown.encode()) // 2
    ci.append_job_summary(path, markdown, where="out/r1/report", limit=limit)
    written = path.read_text(encoding="utf-8")
    assert len(written.encode()) <= limit
    assert written.startswith("earlier step\n## budgetbench: no gate was asked for\n")
    assert written.endswith("; the whole report is in out/r1/report_\n")
    assert "GitHub's 1 MiB job summary limit" in written
    assert written.count("<details>") == written.count("</details>") == 1
    kept = written.removeprefix("earlier step\n").split("\n</details>\n")[0]
    assert markdown.startswith(kept)  # whole lines of the summary, in order
    # Under the default limit the same summary is whole.
    whole = tmp_path / "whole.md"
    ci.append_job_summary(whole, markdown, where="x")
    assert whole.read_text(encoding="utf-8") == markdown
    # A file already at the limit gets nothing more.
    ci.append_job_summary(path, markdown, where="x", limit=len(written.encode()))
    assert path.read_text(encoding="utf-8") == written


def test_the_comment_starts_with_its_marker_and_fits_githubs_characters() -> None:
    body = ci.comment_body("## budgetbench diff\n")
    assert body == f"{ci.COMMENT_MARKER}\n## budgetbench diff\n"
    long = "".join(f"| é{i} | {'ü' * 80} |\n" for i in range(2000))  # 2 bytes a character
    cut = ci.comment_body(long)
    assert cut.startswith(ci.COMMENT_MARKER + "\n| é0 |")
    assert len(cut) <= ci.COMMENT_LIMIT < len(cut.encode())
    assert cut.endswith("`budgetbench diff --out DIR` writes the whole diff_\n")


def test_trend_entries_are_github_action_benchmarks_fields(tmp_path: Path) -> None:
    """The custom tools read a JSON list of {name, value, unit, range?, extra?}, range a
    string ``± N`` (the action's src/extract.ts and extractRangeInfo.ts)."""
    import pandas as pd

    rows = [make_row(item_id=f"i{i}", strategy="rag", budget=512, quality=float(i % 2),
                     evidence_retention=0.5) for i in range(6)]
    rows += [make_row(item_id=f"i{i}", strategy="rag", budget=4096, status="violation")
             for i in range(2)]
    run = write_run(tmp_path / "run", rows)
    from pytest_budgetbench.reports import compute_report

    summary = compute_report([run], run / "report", resamples=200).summary
    paths = ci.write_trend(summary, tmp_path / "trend")
    assert [p.name for p in paths] == ["customBiggerIsBetter.json", "customSmallerIsBetter.json"]
    bigger, smaller = (json.loads(p.read_text(encoding="utf-8")) for p in paths)
    for entry in bigger + smaller:
        assert set(entry) <= {"name", "value", "unit", "range", "extra"}
        assert isinstance(entry["value"], float) and not math.isnan(entry["value"])
        assert all(isinstance(entry[key], str) for key in entry if key != "value")
    quality = next(e for e in bigger if e["name"] == "memory: rag@512 quality")
    row = summary.set_index("budget").loc[512]
    assert quality["value"] == pytest.approx(0.5) and quality["unit"] == "score"
    half = max(row["quality_mean"] - row["quality_lo"], row["quality_hi"] - row["quality_mean"])
    assert re.fullmatch(r"± \d+\.\d{4}", quality["range"])
    assert float(quality["range"][2:]) == pytest.approx(half, abs=1e-4)
    assert {"name": "memory: rag@512 evidence retention", "unit": "share kept",
            "value": 0.5, "extra": "over 6 admitted items"} in bigger
    # Nothing was admitted at 4096: no quality or retention series, only its rate.
    assert not any("@4096" in e["name"] for e in bigger)
    assert {"name": "memory: rag@4096 violation rate", "unit": "share over budget",
            "value": 1.0, "extra": "2 of 2 prompts"} in smaller
    assert isinstance(summary, pd.DataFrame)


def test_report_writes_the_summary_the_trend_and_annotations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [make_row(item_id=f"i{i}", strategy="truncation", budget=budget,
                     status="violation" if budget == 512 and i < 2 else "ok")
            for i in range(10) for budget in (512, 4096)]
    run = write_run(tmp_path / "run", rows)
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    code = main(["report", str(run), "--no-plots", "--resamples=100",
                 "--max-violation-rate=0.01", "--job-summary", str(summary),
                 "--trend", str(tmp_path / "trend")])
    out = capsys.readouterr().out
    markdown = summary.read_text(encoding="utf-8")
    assert code == 1
    assert markdown.startswith("## budgetbench: 1 of 2 gates failed\n")
    assert "| violation-rate truncation@512 | ❌ failed | 20.0% (2/10) | ≤ 1.0% |" in markdown
    assert out.splitlines()[-1] == (
        "::error title=budgetbench gate violation-rate truncation@512 failed::truncation@512: "
        "violation rate 20.0%25 (2/10 prompts) exceeds the maximum 1.0%25 by 19.0 percentage "
        "points")  # % escaped as the runner reads it
    assert "### Per strategy@budget" in markdown
    assert f"**report** {md_escape(str(run / 'report'))}" in markdown
    assert (tmp_path / "trend" / "customSmallerIsBetter.json").is_file()
    monkeypatch.delenv("GITHUB_ACTIONS")
    assert main(["report", str(run), "--no-plots", "--resamples=100",
                 "--max-violation-rate=0.01"]) == 1
    assert "::error" not in capsys.readouterr().out  # outside GitHub Actions: no commands


def test_report_with_a_gate_over_nothing_says_so_in_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [make_row(item_id=f"i{i}", strategy="full_context", reference=True)
            for i in range(3)]
    run = write_run(tmp_path / "run", rows)
    summary = tmp_path / "summary.md"
    assert main(["report", str(run), "--no-plots", "--max-violation-rate=0.1",
                 "--job-summary", str(summary)]) == 1
    markdown = summary.read_text(encoding="utf-8")
    assert markdown.startswith("## budgetbench: 1 of 1 gates failed\n")
    assert "| violation-rate gate: no strategy@budget other than a reference has a row" \
        in markdown


def test_diff_comment_starts_with_the_marker_and_shows_the_retention_change(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two model-free runs: no quality, so the comment's table is the tokens, the
    evidence retention and the status changes."""
    def run(name: str, kept: float) -> Path:
        rows = [make_row(item_id=f"i{i}", strategy="truncation", budget=512, quality=None,
                         evidence_retention=kept, model="none", model_s=None)
                for i in range(8)]
        return write_run(tmp_path / name, rows)

    assert main(["diff", str(run("a", 1.0)), str(run("b", 0.25)), "--format=comment",
                 "--resamples=100"]) == 0
    body = capsys.readouterr().out
    assert body.startswith(f"{ci.COMMENT_MARKER}\n## budgetbench diff\n")
    header = next(line for line in body.splitlines() if line.startswith("| task"))
    assert header == ("| task | strategy | budget | tokens B-A | retention B-A "
                      "| status changed | better | worse |")
    assert "| memory | truncation | 512 | 0.0 \\[0.0, 0.0\\] | -0.750 \\[-0.750, -0.750\\] |" \
        in body


def test_report_summarises_a_regression_gate_per_cell_with_its_change(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--baseline: each strategy@budget's regression verdict, its change and interval
    beside the margin; the cell whose items all went wrong fails."""
    def rows(lost: bool) -> list[dict[str, object]]:
        return [make_row(item_id=f"i{i}", strategy=strategy, budget=512,
                         quality=0.0 if lost and strategy == "rag" else 1.0)
                for i in range(40) for strategy in ("rag", "truncation")]

    before, after = write_run(tmp_path / "a", rows(False)), write_run(tmp_path / "b", rows(True))
    assert main(["report", str(before), "--no-plots", "--resamples=100"]) == 0
    summary = tmp_path / "summary.md"
    code = main(["report", str(after), "--no-plots", "--resamples=100", "--baseline",
                 str(before / "report" / "report.json"), "--max-regression=0.1",
                 "--job-summary", str(summary)])
    markdown = summary.read_text(encoding="utf-8")
    assert code == 1 and markdown.startswith("## budgetbench: 1 of 2 gates failed\n")
    assert re.search(r"\| regression rag@512 \| ❌ failed \| change -1\.000 \\\[-1\.000, "
                     r"-0\.\d+\\\] \| drop of at most 0\.1 \|", markdown), markdown
    assert re.search(r"\| regression truncation@512 \| ✅ passed \| change \+0\.000 "
                     r"\\\[-0\.\d+, \+0\.\d+\\\] \| drop of at most 0\.1 \|", markdown), markdown


def test_a_secret_never_reaches_the_summary_the_annotations_or_the_comment(
    tmp_path: Path,
) -> None:
    from pytest_budgetbench.redact import forget_secrets, register_secret

    planted = "sk-planted-0123456789abcdef"
    register_secret(planted)
    try:
        said = f"the endpoint answered 401 for key {planted}"
        summary = tmp_path / "summary.md"
        ci.append_job_summary(summary, f"## run\n{said}\n", where="reports/run")
        written = [summary.read_text(), ci.comment_body(said),
                   ci.workflow_command("error", said, title="budgetbench gate failed")]
        assert all("endpoint answered 401" in text for text in written)
        assert not any(planted in text for text in written)
    finally:
        forget_secrets()
