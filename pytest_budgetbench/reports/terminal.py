"""The terminal summary printed at the end of a sweep.

Pure Python on purpose: it runs at every session end, where pandas would cost a second
of import time.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_budgetbench.session import BudgetBenchSession


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
    mean_tokens: float | None
    median_model_s: float | None
    token_mismatches: int

    @property
    def violation_rate(self) -> float:
        judged = self.ok + self.violations
        return self.violations / judged if judged else 0.0


def cell_stats(rows: Iterable[Mapping[str, Any]]) -> list[CellStats]:
    """Aggregate rows per (task, strategy, budget), in a stable order."""
    groups: dict[tuple[str, str, int], list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[(row["task"], row["strategy"], int(row["budget"]))].append(row)
    return [_stats(key, groups[key]) for key in sorted(groups)]


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _stats(key: tuple[str, str, int], rows: list[Mapping[str, Any]]) -> CellStats:
    admitted = [r for r in rows if r["status"] == "ok"]
    return CellStats(
        task=key[0],
        strategy=key[1],
        budget=key[2],
        reference=any(bool(r.get("reference")) for r in rows),
        n=len(rows),
        ok=len(admitted),
        violations=sum(r["status"] == "violation" for r in rows),
        errors=sum(r["status"] == "error" for r in rows),
        mean_quality=_mean([float(r["quality"]) for r in admitted if r.get("quality") is not None]),
        mean_tokens=_mean([float(r["counted_tokens"]) for r in admitted]),
        median_model_s=(
            statistics.median([float(r["model_s"]) for r in admitted]) if admitted else None
        ),
        token_mismatches=sum(r.get("token_count_match") is False for r in admitted),
    )


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_table(stats: list[CellStats]) -> list[str]:
    header = (f"{'strategy':<22} {'budget':>7} {'n':>4} {'quality':>8} {'viol.rate':>9} "
              f"{'tokens':>8} {'p50 model s':>11} {'errors':>6}")
    lines = [header, "-" * len(header)]
    for s in stats:
        name = s.strategy + (" (ref)" if s.reference else "")
        lines.append(
            f"{name:<22} {s.budget:>7} {s.n:>4} {_fmt(s.mean_quality, '.3f'):>8} "
            f"{s.violation_rate:>9.3f} {_fmt(s.mean_tokens, '.0f'):>8} "
            f"{_fmt(s.median_model_s, '.2f'):>11} {s.errors:>6}"
        )
    return lines


def write_summary(terminalreporter: Any, session: BudgetBenchSession) -> None:
    from pytest_budgetbench.records import last_row_per_cell

    rows = last_row_per_cell(session.store.rows())
    terminalreporter.section("budgetbench summary")
    if not rows:
        terminalreporter.write_line(f"no cells recorded; run directory: {session.store.run_dir}")
        return
    stats = cell_stats(rows)
    for task in sorted({s.task for s in stats}):
        terminalreporter.write_line(f"task {task}:")
        for line in format_table([s for s in stats if s.task == task]):
            terminalreporter.write_line("  " + line)
    _write_warnings(terminalreporter, rows, stats)
    cached = sum(1 for r in rows if r.get("cached"))
    if cached:
        terminalreporter.write_line(
            f"{cached} of {sum(r['status'] == 'ok' for r in rows)} answers came from the "
            "response cache (model s is the original call's)"
        )
    for reason in session.gate_failures:
        terminalreporter.write_line(f"budgetbench gate failed: {reason}", red=True, bold=True)
    terminalreporter.write_line(f"run directory: {session.store.run_dir}")
    if session.report_dir is not None:
        terminalreporter.write_line(f"report: {session.report_dir / 'report.html'}")


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
