"""The BudgetMem pipeline as the PPO learner's environment: an episode is one cell.

Each episode runs through the sweep's own :class:`~pytest_budgetbench.engine.runner.Runner`, with
a strategy whose tier chooser is the policy's sampler, so training counts, enforces the
budget, checks the strategy's messages and wraps its failures exactly as a sweep does, and
records each episode as a row (``cells.jsonl`` of the runner's store).

It sits beside the runner, above the strategies and tasks it joins (BudgetMem never
imports a task or the runner); ``budgetbench train-router``
(:mod:`pytest_budgetbench.commands.train_router`) builds the runner through the wiring.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_budgetbench.engine.runner import CellResult, Runner
from pytest_budgetbench.errors import ConfigError
from pytest_budgetbench.records.rows import Status
from pytest_budgetbench.strategies.base import Embedder
from pytest_budgetbench.strategies.budgetmem.pipeline import Outcome
from pytest_budgetbench.strategies.budgetmem.router import EpisodeResult, SampledBudgetMem, Sampler
from pytest_budgetbench.sweep.cells import Cell
from pytest_budgetbench.tasks import REGISTRY as TASKS
from pytest_budgetbench.tasks import Item, Task, TaskOptions


@dataclass
class PipelineEnvironment:
    """Episodes of the real pipeline on ``items`` of task ``task``, each run, answered and
    graded by ``runner`` as a cell of ``budget`` tokens."""

    runner: Runner
    task: str
    items: list[Item]
    embedder_factory: Callable[[], Embedder]
    budget: int
    cost: str = "tokens"
    prices: tuple[float, float] = (0.0, 0.0)
    """USD per million input and output tokens, for ``cost='usd'``."""
    meta: dict[str, Any] = field(default_factory=dict)
    _dim: int | None = None

    @property
    def size(self) -> int:
        return len(self.items)

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._dim = len(self.embedder_factory().embed(["dimension probe"])[0])
        return self._dim

    def run(self, index: int, sample: Sampler) -> EpisodeResult:
        item = self.items[index]
        strategy = SampledBudgetMem(sample)
        cell = Cell(task=self.task, item_index=index, item_id=item.item_id,
                    strategy=strategy.name, budget=self.budget)
        result = self.runner.run(cell, strategy=strategy)
        outcome = strategy.outcome
        tiers = {m: t.name for m, t in outcome.tiers.items()} if outcome else {}
        if result.status != Status.OK:
            return EpisodeResult(0.0, 0.0, tiers)  # system plus query alone overflow
        return EpisodeResult(result.quality or 0.0, self._cost(result, outcome), tiers)

    def _cost(self, result: CellResult, outcome: Outcome | None) -> float:
        if outcome is None:  # no history to remember, or no room for a summary
            return 0.0
        if self.cost == "seconds":
            return float(outcome.cost_seconds())
        if self.cost == "usd":
            price_in, price_out = self.prices
            row = result.row
            return (row["aux_input_tokens"] * price_in
                    + row["aux_output_tokens"] * price_out) / 1e6
        return float(outcome.cost_tokens())


def load_training_items(task_name: str, data: Path | None, split: str, count: int,
                        seed: int) -> tuple[Task, list[Item]]:
    """The task and its first ``count`` items of the training split."""
    cls = TASKS.resolve(task_name)
    extra: dict[str, Any] = {"locomo_samples": split} if cls.name == "locomo" else {}
    task = cls(TaskOptions(seed=seed, data_path=data, extra=extra))
    items = task.load()[:count]
    if not items:
        raise ConfigError(f"task '{task_name}' has no training items (split {split!r})")
    return task, items
