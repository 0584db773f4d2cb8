"""The terminal summary printed at the end of a sweep.

Its numbers are the computed report's summary table when the session has one. Without it
(a core install, no ``reports`` extra, or --budgetbench-report=off) a small pandas-free
path aggregates the rows instead: the quality interval is the report's seeded bootstrap
(numpy only) over the admitted, scored rows, left out without numpy, as are the notes on
the paired table.
"""

from __future__ import annotations

import importlib.util
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_budgetbench.records.rows import Status
from pytest_budgetbench.reports.gates.verdicts import retention_notes, violation_rate

if TYPE_CHECKING:
    from pytest_budgetbench.reports.builder import Report
    from pytest_budgetbench.reports.gates.verdicts import GateVerdict
    from pytest_budgetbench.settings.config import Settings


@dataclass(frozen=True)
class CellStats:
    task: str
    strategy: str
    budget: int
    reference: bool
    n: int
    ok: int
    violations: int
    errors: int
    mean_quality: float | None
    quality_lo: float | None
    quality_hi: float | None
    mean_tokens: float | None
    median_model_s: float | None
    token_mismatches: int
    mean_calls: float | None = None
    """Model calls per agent episode (None for single-call tasks)."""
    mean_episode_tokens: float | None = None
    """Prompt and output tokens an agent episode spent, over its calls."""
    mean_retention: float | None = None
    """The share of their items' evidence the prompts as sent kept verbatim, over the
    admitted cells whose item declares evidence (as tokens, over admitted prompts)."""
    mean_name_accuracy: float | None = None
    """A teacher-forced episode's name-only step accuracy (its quality is the exact one),
    over the admitted cells; None where no cell is teacher-forced."""

    @property
    def violation_rate(self) -> float:
        return violation_rate(self.violations, self.ok)


