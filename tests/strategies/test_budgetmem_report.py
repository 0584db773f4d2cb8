"""BudgetMem in the report: tier-selection ratios (tiers.csv, report.json, report.md) and
the quality-vs-processing-cost Pareto plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.reports import build_report
from pytest_budgetbench.reports.synthetic import make_row, write_run

pytest.importorskip("pandas")

MODULES = ("filter", "entity", "temporal", "topic", "summary")


def _info(tiers: list[str]) -> dict[str, Any]:
    return {"budgetmem": {
        "axis": "implementation",
        "tiers": dict(zip(MODULES, tiers, strict=True)),
        "module_s": dict.fromkeys(MODULES, 0.5),
        "module_aux_input_tokens": {m: 100 if t == "HIGH" else 0
                                    for m, t in zip(MODULES, tiers, strict=True)},
        "module_aux_output_tokens": {m: 10 if t == "HIGH" else 0
                                     for m, t in zip(MODULES, tiers, strict=True)},
    }}


def _rows() -> list[dict[str, Any]]:
    rows = []
    for i in range(4):
        router = ["HIGH" if i % 2 else "LOW", "MID", "LOW", "LOW", "HIGH"]
        rows.append(make_row("memory", f"i{i}", "budgetmem@0.1", 2048, quality=1.0,
                             strategy_info=_info(router)))
        rows.append(make_row("memory", f"i{i}", "budgetmem_low", 2048, quality=0.0,
                             strategy_info=_info(["LOW"] * 5)))
        rows.append(make_row("memory", f"i{i}", "truncation", 2048, quality=0.5))
    return rows


def test_tier_ratios_per_module_reach_every_output(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", _rows())
    report = build_report([run], tmp_path / "out", plots=False, resamples=200)
    tiers = report.extra_tables["tiers"].table
    router = tiers[tiers["strategy"] == "budgetmem@0.1"]
    assert list(router["module"]) == list(MODULES)  # pipeline order
    filter_row = router[router["module"] == "filter"].iloc[0]
    assert (filter_row["low"], filter_row["mid"], filter_row["high"]) == (0.5, 0.0, 0.5)
    assert filter_row["aux_tokens_mean"] == pytest.approx(55.0)
    low = tiers[tiers["strategy"] == "budgetmem_low"]
    assert set(low["low"]) == {1.0}
    assert "truncation" not in set(tiers["strategy"])
    assert (tmp_path / "out" / "tiers.csv").is_file()
    document = json.loads((tmp_path / "out" / "report.json").read_text())
    assert len(document["tiers"]) == 2 * len(MODULES)
    assert "BudgetMem tier selection" in (tmp_path / "out" / "report.md").read_text()


def test_pareto_cost_plot_only_for_tasks_with_budgetmem(tmp_path: Path) -> None:
    rows = _rows() + [make_row("other", f"i{i}", "truncation", 2048) for i in range(3)]
    run = write_run(tmp_path / "run", rows)
    report = build_report([run], tmp_path / "out", resamples=200)
    cost_plots = [p for p in report.plots if p.kind == "quality_cost"]
    assert [p.task for p in cost_plots] == ["memory"]
    assert cost_plots[0].path.stat().st_size > 1000
    assert "tokens processed" in cost_plots[0].title


def test_no_budgetmem_rows_means_no_tier_table(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", [make_row("memory", "i0", "truncation", 2048)])
    report = build_report([run], tmp_path / "out", plots=False, resamples=50)
    assert report.extra_tables["tiers"].table.empty
    assert not (tmp_path / "out" / "tiers.csv").exists()
