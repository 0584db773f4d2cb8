"""Gates: a verdict over every cell of one strategy@budget (gate specs, verdicts, the
violation rate, the regression rules), and what a retention mean leaves out."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

# -- gates: a verdict over every cell of one strategy@budget ---------------------------
VIOLATION_GATE = "violation-rate"
REGRESSION_GATE = "regression"
RETENTION_GATE = "retention-floor"
ANSWER_GATE = "answer-kept-floor"
FLOOR_GATES = (RETENTION_GATE, ANSWER_GATE)
"""The gates that hold a share of the admitted items (retention, answer kept) to a floor."""
RATE_EPS = 1e-12
"""Rates are ratios of counts; a difference smaller than this is float noise, not a change."""


def violation_rate(n_violation: float, n_ok: float) -> float:
    """The one definition of a violation rate: violations / (admitted + violations); NaN
    when nothing was judged (every cell errored, or none ran). Tables, report.json, the
    gates and the terminal summary all call this."""
    judged = n_ok + n_violation
    return n_violation / judged if judged else math.nan


NONINFERIORITY, HARM = "noninferiority", "harm"
"""The regression gates' tests (``--budgetbench-regression-test``, ``budgetbench diff
--regression-test``); non-inferiority is the default."""
REGRESSION_TESTS = {NONINFERIORITY: "non-inferiority", HARM: "harm-shown"}
"""Each test's name in messages."""


def quality_regressed(delta: float, upper: float, tolerance: float) -> bool:
    """The harm-shown rule, of the plugin's gate and the console command's: a paired
    quality change ``delta`` with 95% interval upper bound ``upper`` fell by more than
    ``tolerance`` and its interval lies below zero."""
    return delta < -tolerance and upper < 0


def noninferior(lower: float, margin: float) -> bool:
    """The non-inferiority rule: the 95% interval's lower bound ``lower`` of the paired
    quality change lies above ``-margin``, so a drop of more than ``margin`` is excluded
    (False when there is no bound)."""
    return lower > -margin


@dataclass(frozen=True)
class GateSpec:
    """One gate item: a kind over one strategy@budget, pooled over tasks."""

    kind: str
    strategy: str
    """The strategy's own name, as rows record it."""
    budget: int

    @property
    def gate_id(self) -> str:
        return f"{self.kind} {self.strategy}@{self.budget}"


@dataclass(frozen=True)
class GateVerdict:
    """What one gate found over the computed report: its numbers and, when it failed, one
    reason per failing cell (the gate's pytest item fails with them, joined)."""

    spec: GateSpec
    reasons: tuple[str, ...] = ()
    rate: float | None = None
    """The violation gate's pooled rate (NaN when nothing was judged)."""
    n_violation: int | None = None
    n_judged: int | None = None
    """Admitted and over-budget prompts, the denominator of ``rate``."""
    delta: float | None = None
    """The regression gate's largest fall of paired quality over the tasks (None: none)."""
    interval: tuple[float, float] | None = None
    """The 95% interval of ``delta``."""
    retention: float | None = None
    """The retention floor gate's mean evidence retention (None: nothing to average)."""
    answer_kept: float | None = None
    """The answer-kept floor gate's share of items that kept their answer (None: none)."""
    notes: tuple[str, ...] = ()
    """Warnings of a gate that passed (a harm-shown gate too small to detect its margin)."""
    threshold: float | None = None
    """What the gate held its value to: the maximum violation rate, the floor, or the
    regression gate's margin D (None: not judged against one)."""
    passed: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "passed", not self.reasons)

    @property
    def message(self) -> str | None:
        """The one-line failure message, or None when the gate passed."""
        return "; ".join(self.reasons) or None

    def public(self) -> dict[str, object]:
        """The verdict as JSON (an xdist worker's gate report carries it to the controller)."""
        return {"kind": self.spec.kind, "strategy": self.spec.strategy,
                "budget": self.spec.budget, "passed": self.passed, "reasons": list(self.reasons),
                "rate": self.rate, "n_violation": self.n_violation, "n_judged": self.n_judged,
                "delta": self.delta, "interval": list(self.interval) if self.interval else None,
                "retention": self.retention, "answer_kept": self.answer_kept,
                "notes": list(self.notes), "threshold": self.threshold}

    @classmethod
    def from_public(cls, data: Mapping[str, Any]) -> GateVerdict:
        interval = data.get("interval")
        return cls(GateSpec(data["kind"], data["strategy"], int(data["budget"])),
                   tuple(data.get("reasons") or ()), data.get("rate"), data.get("n_violation"),
                   data.get("n_judged"), data.get("delta"),
                   (interval[0], interval[1]) if interval else None,
                   data.get("retention"), data.get("answer_kept"),
                   tuple(data.get("notes") or ()), data.get("threshold"))


class GateSettings(Protocol):
    """What :func:`gate_specs` reads of a sweep's settings
    (:class:`~pytest_budgetbench.settings.config.Settings` is one)."""

    @property
    def budgets(self) -> tuple[int, ...]: ...

    @property
    def max_violation_rate(self) -> float | None: ...

    @property
    def baseline(self) -> str | None: ...

    @property
    def max_regression(self) -> float | None: ...

    def retention_floor(self, strategy: str, budget: int, reference: bool) -> float | None: ...

    def answer_kept_floor(self, strategy: str, budget: int, reference: bool
                          ) -> float | None: ...


def gate_specs(strategies: Mapping[str, bool], settings: GateSettings) -> list[GateSpec]:
    """The gates a sweep's settings ask for. ``strategies`` maps each strategy's name to
    whether it is a reference (references may overflow, so no violation-rate gate judges
    them; a reference has a retention or answer-kept floor only when one is named for it)."""
    violation = settings.max_violation_rate is not None
    regression = settings.baseline is not None and settings.max_regression is not None
    specs = []
    for budget in settings.budgets:
        for name, reference in strategies.items():
            if violation and not reference:
                specs.append(GateSpec(VIOLATION_GATE, name, budget))
            if regression:
                specs.append(GateSpec(REGRESSION_GATE, name, budget))
            if settings.retention_floor(name, budget, reference) is not None:
                specs.append(GateSpec(RETENTION_GATE, name, budget))
            if settings.answer_kept_floor(name, budget, reference) is not None:
                specs.append(GateSpec(ANSWER_GATE, name, budget))
    return specs
