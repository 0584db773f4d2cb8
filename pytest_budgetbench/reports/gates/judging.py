"""Pass/fail gates over a computed report. Pure functions: :func:`gate_verdict` returns one
gate item's structured verdict; :func:`violation_gate` and :func:`regression_gate` return
reason lines (empty when the gate passes) for the console command.

A regression gate judges each paired quality change by one of two tests
(:func:`judge_change`, shared with ``budgetbench diff``): *non-inferiority*, the default,
passes only when the 95% interval's lower bound lies above -D; *harm-shown* fails only when
the change fell by more than D with its interval below zero, and warns when the run was
too small to detect a drop of D (its minimal detectable drop is larger).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pytest_budgetbench.reports import report_json
from pytest_budgetbench.reports.gates.verdicts import (
    ANSWER_GATE,
    HARM,
    NONINFERIORITY,
    RATE_EPS,
    REGRESSION_GATE,
    REGRESSION_TESTS,
    RETENTION_GATE,
    VIOLATION_GATE,
    GateSpec,
    GateVerdict,
    noninferior,
    quality_regressed,
    violation_rate,
)
from pytest_budgetbench.reports.stats import (
    SCORE,
    PairedChange,
    cell_rng,
    no_flip_items_to_exclude,
    paired_changes,
)
from pytest_budgetbench.reports.tables import key_values, paired_scores

if TYPE_CHECKING:
    import pandas as pd


class Seeded(Protocol):
    """The settings a regression gate's paired test draws with."""

    @property
    def seed(self) -> int: ...

    @property
    def resamples(self) -> int: ...


class GatedReport(Protocol):
    """What a gate reads of a computed report
    (:class:`~pytest_budgetbench.reports.builder.Report` is one): its summary table, its
    report.json document and the seed and resamples of its intervals."""

    @property
    def summary(self) -> pd.DataFrame: ...

    @property
    def document(self) -> Mapping[str, Any]: ...

    @property
    def settings(self) -> Seeded: ...


def violation_gate(report: GatedReport, max_rate: float) -> list[str]:
    """One line per non-reference strategy@budget whose violation rate, pooled over tasks,
    exceeds ``max_rate``, or that has no rate (every cell errored): as
    :func:`gate_verdict`, a gate over nothing fails."""
    return _gate_each_cell(report, VIOLATION_GATE,
                           lambda _strategy, _budget, reference: None if reference else max_rate)


def retention_gate(report: GatedReport, floor: Callable[[str, int, bool], float | None]
                   ) -> list[str]:
    """One line per strategy@budget whose pooled mean evidence retention is below its floor
    (``floor(strategy, budget, reference)``, None: no floor), as :func:`gate_verdict`."""
    return _gate_each_cell(report, RETENTION_GATE, floor)


def answer_kept_gate(report: GatedReport, floor: Callable[[str, int, bool], float | None]
                     ) -> list[str]:
    """One line per strategy@budget whose pooled share of items that kept their answer is
    below its floor (``floor(strategy, budget, reference)``), as :func:`gate_verdict`."""
    return _gate_each_cell(report, ANSWER_GATE, floor)



def _gate_each_cell(report: GatedReport, kind: str,
                    threshold: Callable[[str, int, bool], float | None]) -> list[str]:
    """The reason lines of :func:`cell_verdicts`, and one line when there is no verdict,
    since a gate over nothing guards nothing."""
    return verdict_reasons(kind, cell_verdicts(report, kind, threshold))


def verdict_reasons(kind: str, verdicts: Iterable[GateVerdict]) -> list[str]:
    """The failure lines of a ``kind`` gate's ``verdicts``; with no verdict, the line that
    says there was nothing to judge (a gate over nothing fails)."""
    verdicts = list(verdicts)
    if not verdicts:
        return [f"{kind} gate: no strategy@budget other than a reference has a row, so "
                "there is nothing to judge"]
    return [reason for verdict in verdicts for reason in verdict.reasons]


def cell_verdicts(report: GatedReport, kind: str,
                  threshold: Callable[[str, int, bool], float | None]) -> list[GateVerdict]:
    """:func:`gate_verdict` of a ``kind`` gate (violation rate or a floor) for each
    strategy@budget that ``threshold(strategy, budget, reference)`` gives a threshold (the
    maximum violation rate or the floor)."""
    summary = report.summary
    verdicts = []
    groups = summary.groupby(["strategy", "budget"], sort=True) if not summary.empty else ()
    for key, group in groups:
        strategy, budget = key_values(key)
        value = threshold(str(strategy), int(budget), bool(group["reference"].any()))
        if value is not None:
            verdicts.append(gate_verdict(
                report, GateSpec(kind, str(strategy), int(budget)),
                max_rate=value if kind == VIOLATION_GATE else None,
                min_retention=value if kind == RETENTION_GATE else None,
                min_answer_kept=value if kind == ANSWER_GATE else None))
    return verdicts


