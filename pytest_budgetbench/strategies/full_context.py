"""``full_context``: the reference strategy, the whole history unchanged at every budget."""

from __future__ import annotations

from collections.abc import Sequence

from pytest_budgetbench.messages import Message
from pytest_budgetbench.strategies.base import Regime, Strategy


class FullContext(Strategy):
    """The reference: the whole history, unchanged, whatever the budget."""

    name = "full_context"
    regimes = frozenset({Regime.LOCAL_ONLY, Regime.RESET_PER_ITEM})
    reference = True
    handles_tools = True

    def apply(self, messages: Sequence[Message], budget: int) -> list[Message]:
        return [dict(m) for m in messages]
