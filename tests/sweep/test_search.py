"""The budget search (sweep.search): its answer is the brute force's over the whole grid
("the smallest budget at which the floors hold, and at every budget above it") whenever the
probes' outcomes are monotone, and whenever they show they are not; what ``search:LO..HI``
accepts."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_budgetbench.errors import ConfigError
from pytest_budgetbench.sweep.search import (
    BudgetSearch,
    brute_force,
    check_grid,
    find_safe_budget,
    parse_search,
)

GRID = BudgetSearch(512, 4096).grid


@dataclass(frozen=True)
class Outcome:
    budget: int
    passed: bool
    items: Mapping[str, tuple[float, float | None]] = field(default_factory=dict)


class Table:
    """Every probe's outcome, known in advance; counts the probes asked for."""

    def __init__(self, grid: tuple[int, ...], passes: list[bool],
                 items: list[dict[str, tuple[float, float | None]]] | None = None) -> None:
        self.grid = grid
        self.outcomes = {b: Outcome(b, p, (items or [{}] * len(grid))[i])
                         for i, (b, p) in enumerate(zip(grid, passes, strict=True))}
        self.asked: list[int] = []

    def probe(self, budget: int) -> Outcome:
        assert budget not in self.asked, f"{budget} probed twice"
        self.asked.append(budget)
        return self.outcomes[budget]

    def brute(self) -> int | None:
        return brute_force(self.grid, {b: o.passed for b, o in self.outcomes.items()})


@st.composite
def monotone_tables(draw: st.DrawFn) -> Table:
    """Outcomes that never go the wrong way as the budget grows: the floors fail below a
    threshold and hold from it on, each item admitted from its own threshold on, keeping
    more or as much evidence at each larger budget."""
    size = draw(st.integers(1, len(GRID)))
    grid = GRID[:size]
    threshold = draw(st.integers(0, size))  # size: fails everywhere
    items: list[dict[str, tuple[float, float | None]]] = [{} for _ in grid]
    for item in range(draw(st.integers(0, 4))):
        start = draw(st.integers(0, size))
        kept = sorted(draw(st.lists(st.floats(0, 1), min_size=size, max_size=size)))
        for index in range(size):
            items[index][f"i{item}"] = (1.0, kept[index]) if index >= start else (0.0, None)
    return Table(grid, [index >= threshold for index in range(size)], items)


@settings(max_examples=150, deadline=None)
@given(monotone_tables())
def test_on_monotone_outcomes_the_search_is_the_brute_force_in_few_probes(table: Table
                                                                          ) -> None:
    trace = find_safe_budget(table.grid, table.probe)
    assert trace.safe == table.brute()
    assert trace.scanned is None
    assert len(table.asked) <= 2 * math.ceil(math.log2(len(table.grid))) + 2
    if trace.safe is not None and trace.safe > table.grid[0]:  # the budget below was seen
        below = trace.at(trace.safe - 64)
        assert below is not None and not below.passed


@st.composite
def any_tables(draw: st.DrawFn) -> Table:
    size = draw(st.integers(1, 40))
    passes = draw(st.lists(st.booleans(), min_size=size, max_size=size))
    items = [{"a": (draw(st.sampled_from([0.0, 0.5, 1.0])), draw(st.none() | st.floats(0, 1)))}
             for _ in range(size)]
    return Table(GRID[:size], passes, items)


@settings(max_examples=200, deadline=None)
@given(any_tables())
def test_on_any_outcomes_the_answer_holds_and_is_exact_once_the_search_scans(table: Table
                                                                             ) -> None:
    trace = find_safe_budget(table.grid, table.probe)
    brute = table.brute()
    if trace.scanned is not None:
        assert trace.safe == brute
    if trace.safe is None:
        assert brute is None
    else:  # never a budget that fails, and never above the brute force's answer
        assert table.outcomes[trace.safe].passed
        assert brute is not None and trace.safe <= brute


def test_an_item_keeping_less_at_a_larger_budget_makes_the_search_probe_every_budget() -> None:
    """The floors fail at 896 although they hold at 704: binary search alone would answer
    704. Item x keeps less evidence at 1088 than at 704, which refutes monotonicity, so the
    search probes from HI down and answers as the brute force does."""
    grid = BudgetSearch(512, 1088).grid  # 10 budgets
    passes = [False, False, False, True, True, True, False, True, True, True]
    kept = [0.0, 0.2, 0.4, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.8]
    table = Table(grid, passes, [{"x": (1.0, k)} for k in kept])
    trace = find_safe_budget(grid, table.probe)
    assert trace.safe == table.brute() == 960
    assert trace.scanned == "item x keeps 1.00 of its evidence at 704 but 0.80 at 1088"
    assert table.asked[:5] == [1088, 512, 576, 704, 640]  # HI, LO, doubling, binary


def test_a_failure_between_monotone_probes_is_what_the_search_cannot_see() -> None:
    """The documented limit: the same outcomes, with items that never go the wrong way at
    the probed budgets, give binary search's answer, below the brute force's."""
    grid = BudgetSearch(512, 1088).grid
    passes = [False, False, False, True, True, True, False, True, True, True]
    table = Table(grid, passes)
    trace = find_safe_budget(grid, table.probe)
    assert (trace.safe, table.brute(), trace.scanned) == (704, 960, None)


def test_when_hi_fails_there_is_no_safe_budget_after_one_probe() -> None:
    table = Table(GRID, [True] * (len(GRID) - 1) + [False])
    trace = find_safe_budget(GRID, table.probe)
    assert (trace.safe, table.asked) == (None, [4096])


@pytest.mark.parametrize(("raw", "message"), [
    ("search:4096..512", "--budgets=search:4096..512: LO 4096 is above HI 512; give the "
     "smallest budget first, e.g. --budgets=search:512..4096"),
    ("search:512-4096", "--budgets=search:LO..HI takes two positive token counts, the "
     "smallest and the largest budget to try, e.g. --budgets=search:512..16384 (got "
     "'search:512-4096')"),
    ("search:0..4096", "takes two positive token counts"),
    ("search:512..20000000", "20000000 tokens is more than any served model takes"),
])
def test_a_bad_range_is_one_line(raw: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_search(raw, 10_000_000)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_the_grid_ends_at_hi_and_is_not_huge() -> None:
    assert parse_search("search:512..4096", 10_000_000) == BudgetSearch(512, 4096)
    assert BudgetSearch(512, 4096).grid[:3] == (512, 576, 640) and GRID[-1] == 4096
    assert BudgetSearch(100, 100).grid == (100,)
    with pytest.raises(ConfigError, match="HI - LO = 3500 is not a multiple of the step, so "
                       "HI is not on the grid; end the range at 3956 or 4020"):
        check_grid(BudgetSearch(500, 4000, 64), "--budgetbench-search-step")
    with pytest.raises(ConfigError, match="a grid of 999,001 budgets"):
        check_grid(BudgetSearch(1000, 1_000_000, 1), "--budgetbench-search-step")