def regression_verdicts(report: GatedReport, found: RegressionFindings, max_regression: float,
                        regression_test: str = NONINFERIORITY) -> list[GateVerdict]:
    """A regression gate's verdict for each strategy@budget of ``report``, from the
    ``found`` of :func:`regression_findings` (computed once for every cell)."""
    summary = report.summary
    if summary.empty:
        return []
    cells = sorted({(str(s), int(b)) for s, b in zip(summary["strategy"], summary["budget"],
                                                    strict=True)})
    return [found.verdict(GateVerdict(GateSpec(REGRESSION_GATE, strategy, budget),
                                      threshold=max_regression), regression_test)
            for strategy, budget in cells]


@dataclass(frozen=True)
class FloorShare:
    """What a floor gate averages: a share of a cell's admitted items, each item's from
    report.json (:class:`~pytest_budgetbench.reports.report_json.CellRecord`)."""

    field: str
    """The CellRecord's item -> share mapping, and the GateVerdict field of the mean."""
    mean: str
    """The mean in words, as the failure line names it."""
    over: str
    """The items it is the mean over."""
    none: str
    """Why a cell with admitted items has none of them."""


FLOOR_SHARES = {
    RETENTION_GATE: FloorShare("retention", "mean evidence retention",
                               "admitted items that declare evidence",
                               "none of its admitted items declares evidence"),
    ANSWER_GATE: FloorShare("answer_kept", "answer kept",
                            "admitted items whose evidence holds their answer",
                            "none of its admitted items has a gold answer its evidence "
                            "holds (engine.answers)"),
}
"""The floor gates' shares, by the gate's kind."""


