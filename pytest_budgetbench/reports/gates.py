"""Pass/fail gates over a built report. Pure functions: they return reason lines (empty when
the gate passes); the plugin and the CLI print them and set the exit status."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_budgetbench.reports import report_json
from pytest_budgetbench.reports.stats import bootstrap_ci, cell_rng
from pytest_budgetbench.reports.tables import key_values, paired_deltas

if TYPE_CHECKING:
    from pytest_budgetbench.reports.builder import Report

# Rates are ratios of counts; anything smaller is float noise, not a change.
_EPS = 1e-12


def violation_gate(report: Report, max_rate: float) -> list[str]:
    """One line per non-reference strategy@budget whose violation rate, pooled over tasks
    (violations / (admitted + violations)), exceeds ``max_rate``, or that has no rate
    (every cell errored): as :func:`gate_verdict`, a gate over nothing fails."""
    summary = report.summary
    candidates = summary.loc[~summary["reference"].astype(bool)] if not summary.empty else summary
    if candidates.empty:
        return ["violation gate: no strategy@budget other than a reference has a row, so "
                "there is no violation rate to judge"]
    pooled = candidates.groupby(["strategy", "budget"], sort=True)[
        ["n_ok", "n_violation", "n_error"]].sum()
    reasons = []
    for key, counts in pooled.iterrows():
        strategy, budget = key_values(key)
        ran = int(counts["n_ok"] + counts["n_violation"])
        if ran == 0:
            reasons.append(f"{strategy}@{budget}: no cell was admitted or over budget "
                           f"({int(counts['n_error'])} errored, see cells.jsonl), so there "
                           "is no violation rate to judge")
            continue
        reason = _violation_reason(f"{strategy}@{budget}", int(counts["n_violation"]), ran,
                                   max_rate)
        if reason:
            reasons.append(reason)
    return reasons


def _violation_reason(label: str, violations: int, ran: int, max_rate: float) -> str | None:
    rate = violations / ran
    if rate <= max_rate + _EPS:
        return None
    return (
        f"{label}: violation rate {rate:.1%} ({violations}/{ran} prompts) exceeds the "
        f"maximum {max_rate:.1%} by {100 * (rate - max_rate):.1f} percentage points"
    )


def gate_verdict(
    report: Report,
    kind: str,
    strategy: str,
    budget: int,
    *,
    max_rate: float | None = None,
    max_regression: float | None = None,
    baseline: Path | None = None,
) -> str | None:
    """One gate item's verdict over one strategy@budget: its failure reason, or None.

    ``kind`` is "violation-rate" or "regression". A gate that has nothing to judge (every
    cell errored, or none ran) fails and says so: a gate that passes on no data guards
    nothing.
    """
    label = f"{strategy}@{budget}"
    summary = report.summary
    mine = summary.loc[(summary["strategy"] == strategy) & (summary["budget"] == budget)]
    if "category" in mine.columns:
        mine = mine.loc[mine["category"].isna()]
    n_ok = int(mine["n_ok"].sum()) if not mine.empty else 0
    n_violation = int(mine["n_violation"].sum()) if not mine.empty else 0
    n_error = int(mine["n_error"].sum()) if not mine.empty else 0
    if kind == "violation-rate":
        assert max_rate is not None
        if n_ok + n_violation == 0:
            return (f"{label}: no cell was admitted or over budget ({n_error} errored, "
                    "see cells.jsonl), so there is no violation rate to judge")
        return _violation_reason(label, n_violation, n_ok + n_violation, max_rate)
    assert baseline is not None and max_regression is not None
    if n_ok + n_violation == 0:
        return (f"{label}: no cell was admitted or over budget ({n_error} errored, see "
                "cells.jsonl), so there is nothing to compare with the baseline")
    reasons = regression_gate(report, baseline, max_regression)
    mine_reasons = [r for r in reasons if r.split(": ", 1)[-1].startswith(f"{label}: ")
                    or r.startswith("regression gate:")]
    return "; ".join(mine_reasons) or None


def regression_gate(
    report: Report, baseline_report_json: Path, max_regression: float
) -> list[str]:
    """Compare each task's strategy@budget with the same cell of a baseline report.json.

    Fails a cell when (a) its mean quality, paired by item_id over items scored in both
    runs, fell by more than ``max_regression`` and the 95% paired bootstrap interval of the
    change lies below zero, or (b) its violation rate rose (reference strategies, which are
    allowed to overflow, are exempt from (b)).
    """
    try:
        baseline = report_json.cell_records(report_json.read_report_json(baseline_report_json))
    except (report_json.BaselineError, KeyError, TypeError, ValueError) as exc:
        # Fail closed: a gate that silently passes on an unreadable baseline guards nothing.
        return [f"regression gate: unusable baseline {baseline_report_json}: {exc}"]
    current = report_json.cell_records(report.document)
    incomparable = check_baseline_comparable(baseline.keys(), current.keys(),
                                             source=baseline_report_json)
    if incomparable:
        return incomparable  # a gate that compared nothing must not pass
    common = sorted(current.keys() & baseline.keys())
    if not any(current[key].n_ok + current[key].n_violation for key in common):
        return [f"regression gate: no cell this run shares with baseline "
                f"{baseline_report_json} was admitted or over budget (every one errored, "
                "see cells.jsonl), so nothing was compared"]
    reasons: list[str] = []
    for key in common:
        task, strategy, budget = key
        now, before = current[key], baseline[key]
        label = f"{task}: {strategy}@{budget}"
        deltas = paired_deltas(now.quality, before.quality)
        if deltas.size:
            delta = float(deltas.mean())
            rng = cell_rng(report.settings.seed, "regression", *key)
            lo, hi = bootstrap_ci(deltas, resamples=report.settings.resamples, rng=rng)
            if delta < -max_regression and hi < 0:
                reasons.append(
                    f"{label}: quality fell by {-delta:.3f} over {deltas.size} paired items "
                    f"(95% CI of the change [{lo:.3f}, {hi:.3f}]), more than the allowed "
                    f"{max_regression:.3f}"
                )
        if not now.reference and _rose(now.violation_rate, before.violation_rate):
            reasons.append(
                f"{label}: violation rate rose from {before.violation_rate:.1%} "
                f"({before.n_violation}/{before.n_ok + before.n_violation}) to "
                f"{now.violation_rate:.1%} ({now.n_violation}/{now.n_ok + now.n_violation})"
            )
    return reasons


CellKey = tuple[str, str, int]
"""(task, strategy, budget)"""


def check_baseline_comparable(
    baseline: Path | str | Iterable[CellKey],
    planned: Iterable[CellKey],
    *,
    source: Path | str | None = None,
) -> list[str]:
    """Why ``planned`` cells cannot be compared with a baseline; empty when they can.

    ``baseline`` is a report.json path or its (task, strategy, budget) cells; ``planned``
    the cells of this run (a report's, or, before a sweep, the cells it will run, by
    strategy *name*). Comparable means: every task of the run is in the baseline, and
    shares at least one strategy@budget with it. One line per task that does not.
    """
    if isinstance(baseline, Path | str):
        source = source or baseline
        try:
            document = report_json.read_report_json(Path(baseline))
            baseline = report_json.cell_records(document).keys()
        except (report_json.BaselineError, KeyError, TypeError, ValueError) as exc:
            return [f"regression gate: unusable baseline {baseline}: {exc}"]
    before = _by_task(baseline)
    now = _by_task(planned)
    where = f"baseline {source}" if source else "the baseline"
    reasons = []
    for task in sorted(now):
        if task not in before:
            have = ", ".join(sorted(before)) or "none"
            reasons.append(
                f"regression gate: nothing is comparable for task '{task}': {where} has no "
                f"cells of it (its tasks: {have}); use a baseline of the same tasks"
            )
        elif not now[task] & before[task]:
            reasons.append(
                f"regression gate: nothing is comparable for task '{task}': no "
                f"strategy@budget is in both this run ({_cells(now[task])}) and {where} "
                f"({_cells(before[task])}); run at least one of the baseline's "
                "strategy@budget cells, or make a new baseline"
            )
    if not now:
        reasons.append(f"regression gate: this run has no cells to compare with {where}")
    return reasons


def _by_task(keys: Iterable[CellKey]) -> dict[str, set[tuple[str, int]]]:
    tasks: dict[str, set[tuple[str, int]]] = {}
    for task, strategy, budget in keys:
        tasks.setdefault(str(task), set()).add((str(strategy), int(budget)))
    return tasks


def _cells(cells: set[tuple[str, int]], limit: int = 6) -> str:
    names = [f"{strategy}@{budget}" for strategy, budget in sorted(cells)]
    more = f", and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _rose(now: float, before: float) -> bool:
    if math.isnan(now):
        return False
    return now > (0.0 if math.isnan(before) else before) + _EPS
