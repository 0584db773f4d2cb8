"""``pair_truncation``: an agent's trajectory truncated without breaking a tool-call pair.

The system messages and the first user turn (the task) are kept, then as many of the most
recent units (``messages.exchanges``: a call with its results, or one message) as fit;
the last unit, what the model answers now, is always sent. Unlike ``truncation``, the
task survives however long the episode runs. Stateless: each call's prompt is a function
of the trajectory alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_budgetbench.messages import Message
from pytest_budgetbench.strategies._agent import fit_agent, split_trajectory
from pytest_budgetbench.strategies.base import Regime, Strategy


class PairTruncation(Strategy):
    """Head, first user turn, then the newest whole units that fit."""

    name = "pair_truncation"
    regimes = frozenset({Regime.LOCAL_ONLY, Regime.RESET_PER_ITEM})
    handles_tools = True

    def apply(self, messages: Sequence[Message], budget: int) -> list[Message]:
        trajectory = split_trajectory(messages)
        return fit_agent(self.context.tokens, trajectory, trajectory.units, budget)
