"""``truncation``: the system prompt and the final query, then the newest history that fits."""

from __future__ import annotations

from collections.abc import Sequence

from pytest_budgetbench.messages import Message, exchanges, split_ends
from pytest_budgetbench.strategies._agent import fit_newest
from pytest_budgetbench.strategies.base import Regime, Strategy


class Truncation(Strategy):
    """Keep the system prompt and the final query, then the newest history that fits.

    The history is dropped in whole units (``messages.exchanges``): a tool call goes with
    its results, so a trajectory keeps its pairs. Each message is counted once (cached by
    content), and the running sum is checked against the exact count of the assembled
    prompt, dropping one more unit if a template ever makes the sum an underestimate.
    """

    name = "truncation"
    regimes = frozenset({Regime.LOCAL_ONLY, Regime.RESET_PER_ITEM})
    handles_tools = True

    def apply(self, messages: Sequence[Message], budget: int) -> list[Message]:
        head, history, query = split_ends(messages)
        # A trajectory that ends in tool results has no query: its last unit is what the
        # model answers now, so it is always sent (an empty prompt is no prompt).
        return fit_newest(self.context.tokens, head, exchanges(history), budget,
                          back=query, always=0 if query else 1)