def cell_stats(
    rows: Iterable[Mapping[str, Any]], *, resamples: int = 2000, seed: int = 0
) -> list[CellStats]:
    """Aggregate rows per (task, strategy, budget), in a stable order."""
    groups: dict[tuple[str, str, int], list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[(row["task"], row["strategy"], int(row["budget"]))].append(row)
    return [_stats(key, groups[key], resamples, seed) for key in sorted(groups)]


def report_stats(report: Report, rows: Iterable[Mapping[str, Any]]) -> list[CellStats]:
    """The computed report's summary table as the terminal's stats (token mismatches,
    which the report does not count, from the rows)."""
    mismatches: dict[tuple[str, str, int], int] = defaultdict(int)
    for row in rows:
        if row["status"] == Status.OK and row.get("token_count_match") is False:
            mismatches[(row["task"], row["strategy"], int(row["budget"]))] += 1
    stats = []
    for cell in report.summary.to_dict("records"):
        key = (str(cell["task"]), str(cell["strategy"]), int(cell["budget"]))
        stats.append(CellStats(
            *key, reference=bool(cell["reference"]), n=int(cell["n_cells"]),
            ok=int(cell["n_ok"]), violations=int(cell["n_violation"]),
            errors=int(cell["n_error"]), mean_quality=_number(cell["quality_mean"]),
            quality_lo=_number(cell["quality_lo"]), quality_hi=_number(cell["quality_hi"]),
            mean_tokens=_number(cell["tokens_mean"]),
            median_model_s=_number(cell["model_s_p50"]), token_mismatches=mismatches[key],
            mean_calls=_number(cell["calls_mean"]),
            mean_episode_tokens=_number(cell["total_tokens_mean"]),
            mean_retention=_number(cell["evidence_retention_mean"]),
            mean_name_accuracy=_number(cell["name_accuracy_mean"])))
    return sorted(stats, key=lambda s: (s.task, s.strategy, s.budget))


def _number(value: Any) -> float | None:
    return None if value is None or math.isnan(float(value)) else float(value)


def _interval(
    scores: list[float], key: tuple[str, str, int], resamples: int, seed: int
) -> tuple[float | None, float | None]:
    if len(scores) < 2 or resamples < 1:
        return None, None
    from pytest_budgetbench.reports.stats import bootstrap_ci, cell_rng

    lo, hi = bootstrap_ci(scores, resamples=resamples, rng=cell_rng(seed, "quality", *key))
    return float(lo), float(hi)


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _stats(
    key: tuple[str, str, int], rows: list[Mapping[str, Any]], resamples: int, seed: int
) -> CellStats:
    admitted = [r for r in rows if r["status"] == Status.OK]
    ran = [r for r in rows if r["status"] in (Status.OK, Status.VIOLATION)]
    scores = [float(r["quality"]) for r in admitted if r.get("quality") is not None]
    lo, hi = _interval(scores, key, resamples, seed)
    return CellStats(
        task=key[0],
        strategy=key[1],
        budget=key[2],
        reference=any(bool(r.get("reference")) for r in rows),
        n=len(rows),
        ok=len(admitted),
        violations=sum(r["status"] == Status.VIOLATION for r in rows),
        errors=sum(r["status"] == Status.ERROR for r in rows),
        mean_quality=_mean(scores),
        quality_lo=lo,
        quality_hi=hi,
        mean_tokens=_mean([float(r["counted_tokens"]) for r in admitted]),
        median_model_s=_median([float(r["model_s"]) for r in admitted
                                if r.get("model_s") is not None]),  # none: nothing sent
        token_mismatches=sum(r.get("token_count_match") is False for r in admitted),
        mean_calls=_mean([float(r["calls"]) for r in ran if r.get("calls") is not None]),
        mean_episode_tokens=_mean([float(r["total_tokens"]) for r in ran
                                   if r.get("total_tokens") is not None]),
        mean_retention=_mean([float(r["evidence_retention"]) for r in admitted
                              if r.get("evidence_retention") is not None]),
        mean_name_accuracy=_mean([float(r["name_accuracy"]) for r in admitted
                                  if r.get("name_accuracy") is not None]),
    )


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None or math.isnan(value) else format(value, spec)


def _ci(s: CellStats) -> str:
    if s.quality_lo is None or s.quality_hi is None:
        return "-"
    return f"[{s.quality_lo:.2f}, {s.quality_hi:.2f}]"


def format_table(stats: list[CellStats]) -> list[str]:
    """The table's lines; agent episodes add their calls and tokens per episode (and
    ``tokens`` is then an episode's largest call, the one the budget bounds). The last
    column, ``retention``, is the mean share of the items' evidence the prompts kept
    verbatim ("-" where no item declares evidence). Teacher-forced episodes add ``name
    acc.``, the name-only step accuracy beside quality's exact one."""
    episodes = any(s.mean_calls is not None for s in stats)
    forced = any(s.mean_name_accuracy is not None for s in stats)
    header = (f"{'strategy':<22} {'budget':>7} {'n':>4} {'admitted':>8} {'quality':>8} "
              f"{'95% CI':>12} {'viol.rate':>9} {'tokens':>8} {'p50 model s':>11} "
              f"{'errors':>6}")
    if episodes:
        header += f" {'calls':>6} {'tok/episode':>11}"
    if forced:
        header += f" {'name acc.':>9}"
    header += f" {'retention':>9}"
    lines = [header, "-" * len(header)]
    for s in stats:
        name = s.strategy + (" (ref)" if s.reference else "")
        line = (
            f"{name:<22} {s.budget:>7} {s.n:>4} {s.ok:>8} {_fmt(s.mean_quality, '.3f'):>8} "
            f"{_ci(s):>12} {_fmt(s.violation_rate, '.3f'):>9} {_fmt(s.mean_tokens, '.0f'):>8} "
            f"{_fmt(s.median_model_s, '.2f'):>11} {s.errors:>6}"
        )
        if episodes:
            line += f" {_fmt(s.mean_calls, '.1f'):>6} {_fmt(s.mean_episode_tokens, '.0f'):>11}"
        if forced:
            line += f" {_fmt(s.mean_name_accuracy, '.3f'):>9}"
        line += f" {_fmt(s.mean_retention, '.3f'):>9}"
        lines.append(line)
    return lines


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

    rows = last_row_per_cell(RunStore(Path(run_dir)).rows())
    terminalreporter.section("budgetbench summary")
    if not rows:
        terminalreporter.write_line(f"no cells recorded; run directory: {run_dir}")
        return
    # Without the reports extra (numpy) the interval column is "-"; the rest is plain Python.
    with_numpy = importlib.util.find_spec("numpy") is not None
    if report is not None:
        stats = report_stats(report, rows)
    else:
        stats = cell_stats(rows, resamples=settings.resamples if with_numpy else 0,
                           seed=settings.seed)
    for task in sorted({s.task for s in stats}):
        terminalreporter.write_line(f"task {task}:")
        for line in format_table([s for s in stats if s.task == task]):
            terminalreporter.write_line("  " + line)
    _write_warnings(terminalreporter, rows, stats)
    for line in retention_notes(rows):
        terminalreporter.write_line(f"budgetbench: note: {line}", yellow=True)
    if settings.reference is None and with_numpy:
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


def _write_warnings(
    terminalreporter: Any, rows: list[dict[str, Any]], stats: list[CellStats]
) -> None:
    mismatches = sum(s.token_mismatches for s in stats)
    if mismatches:
        terminalreporter.write_line(
            f"warning: on {mismatches} admitted cells our token count differs from the "
            "server's usage.prompt_tokens (see token_count_match in cells.jsonl)", yellow=True
        )
    if any(r.get("tokenizer_exact") is False for r in rows):
        terminalreporter.write_line(
            "warning: token counts are approximate (tokenizer_exact=false)", yellow=True
        )
