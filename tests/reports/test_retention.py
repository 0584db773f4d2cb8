"""Evidence retention in the report tables (issue 33): paired.csv's paired change of
retention against the reference cell, categories.csv's retention columns, and the
summary tables of report.md and report.html."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_budgetbench.reports import build_report, tables
from pytest_budgetbench.reports.stats import bootstrap_ci, cell_rng
from pytest_budgetbench.reports.synthetic import make_row, write_run

pytest.importorskip("pandas")

RESAMPLES = 500

# paired.csv's columns before retention: users and gates read them by position and name.
PAIRED_COLUMNS_BEFORE = [
    "task", "strategy", "budget", "ref_strategy", "ref_budget", "n_items", "n_paired",
    "quality", "ref_quality", "delta", "delta_lo", "delta_hi", "ci_method", "flips_down",
    "flips_up", "mcnemar_p", "mde", "excluded_violation", "ref_excluded_violation",
    "excluded_other", "ref_quality_of_excluded",
]
RETENTION_COLUMNS = ["retention", "ref_retention", "retention_delta", "retention_delta_lo",
                     "retention_delta_hi"]
# After retention, answer kept's (issue 40, tests/reports/test_answer_kept.py).
ANSWER_COLUMNS = ["answer_kept", "ref_answer_kept", "answer_kept_delta", "answer_kept_delta_lo",
                  "answer_kept_delta_hi"]


def evidence(kept: int | None, total: int = 2) -> dict[str, Any]:
    """A row's evidence fields: ``kept`` of ``total`` spans, or none declared (None)."""
    if kept is None:
        return {}
    return {"evidence_total": total, "evidence_kept": kept,
            "evidence_retention": round(kept / total, 4)}


def build(tmp_path: Path, rows: list[dict[str, Any]]) -> Any:
    run = write_run(tmp_path / "run", rows)
    return build_report([run], tmp_path / "out", plots=False, resamples=RESAMPLES)


def csv_rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or []), list(reader)


def only(table: Any, strategy: str, **extra: Any) -> Any:
    mask = table["strategy"] == strategy
    for column, value in extra.items():
        mask &= table[column] == value
    (row,) = table.loc[mask].to_dict(orient="records")
    return row


def dropping_rows(n: int = 20, dropped: int = 16) -> list[dict[str, Any]]:
    """full_context keeps both spans of every item; trunc keeps none on the first
    ``dropped`` items and both on the rest; one trunc item is over budget."""
    rows = []
    for i in range(n):
        category = "early" if i < n // 2 else "late"
        rows.append(make_row(item_id=f"i{i}", strategy="full_context", budget=4000,
                             reference=True, category=category, **evidence(2)))
        status = "violation" if i == n - 1 else "ok"
        rows.append(make_row(item_id=f"i{i}", strategy="trunc", budget=500, status=status,
                             category=category, **evidence(0 if i < dropped else 2)))
    return rows


def test_retention_delta_pairs_the_admitted_items_and_its_interval_excludes_zero(
    tmp_path: Path,
) -> None:
    report = build(tmp_path, dropping_rows())
    row = only(report.paired, "trunc")
    # 19 items admitted in both (i19 was over budget): 16 lost all evidence, 3 kept it.
    assert (row["retention"], row["ref_retention"]) == pytest.approx((3 / 19, 1.0))
    assert row["retention_delta"] == pytest.approx(-16 / 19)
    assert row["retention_delta_lo"] <= row["retention_delta"] <= row["retention_delta_hi"] < 0
    # The shared paired bootstrap: the per-item differences, the run's seed and resamples.
    # The items in the item table's order (by id), i19 left out.
    ids = sorted(f"i{i}" for i in range(19))
    differences = np.array([-1.0 if int(i[1:]) < 16 else 0.0 for i in ids])
    expected = bootstrap_ci(differences, resamples=RESAMPLES,
                            rng=cell_rng(0, "retention", "full_context", 4000, "memory",
                                         "trunc", 500))
    assert (row["retention_delta_lo"], row["retention_delta_hi"]) == pytest.approx(expected)


