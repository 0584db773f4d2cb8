"""``condenser``: the oldest steps of an episode summarised by the auxiliary model, once,
and the summary reused and extended at later calls.

As OpenHands' ``LLMSummarizingCondenser``: the system messages and the first user turn
(the task) are always sent, then the summary, then the newest steps verbatim. While the
prompt fits the budget nothing is condensed. When a call's prompt would pass it, the
oldest units after the task (whole units, ``messages.exchanges``: a call with its results)
are *forgotten* until the newest ones take at most ``condenser_keep`` (0.5) of the room the
budget leaves beside the task and the last unit, so the episode can grow for a while
before the next condensation. The auxiliary model (``context.aux``, purpose
``"condenser"``) folds the forgotten steps into the summary it wrote before: one call
reads the summary so far and as many forgotten steps as fit the budget, and writes the new
summary (at most ``condenser_summary_tokens``, 512, and a quarter of the room); more
steps than one call can read take more calls, each within the budget. A step too long for
one call is cut to its beginning.

The summary is a user message right after the task, as OpenHands sends its condensation:
``[Summary of 14 earlier messages of this episode]`` and the text. State is per episode
(:meth:`reset`) and is kept while each trajectory extends the last one. An empty reply
keeps the previous summary and is counted in ``context.aux_failures``; a reply longer than
asked is cut. The prompt fits whenever the head and the last unit do: the summary, then
the task, give way first. ``context.info["condenser"]`` counts condensations, condensed
messages and the summary's tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_budgetbench.messages import Message, text_of, tool_calls_of
from pytest_budgetbench.options import Option, positive_int, rate
from pytest_budgetbench.strategies._agent import (
    EpisodeState,
    Trajectory,
    Unit,
    fit_agent,
    split_trajectory,
    unit_cost,
)
from pytest_budgetbench.strategies._chunking import fit_prefix
from pytest_budgetbench.strategies.base import AuxiliaryModel, Regime, Strategy, StrategyContext

CONDENSER_KEEP = Option(
    "condenser_keep",
    "share of the room the condenser's newest verbatim steps may take after a condensation",
    rate, 0.5)
CONDENSER_SUMMARY_TOKENS = Option(
    "condenser_summary_tokens", "most tokens of the condenser's summary", positive_int, 512)

MIN_SUMMARY_TOKENS = 16  # below this a summary cannot say anything useful: skip the call
SUMMARY_SHARE = 4  # the summary takes at most a quarter of the room
INSTRUCTION = (
    "You keep the memory of an agent that works on a task with tools. Rewrite the summary "
    "so far to include the new events: the task's goal and requirements, what the agent "
    "did (tool calls with their arguments) and what it learnt (key results: names, ids, "
    "numbers, states), and what remains to do. Be brief. No preamble."
)


def event_text(message: Message, names: dict[str, str]) -> str:
    """One message of the trajectory as a line of the events the summariser reads."""
    text = text_of(message).strip()
    role = message.get("role")
    if role == "tool":
        name = names.get(str(message.get("tool_call_id")), "a tool")
        return f"result of {name}: {text}"
    calls = [f"called {call.get('function', {}).get('name')}"
             f"({call.get('function', {}).get('arguments', '')})"
             for call in tool_calls_of(message)]
    return f"{role}: " + "; ".join([text, *calls] if text else calls)


def summary_message(summary: str, messages: int) -> Message:
    if not summary:
        return {"role": "user", "content": f"[{messages} earlier messages of this episode "
                                           "were left out to fit the context budget]"}
    return {"role": "user",
            "content": f"[Summary of {messages} earlier messages of this episode]\n{summary}"}


class Condenser(Strategy):
    """An incremental, auxiliary-model summary of the oldest steps, then the newest."""

    name = "condenser"
    regimes = frozenset({Regime.AUXILIARY_MODEL, Regime.RESET_PER_ITEM})
    handles_tools = True
    declared_options = (CONDENSER_KEEP, CONDENSER_SUMMARY_TOKENS)

    def reset(self, context: StrategyContext) -> None:
        super().reset(context)
        self.episode = EpisodeState()
        self._forget()
        self.condensations = 0

    def _forget(self) -> None:
        self.summary = ""
        self.condensed = 0  # units after the task folded into the summary (or left out)
        self.condensed_messages = 0

    def apply(self, messages: Sequence[Message], budget: int) -> list[Message]:
        if not self.episode.extends(messages):
            self._forget()
        trajectory = split_trajectory(messages)
        if (self.condensed < len(trajectory.units) - 1
                and self._count(trajectory) > budget):
            self._condense(trajectory, budget)
        self.context.info[self.name] = {
            "condensations": self.condensations,
            "condensed_messages": self.condensed_messages,
            "summary_tokens": self.context.tokens.count_text(self.summary),
        }
        return fit_agent(self.context.tokens, trajectory, trajectory.units[self.condensed:],
                         budget, self._summary())

    def _summary(self) -> list[Message]:
        return [summary_message(self.summary, self.condensed_messages)] if self.condensed else []

    def _count(self, trajectory: Trajectory) -> int:
        kept = [m for unit in trajectory.units[self.condensed:] for m in unit]
        return self.context.tokens.count_messages([*trajectory.front, *self._summary(), *kept])

    # -- condensing ----------------------------------------------------------------------
    def _condense(self, trajectory: Trajectory, budget: int) -> None:
        """Forget the oldest units until the newest take ``condenser_keep`` of the room,
        and fold them into the summary."""
        tokens = self.context.tokens
        units = trajectory.units
        room = budget - tokens.count_messages([*trajectory.front, *units[-1]])
        options = self.context.options
        target = min(int(options.get(CONDENSER_SUMMARY_TOKENS.key,
                                     CONDENSER_SUMMARY_TOKENS.default)),
                     max(0, room) // SUMMARY_SHARE)
        keep = float(options.get(CONDENSER_KEEP.key, CONDENSER_KEEP.default))
        available = int(keep * room) - target - tokens.count_message(summary_message("", 0))
        start = len(units) - 1
        while start > self.condensed:
            cost = unit_cost(tokens, units[start - 1])
            if cost > available:
                break
            available -= cost
            start -= 1
        forgotten = units[self.condensed:start]
        if not forgotten:
            return
        if target >= MIN_SUMMARY_TOKENS:
            self.summary = self._fold(self.summary, forgotten, trajectory.tool_names(),
                                      target, budget)
        self.condensed = start
        self.condensed_messages += sum(len(unit) for unit in forgotten)
        self.condensations += 1

    def _fold(self, summary: str, forgotten: Sequence[Unit], names: dict[str, str],
              target: int, budget: int) -> str:
        """``summary`` extended with the forgotten steps, a call per what fits one."""
        events = [event_text(m, names) for unit in forgotten for m in unit]
        while events:
            limit = budget - self.context.tokens.count_messages(self._prompt(summary, ""))
            if limit < MIN_SUMMARY_TOKENS:
                break  # the budget cannot hold a call worth making
            batch, events = self._batch(events, limit)
            reply = self._call(summary, batch, target, budget)
            if reply is None:
                break
            if reply:
                summary = reply
            else:  # an empty reply: keep what the summary said
                self.context.aux_failures += 1
        return self._clip(summary, target)

    def _batch(self, events: list[str], limit: int) -> tuple[str, list[str]]:
        """The oldest events that fit ``limit`` tokens (the first one cut to fit when it
        alone does not), and the rest."""
        tokens = self.context.tokens
        taken: list[str] = []
        used = 0
        for event in events:
            cost = tokens.count_text(event) + 1
            if used + cost > limit:
                break
            taken.append(event)
            used += cost
        if not taken:
            return self._clip(events[0], limit) + " […]", events[1:]
        return "\n".join(taken), events[len(taken):]

    def _prompt(self, summary: str, events: str) -> list[Message]:
        return [{"role": "system", "content": INSTRUCTION},
                {"role": "user", "content": f"Summary so far:\n{summary or '(none yet)'}\n\n"
                                            f"New events:\n{events}"}]

    def _call(self, summary: str, events: str, target: int, budget: int) -> str | None:
        """One fold's new summary; the events are cut further if the exact count is over
        budget, and None (no call) when nothing of them fits."""
        tokens = self.context.tokens
        prompt = self._prompt(summary, events)
        counted = tokens.count_messages(prompt)
        while counted > budget and events:
            limit = tokens.count_text(events) - (counted - budget)
            events = events[:fit_prefix(tokens, events, 0, len(events), limit)]
            prompt = self._prompt(summary, events)
            counted = tokens.count_messages(prompt)
        if not events.strip():
            return None
        reply = self._aux().complete(prompt, max_tokens=target, purpose="condenser")
        return self._clip(reply.strip(), target)

    def _clip(self, text: str, limit: int) -> str:
        """``text`` cut after a word to ``limit`` tokens."""
        return text[:fit_prefix(self.context.tokens, text, 0, len(text), limit)].strip()

    def _aux(self) -> AuxiliaryModel:
        if self.context.aux is None:
            raise RuntimeError("condenser needs the runner's auxiliary model (context.aux)")
        return self.context.aux