def _floor_verdict(report: GatedReport, counted: GateVerdict, floor: float,
                   n_error: int) -> GateVerdict:
    """A floor gate (:data:`FLOOR_SHARES`): the mean of its share over the strategy@budget's
    admitted items that have one, pooled over tasks (each item's averaged over its
    repeats), at least ``floor``."""
    spec = counted.spec
    share = FLOOR_SHARES[spec.kind]
    label = f"{spec.strategy}@{spec.budget}"
    kept = {f"{task}/{item}": value
            for (task, strategy, budget), cell in report_json.cell_records(report.document).items()
            if (strategy, budget) == (spec.strategy, spec.budget)
            for item, value in getattr(cell, share.field).items()}
    noun = share.mean.removeprefix("mean ")
    if not kept:
        why = (f"no cell was admitted ({counted.n_violation or 0} over budget, {n_error} "
               "errored)" if not counted.n_judged or counted.n_judged == counted.n_violation
               else share.none)
        return replace(counted, reasons=(f"{label}: {why}, so there is no {noun} to judge",))
    mean = sum(kept.values()) / len(kept)
    judged = replace(counted, **{share.field: mean})
    if mean >= floor - RATE_EPS:
        return judged
    lowest = sorted(kept.items(), key=lambda pair: (pair[1], pair[0]))[:3]
    return replace(judged, reasons=(
        f"{label}: {share.mean} {mean:.3f} over the {len(kept)} {share.over} is below the "
        f"floor {floor:.3f} (lowest: "
        f"{', '.join(f'{item} {value:.2f}' for item, value in lowest)})",))


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
    report: GatedReport,
    spec: GateSpec,
    *,
    max_rate: float | None = None,
    max_regression: float | None = None,
    baseline: Path | None = None,
    regression_test: str = NONINFERIORITY,
    min_retention: float | None = None,
    min_answer_kept: float | None = None,
) -> GateVerdict:
    """One gate item's verdict over one strategy@budget, pooled over tasks.

    ``spec.kind`` is "violation-rate", "retention-floor" (mean evidence retention at least
    ``min_retention``), "answer-kept-floor" (the share of items that kept their answer at
    least ``min_answer_kept``) or "regression" (judged by ``regression_test``, see
    :func:`judge_change`). A gate that has nothing to judge
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
    threshold = {VIOLATION_GATE: max_rate, RETENTION_GATE: min_retention,
                 ANSWER_GATE: min_answer_kept}.get(spec.kind, max_regression)
    counted = GateVerdict(spec, rate=violation_rate(violations, n_ok), n_violation=violations,
                          n_judged=judged, threshold=threshold)
    if spec.kind == VIOLATION_GATE:
        assert max_rate is not None
        if judged == 0:
            return replace(counted, reasons=(f"{label}: no cell was admitted or over budget "
                                             f"({n_error} errored, see cells.jsonl), so there "
                                             "is no violation rate to judge",))
        reason = _violation_reason(label, violations, judged, max_rate)
        return replace(counted, reasons=(reason,) if reason else ())
    if spec.kind in FLOOR_SHARES:
        floor = min_retention if spec.kind == RETENTION_GATE else min_answer_kept
        assert floor is not None
        return _floor_verdict(report, counted, floor, n_error)
    assert baseline is not None and max_regression is not None
    if judged == 0:
        return replace(counted, reasons=(f"{label}: no cell was admitted or over budget "
                                         f"({n_error} errored, see cells.jsonl), so there is "
                                         "nothing to compare with the baseline",))
    found = regression_findings(report, baseline, max_regression, regression_test)
    return found.verdict(counted, regression_test)


def regression_gate(
    report: GatedReport, baseline_report_json: Path, max_regression: float,
    regression_test: str = NONINFERIORITY,
) -> list[str]:
    """Compare each task's strategy@budget with the same cell of a baseline report.json
    (see :func:`regression_findings`): one line per failing cell."""
    return regression_findings(report, baseline_report_json, max_regression,
                               regression_test).failures()


@dataclass
class RegressionFindings:
    general: list[str] = field(default_factory=list)
    """Reasons that fail every regression gate (an unusable or incomparable baseline)."""
    reasons: dict[tuple[str, int], list[str]] = field(default_factory=dict)
    """Failure lines by strategy@budget, task by task."""
    falls: dict[tuple[str, int], list[tuple[float, float, float]]] = field(
        default_factory=dict)
    """Each task's paired quality change and its interval by strategy@budget."""
    notes: dict[tuple[str, int], list[str]] = field(default_factory=dict)
    """Warnings of cells that passed, by strategy@budget (see :func:`judge_change`)."""

    def failures(self) -> list[str]:
        return self.general + [r for key in sorted(self.reasons) for r in self.reasons[key]]

    def warnings(self) -> list[str]:
        return [n for key in sorted(self.notes) for n in self.notes[key]]

    def verdict(self, counted: GateVerdict, regression_test: str) -> GateVerdict:
        """The regression gate's verdict on ``counted``'s strategy@budget: its failure
        lines, and the change of the task that decides ``regression_test`` (the lowest
        bound, or under harm-shown the largest fall) with its interval."""
        key = (counted.spec.strategy, counted.spec.budget)
        by = 1 if regression_test == NONINFERIORITY else 0
        worst = min(self.falls.get(key, []), default=None, key=lambda fall: fall[by])
        return replace(counted, reasons=tuple(self.general + self.reasons.get(key, [])),
                       delta=None if worst is None else worst[0],
                       interval=None if worst is None else (worst[1], worst[2]),
                       notes=tuple(self.notes.get(key, [])))


