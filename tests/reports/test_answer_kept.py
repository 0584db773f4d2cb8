"""Answer kept in the reports (issue 40): the summary's two means (all items whose evidence
holds the answer, and those where it is unique), summary.csv, the paired change with its
interval, categories, the terminal table, report.json and the answer-kept floor gate."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_budgetbench.records.rows import Status
from pytest_budgetbench.reports import build_report
from pytest_budgetbench.reports.stats import bootstrap_ci, cell_rng
from pytest_budgetbench.reports.synthetic import make_row, write_run

pytest.importorskip("pandas")

RESAMPLES = 500


def answer(kept: bool | None, unique: bool = True) -> dict[str, Any]:
    """A row's answer fields: kept or not, or no answer the evidence holds (None)."""
    if kept is None:
        return {}
    return {"answer_kept": kept, "answer_unique": unique}


def rows_of_a_summary_that_drops_answers(n: int = 20) -> list[dict[str, Any]]:
    """full_context keeps every answer. summary keeps the answer of the odd items only; the
    items from i12 on have an echo (not unique); i18 and i19 have no answer in their
    evidence; i17 is over budget (its prompt kept the answer, but was never sent)."""
    rows = []
    for i in range(n):
        category = "early" if i < n // 2 else "late"
        has = None if i >= 18 else True
        unique = i < 12
        rows.append(make_row(item_id=f"i{i}", strategy="full_context", budget=4000,
                             reference=True, category=category, **answer(has, unique)))
        status = Status.VIOLATION if i == 17 else Status.OK
        kept = None if i >= 18 else (i % 2 == 1 or i == 17)
        rows.append(make_row(item_id=f"i{i}", strategy="summary", budget=500, status=status,
                             category=category, **answer(kept, unique)))
    return rows


def build(tmp_path: Path, rows: list[dict[str, Any]]) -> Any:
    run = write_run(tmp_path / "run", rows)
    return build_report([run], tmp_path / "out", plots=False, resamples=RESAMPLES)


def only(table: Any, strategy: str, **extra: Any) -> dict[str, Any]:
    mask = table["strategy"] == strategy
    for column, value in extra.items():
        mask &= table[column] == value
    (row,) = table.loc[mask].to_dict(orient="records")
    return dict(row)


def csv_rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or []), list(reader)


def test_the_summary_means_answer_kept_over_items_with_an_answer_and_the_unique_ones(
    tmp_path: Path,
) -> None:
    report = build(tmp_path, rows_of_a_summary_that_drops_answers())
    row = only(report.summary, "summary")
    # Admitted with an answer: i0..i16 (i17 over budget, i18-i19 none): 8 odd of 17.
    assert row["answer_kept_mean"] == pytest.approx(8 / 17)
    # Unique: i0..i11, 6 odd of 12.
    assert row["answer_kept_unique_mean"] == pytest.approx(6 / 12)
    assert only(report.summary, "full_context")["answer_kept_mean"] == 1.0
    header, lines = csv_rows(report.out_dir / "summary.csv")
    assert {"answer_kept_mean", "answer_kept_unique_mean"} <= set(header)
    line = next(line for line in lines if line["strategy"] == "summary")
    assert float(line["answer_kept_mean"]) == pytest.approx(8 / 17)
    assert float(line["answer_kept_unique_mean"]) == pytest.approx(0.5)


def test_the_terminal_computes_the_same_means_from_the_rows_without_pandas() -> None:
    from pytest_budgetbench.reports.summary import row_columns, summarise
    from pytest_budgetbench.reports.terminal import format_table

    stats = summarise(row_columns(rows_of_a_summary_that_drops_answers()), resamples=10,
                      seed=0)
    summary = next(s for s in stats if s.strategy == "summary")
    assert summary.answer_kept_mean == pytest.approx(8 / 17)
    assert summary.answer_kept_unique_mean == pytest.approx(0.5)
    header, _, *lines = format_table(stats)
    assert header.split()[-2:] == ["ans.kept", "unique"]
    line = next(line for line in lines if line.startswith("summary"))
    assert line.split()[-2:] == [f"{8 / 17:.3f}", "0.500"]
    # No task gives an answer: no column.
    plain = [make_row(item_id="i0", strategy="truncation")]
    assert "ans.kept" not in format_table(summarise(row_columns(plain), resamples=10,
                                                    seed=0))[0]


def test_answer_kept_pairs_against_the_reference_with_a_paired_bootstrap(
    tmp_path: Path,
) -> None:
    report = build(tmp_path, rows_of_a_summary_that_drops_answers())
    row = only(report.paired, "summary")
    assert (row["answer_kept"], row["ref_answer_kept"]) == pytest.approx((8 / 17, 1.0))
    assert row["answer_kept_delta"] == pytest.approx(-9 / 17)
    ids = sorted(f"i{i}" for i in range(17))  # the item table's order, i17-i19 left out
    differences = np.array([0.0 if int(i[1:]) % 2 else -1.0 for i in ids])
    expected = bootstrap_ci(differences, resamples=RESAMPLES,
                            rng=cell_rng(0, "answer_kept", "full_context", 4000, "memory",
                                         "summary", 500))
    assert (row["answer_kept_delta_lo"], row["answer_kept_delta_hi"]) == pytest.approx(expected)
    assert row["answer_kept_delta_hi"] < 0
    # Retention, which these rows lack, stays empty beside it.
    assert np.isnan(row["retention_delta"])
    header, (line,) = csv_rows(report.out_dir / "paired.csv")
    assert header[-5:] == ["answer_kept", "ref_answer_kept", "answer_kept_delta",
                           "answer_kept_delta_lo", "answer_kept_delta_hi"]
    assert float(line["answer_kept_delta"]) == pytest.approx(-9 / 17)


