"""Pass/fail gates over a computed report. Pure functions: :func:`gate_verdict` returns one
gate item's structured verdict; :func:`violation_gate` and :func:`regression_gate` return
reason lines (empty when the gate passes) for the console command."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_budgetbench.cells import (
    RATE_EPS,
    VIOLATION_GATE,
    GateSpec,
    GateVerdict,
    quality_regressed,
    violation_rate,
)
from pytest_budgetbench.reports import report_json
from pytest_budgetbench.reports.stats import bootstrap_ci, cell_rng
from pytest_budgetbench.reports.tables import key_values, paired_deltas

if TYPE_CHECKING:
    from pytest_budgetbench.reports.builder import Report


def violation_gate(report: Report, max_rate: float) -> list[str]:
    """One line per non-reference strategy@budget whose violation rate, pooled over tasks,
    exceeds ``max_rate``, or that has no rate (every cell errored): as
    :func:`gate_verdict`, a gate over nothing fails."""
    summary = report.summary
    candidates = summary.loc[~summary["reference"].astype(bool)] if not summary.empty else summary
    if candidates.empty:
        return ["violation gate: no strategy@budget other than a reference has a row, so "
                "there is no violation rate to judge"]
    reasons: list[str] = []
    for key in candidates.groupby(["strategy", "budget"], sort=True).groups:
        strategy, budget = key_values(key)
        verdict = gate_verdict(report, GateSpec(VIOLATION_GATE, str(strategy), int(budget)),
                               max_rate=max_rate)
        reasons.extend(verdict.reasons)
    return reasons


def _violation_reason(label: str, violations: int, judged: int, max_rate: float
                      ) -> str | None:
    rate = violation_rate(violations, judged - violations)
    if rate <= max_rate + RATE_EPS:
        return None
    return (
        f"{label}: violation rate {rate:.1%} ({violations}/{judged} prompts) exceeds the "
        f"maximum {max_rate:.1%} by {100 * (rate - max_rate):.1f} percentage points"
    )


def gate_verdict(
    report: Report,
    spec: GateSpec,
    *,
    max_rate: float | None = None,
    max_regression: float | None = None,
    baseline: Path | None = None,
) -> GateVerdict:
    """One gate item's verdict over one strategy@budget, pooled over tasks.

    ``spec.kind`` is "violation-rate" or "regression". A gate that has nothing to judge
    (every cell errored, or none ran) fails and says so: a gate that passes on no data
    guards nothing.
    """
    label = f"{spec.strategy}@{spec.budget}"
    summary = report.summary
    mine = summary.loc[(summary["strategy"] == spec.strategy)
                       & (summary["budget"] == spec.budget)]
    if "category" in mine.columns:
        mine = mine.loc[mine["category"].isna()]
    n_ok = int(mine["n_ok"].sum()) if not mine.empty else 0
    violations = int(mine["n_violation"].sum()) if not mine.empty else 0
    n_error = int(mine["n_error"].sum()) if not mine.empty else 0
    judged = n_ok + violations
    counted = GateVerdict(spec, rate=violation_rate(violations, n_ok), n_violation=violations,
                          n_judged=judged)
    if spec.kind == VIOLATION_GATE:
        assert max_rate is not None
        if judged == 0:
            return replace(counted, reasons=(f"{label}: no cell was admitted or over budget "
                                             f"({n_error} errored, see cells.jsonl), so there "
                                             "is no violation rate to judge",))
        reason = _violation_reason(label, violations, judged, max_rate)
        return replace(counted, reasons=(reason,) if reason else ())
    assert baseline is not None and max_regression is not None
    if judged == 0:
        return replace(counted, reasons=(f"{label}: no cell was admitted or over budget "
                                         f"({n_error} errored, see cells.jsonl), so there is "
                                         "nothing to compare with the baseline",))
    found = regression_findings(report, baseline, max_regression)
    key = (spec.strategy, spec.budget)
    worst = min(found.falls.get(key, []), default=None)
    return replace(counted, reasons=tuple(found.general + found.reasons.get(key, [])),
                   delta=None if worst is None else worst[0],
                   interval=None if worst is None else (worst[1], worst[2]))


def regression_gate(
    report: Report, baseline_report_json: Path, max_regression: float
) -> list[str]:
    """Compare each task's strategy@budget with the same cell of a baseline report.json
    (see :func:`regression_findings`): one line per failing cell."""
    found = regression_findings(report, baseline_report_json, max_regression)
    return found.general + [r for key in sorted(found.reasons) for r in found.reasons[key]]


@dataclass
class RegressionFindings:
    general: list[str] = field(default_factory=list)
    """Reasons that fail every regression gate (an unusable or incomparable baseline)."""
    reasons: dict[tuple[str, int], list[str]] = field(default_factory=dict)
    """Failure lines by strategy@budget, task by task."""
    falls: dict[tuple[str, int], list[tuple[float, float, float]]] = field(
        default_factory=dict)
    """Each task's paired quality change and its interval by strategy@budget."""


