"""The terminal summary printed at the end of a sweep.

Its numbers are :mod:`.summary`'s, the one computation of the per-cell statistics: the
computed report's summary table when the session has one, else :func:`.summary.summarise`
over the rows (a core install, no ``reports`` extra, or --budgetbench-report=off), which
leaves the quality interval out without numpy, as it does the notes on the paired table.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_budgetbench.records.rows import Status
from pytest_budgetbench.reports.summary import (
    CellSummary,
    numpy_importable,
    retention_notes,
    row_columns,
    summarise,
)

if TYPE_CHECKING:
    from pytest_budgetbench.records.safe_budgets import SafeBudgetRecord
    from pytest_budgetbench.reports.builder import Report
    from pytest_budgetbench.reports.gates.verdicts import GateVerdict
    from pytest_budgetbench.settings.config import Settings


def cell_summaries(rows: Sequence[dict[str, Any]], settings: Settings,
                   report: Report | None = None) -> list[CellSummary]:
    """The cells' statistics: the computed ``report``'s summary table when there is one,
    else :func:`.summary.summarise` over ``rows`` with the settings' resamples and seed."""
    if report is not None:
        return [CellSummary.from_record(record)
                for record in report.summary.to_dict("records")]
    return summarise(row_columns(rows), resamples=settings.resamples, seed=settings.seed)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None or math.isnan(value) else format(value, spec)


def _ci(s: CellSummary) -> str:
    if s.quality_lo is None or s.quality_hi is None:
        return "-"
    return f"[{s.quality_lo:.2f}, {s.quality_hi:.2f}]"


NAME_WIDTH = 22
"""The strategy column's width, wider where a name is longer."""


def format_table(stats: list[CellSummary]) -> list[str]:
    """The table's lines; agent episodes add their calls and tokens per episode (and
    ``tokens`` is then an episode's largest call, the one the budget bounds). The last
    column, ``retention``, is the mean share of the items' evidence the prompts kept
    verbatim ("-" where no item declares evidence). Teacher-forced episodes add ``name
    acc.``, the name-only step accuracy beside quality's exact one. Tasks that give their
    gold answers add ``ans.kept``, the share of prompts that kept the answer outside the
    question where the evidence holds it, and ``unique``, the same over the items whose
    answer the history holds only in the evidence."""
    episodes = any(s.calls_mean is not None for s in stats)
    forced = any(s.name_accuracy_mean is not None for s in stats)
    answers = any(s.answer_kept_mean is not None for s in stats)
    names = [s.strategy + (" (ref)" if s.reference else "") for s in stats]
    width = max([NAME_WIDTH, *map(len, names)])  # a framework's policy names run long
    header = (f"{'strategy':<{width}} {'budget':>7} {'n':>4} {'admitted':>8} {'quality':>8} "
              f"{'95% CI':>12} {'viol.rate':>9} {'tokens':>8} {'p50 model s':>11} "
              f"{'errors':>6}")
    if episodes:
        header += f" {'calls':>6} {'tok/episode':>11}"
    if forced:
        header += f" {'name acc.':>9}"
    header += f" {'retention':>9}"
    if answers:
        header += f" {'ans.kept':>8} {'unique':>6}"
    lines = [header, "-" * len(header)]
    for s, name in zip(stats, names, strict=True):
        line = (
            f"{name:<{width}} {s.budget:>7} {s.n_cells:>4} {s.n_ok:>8} "
            f"{_fmt(s.quality_mean, '.3f'):>8} {_ci(s):>12} {_fmt(s.violation_rate, '.3f'):>9} "
            f"{_fmt(s.tokens_mean, '.0f'):>8} {_fmt(s.model_s_p50, '.2f'):>11} {s.n_error:>6}"
        )
        if episodes:
            line += f" {_fmt(s.calls_mean, '.1f'):>6} {_fmt(s.total_tokens_mean, '.0f'):>11}"
        if forced:
            line += f" {_fmt(s.name_accuracy_mean, '.3f'):>9}"
        line += f" {_fmt(s.evidence_retention_mean, '.3f'):>9}"
        if answers:
            line += (f" {_fmt(s.answer_kept_mean, '.3f'):>8}"
                     f" {_fmt(s.answer_kept_unique_mean, '.3f'):>6}")
        lines.append(line)
    return lines


