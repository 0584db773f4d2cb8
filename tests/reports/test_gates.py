"""violation_gate and regression_gate on constructed runs."""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.reports import (
    build_report,
    check_baseline_comparable,
    regression_gate,
    violation_gate,
)
from pytest_budgetbench.reports.gates.judging import regression_findings
from pytest_budgetbench.reports.gates.verdicts import HARM, NONINFERIORITY
from pytest_budgetbench.reports.synthetic import make_row, write_run

pytest.importorskip("pandas")


def report_of(tmp_path: Path, name: str, rows: list[dict[str, Any]]) -> Any:
    run = write_run(tmp_path / name / "run", rows)
    return build_report([run], tmp_path / name / "out", plots=False, resamples=2000)


def run_rows(
    *,
    trunc_violations: int = 0,
    ref_violations: int = 0,
    quality: Any = lambda i: float(i % 3 != 0),
    n: int = 40,
    tasks: tuple[str, ...] = ("memory",),
) -> list[dict[str, Any]]:
    rows = []
    for task in tasks:
        for i in range(n):
            rows.append(make_row(task, f"i{i}", "full_context", 500, reference=True,
                                 status="violation" if i < ref_violations else "ok",
                                 quality=1.0))
            rows.append(make_row(task, f"i{i}", "trunc", 500,
                                 status="violation" if i < trunc_violations else "ok",
                                 quality=quality(i)))
    return rows


# -- violation gate -------------------------------------------------------------------------
def test_violation_gate_passes_under_the_limit(tmp_path: Path) -> None:
    report = report_of(tmp_path, "r", run_rows(trunc_violations=2))
    assert violation_gate(report, 0.05) == []  # 2/40 = 5% is not above 5%


def test_violation_gate_fails_and_names_the_cell(tmp_path: Path) -> None:
    report = report_of(tmp_path, "r", run_rows(trunc_violations=8))
    reasons = violation_gate(report, 0.05)
    assert len(reasons) == 1
    assert reasons[0].startswith("trunc@500: violation rate 20.0% (8/40 prompts)")
    assert "5.0%" in reasons[0] and "15.0 percentage points" in reasons[0]


def test_violation_gate_ignores_reference_strategies(tmp_path: Path) -> None:
    report = report_of(tmp_path, "r", run_rows(ref_violations=40))
    assert violation_gate(report, 0.0) == []


def test_violation_gate_pools_tasks(tmp_path: Path) -> None:
    rows = run_rows(trunc_violations=4, n=20, tasks=("a",)) + run_rows(n=20, tasks=("b",))
    report = report_of(tmp_path, "r", rows)
    # 20% in task a, 0% in b: 4/40 = 10% pooled.
    assert violation_gate(report, 0.10) == []
    assert "10.0% (4/40 prompts)" in violation_gate(report, 0.05)[0]


# -- regression gate ------------------------------------------------------------------------
def test_identical_runs_pass_the_harm_shown_test(tmp_path: Path) -> None:
    baseline = report_of(tmp_path, "base", run_rows())
    current = report_of(tmp_path, "now", run_rows())
    assert regression_gate(current, baseline.paths["json"], 0.0, HARM) == []


def test_identical_runs_large_enough_to_exclude_the_margin_pass_non_inferiority(
    tmp_path: Path,
) -> None:
    # 40 unchanged 0/1 items: the score interval is +-0.088, inside a margin of 0.1.
    baseline = report_of(tmp_path, "base", run_rows())
    current = report_of(tmp_path, "now", run_rows())
    assert regression_gate(current, baseline.paths["json"], 0.1) == []


