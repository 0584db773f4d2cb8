from __future__ import annotations

from collections.abc import Sequence

from pytest_budgetbench.messages import Message, split_ends
from pytest_budgetbench.strategies.base import Regime, Strategy


class Truncation(Strategy):
    """Keep the system prompt and the final query, then the newest history that fits.

    Each message is counted once (cached by content), and the running sum is checked
    against the exact count of the assembled prompt, dropping one more message if a
    template ever makes the sum an underestimate.
    """

    name = "truncation"
    regimes = frozenset({Regime.LOCAL_ONLY, Regime.RESET_PER_ITEM})

    def apply(self, messages: Sequence[Message], budget: int) -> list[Message]:
        tokens = self.context.tokens
        head, history, query = split_ends(messages)
        used = tokens.overhead() + sum(tokens.count_message(m) for m in head + query)
        start = len(history)
        while start > 0:
            cost = tokens.count_message(history[start - 1])
            if used + cost > budget:
                break
            used += cost
            start -= 1
        kept = history[start:]
        while kept and tokens.count_messages(head + kept + query) > budget:
            kept = kept[1:]
        return [dict(m) for m in head + kept + query]