def format_safe_budgets(records: Sequence[SafeBudgetRecord]) -> list[str]:
    """The budget search's table: per task, each strategy's smallest safe budget (the
    smallest first), its retention and violation rate, and the grid budget below it with
    the floor it fails (under a maximum safe budget, the gate's failures follow)."""
    if not records:
        return ["no budget search finished (see the failures above)"]
    from pytest_budgetbench.reports.gates.safe_budget import probe_at

    first = records[0]
    floors = [f"retention >= {first['min_retention']:.3f}"
              if first["min_retention"] is not None else "",
              f"violation rate <= {first['max_violation_rate']:.1%}"
              if first["max_violation_rate"] is not None else ""]
    lines = [f"smallest safe budget, search:{first['lo']}..{first['hi']} step {first['step']}"
             f" (floors: {' and '.join(f for f in floors if f)}, at it and every budget "
             "above it):"]
    width = max(len("strategy"), *(len(r["strategy"]) for r in records))
    header = (f"{'strategy':<{width}} {'safe':>6} {'retention':>9} {'viol.rate':>9} "
              f"{'probes':>6} {'below':>6}  why the budget below fails")
    for task in sorted({r["task"] for r in records}):
        lines += [f"task {task}:", "  " + header, "  " + "-" * len(header)]
        mine = sorted((r for r in records if r["task"] == task), key=_smallest_first)
        for record in mine:
            safe = record["safe_budget"]
            shown = probe_at(record, record["hi"] if safe is None else safe)
            if safe is None:
                below, why = "-", f"none up to {record['hi']}, where: "
                why += "; ".join(shown.reasons) if shown else "not probed"
            elif record["below"] is None:
                below, why = "-", f"{safe} is the smallest budget searched"
            else:
                failed = probe_at(record, record["below"])
                below, why = str(record["below"]), "; ".join(failed.reasons) if failed else "-"
            if record["scanned"]:
                why += f" [probed every budget from {record['hi']} down: {record['scanned']}]"
            lines.append(
                f"  {record['strategy']:<{width}} {safe if safe is not None else 'none':>6} "
                f"{_fmt(shown.retention if shown else None, '.3f'):>9} "
                f"{_fmt(shown.violation_rate if shown else None, '.1%'):>9} "
                f"{len(record['probes']):>6} {below:>6}  {why}")
    lines += [f"budgetbench gate failed: {r['gate']}" for r in records if r["gate"]]
    return lines


def _smallest_first(record: SafeBudgetRecord) -> tuple[bool, int, str]:
    safe = record["safe_budget"]
    return safe is None, safe or 0, record["strategy"]