def test_non_inferiority_fails_a_run_too_small_to_exclude_the_margin(tmp_path: Path) -> None:
    baseline = report_of(tmp_path, "base", run_rows(n=200))
    small = report_of(tmp_path, "small", run_rows(n=10))
    reasons = regression_gate(small, baseline.paths["json"], 0.05, NONINFERIORITY)
    trunc = next(r for r in reasons if "trunc@500" in r)
    assert trunc.startswith("memory: trunc@500: non-inferiority test failed: the lower bound "
                            "-0.278 of the 95% interval of the change is not above the margin "
                            "-0.05")
    assert "with n=10 it cannot be: even with no flip it takes 73 items" in trunc
    assert "change +0.000 over 10 paired items, 95% CI [-0.278, +0.278] (score interval)" \
        in trunc
    assert "MDE 0.616, 0 right->wrong and 0 wrong->right (McNemar exact p=1)" in trunc
    large = report_of(tmp_path, "large", run_rows(n=200))
    assert regression_gate(large, baseline.paths["json"], 0.05, NONINFERIORITY) == []


def test_harm_shown_passes_a_run_too_small_to_detect_the_margin_with_a_warning(
    tmp_path: Path,
) -> None:
    baseline = report_of(tmp_path, "base", run_rows(n=10))
    current = report_of(tmp_path, "now", run_rows(n=10, quality=lambda i: float(i % 3 == 1)))
    found = regression_findings(current, baseline.paths["json"], 0.05, HARM)
    assert found.failures() == []
    (warning,) = [w for w in found.warnings() if "trunc@500" in w]
    assert warning.startswith("memory: trunc@500: harm-shown test passed but cannot detect a "
                              "drop of 0.05 with n=10 (MDE ")
    # A fall of 0.3 that 10 items cannot show: a pass, but not a quiet one.
    assert "change -0.300 over 10 paired items" in warning
    assert "3 right->wrong and 0 wrong->right (McNemar exact p=0.25)" in warning
    # Large enough to detect it: no warning.
    baseline = report_of(tmp_path, "base2", run_rows(n=400))
    current = report_of(tmp_path, "now2", run_rows(n=400))
    assert regression_findings(current, baseline.paths["json"], 0.05, HARM).warnings() == []


def test_significant_drop_fails_both_tests(tmp_path: Path) -> None:
    baseline = report_of(tmp_path, "base", run_rows(quality=lambda i: 1.0))
    current = report_of(tmp_path, "now", run_rows(quality=lambda i: float(i % 2)))
    (harm,) = regression_gate(current, baseline.paths["json"], 0.1, HARM)
    assert harm.startswith("memory: trunc@500: harm-shown test failed: quality fell by 0.500, "
                           "more than the allowed 0.100, with its interval below zero (change "
                           "-0.500 over 40 paired items")
    assert "20 right->wrong and 0 wrong->right (McNemar exact p=1.91e-06)" in harm
    (worse,) = regression_gate(current, baseline.paths["json"], 0.1)
    assert "non-inferiority test failed" in worse


def test_drop_within_the_tolerance_passes_harm_shown_but_not_non_inferiority(
    tmp_path: Path,
) -> None:
    baseline = report_of(tmp_path, "base", run_rows(quality=lambda i: 1.0))
    current = report_of(tmp_path, "now", run_rows(quality=lambda i: float(i % 2)))
    assert regression_gate(current, baseline.paths["json"], 0.6, HARM) == []
    # A fall of 0.5 whose interval reaches -0.65 does not exclude a drop of 0.6.
    assert regression_gate(current, baseline.paths["json"], 0.6, NONINFERIORITY)


def test_noisy_drop_whose_interval_spans_zero_passes_harm_shown(tmp_path: Path) -> None:
    noise = random.Random(4)
    before = [float(noise.random() < 0.5) for _ in range(40)]
    after = list(before)
    after[0], after[1] = 1.0 - after[0], 0.0  # a change or two: not significant
    baseline = report_of(tmp_path, "base", run_rows(quality=lambda i: before[i]))
    current = report_of(tmp_path, "now", run_rows(quality=lambda i: after[i]))
    assert regression_gate(current, baseline.paths["json"], 0.0, HARM) == []


