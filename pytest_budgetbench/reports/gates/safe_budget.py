"""The budget search's judgments: the floors at one budget (a probe), and the gate on a
strategy's safe budget (``--budgetbench-max-safe-budget``).

The floors are the gates' own options and rules: ``--budgetbench-max-violation-rate`` (the
violation rate of :func:`~.verdicts.violation_rate`, over admitted and over-budget
prompts) and ``--budgetbench-min-retention`` (the mean evidence retention over the admitted
items that declare evidence, each item's repeats averaged first, as the retention floor
gate computes it), each compared with :data:`~.verdicts.RATE_EPS` of slack. Pure Python: a
model-free search runs on the core install, without the ``reports`` extra.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pytest_budgetbench.records.safe_budgets import ProbeRecord, SafeBudgetRecord
from pytest_budgetbench.reports.gates.verdicts import RATE_EPS, violation_rate
from pytest_budgetbench.sweep.search import BudgetSearch, SearchTrace

SAFE_BUDGET_GATE = "safe-budget"


@dataclass(frozen=True)
class Floors:
    """What a probe must meet; None: not judged."""

    min_retention: float | None = None
    max_violation_rate: float | None = None
    min_answer_kept: float | None = None


@dataclass(frozen=True)
class ProbeOutcome:
    """One probe: every item of a task under one strategy at one budget, judged by the
    floors (a :class:`~pytest_budgetbench.sweep.search.Judged`)."""

    budget: int
    n_ok: int = 0
    n_violation: int = 0
    n_error: int = 0
    retention: float | None = None
    n_retention: int = 0
    answer_kept: float | None = None
    n_answer_kept: int = 0
    reasons: tuple[str, ...] = ()
    items: Mapping[str, tuple[float, float | None]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.reasons

    @property
    def violation_rate(self) -> float:
        return violation_rate(self.n_violation, self.n_ok)

    def record(self) -> ProbeRecord:
        return {"budget": self.budget, "n_ok": self.n_ok, "n_violation": self.n_violation,
                "n_error": self.n_error, "retention": self.retention,
                "n_retention": self.n_retention, "answer_kept": self.answer_kept,
                "n_answer_kept": self.n_answer_kept, "reasons": list(self.reasons)}

    @classmethod
    def from_record(cls, record: ProbeRecord) -> ProbeOutcome:
        """A probe as safe_budgets.jsonl keeps it (without its items)."""
        return cls(record["budget"], record["n_ok"], record["n_violation"],
                   record["n_error"], record["retention"], record["n_retention"],
                   record.get("answer_kept"), record.get("n_answer_kept", 0),
                   tuple(record["reasons"]))


def judge_probe(budget: int, rows: Iterable[Mapping[str, Any]], floors: Floors
                ) -> ProbeOutcome:
    """The floors over the rows of one probe (each a cell's row, or ``{"item_id": ...,
    "status": "error"}`` for a cell that raised)."""
    counts = {"ok": 0, "violation": 0, "error": 0}
    judged: dict[str, list[bool]] = defaultdict(list)
    kept: dict[str, list[float]] = defaultdict(list)
    answers: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        status = str(row["status"])
        counts[status] = counts.get(status, 0) + 1
        if status not in ("ok", "violation"):
            continue
        item = str(row["item_id"])
        judged[item].append(status == "ok")
        if status == "ok":
            if row.get("evidence_retention") is not None:
                kept[item].append(float(row["evidence_retention"]))
            if row.get("answer_kept") is not None:
                answers[item].append(float(bool(row["answer_kept"])))
    per_item = _item_means(kept)
    answer_items = _item_means(answers)
    outcome = ProbeOutcome(
        budget, counts["ok"], counts["violation"], counts["error"], _mean(per_item),
        len(per_item), _mean(answer_items), len(answer_items),
        items={item: (sum(admitted) / len(admitted), per_item.get(item))
               for item, admitted in judged.items()})
    return replace(outcome, reasons=_reasons(outcome, floors))


def _item_means(values: Mapping[str, list[float]]) -> dict[str, float]:
    """Each item's mean over its repeats: an item counts once, as in the floor gates."""
    return {item: sum(kept) / len(kept) for item, kept in values.items()}


