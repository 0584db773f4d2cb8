"""The machinery the memory systems share: the aux call cut to its limit and its cost,
JSON found in small models' replies, and built memories reused by content."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pytest_budgetbench.messages import Message
from pytest_budgetbench.model.structured import Schema
from pytest_budgetbench.strategies._memory_system import (
    BuiltMemories,
    Cost,
    ask,
    json_values,
)
from pytest_budgetbench.strategies.base import StrategyContext
from pytest_budgetbench.tokens.approximate import ApproxCounter


@dataclass
class Recorded:
    latency_s: float
    counted: int


class RecordingAux:
    """Records calls as the runner's recorder does (``calls``, each with ``latency_s``): a
    cached reply keeps the latency it was first answered in, here 7.5 s whatever the wall
    time."""

    def __init__(self) -> None:
        self.tokens = ApproxCounter()
        self.calls: list[Recorded] = []

    def complete(self, messages: Sequence[Message], *, max_tokens: int, purpose: str,
                 schema: Schema | None = None) -> str:
        self.calls.append(Recorded(7.5, self.tokens.count_messages(messages)))
        return "a reply"


def test_ask_cuts_the_material_to_the_limit_and_adds_the_recorded_cost() -> None:
    aux = RecordingAux()
    context = StrategyContext(tokens=aux.tokens, aux=aux)
    cost = Cost()
    material = " ".join(f"word{i}" for i in range(2000))
    reply = ask(context, "test", "Summarise.", material, "Now.", limit=120, max_tokens=16,
                purpose="test/summarise", cost=cost)
    assert reply == "a reply" and cost.aux_calls == 1
    assert 100 < aux.calls[0].counted <= 120 and cost.input_tokens == aux.calls[0].counted
    assert cost.model_s == 7.5  # the recorded latency, not the wall time
    assert ask(context, "test", "Summarise.", material, "", limit=8, max_tokens=16,
               purpose="test/summarise", cost=cost) is None  # nothing fits: no call
    assert cost.aux_calls == 1 and len(aux.calls) == 1


def test_json_values_finds_fenced_and_inline_json_and_lenient_repairs() -> None:
    reply = 'Sure!\n```json\n{"a": 1}\n```\nand also [2, 3] and {"b": True,}'
    assert list(json_values(reply))[:2] == [{"a": 1}, {"a": 1}]
    assert [2, 3] in list(json_values(reply))
    assert {"b": True} not in list(json_values(reply))
    assert {"b": True} in list(json_values(reply, lenient=True))


def test_built_memories_are_reused_by_content_and_window_never_by_position() -> None:
    memories: BuiltMemories[list[str]] = BuiltMemories(capacity=2)
    history: list[Message] = [{"role": "user", "content": "my parrot is Rufus"}]
    key = memories.key([], history, 1024)
    built, reused = memories.get_or_build(key, lambda: ["Rufus"])
    again, reused_again = memories.get_or_build(key, lambda: ["rebuilt"])
    assert (built, reused, again, reused_again) == (["Rufus"], False, ["Rufus"], True)
    other = [{"role": "user", "content": "my parrot is Polly"}]
    assert memories.key([], other, 1024) != key != memories.key([], history, 2048)
    for window in (2048, 4096):  # capacity 2: the least recently used goes first
        memories.get_or_build(memories.key([], history, window), lambda: [])
    assert memories.get(key) is None
