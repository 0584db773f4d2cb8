"""An agent's trajectory as the agent strategies see it, and what they share.

At every model call of an episode the runner hands the strategy the whole trajectory so
far: system messages (the *head*), the *first user turn* (the task), then assistant
messages with tool calls, their ``tool`` results and later user turns, ending with a user
turn or tool results. :func:`split_trajectory` cuts what follows the first user turn into
*units* (:func:`~pytest_budgetbench.messages.exchanges`: a call with its results, or one
message), so a strategy that keeps or drops whole units never breaks a pair. The last unit
is what the model answers now; every agent strategy sends it whole, at the end.

- :func:`fit_newest`: the fixed messages plus the newest units that fit, counted exactly;
- :func:`mask_result`: a tool result replaced by a placeholder that names what it omitted;
- :class:`EpisodeState`: per-episode state that is valid while the trajectory only grows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pytest_budgetbench.messages import Message, exchanges, split_ends, text_of, tool_calls_of
from pytest_budgetbench.tokens.base import TokenCounter

Unit = list[Message]


@dataclass(frozen=True)
class Trajectory:
    """``head + first + units`` is the trajectory; ``starts[u]`` is the index of unit
    ``u``'s first message in it (so state can name a message across calls)."""

    head: list[Message]
    first: list[Message]
    units: list[Unit]
    starts: list[int]

    @property
    def front(self) -> list[Message]:
        """What every prompt opens with: the system messages and the task."""
        return [*self.head, *self.first]

    @property
    def last(self) -> Unit:
        """What the model answers now ([] when the first user turn is all there is)."""
        return self.units[-1] if self.units else []

    def tool_names(self) -> dict[str, str]:
        """The function each call id calls, for placeholders."""
        return {
            str(call.get("id")): str(call.get("function", {}).get("name", "a tool"))
            for unit in self.units for call in tool_calls_of(unit[0])
        }


def split_trajectory(messages: Sequence[Message]) -> Trajectory:
    """The head, the first user turn (the message right after the head when it is a user's)
    and the rest in units."""
    head, _history, _query = split_ends(messages)
    rest = list(messages[len(head):])
    first = rest[:1] if rest and rest[0].get("role") == "user" else []
    units = exchanges(rest[len(first):])
    starts: list[int] = []
    position = len(head) + len(first)
    for unit in units:
        starts.append(position)
        position += len(unit)
    return Trajectory(head, first, units, starts)


def unit_cost(tokens: TokenCounter, unit: Unit) -> int:
    """What a unit adds to a prompt, from the cached per-message counts."""
    return sum(tokens.count_message(m) for m in unit)


def fit_newest(
    tokens: TokenCounter,
    front: Sequence[Message],
    units: Sequence[Unit],
    budget: int,
    *,
    back: Sequence[Message] = (),
    always: int = 1,
) -> list[Message]:
    """``front`` + the newest ``units`` that fit + ``back``: a suffix of whole units, the
    newest ``always`` of them kept whatever the budget. Planned on cached per-message
    counts over the exact count of the fixed part, then counted exactly and trimmed by one
    more unit at a time if a template made the plan an underestimate."""
    forced = max(0, len(units) - always)
    used = tokens.count_messages(_assemble(front, units[forced:], back))
    start = forced
    while start > 0:
        cost = unit_cost(tokens, units[start - 1])
        if used + cost > budget:
            break
        used += cost
        start -= 1
    prompt = _assemble(front, units[start:], back)
    while start < forced and tokens.count_messages(prompt) > budget:
        start += 1
        prompt = _assemble(front, units[start:], back)
    return prompt


def fit_agent(
    tokens: TokenCounter, trajectory: Trajectory, units: Sequence[Unit], budget: int,
    extra: Sequence[Message] = (),
) -> list[Message]:
    """The agent strategies' prompt: the head, the first user turn, ``extra`` (e.g. a
    summary) and the newest of ``units`` that fit, the last one always. What cannot fit
    with the last unit goes first: ``extra``, then the first user turn (a task statement
    too large for the budget), so the prompt fits whenever head + last unit do."""
    if not units:
        return [dict(m) for m in trajectory.front]  # the task is what the model answers
    last = list(units[-1])
    for front in ([*trajectory.front, *extra], trajectory.front, trajectory.head):
        if tokens.count_messages([*front, *last]) <= budget:
            return fit_newest(tokens, front, units, budget)
    return fit_newest(tokens, trajectory.head, units, budget)


def _assemble(front: Sequence[Message], units: Sequence[Unit],
              back: Sequence[Message]) -> list[Message]:
    return [dict(m) for m in [*front, *(m for unit in units for m in unit), *back]]


def placeholder_text(message: Message, names: dict[str, str]) -> str:
    """What stands in for an omitted tool result: its tool and its size."""
    name = names.get(str(message.get("tool_call_id")), "a tool")
    return f"[tool result omitted: {len(text_of(message)):,} characters from {name}]"


def mask_result(message: Message, names: dict[str, str]) -> Message:
    """``message`` (a tool result) with its content replaced by a placeholder; unchanged
    when the placeholder would not be shorter (masking must never grow a prompt)."""
    text = placeholder_text(message, names)
    if len(text) >= len(text_of(message)):
        return dict(message)
    return {**message, "content": text}


def tool_steps(units: Sequence[Unit]) -> list[int]:
    """Indices of the units that are tool calls with their results, oldest first."""
    return [u for u, unit in enumerate(units) if tool_calls_of(unit[0])]


def protected_steps(units: Sequence[Unit], keep: int) -> set[int]:
    """The units whose results stay verbatim: the newest ``keep`` tool steps and the last
    unit (the results the model asked for just now)."""
    steps = tool_steps(units)
    kept = set(steps[len(steps) - keep:]) if keep > 0 else set()
    return kept | ({len(units) - 1} if units else set())


class EpisodeState:
    """The trajectory an incremental strategy last saw: its state stays valid while each
    new trajectory extends that one (an episode grows), and is dropped when it does not
    (a new episode without a reset, or a caller that rewrote the past)."""

    def __init__(self) -> None:
        self.seen: list[Message] = []

    def extends(self, messages: Sequence[Message]) -> bool:
        """Whether ``messages`` begins with what was seen last time; remembers it."""
        grows = len(messages) >= len(self.seen) and list(messages[:len(self.seen)]) == self.seen
        self.seen = list(messages)
        return grows