def write_summary(
    terminalreporter: Any,
    run_dir: Path,
    settings: Settings,
    *,
    report: Report | None = None,
    verdicts: Sequence[GateVerdict] = (),
    report_dir: Path | None = None,
    report_missing: str | None = None,
) -> None:
    """The summary of the run in ``run_dir``: the computed ``report``'s numbers when there
    is one, the gates' ``verdicts``, and where the report was written (or why not)."""
    from pytest_budgetbench.records.rows import last_row_per_cell
    from pytest_budgetbench.records.store import RunStore

    store = RunStore(Path(run_dir))
    rows = last_row_per_cell(store.rows())
    terminalreporter.section("budgetbench summary")
    if not rows:
        terminalreporter.write_line(f"no cells recorded; run directory: {run_dir}")
        return
    if settings.search is not None:  # the probes' cells are in the report; the answer here
        for line in format_safe_budgets(store.safe_budgets()):
            failed = line.startswith("budgetbench gate failed")
            terminalreporter.write_line(line, red=failed, bold=failed)
    else:
        stats = cell_summaries(rows, settings, report)
        for task in sorted({s.task for s in stats}):
            terminalreporter.write_line(f"task {task}:")
            for line in format_table([s for s in stats if s.task == task]):
                terminalreporter.write_line("  " + line)
    _write_warnings(terminalreporter, rows)
    for line in retention_notes(rows) if settings.search is None else ():
        terminalreporter.write_line(f"budgetbench: note: {line}", yellow=True)
    if settings.reference is None and numpy_importable():
        for line in reference_notes(rows):
            terminalreporter.write_line(line, yellow=True)
    # An episode over budget at a later call may have its earlier calls cached: no answer.
    answers = [r for r in rows if r["status"] == Status.OK]
    cached = sum(1 for r in answers if r.get("cached"))
    if cached:
        terminalreporter.write_line(
            f"{cached} of {len(answers)} answers came from the response cache (model s is "
            "the original call's)"
        )
    for verdict in verdicts:
        if not verdict.passed:
            terminalreporter.write_line(f"budgetbench gate failed: {verdict.message}",
                                        red=True, bold=True)
        for note in verdict.notes:  # passed, but too small to show what it guards against
            terminalreporter.write_line(f"budgetbench gate warning: {note}", yellow=True)
    terminalreporter.write_line(f"run directory: {run_dir}")
    if report_dir is not None:
        terminalreporter.write_line(f"report: {report_dir / 'report.html'}")
    elif report_missing is not None:
        terminalreporter.write_line(f"report: not written: {report_missing}", yellow=True)


def reference_notes(rows: list[dict[str, Any]]) -> list[str]:
    """One line per task whose default reference (full_context at its largest budget)
    admitted no item: which cell the paired table uses instead, or why it is empty."""
    from pytest_budgetbench.reports.tables import DEFAULT_REFERENCE, pairing_reference

    notes = []
    for task in sorted({r["task"] for r in rows}):
        mine = [r for r in rows if r["task"] == task]
        flagged = sorted({r["strategy"] for r in mine if r.get("reference")})
        names = {r["strategy"] for r in mine}
        strategy = DEFAULT_REFERENCE if DEFAULT_REFERENCE in names else (flagged or [None])[0]
        if strategy is None:
            continue
        default = (strategy, max(int(r["budget"]) for r in mine if r["strategy"] == strategy))
        admitted: dict[tuple[str, int], int] = defaultdict(int)
        # As tables.admitted_counts: scored items, or admitted ones where none is scored.
        scored = any(r.get("quality") is not None for r in mine)
        for r in mine:
            if r["status"] == Status.OK and (r.get("quality") is not None or not scored):
                admitted[(r["strategy"], int(r["budget"]))] += 1
        chosen = pairing_reference(default, admitted)
        label = f"{default[0]}@{default[1]}"
        if chosen == default and admitted.get(default, 0):
            continue
        if chosen != default and chosen is not None:
            notes.append(
                f"task {task}: the default reference {label} admitted no item, so the paired "
                f"table pairs against {chosen[0]}@{chosen[1]}, the cell that admitted the most "
                f"items ({admitted[chosen]}); choose with --budgetbench-reference=STRATEGY@BUDGET"
            )
            continue
        needed = [int(r["counted_tokens"]) for r in mine if (r["strategy"], int(r["budget"]))
                  == default and r.get("counted_tokens")]
        size = f" (its prompts need up to {max(needed)} tokens)" if needed else ""
        notes.append(
            f"task {task}: the paired table is empty: no cell admitted an item, the "
            f"reference {label} included{size}; pass a larger budget in --budgets, or "
            "--budgetbench-reference=STRATEGY@BUDGET of a cell that admits items"
        )
    return notes


def _write_warnings(terminalreporter: Any, rows: list[dict[str, Any]]) -> None:
    mismatches = sum(r["status"] == Status.OK and r.get("token_count_match") is False
                     for r in rows)
    if mismatches:
        terminalreporter.write_line(
            f"warning: on {mismatches} admitted cells our token count differs from the "
            "server's usage.prompt_tokens (see token_count_match in cells.jsonl)", yellow=True
        )
    if any(r.get("tokenizer_exact") is False for r in rows):
        terminalreporter.write_line(
            "warning: token counts are approximate (tokenizer_exact=false)", yellow=True
        )
