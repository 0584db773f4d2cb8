"""``observation_masking``: older tool results replaced by placeholders, calls kept.

After JetBrains' "The Complexity Trap" (Lindenbauer et al., 2025), where masking the
observations of all but the latest turns matched LLM summarisation at a fraction of its
cost: the results of the newest ``masking_keep`` tool steps (a step is one assistant
message's calls, several when they run in parallel) and of the last unit stay verbatim;
every older result's content becomes ``[tool result omitted: 2,314 characters from
get_weather]`` (a result no longer than its placeholder is left as it is). The calls, the
assistant's reasoning and the user turns are kept, so every pair stays whole. If the
masked prompt is still over budget, whole oldest units after the first user turn are
dropped, as ``pair_truncation`` does. Stateless: no model call, no state.
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_budgetbench.messages import Message
from pytest_budgetbench.options import Option, positive_int
from pytest_budgetbench.strategies._agent import (
    Trajectory,
    Unit,
    fit_agent,
    mask_result,
    protected_steps,
    split_trajectory,
)
from pytest_budgetbench.strategies.base import Regime, Strategy

MASKING_KEEP = Option(
    "masking_keep",
    "tool steps whose results observation_masking keeps verbatim (the newest; the last "
    "unit's always)",
    positive_int,
    3,
)


def masked_units(trajectory: Trajectory, keep: int) -> list[Unit]:
    """The units with every tool result outside the protected steps masked."""
    protected = protected_steps(trajectory.units, keep)
    names = trajectory.tool_names()
    return [
        unit if u in protected
        else [mask_result(m, names) if m.get("role") == "tool" else m for m in unit]
        for u, unit in enumerate(trajectory.units)
    ]


class ObservationMasking(Strategy):
    """Tool results older than the newest steps replaced by a placeholder."""

    name = "observation_masking"
    regimes = frozenset({Regime.LOCAL_ONLY, Regime.RESET_PER_ITEM})
    handles_tools = True
    declared_options = (MASKING_KEEP,)

    def apply(self, messages: Sequence[Message], budget: int) -> list[Message]:
        trajectory = split_trajectory(messages)
        keep = int(self.context.options.get(MASKING_KEEP.key, MASKING_KEEP.default))
        units = masked_units(trajectory, keep)
        return fit_agent(self.context.tokens, trajectory, units, budget)
