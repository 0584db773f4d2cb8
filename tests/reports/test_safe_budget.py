"""The budget search's judgments (reports.gates.safe_budget): the floors at one budget, as
the retention and violation gates judge them, and the gate on a safe budget."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.reports.gates.safe_budget import (
    Floors,
    ProbeOutcome,
    gate_reason,
    judge_probe,
    max_safe_budget,
    safe_budget_record,
)
from pytest_budgetbench.sweep.search import BudgetSearch, SearchTrace

FLOORS = Floors(min_retention=0.9, max_violation_rate=0.05)


def row(item: str, status: str = "ok", kept: float | None = 1.0, **more: Any
        ) -> dict[str, Any]:
    return {"item_id": item, "status": status,
            "evidence_retention": kept if status == "ok" else None, **more}


def test_retention_is_the_mean_over_admitted_items_with_each_items_repeats_averaged_first(
) -> None:
    probe = judge_probe(1024, [row("a", kept=1.0), row("a", kept=0.0), row("b", kept=1.0),
                               row("c", kept=None), row("d", "violation")], Floors(0.7))
    assert probe.retention == 0.75 and probe.n_retention == 2  # (0.5 + 1.0) / 2
    assert probe.passed  # 0.75 >= 0.7
    assert probe.items == {"a": (1.0, 0.5), "b": (1.0, 1.0), "c": (1.0, None),
                           "d": (0.0, None)}
    assert judge_probe(1024, [row("a", kept=0.5)], Floors(0.9)).reasons == (
        "evidence retention 0.500 over 1 admitted items is below the floor 0.900",)


def test_answer_kept_is_a_floor_judged_per_item_as_retention_is() -> None:
    rows = [row("a", answer_kept=True), row("a", answer_kept=False), row("b", answer_kept=True),
            row("c", answer_kept=None), row("d", "violation", answer_kept=False)]
    probe = judge_probe(1024, rows, Floors(min_answer_kept=0.7))
    assert (probe.answer_kept, probe.n_answer_kept) == (0.75, 2) and probe.passed
    assert judge_probe(1024, rows, Floors(min_answer_kept=0.8)).reasons == (
        "answer kept 0.750 over 2 admitted items is below the floor 0.800",)
    assert judge_probe(1024, [row("c")], Floors(min_answer_kept=0.8)).reasons == (
        "none of its admitted items has its answer in its evidence, so there is no answer "
        "kept to judge",)


def test_the_violation_rate_counts_admitted_and_over_budget_prompts_not_errors() -> None:
    rows = [row(str(i)) for i in range(19)] + [row("x", "violation"), row("y", "error")]
    probe = judge_probe(2048, rows, FLOORS)
    assert probe.violation_rate == 1 / 20 and probe.n_error == 1 and probe.passed
    probe = judge_probe(2048, [*rows, row("z", "violation")], FLOORS)
    assert probe.reasons == ("violation rate 9.5% (2/21 prompts) exceeds the maximum 5.0%",)


def test_a_probe_with_nothing_to_judge_fails_both_floors_and_says_why() -> None:
    probe = judge_probe(512, [row("a", "violation"), row("b", "error")], FLOORS)
    assert probe.reasons == (
        "violation rate 100.0% (1/1 prompts) exceeds the maximum 5.0%",
        "no prompt was admitted (1 over budget, 1 errored), so there is no evidence "
        "retention to judge")
    errored = judge_probe(512, [row("b", "error")], Floors(max_violation_rate=0.05))
    assert errored.reasons == ("no prompt was admitted or over budget (1 errored)",)


def test_the_gate_fails_above_its_maximum_naming_why_the_budget_below_fails() -> None:
    search = BudgetSearch(512, 1024)
    below = judge_probe(896, [row("a", kept=0.5)], FLOORS)
    trace = SearchTrace(960, [ProbeOutcome(1024), ProbeOutcome(960), below])
    record = safe_budget_record("memory", "truncation", search, FLOORS, trace, 900)
    assert record["below"] == 896
    assert record["gate"] == gate_reason(record) == (
        "memory: truncation: safe budget 960 is above the maximum 900 (at 896: evidence "
        "retention 0.500 over 1 admitted items is below the floor 0.900)")
    assert safe_budget_record("memory", "truncation", search, FLOORS, trace, 960)["gate"] is None
    assert safe_budget_record("memory", "truncation", search, FLOORS, trace, None)["gate"] is None
    top = judge_probe(1024, [row("a", "violation")], Floors(max_violation_rate=0.05))
    none = safe_budget_record("memory", "rag", search, FLOORS, SearchTrace(None, [top]), 4096)
    assert none["gate"] == (
        "memory: rag: no budget in 512..1024 meets the floors (at 1024: violation rate 100.0% "
        "(1/1 prompts) exceeds the maximum 5.0%), so none is at or under the maximum safe "
        "budget 4096")


def test_a_bare_maximum_gates_every_strategy_but_a_reference_which_needs_its_name() -> None:
    limits = {"": 2048, "full_context": 4096}
    assert max_safe_budget(limits, "rag", reference=False) == 2048
    assert max_safe_budget(limits, "full_context", reference=True) == 4096
    assert max_safe_budget({"": 2048}, "full_context", reference=True) is None
    assert max_safe_budget({}, "rag", reference=False) is None


def test_the_search_plot_is_written_per_task(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from pytest_budgetbench.reports.plots import safe_budget_plots

    search = BudgetSearch(512, 1024)
    probes = [judge_probe(b, [row("a", kept=k)], FLOORS) for b, k in ((1024, 1.0), (512, 0.5))]
    records = [safe_budget_record(task, "truncation", search, FLOORS,
                                  SearchTrace(1024, probes), None)
               for task in ("memory", "needle")]
    plots = safe_budget_plots(records, tmp_path)
    assert [plot.task for plot in plots] == ["memory", "needle"]
    for plot in plots:
        assert plot.path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert plot.title == f"{plot.task}: retention against budget, safe budgets marked"
