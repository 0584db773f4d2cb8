"""The item x strategy x budget matrix, with stable, readable ids."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pytest_budgetbench.errors import ConfigError

_UNSAFE = re.compile(r"[^A-Za-z0-9_.@]+")
HASH_MARK = "+"
"""Joins a cleaned id part to the hash of its original: no clean part contains it."""


def clean_part(text: str) -> str:
    """``text`` with each run of characters outside ``[A-Za-z0-9_.@]`` as one ``_``, no
    ``_`` at either end, ``x`` when nothing is left: readable, but not unique
    (``a-b`` and ``a_b`` are both ``a_b``)."""
    return _UNSAFE.sub("_", text).strip("_") or "x"


def id_part(text: str) -> str:
    """``text`` as one part of a cell id, distinct for distinct texts: ``text`` itself when
    it is already clean (:func:`clean_part` leaves it as it is), else its cleaned form,
    ``+`` and a short hash of the original (``a-b`` -> ``a_b+<12 hex digits>``, ``对话一``
    -> ``x+<12 hex digits>``). A clean part has no ``+``, so the two kinds never meet."""
    clean = clean_part(text)
    if clean == text:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{clean}{HASH_MARK}{digest}"


def split_reference(text: str) -> tuple[str, int | None]:
    """``strategy@budget`` -> (strategy, budget); a strategy alone -> (strategy, None).

    The budget is what follows the last ``@`` when it is a count, so strategy names with
    an ``@`` of their own work: ``budgetmem@0.1`` and ``budgetmem@0.1@2048``.
    """
    strategy, sep, budget = text.strip().rpartition("@")
    if sep and budget.isascii() and budget.isdigit():
        return strategy, int(budget)
    return text.strip(), None


@dataclass(frozen=True)
class Cell:
    task: str
    item_index: int
    item_id: str
    strategy: str
    """How the strategy was selected: a registered name or ``module:attr``."""
    budget: int
    repeat: int = 0
    strategy_name: str = ""
    """The strategy's own ``name``, used in ids; defaults to ``strategy``."""

    @property
    def strategy_label(self) -> str:
        """The strategy as ids, rows and reports name it: its own ``name``, else how it was
        selected."""
        return self.strategy_name or self.strategy

    @property
    def cell_id(self) -> str:
        parts = [self.task, self.item_id, self.strategy_label, str(self.budget)]
        if self.repeat:
            parts.append(f"r{self.repeat}")
        return "-".join(id_part(p) for p in parts)

    @property
    def group(self) -> str:
        """Cells of one item share caches; xdist's loadgroup keeps them on one worker."""
        return f"{self.task}-{self.item_id}"


def build_cells(
    items_by_task: Mapping[str, Sequence[str]],
    strategies: Sequence[str],
    budgets: Sequence[int],
    repeats: int = 1,
    names: dict[str, str] | None = None,
) -> list[Cell]:
    """Cells in a deterministic order: task, item, budget, strategy, repeat.

    Keeping an item's cells adjacent, and a budget's strategies adjacent, lets the model
    server reuse its KV cache when consecutive prompts share a prefix.

    Two items of a task with one id, or two ids (or strategy names) with one id part, are
    a ConfigError: their cells would share one id, so one result would stand for both.
    """
    for task, item_ids in items_by_task.items():
        _check_distinct(item_ids, f"task '{task}' item ids", "give each item its own id")
    _check_distinct([(names or {}).get(s, s) for s in strategies],
                    "--budgetbench-strategies names", "give one strategy another name")
    cells = []
    for task, item_ids in items_by_task.items():
        for index, item_id in enumerate(item_ids):
            for budget in budgets:
                for strategy in strategies:
                    for repeat in range(repeats):
                        name = (names or {}).get(strategy, strategy)
                        cells.append(Cell(task, index, item_id, strategy, budget, repeat, name))
    return cells


def adjacent_prompt_starts(cells: Sequence[Cell], starts: Mapping[str, Mapping[str, str]]
                           ) -> list[Cell]:
    """The cells with each task's items that share a prompt start (``starts[task][item_id]``,
    e.g. the tool list, which leads every prompt) moved next to each other: each such group
    where its first item was, items and cells otherwise in order.

    A server that keeps its last prompt (llama.cpp) then reuses the shared start at an
    item's first call instead of prefilling it again: BFCL entries of one tool set share
    some 3,000 tokens. Which items run is unchanged; only their order.
    """
    rank: dict[tuple[str, str], int] = {}
    for cell in cells:
        rank.setdefault((cell.task, starts[cell.task][cell.item_id]), len(rank))
    return sorted(cells, key=lambda cell: rank[(cell.task, starts[cell.task][cell.item_id])])


def _check_distinct(values: Iterable[str], where: str, fix: str) -> None:
    seen: dict[str, tuple[int, str]] = {}
    for index, value in enumerate(values):
        first, earlier = seen.setdefault(id_part(value), (index, value))
        if first == index:
            continue
        if earlier == value:
            raise ConfigError(
                f"{where}: {value!r} is given twice (entries {first + 1} and {index + 1}), "
                f"so their cells would share one id and one result; {fix}"
            )
        raise ConfigError(
            f"{where}: {earlier!r} and {value!r} give one cell id part {id_part(value)!r}, "
            f"so their cells would share one id and one result; {fix}"
        )
