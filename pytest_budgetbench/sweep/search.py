"""The smallest safe budget: which budgets a search probes, and what it answers.

``--budgets=search:LO..HI`` asks, for each strategy and task, "how small can my context
be?". The budgets it may probe are a grid, LO, LO+STEP, ..., HI
(``--budgetbench-search-step``, 64 tokens by default). A *probe* runs every item of the
task at one budget and judges the floors there (the violation rate and the retention of
``--budgetbench-max-violation-rate`` and ``--budgetbench-min-retention``); this module
decides which budgets to probe and reads the answer off the probes. It knows nothing of
cells or rows: a probe is a callable (``engine.search`` runs the cells,
``reports.gates.safe_budget`` judges them).

**What the answer is.** A floor can fail at a budget above one where it held (retention
over the admitted items can drop when a larger budget admits an item that keeps little;
a strategy's packing can keep less at a larger budget), so the answer is defined, not
assumed: the *safe budget* is the smallest grid budget ``b`` at which the floors hold **and
at every grid budget above it, up to HI** -- a team that sets ``b`` may grow it later and
stay safe. It is one step above the largest grid budget that fails, LO when none fails,
and None when HI itself fails. :func:`brute_force` computes it by probing every grid budget.

**How it is found** (:func:`find_safe_budget`): HI (None when it fails), then LO (the
answer when it holds), then doubling steps up from LO until a probe holds, and a binary
search between the last failure and that pass down to one step. That is exact when the
floors' outcome is monotone in the budget, with about 2 log2(grid) probes instead of the
whole grid. Every probe also says, per item, whether the prompt was admitted and what
share of the evidence it kept: when the probes show any item going the wrong way as the
budget grows (admitted at one budget and over at a larger one, or keeping less evidence
at a larger budget), monotonicity is refuted and the search probes every grid budget from
HI down to the first failure, which is :func:`brute_force`'s answer by definition. So the
search's answer is the brute force's whenever the outcome is monotone, and whenever the
probes' items show it is not (tests/sweep/test_search.py checks both on random outcomes);
otherwise it is never a budget that fails, and never above the brute force's. What it
cannot see is an outcome that goes the wrong way only between two probes, on no item the
probes show (e.g. a failure between a passing LO and HI, which two probes settle).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Generic, Protocol, TypeVar

from pytest_budgetbench.errors import ConfigError

SEARCH_PREFIX = "search:"
"""``--budgets=search:LO..HI``: a search instead of a list of budgets."""
DEFAULT_STEP = 64
MAX_GRID = 10_000
"""The most budgets a search's grid may hold: a finer grid is a typo (a step of 1 over a
10M range), and it is listed in run.json."""


@dataclass(frozen=True)
class BudgetSearch:
    """The range a search probes: ``lo``, ``lo + step``, ..., ``hi``."""

    lo: int
    hi: int
    step: int = DEFAULT_STEP

    @property
    def grid(self) -> tuple[int, ...]:
        return tuple(range(self.lo, self.hi + 1, self.step))

    @property
    def text(self) -> str:
        return f"{SEARCH_PREFIX}{self.lo}..{self.hi}"


def is_search(raw: str) -> bool:
    return raw.strip().lower().startswith(SEARCH_PREFIX)


def parse_search(raw: str, max_budget: int) -> BudgetSearch:
    """``search:LO..HI`` -> BudgetSearch (its step is set later, from its own option)."""
    text = raw.strip()[len(SEARCH_PREFIX):].strip()
    lo, dots, hi = text.partition("..")
    lo, hi = lo.strip(), hi.strip()
    if not dots or not (lo.isascii() and lo.isdigit() and hi.isascii() and hi.isdigit()) \
            or int(lo) <= 0:
        raise ConfigError(
            "--budgets=search:LO..HI takes two positive token counts, the smallest and the "
            f"largest budget to try, e.g. --budgets=search:512..16384 (got {raw.strip()!r})")
    if int(hi) > max_budget:
        raise ConfigError(f"--budgets={raw.strip()}: {hi} tokens is more than any served "
                          f"model takes in one prompt; budgets go up to {max_budget:,}")
    if int(lo) > int(hi):
        raise ConfigError(
            f"--budgets={raw.strip()}: LO {lo} is above HI {hi}; give the smallest budget "
            f"first, e.g. --budgets=search:{hi}..{lo}")
    return BudgetSearch(int(lo), int(hi))


def check_grid(search: BudgetSearch, step_flag: str) -> None:
    """The grid must end at HI and hold at most :data:`MAX_GRID` budgets."""
    span = search.hi - search.lo
    if span % search.step:
        below = search.hi - span % search.step
        raise ConfigError(
            f"--budgets={search.text} with {step_flag}={search.step}: HI - LO = {span} is not "
            f"a multiple of the step, so HI is not on the grid; end the range at {below} or "
            f"{below + search.step}, or pick a step that divides {span}")
    if span // search.step + 1 > MAX_GRID:
        raise ConfigError(
            f"--budgets={search.text} with {step_flag}={search.step} is a grid of "
            f"{span // search.step + 1:,} budgets (at most {MAX_GRID:,}); raise the step")


class Judged(Protocol):
    """A probe's outcome, as the search reads it."""

    @property
    def budget(self) -> int: ...

    @property
    def passed(self) -> bool:
        """The floors hold at this budget."""
        ...

    @property
    def items(self) -> Mapping[str, tuple[float, float | None]]:
        """Per item: the share of its prompts admitted (0..1, over its repeats) and the
        mean evidence retention of its admitted prompts (None: none admitted, or no
        evidence). An item whose every prompt errored is left out."""
        ...