def regression_findings(
    report: GatedReport, baseline_report_json: Path, max_regression: float,
    regression_test: str = NONINFERIORITY,
) -> RegressionFindings:
    """Compare each task's strategy@budget with the same cell of a baseline report.json.

    Fails a cell when (a) its mean quality, or its mean evidence retention, paired by
    item_id over the items both runs have it for, fails ``regression_test`` with margin
    ``max_regression`` (:func:`judge_change`): a model-free run is judged on retention
    alone, a task without evidence on quality alone; or (b) its violation rate rose
    (reference strategies, which are allowed to overflow, are exempt from (b)).
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
    seed = report.settings.seed
    changes = paired_changes(
        [(*paired_scores(getattr(current[key], metric), getattr(baseline[key], metric)),
          cell_rng(seed, *(("regression",) if metric == "quality" else ("regression", metric)),
                   *key))
         for key in common for metric in REGRESSION_METRICS],
        resamples=report.settings.resamples)
    for index, key in enumerate(common):
        task, strategy, budget = key
        now, before = current[key], baseline[key]
        reasons = found.reasons.setdefault((strategy, budget), [])
        width = len(REGRESSION_METRICS)
        mine = changes[index * width:(index + 1) * width]
        if now.n_ok and not any(change.n for change in mine):
            reasons.append(_nothing_compared(f"{task}: {strategy}@{budget}",
                                             baseline_report_json))
        for metric, change in zip(REGRESSION_METRICS, mine, strict=True):
            if not change.n:
                continue
            found.falls.setdefault((strategy, budget), []).append(
                (change.delta, change.lo, change.hi))
            label = f"{task}: {strategy}@{budget}" + (
                "" if metric == "quality" else f" {REGRESSION_METRICS[metric]}")
            reason, note = judge_change(label, change, max_regression, regression_test,
                                        metric=REGRESSION_METRICS[metric])
            reasons.extend([reason] if reason else [])
            found.notes.setdefault((strategy, budget), []).extend([note] if note else [])
        label = f"{task}: {strategy}@{budget}"
        if not now.reference and _rose(now.violation_rate, before.violation_rate):
            reasons.append(f"{label}: violation rate rose from {_rate(before)} to {_rate(now)}")
    return found


def _nothing_compared(label: str, baseline: Path) -> str:
    """A cell whose admitted items have neither a quality nor a retention in both runs: a
    gate that compared nothing must fail, not pass with no change to show."""
    return (f"{label}: nothing was compared with baseline {baseline}: no item has a quality "
            "or an evidence retention in both runs (a model-free run has no quality, an item "
            "without evidence no retention); declare evidence in the items (docs/reports.md, "
            "Evidence retention), or compare runs that send the prompts to a model")


REGRESSION_METRICS = {"quality": "quality", "retention": "evidence retention"}
"""What a regression gate compares item by item (a CellRecord's field: its name in
messages), where both runs have it: a model-free run has no quality, a task without
evidence no retention."""


def judge_change(label: str, change: PairedChange, margin: float, test: str,
                 metric: str = "quality") -> tuple[str | None, str | None]:
    """(failure, warning) of one paired quality change B-A under ``test`` with ``margin``
    D; each line names the test and gives the change, interval, n, margin and MDE.

    Non-inferiority fails unless the interval's lower bound is above -D: a run too small
    to exclude a drop of D fails, since absence of evidence is not evidence of absence.
    Harm-shown fails only a shown fall
    (:func:`~pytest_budgetbench.reports.gates.verdicts.quality_regressed`);
    a pass whose minimal detectable drop exceeds D comes with a warning, not a failure, as
    harm-shown is what a user picks to block on evidence only.
    """
    numbers = _change_numbers(change, margin)
    if test == HARM:
        if quality_regressed(change.delta, change.hi, margin):
            return (f"{label}: {REGRESSION_TESTS[HARM]} test failed: {metric} fell by "
                    f"{-change.delta:.3f}, more than the allowed {margin:.3f}, with its "
                    f"interval below zero ({numbers})", None)
        if not change.mde <= margin:
            return None, (f"{label}: {REGRESSION_TESTS[HARM]} test passed but cannot detect "
                          f"a drop of {margin:g} with n={change.n} (MDE {change.mde:.3f}), so "
                          f"the pass is no evidence against one; use the non-inferiority "
                          f"test or more items ({numbers})")
        return None, None
    if noninferior(change.lo, margin):
        return None, None
    return (f"{label}: {REGRESSION_TESTS[NONINFERIORITY]} test failed: the lower bound "
            f"{change.lo:+.3f} of the 95% interval of the change is not above the margin "
            f"-{margin:g}, so a drop of more than {margin:g} is not excluded"
            f"{_items_needed(change, margin)} ({numbers})", None)


def _change_numbers(change: PairedChange, margin: float) -> str:
    method = ("score interval" if change.method == SCORE else "paired bootstrap")
    numbers = (f"change {change.delta:+.3f} over {change.n} paired items, 95% CI "
               f"[{change.lo:+.3f}, {change.hi:+.3f}] ({method}), margin {margin:g}, MDE "
               f"{change.mde:.3f}")
    if change.flips_down is not None:
        numbers += (f", {change.flips_down} right->wrong and {change.flips_up} wrong->right "
                    f"(McNemar exact p={change.mcnemar_p:.3g})")
    return numbers


def _items_needed(change: PairedChange, margin: float) -> str:
    """How many items, none flipped, it takes to exclude the margin: the least a 0/1
    grader's run can have and pass."""
    if change.method != SCORE or margin <= 0:
        return ""
    needed = no_flip_items_to_exclude(margin)
    if change.n >= needed:
        return ""
    return f"; with n={change.n} it cannot be: even with no flip it takes {needed} items"


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
