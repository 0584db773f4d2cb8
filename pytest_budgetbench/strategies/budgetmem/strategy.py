"""The BudgetMem strategies: fixed-tier controls, a seeded random control, and routers.

All run the same pipeline
(:func:`~pytest_budgetbench.strategies.budgetmem.modules.run_pipeline`) and differ only in
how each module's tier is chosen, so the report's paired deltas between a router and a
control measure what the routing adds. The prompt is always the system
messages, one system message holding the pipeline's knowledge summary, and the query;
the summary is cut until the whole prompt fits the budget (it is left out when system
plus query leave no room).
"""

from __future__ import annotations

import random
from abc import abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from pytest_budgetbench.messages import Message, split_ends
from pytest_budgetbench.options import Option
from pytest_budgetbench.strategies._chunking import fit_prefix
from pytest_budgetbench.strategies._packing import query_text
from pytest_budgetbench.strategies.base import Regime, Strategy
from pytest_budgetbench.strategies.budgetmem.modules import run_pipeline
from pytest_budgetbench.strategies.budgetmem.pipeline import Outcome, Services, State
from pytest_budgetbench.strategies.budgetmem.tiers import (
    AXIS,
    TOP_K,
    Tier,
    axis_option,
    top_k_option,
)

SUMMARY_HEADER = "Memory notes for the question:\n"
MIN_SUMMARY_TOKENS = 8  # below this the summary message is noise


def summary_message(summary: str) -> Message:
    return {"role": "system", "content": SUMMARY_HEADER + summary}


class BudgetMem(Strategy):
    """The pipeline with a per-module tier chooser; subclasses choose."""

    regimes = frozenset({Regime.AUXILIARY_MODEL, Regime.RESET_PER_ITEM})
    uses_embedder = True  # every chunk is embedded, whatever the tier
    declared_options: ClassVar[tuple[Option, ...]] = (AXIS, TOP_K)
    outcome: Outcome | None = None

    @abstractmethod
    def choose(self, module: str, state: State, services: Services) -> Tier:
        """The tier of ``module``, given the state the module is about to read."""

    def apply(self, messages: Sequence[Message], budget: int) -> list[Message]:
        head, history, query = split_ends(messages)
        tokens = self.context.tokens
        self.outcome = None
        room = budget - tokens.count_messages([*head, summary_message(""), *query])
        if not history or room < MIN_SUMMARY_TOKENS:
            return [dict(m) for m in head + query]
        options = self.context.options
        axis = axis_option(options)
        services = Services(self.context, budget, axis)
        outcome = run_pipeline(services, history, query_text(query), top_k_option(options),
                               room, lambda module, state: self.choose(module, state, services))
        self.outcome = outcome
        self.context.info.update(outcome.info(axis))
        return self.assemble(head, query, outcome.state.summary, budget)

    def assemble(self, head: list[Message], query: list[Message], summary: str,
                 budget: int) -> list[Message]:
        """System messages, the summary, the query: the summary cut until it fits."""
        tokens = self.context.tokens
        while summary.strip():
            prompt = [*head, summary_message(summary), *query]
            excess = tokens.count_messages(prompt) - budget
            if excess <= 0:
                return [dict(m) for m in prompt]
            keep = tokens.count_text(summary) - excess
            summary = summary[: fit_prefix(tokens, summary, 0, len(summary), keep)].rstrip()
        return [dict(m) for m in head + query]


class _Fixed(BudgetMem):
    tier: ClassVar[Tier]

    def choose(self, module: str, state: State, services: Services) -> Tier:
        return self.tier


class BudgetMemLow(_Fixed):
    """Every module at LOW: the control for a router that saves everything."""

    name = "budgetmem_low"
    tier = Tier.LOW


class BudgetMemMid(_Fixed):
    name = "budgetmem_mid"
    tier = Tier.MID


class BudgetMemHigh(_Fixed):
    name = "budgetmem_high"
    tier = Tier.HIGH


class BudgetMemRandom(BudgetMem):
    """Each module's tier drawn uniformly, seeded by the run seed, item and module."""

    name = "budgetmem_random"

    def choose(self, module: str, state: State, services: Services) -> Tier:
        rng = random.Random(f"budgetmem/{self.context.seed}/{self.context.item_id}/{module}")
        return Tier(rng.randrange(len(Tier)))