def test_items_are_paired_by_id(tmp_path: Path) -> None:
    # The same qualities in another row order must not look like a change.
    rows = run_rows(quality=lambda i: float(i < 20))
    baseline = report_of(tmp_path, "base", rows)
    current = report_of(tmp_path, "now", list(reversed(rows)))
    assert regression_gate(current, baseline.paths["json"], 0.1) == []


def test_violation_rate_rise_fails(tmp_path: Path) -> None:
    baseline = report_of(tmp_path, "base", run_rows(trunc_violations=1))
    current = report_of(tmp_path, "now", run_rows(trunc_violations=3))
    reasons = regression_gate(current, baseline.paths["json"], 1.0)
    assert len(reasons) == 1
    assert "violation rate rose from 2.5% (1/40) to 7.5% (3/40)" in reasons[0]
    # ...and a fall is fine.
    assert regression_gate(baseline, current.paths["json"], 1.0) == []


def test_reference_violation_rise_is_exempt(tmp_path: Path) -> None:
    baseline = report_of(tmp_path, "base", run_rows())
    current = report_of(tmp_path, "now", run_rows(ref_violations=5))
    assert regression_gate(current, baseline.paths["json"], 0.2) == []


def test_unreadable_baseline_fails_closed(tmp_path: Path) -> None:
    current = report_of(tmp_path, "now", run_rows())
    missing = regression_gate(current, tmp_path / "missing.json", 0.0)
    assert len(missing) == 1 and "unusable baseline" in missing[0]
    other = tmp_path / "other.json"
    other.write_text('{"schema": "something-else"}')
    assert "not a budgetbench report.json" in regression_gate(current, other, 0.0)[0]


def test_a_baseline_with_no_shared_budget_fails_as_not_comparable(tmp_path: Path) -> None:
    def at(budget: int) -> list[dict[str, Any]]:
        return [make_row("memory", f"i{i}", "trunc", budget, quality=0.0 if budget % 2 else 1.0)
                for i in range(10)]

    baseline = report_of(tmp_path, "base", at(300) + at(5000))
    current = report_of(tmp_path, "now", at(301) + at(5001))  # every answer wrong
    (reason,) = regression_gate(current, baseline.paths["json"], 0.05)
    assert "nothing is comparable for task 'memory'" in reason
    assert "trunc@301" in reason and "trunc@300" in reason


def test_a_baseline_of_other_tasks_is_not_comparable(tmp_path: Path) -> None:
    baseline = report_of(tmp_path, "base", run_rows(tasks=("a",)))
    current = report_of(tmp_path, "now", run_rows(tasks=("a", "b")))
    (reason,) = regression_gate(current, baseline.paths["json"], 0.05)
    assert "task 'b'" in reason and "no cells of it" in reason


def test_a_regression_gate_that_compared_nothing_fails_and_says_so(tmp_path: Path) -> None:
    """Model-free runs over items without evidence: no quality and no retention to pair,
    so each regression gate fails naming the cell, rather than passing with no change."""
    from pytest_budgetbench.reports import gate_verdict
    from pytest_budgetbench.reports.gates.verdicts import REGRESSION_GATE, GateSpec

    rows = [make_row("own", f"i{i}", "trunc", 500, quality=None) for i in range(10)]
    baseline = report_of(tmp_path, "base", rows)
    current = report_of(tmp_path, "now", rows)
    (reason,) = regression_gate(current, baseline.paths["json"], 0.1)
    assert reason.startswith(f"own: trunc@500: nothing was compared with baseline "
                             f"{baseline.paths['json']}: no item has a quality or an evidence "
                             "retention in both runs")
    verdict = gate_verdict(current, GateSpec(REGRESSION_GATE, "trunc", 500),
                           max_regression=0.1, baseline=baseline.paths["json"])
    assert not verdict.passed and verdict.reasons == (reason,)
    # One item with quality in both runs is a comparison: no such failure.
    rows[0] = make_row("own", "i0", "trunc", 500, quality=1.0)
    compared = report_of(tmp_path, "one", rows)
    assert not any("nothing was compared" in line for line in regression_gate(
        compared, report_of(tmp_path, "base1", rows).paths["json"], 0.1, HARM))