def _mean(per_item: Mapping[str, float]) -> float | None:
    return sum(per_item.values()) / len(per_item) if per_item else None


def _reasons(probe: ProbeOutcome, floors: Floors) -> tuple[str, ...]:
    """Why ``probe`` fails ``floors``, one short reason per floor (the table shows them)."""
    reasons = []
    judged = probe.n_ok + probe.n_violation
    if floors.max_violation_rate is not None:
        if not judged:
            reasons.append(f"no prompt was admitted or over budget ({probe.n_error} errored)")
        elif probe.violation_rate > floors.max_violation_rate + RATE_EPS:
            reasons.append(f"violation rate {probe.violation_rate:.1%} ({probe.n_violation}/"
                           f"{judged} prompts) exceeds the maximum "
                           f"{floors.max_violation_rate:.1%}")
    for floor, value, n, what, needs in (
            (floors.min_retention, probe.retention, probe.n_retention, "evidence retention",
             "declares evidence"),
            (floors.min_answer_kept, probe.answer_kept, probe.n_answer_kept, "answer kept",
             "has its answer in its evidence")):
        if floor is None:
            continue
        if value is None:
            why = (f"none of its admitted items {needs}" if probe.n_ok else
                   f"no prompt was admitted ({probe.n_violation} over budget, "
                   f"{probe.n_error} errored)")
            reasons.append(f"{why}, so there is no {what} to judge")
        elif value < floor - RATE_EPS:
            reasons.append(f"{what} {value:.3f} over {n} admitted items is below the floor "
                           f"{floor:.3f}")
    return tuple(reasons)


def max_safe_budget(limits: Mapping[str, int], strategy: str, reference: bool) -> int | None:
    """The largest safe budget allowed ``strategy`` by ``--budgetbench-max-safe-budget``
    (``{"": N}`` for every non-reference strategy, ``{"rag": N}`` for one); None: no gate.
    A reference strategy (full_context) is gated only when named, as retention floors are."""
    own = limits.get(strategy)
    return own if own is not None or reference else limits.get("")


def safe_budget_record(task: str, strategy: str, search: BudgetSearch, floors: Floors,
                       trace: SearchTrace[ProbeOutcome], limit: int | None
                       ) -> SafeBudgetRecord:
    """What safe_budgets.jsonl keeps of one search, its gate judged."""
    below = None
    if trace.safe is not None and trace.safe > search.lo:
        below = trace.safe - search.step
    record: SafeBudgetRecord = {
        "task": task, "strategy": strategy, "lo": search.lo, "hi": search.hi,
        "step": search.step, "min_retention": floors.min_retention,
        "min_answer_kept": floors.min_answer_kept,
        "max_violation_rate": floors.max_violation_rate, "safe_budget": trace.safe,
        "below": below, "scanned": trace.scanned, "max_safe_budget": limit, "gate": None,
        "probes": [probe.record() for probe in trace.probes]}
    record["gate"] = gate_reason(record)
    return record


def probe_at(record: SafeBudgetRecord, budget: int | None) -> ProbeOutcome | None:
    """The probe of ``record`` at ``budget`` (None: not probed)."""
    found = next((p for p in record["probes"] if p["budget"] == budget), None)
    return None if found is None else ProbeOutcome.from_record(found)


def gate_reason(record: SafeBudgetRecord) -> str | None:
    """Why the search's safe budget breaks ``--budgetbench-max-safe-budget`` (None: it is at
    or under its maximum, or no maximum applies)."""
    limit = record["max_safe_budget"]
    safe = record["safe_budget"]
    if limit is None or (safe is not None and safe <= limit):
        return None
    label = f"{record['task']}: {record['strategy']}"
    if safe is None:
        top = probe_at(record, record["hi"])
        why = "; ".join(top.reasons) if top else "not probed"
        return (f"{label}: no budget in {record['lo']}..{record['hi']} meets the floors (at "
                f"{record['hi']}: {why}), so none is at or under the maximum safe budget "
                f"{limit}")
    below = probe_at(record, record["below"])
    why = (f"at {record['below']}: {'; '.join(below.reasons)}" if below is not None
           else f"{safe} is the lowest budget the search tries")
    return f"{label}: safe budget {safe} is above the maximum {limit} ({why})"
