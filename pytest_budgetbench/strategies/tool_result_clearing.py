"""``tool_result_clearing``: clear the oldest tool results when the prompt nears the budget.

The context-editing approach (Anthropic's ``clear_tool_uses``): nothing changes while the
prompt stays under ``clearing_trigger`` of the budget (0.8); when a call's prompt passes
it, the oldest tool results are cleared (their content replaced by a placeholder that
names the tool and the size, the call kept) until the prompt is under
``clearing_target`` of the budget (0.5; a target above the trigger is read as the
trigger), sparing the newest ``clearing_keep`` tool steps and the last unit. A cleared
result stays cleared for the rest of the episode, so the prompt's beginning changes only
at a clearing, not at every call (a server's prefix cache keeps working between them).
If clearing all it may still leaves the prompt over budget, whole oldest units after the
first user turn are dropped, as ``pair_truncation`` does.

``context.info["tool_result_clearing"]`` counts the clearings and the results cleared.
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_budgetbench.messages import Message
from pytest_budgetbench.options import Option, positive_int, rate
from pytest_budgetbench.strategies._agent import (
    EpisodeState,
    Trajectory,
    Unit,
    fit_agent,
    mask_result,
    protected_steps,
    split_trajectory,
)
from pytest_budgetbench.strategies.base import Regime, Strategy, StrategyContext

CLEARING_TRIGGER = Option(
    "clearing_trigger", "share of the budget above which tool_result_clearing clears",
    rate, 0.8)
CLEARING_TARGET = Option(
    "clearing_target", "share of the budget tool_result_clearing clears down to",
    rate, 0.5)
CLEARING_KEEP = Option(
    "clearing_keep", "newest tool steps whose results tool_result_clearing never clears",
    positive_int, 3)


class ToolResultClearing(Strategy):
    """Oldest tool results cleared, once the prompt passes a share of the budget."""

    name = "tool_result_clearing"
    regimes = frozenset({Regime.LOCAL_ONLY, Regime.RESET_PER_ITEM})
    handles_tools = True
    declared_options = (CLEARING_TRIGGER, CLEARING_TARGET, CLEARING_KEEP)

    def reset(self, context: StrategyContext) -> None:
        super().reset(context)
        self.episode = EpisodeState()
        self.cleared: set[int] = set()  # trajectory indices of the cleared results
        self.clearings = 0

    def apply(self, messages: Sequence[Message], budget: int) -> list[Message]:
        if not self.episode.extends(messages):
            self.cleared = set()
        trajectory = split_trajectory(messages)
        options = self.context.options
        trigger = float(options.get(CLEARING_TRIGGER.key, CLEARING_TRIGGER.default))
        target = min(trigger, float(options.get(CLEARING_TARGET.key, CLEARING_TARGET.default)))
        units = self._units(trajectory)
        if self._count(trajectory, units) > trigger * budget:
            keep = int(options.get(CLEARING_KEEP.key, CLEARING_KEEP.default))
            self._clear(trajectory, units, target * budget, keep)
            units = self._units(trajectory)
        self.context.info[self.name] = {"clearings": self.clearings,
                                        "cleared": len(self.cleared)}
        return fit_agent(self.context.tokens, trajectory, units, budget)

    def _units(self, trajectory: Trajectory) -> list[Unit]:
        """The units with the results cleared so far masked."""
        names = trajectory.tool_names()
        return [
            [mask_result(m, names) if start + i in self.cleared else m
             for i, m in enumerate(unit)]
            for start, unit in zip(trajectory.starts, trajectory.units, strict=True)
        ]

    def _count(self, trajectory: Trajectory, units: Sequence[Unit]) -> int:
        return self.context.tokens.count_messages(
            [*trajectory.front, *(m for unit in units for m in unit)])

    def _clear(self, trajectory: Trajectory, units: list[Unit], goal: float,
               keep: int) -> None:
        """Clear the oldest results (not the protected steps') until the prompt, as
        counted, is at most ``goal``; planned on cached per-message counts, checked
        exactly whenever the plan says the goal is met."""
        tokens = self.context.tokens
        names = trajectory.tool_names()
        protected = protected_steps(trajectory.units, keep)
        counted = self._count(trajectory, units)
        estimate = counted
        cleared_any = False
        for u, (start, unit) in enumerate(zip(trajectory.starts, trajectory.units,
                                              strict=True)):
            if u in protected:
                continue
            for i, message in enumerate(unit):
                masked = mask_result(message, names)
                if message.get("role") != "tool" or start + i in self.cleared or masked == message:
                    continue
                self.cleared.add(start + i)
                cleared_any = True
                estimate -= tokens.count_message(message) - tokens.count_message(masked)
                if estimate <= goal:
                    estimate = self._count(trajectory, self._units(trajectory))
                    if estimate <= goal:
                        self.clearings += 1
                        return
        self.clearings += int(cleared_any)