def test_paired_csv_keeps_its_columns_and_adds_retention_at_the_end(tmp_path: Path) -> None:
    report = build(tmp_path, dropping_rows())
    header, lines = csv_rows(report.out_dir / "paired.csv")
    assert header == PAIRED_COLUMNS_BEFORE + RETENTION_COLUMNS + ANSWER_COLUMNS
    assert list(tables.PAIRED_COLUMNS[len(PAIRED_COLUMNS_BEFORE) - 3:]) == (
        RETENTION_COLUMNS + ANSWER_COLUMNS)
    (line,) = lines
    assert float(line["retention_delta"]) == pytest.approx(-16 / 19)
    assert float(line["retention_delta_hi"]) < 0


def test_retention_columns_are_empty_where_no_item_declares_evidence(tmp_path: Path) -> None:
    rows = []
    for i in range(10):
        rows.append(make_row(item_id=f"i{i}", strategy="full_context", budget=4000,
                             reference=True, quality=1.0))
        rows.append(make_row(item_id=f"i{i}", strategy="trunc", budget=500,
                             quality=float(i % 2)))
    report = build(tmp_path, rows)
    header, (line,) = csv_rows(report.out_dir / "paired.csv")
    assert header == PAIRED_COLUMNS_BEFORE + RETENTION_COLUMNS + ANSWER_COLUMNS
    assert [line[c] for c in RETENTION_COLUMNS] == [""] * len(RETENTION_COLUMNS)
    assert float(line["delta"]) == pytest.approx(-0.5)  # quality still pairs
    _, categories = csv_rows(report.out_dir / "categories.csv")
    assert {line["retention_delta"] for line in categories} == {""}


def test_retention_pairs_only_items_with_retention_on_both_sides(tmp_path: Path) -> None:
    rows = []
    for i in range(6):
        # The reference saw no evidence on i0 and i1 (an episode that had not shown it yet).
        rows.append(make_row(item_id=f"i{i}", strategy="full_context", budget=4000,
                             reference=True, **evidence(None if i < 2 else 2)))
        rows.append(make_row(item_id=f"i{i}", strategy="trunc", budget=500, **evidence(1)))
    row = only(build(tmp_path, rows).paired, "trunc")
    assert (row["retention"], row["ref_retention"], row["retention_delta"]) == pytest.approx(
        (0.5, 1.0, -0.5))
    # Every pair changed by the same -0.5: the interval collapses onto it.
    assert (row["retention_delta_lo"], row["retention_delta_hi"]) == pytest.approx((-0.5, -0.5))


def test_categories_carry_retention_mean_and_delta(tmp_path: Path) -> None:
    report = build(tmp_path, dropping_rows())
    header, _ = csv_rows(report.out_dir / "categories.csv")
    assert header[-6:-3] == ["retention_delta", "retention_delta_lo", "retention_delta_hi"]
    assert header.index("evidence_retention_mean") < header.index("n_paired")
    early = only(report.categories, "trunc", category="early")
    late = only(report.categories, "trunc", category="late")
    # early: i0-i9 all dropped; late: i10-i15 dropped, i16-i17 kept, i18 kept, i19 over budget.
    assert (early["evidence_retention_mean"], early["retention_delta"]) == pytest.approx(
        (0.0, -1.0))
    assert (late["evidence_retention_mean"], late["retention_delta"]) == pytest.approx(
        (3 / 9, -6 / 9))


def test_report_md_and_html_show_retention(tmp_path: Path) -> None:
    report = build(tmp_path, dropping_rows())
    md = (report.out_dir / "report.md").read_text(encoding="utf-8")
    html = (report.out_dir / "report.html").read_text(encoding="utf-8")
    for page in (md, html):
        assert "evidence retention" in page and "retention delta" in page
    # trunc's summary retention over its 19 admitted items, and its paired change.
    assert f"{3 / 19:.3f}" in md and f"{-16 / 19:.3f} \\[" in md
    assert f"<td>{-16 / 19:.3f} [" in html