J = TypeVar("J", bound=Judged)


@dataclass(frozen=True)
class SearchTrace(Generic[J]):
    """What a search found: the safe budget (None: not even HI is safe), every probe in the
    order it ran, and why the search fell back to probing each budget from HI down (None:
    the probes were monotone)."""

    safe: int | None
    probes: list[J] = field(default_factory=list)
    scanned: str | None = None

    def at(self, budget: int) -> J | None:
        return next((probe for probe in self.probes if probe.budget == budget), None)


def brute_force(grid: tuple[int, ...], passes: Mapping[int, bool]) -> int | None:
    """The definition: the smallest grid budget from which on, up to the last, every grid
    budget passes (``passes`` must hold every budget of ``grid``)."""
    safe = None
    for budget in reversed(grid):
        if not passes[budget]:
            break
        safe = budget
    return safe


def find_safe_budget(grid: tuple[int, ...], probe: Callable[[int], J]) -> SearchTrace[J]:
    """The safe budget of ``grid`` (ascending) by the probes ``probe(budget)``, probing as
    few budgets as the outcome's monotonicity allows (see the module's docstring)."""
    done: dict[int, J] = {}
    order: list[J] = []

    def at(index: int) -> bool:
        budget = grid[index]
        if budget not in done:
            done[budget] = probe(budget)
            order.append(done[budget])
        return done[budget].passed

    top = len(grid) - 1
    if not at(top):
        return SearchTrace(None, order)
    candidate = 0
    if not at(0):
        failed, passed, stride = 0, top, 1
        while failed + stride < top:  # doubling steps up from LO
            if at(failed + stride):
                passed = failed + stride
                break
            failed += stride
            stride *= 2
        while passed - failed > 1:  # binary search to one step
            middle = (failed + passed) // 2
            if at(middle):
                passed = middle
            else:
                failed = middle
        candidate = passed
    refuted = _refuted(order)
    if refuted is None:
        return SearchTrace(grid[candidate], order)
    index = top
    while index > 0 and at(index - 1):  # every budget from HI down to the first failure
        index -= 1
    return SearchTrace(grid[index], order, refuted)


def _refuted(probes: list[J]) -> str | None:
    """Why ``probes`` show the outcome is not monotone in the budget (None: they do not)."""
    # The floors' own outcome never shows it: binary search keeps every probe below its
    # answer a failure and every one from it up a pass. Only the items can.
    ordered = sorted(probes, key=lambda probe: probe.budget)
    for lower, upper in pairwise(ordered):
        for item, (admitted, kept) in lower.items.items():
            above = upper.items.get(item)
            if above is None:
                continue
            if above[0] < admitted:
                return (f"item {item} is admitted at {lower.budget} ({admitted:.0%} of its "
                        f"prompts) but less at {upper.budget} ({above[0]:.0%})")
            if kept is not None and above[1] is not None and above[1] < kept:
                return (f"item {item} keeps {kept:.2f} of its evidence at {lower.budget} but "
                        f"{above[1]:.2f} at {upper.budget}")
    return None