def test_check_baseline_comparable_before_a_sweep(tmp_path: Path) -> None:
    baseline = report_of(tmp_path, "base", run_rows()).paths["json"]
    assert check_baseline_comparable(baseline, [("memory", "trunc", 500)]) == []
    assert check_baseline_comparable(baseline, [("memory", "trunc", 501)])
    assert "unusable baseline" in check_baseline_comparable(
        tmp_path / "missing.json", [("memory", "trunc", 500)])[0]


# -- structured verdicts over one computed report -------------------------------------------
def test_gate_verdict_carries_its_numbers_and_the_report_is_computed_without_writing(
    tmp_path: Path,
) -> None:
    from pytest_budgetbench.reports import compute_report, gate_verdict, write_report
    from pytest_budgetbench.reports.gates.verdicts import VIOLATION_GATE, GateSpec

    run = write_run(tmp_path / "run", run_rows(trunc_violations=4))
    report = compute_report([run], tmp_path / "out", resamples=200)
    assert not (tmp_path / "out").exists()  # computing writes nothing
    verdict = gate_verdict(report, GateSpec(VIOLATION_GATE, "trunc", 500), max_rate=0.05)
    assert (verdict.passed, verdict.n_violation, verdict.n_judged) == (False, 4, 40)
    assert verdict.rate == pytest.approx(0.1)
    assert verdict.message == verdict.reasons[0] and verdict.reasons[0].startswith("trunc@500:")
    write_report(report, plots=False)
    assert (tmp_path / "out" / "report.json").is_file()


def test_a_regression_verdict_keeps_its_largest_fall_and_interval(tmp_path: Path) -> None:
    from pytest_budgetbench.reports import gate_verdict
    from pytest_budgetbench.reports.gates.verdicts import REGRESSION_GATE, GateSpec

    baseline = report_of(tmp_path, "base", run_rows(quality=lambda i: 1.0))
    current = report_of(tmp_path, "now", run_rows(quality=lambda i: float(i % 2)))
    verdict = gate_verdict(current, GateSpec(REGRESSION_GATE, "trunc", 500),
                           max_regression=0.1, baseline=baseline.paths["json"])
    assert not verdict.passed and verdict.delta == pytest.approx(-0.5)
    assert verdict.interval is not None and verdict.interval[1] < 0


def test_one_violation_rate_is_nan_when_nothing_was_judged() -> None:
    import math

    from pytest_budgetbench.reports.gates.verdicts import violation_rate
    from pytest_budgetbench.reports.summary import row_columns, summarise
    from pytest_budgetbench.reports.terminal import format_table

    assert violation_rate(1, 3) == 0.25 and math.isnan(violation_rate(0, 0))
    rows = [{"task": "t", "item_id": "i", "strategy": "s", "budget": 1, "status": "error"}]
    (stats,) = summarise(row_columns(rows), resamples=1, seed=0)
    assert math.isnan(stats.violation_rate)  # the terminal said 0.0, report.json NaN
    assert format_table([stats])[-1].split()[6] == "-"


def test_the_terminal_reads_the_computed_reports_numbers(tmp_path: Path) -> None:
    from pytest_budgetbench.reports import compute_report
    from pytest_budgetbench.reports.summary import row_columns, summarise
    from pytest_budgetbench.reports.terminal import cell_summaries
    from pytest_budgetbench.settings.config import Settings

    rows = run_rows(trunc_violations=3)
    run = write_run(tmp_path / "run", rows)
    report = compute_report([run], tmp_path / "out", resamples=200)
    from_report = cell_summaries(rows, Settings(), report)
    # The report's table is summarise's cells, each column as computed.
    assert from_report == summarise(row_columns(rows), resamples=200, seed=0)
    assert [(s.strategy, s.n_cells, s.n_ok, s.n_violation, s.reference) for s in from_report
            ] == [("full_context", 40, 40, 0, True), ("trunc", 40, 37, 3, False)]
    assert all(s.quality_lo is not None for s in from_report)  # the report's interval