def regression_findings(
    report: Report, baseline_report_json: Path, max_regression: float
) -> RegressionFindings:
    """Compare each task's strategy@budget with the same cell of a baseline report.json.

    Fails a cell when (a) its mean quality, paired by item_id over items scored in both
    runs, fell by more than ``max_regression`` and the 95% paired bootstrap interval of the
    change lies below zero (:func:`~pytest_budgetbench.cells.quality_regressed`), or (b) its
    violation rate rose (reference strategies, which are allowed to overflow, are exempt
    from (b)).
    """
    found = RegressionFindings()
    try:
        baseline = report_json.cell_records(report_json.read_report_json(baseline_report_json))
    except (report_json.BaselineError, KeyError, TypeError, ValueError) as exc:
        # Fail closed: a gate that silently passes on an unreadable baseline guards nothing.
        found.general.append(f"regression gate: unusable baseline {baseline_report_json}: {exc}")
        return found
    current = report_json.cell_records(report.document)
    found.general += check_baseline_comparable(baseline.keys(), current.keys(),
                                               source=baseline_report_json)
    if found.general:
        return found  # a gate that compared nothing must not pass
    common = sorted(current.keys() & baseline.keys())
    if not any(current[key].n_ok + current[key].n_violation for key in common):
        found.general.append(
            f"regression gate: no cell this run shares with baseline {baseline_report_json} "
            "was admitted or over budget (every one errored, see cells.jsonl), so nothing "
            "was compared")
        return found
    for key in common:
        task, strategy, budget = key
        now, before = current[key], baseline[key]
        label = f"{task}: {strategy}@{budget}"
        reasons = found.reasons.setdefault((strategy, budget), [])
        deltas = paired_deltas(now.quality, before.quality)
        if deltas.size:
            delta = float(deltas.mean())
            rng = cell_rng(report.settings.seed, "regression", *key)
            lo, hi = bootstrap_ci(deltas, resamples=report.settings.resamples, rng=rng)
            found.falls.setdefault((strategy, budget), []).append((delta, lo, hi))
            if quality_regressed(delta, hi, max_regression):
                reasons.append(
                    f"{label}: quality fell by {-delta:.3f} over {deltas.size} paired items "
                    f"(95% CI of the change [{lo:.3f}, {hi:.3f}]), more than the allowed "
                    f"{max_regression:.3f}"
                )
        if not now.reference and _rose(now.violation_rate, before.violation_rate):
            reasons.append(f"{label}: violation rate rose from {_rate(before)} to {_rate(now)}")
    return found


def _rate(cell: report_json.CellRecord) -> str:
    violations, judged = cell.n_violation, cell.n_ok + cell.n_violation
    return f"{cell.violation_rate:.1%} ({violations}/{judged})"


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
    return now > (0.0 if math.isnan(before) else before) + RATE_EPS