def test_categories_and_the_pages_carry_answer_kept(tmp_path: Path) -> None:
    report = build(tmp_path, rows_of_a_summary_that_drops_answers())
    early = only(report.categories, "summary", category="early")
    late = only(report.categories, "summary", category="late")
    # early: i0..i9, 5 odd kept of 10; late: i10..i16 admitted with an answer, 3 odd of 7.
    assert (early["answer_kept_mean"], early["answer_kept_delta"]) == pytest.approx((0.5, -0.5))
    assert (late["answer_kept_mean"], late["answer_kept_delta"]) == pytest.approx(
        (3 / 7, -4 / 7))
    header, _ = csv_rows(report.out_dir / "categories.csv")
    assert header[-3:] == ["answer_kept_delta", "answer_kept_delta_lo", "answer_kept_delta_hi"]
    md = (report.out_dir / "report.md").read_text(encoding="utf-8")
    assert "answer kept (unique)" in md and "answer kept delta" in md
    assert f"{8 / 17:.3f}" in md and f"{-9 / 17:.3f} \\[" in md


def test_report_json_carries_each_items_answer_kept_for_the_gates(tmp_path: Path) -> None:
    from pytest_budgetbench.reports import report_json

    report = build(tmp_path, rows_of_a_summary_that_drops_answers())
    cells = report_json.cell_records(report.document)
    kept = cells[("memory", "summary", 500)].answer_kept
    assert len(kept) == 17 and kept["i1"] == 1.0 and kept["i0"] == 0.0
    assert "i17" not in kept and "i18" not in kept  # over budget; no answer


# -- the floor gate -------------------------------------------------------------------------
def test_the_answer_kept_floor_fails_below_it_and_names_the_lowest_items(
    tmp_path: Path,
) -> None:
    from pytest_budgetbench.reports import answer_kept_gate, gate_verdict
    from pytest_budgetbench.reports.gates.verdicts import ANSWER_GATE, GateSpec, GateVerdict

    report = build(tmp_path, rows_of_a_summary_that_drops_answers())
    failed = gate_verdict(report, GateSpec(ANSWER_GATE, "summary", 500), min_answer_kept=0.5)
    assert not failed.passed and failed.answer_kept == pytest.approx(8 / 17)
    assert failed.message == (
        f"summary@500: answer kept {8 / 17:.3f} over the 17 admitted items whose evidence "
        "holds their answer is below the floor 0.500 (lowest: memory/i0 0.00, "
        "memory/i10 0.00, memory/i12 0.00)")
    passed = gate_verdict(report, GateSpec(ANSWER_GATE, "summary", 500), min_answer_kept=0.45)
    assert passed.passed and passed.answer_kept == pytest.approx(8 / 17)
    assert GateVerdict.from_public(failed.public()) == failed  # an xdist worker's verdict
    # The console command's gate: every non-reference cell (full_context is the reference).
    assert answer_kept_gate(report, lambda s, b, ref: None if ref else 0.5) == [
        failed.message]
    assert answer_kept_gate(report, lambda s, b, ref: None if ref else 0.4) == []


def test_an_answer_kept_floor_over_items_without_answers_fails_and_says_why(
    tmp_path: Path,
) -> None:
    from pytest_budgetbench.reports import gate_verdict
    from pytest_budgetbench.reports.gates.verdicts import ANSWER_GATE, GateSpec

    rows = [make_row(item_id=f"i{i}", strategy="summary", budget=500) for i in range(3)]
    verdict = gate_verdict(build(tmp_path, rows), GateSpec(ANSWER_GATE, "summary", 500),
                           min_answer_kept=0.5)
    assert verdict.message == (
        "summary@500: none of its admitted items has a gold answer its evidence holds "
        "(engine.answers), so there is no answer kept to judge")


def test_the_report_command_gates_on_answer_kept(tmp_path: Path) -> None:
    from pytest_budgetbench.commands.cli import main

    run = write_run(tmp_path / "run", rows_of_a_summary_that_drops_answers())
    common = ["report", str(run), "--no-plots", f"--out={tmp_path / 'out'}"]
    assert main([*common, "--min-answer-kept=0.4"]) == 0
    assert main([*common, "--min-answer-kept=0.5"]) == 1
    assert main([*common, "--min-answer-kept=summary@500=0.4"]) == 0
    assert main([*common, "--min-answer-kept=rag@500=0.4"]) == 2  # a cell not recorded