class Lines:
    """A terminal reporter that keeps the lines written to it."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def section(self, title: str) -> None:
        self.lines.append(f"== {title}")

    def write_line(self, line: str, **markup: Any) -> None:
        self.lines.append(line)


def repeated_rows() -> list[dict[str, Any]]:
    """Three repeats of each item, admitted unevenly: an item's mean over its repeats
    (the report's rule) is not the mean over admitted rows. In trunc@500, item i0 scores
    1, 1, 1 and i1 scores 0 once and violates twice: 0.5 per item, 0.75 per row."""
    rows = []
    for item in range(6):
        for repeat in range(3):
            rows.append(make_row("memory", f"i{item}", "full_context", 500, reference=True,
                                 repeat=repeat, quality=1.0, evidence_retention=1.0))
            violates = item % 2 == 1 and repeat > 0
            rows.append(make_row(
                "memory", f"i{item}", "trunc", 500, repeat=repeat,
                status="violation" if violates else "ok",
                quality=0.0 if item % 2 else 1.0 - 0.1 * (item == 2),
                counted_tokens=100 + 37 * item + repeat, model_s=0.1 * (item + repeat),
                calls=1 + item % 3 + repeat, total_tokens=200 + 50 * item * repeat,
                evidence_retention=0.25 * (item % 4), name_accuracy=0.5 + 0.1 * repeat))
    return rows


def test_the_terminal_prints_the_reports_summary_with_or_without_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from pytest_budgetbench.reports import compute_report
    from pytest_budgetbench.reports.terminal import write_summary
    from pytest_budgetbench.settings.config import Settings

    run = write_run(tmp_path / "run", repeated_rows())
    settings = Settings(resamples=300, seed=3)
    report = compute_report([run], tmp_path / "out", resamples=300, seed=3)

    def printed(report: Any) -> list[str]:
        terminal = Lines()
        write_summary(terminal, run, settings, report=report)
        return terminal.lines

    with_report, without = printed(report), printed(None)
    assert with_report == without
    (trunc,) = [line.split() for line in with_report if line.startswith("  trunc ")]
    # n, admitted, quality (over items, repeats averaged), 95% CI, violation rate.
    assert trunc[2:5] == ["18", "12", "0.483"] and trunc[7] == "0.333"
    # Without numpy (the core install) every number is the same but the interval's.
    monkeypatch.setitem(sys.modules, "numpy", None)
    no_interval = [re.sub(r"\[[^]]*\]", lambda m: "-".rjust(len(m.group())), line)
                   for line in with_report]
    assert printed(None) == no_interval != with_report


def test_a_harm_shown_verdict_that_passed_carries_its_warning_through_its_report(
    tmp_path: Path,
) -> None:
    from pytest_budgetbench.reports import gate_verdict
    from pytest_budgetbench.reports.gates.verdicts import (
        REGRESSION_GATE,
        GateSpec,
        GateVerdict,
    )

    baseline = report_of(tmp_path, "base", run_rows(n=10))
    current = report_of(tmp_path, "now", run_rows(n=10))
    verdict = gate_verdict(current, GateSpec(REGRESSION_GATE, "trunc", 500),
                           max_regression=0.05, baseline=baseline.paths["json"],
                           regression_test=HARM)
    assert verdict.passed and len(verdict.notes) == 1
    assert "cannot detect a drop of 0.05 with n=10" in verdict.notes[0]
    assert GateVerdict.from_public(verdict.public()) == verdict  # an xdist worker's, too
    strict = gate_verdict(current, GateSpec(REGRESSION_GATE, "trunc", 500),
                          max_regression=0.05, baseline=baseline.paths["json"])
    assert not strict.passed and strict.notes == ()
    assert strict.interval == pytest.approx((-0.2775, 0.2775), abs=1e-4)
