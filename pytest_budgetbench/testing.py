"""The strategy conformance kit: hypothesis checks for strategy authors.

Call :func:`check_strategy` from your own test suite::

    from pytest_budgetbench.testing import check_strategy

    def test_my_strategy_conforms():
        check_strategy(MyStrategy)

A plain strategy (a function ``(messages, budget) -> messages``, an object with
``__call__``, or such a class) is checked as the runner wraps it: ``check_strategy(keep_last)``.
A factory that takes no argument, e.g. ``lambda: MyStrategy(top_k=3)``, works too.

A strategy conforms when, for generated histories and budgets, it

1. fits the budget whenever system plus query fit (reference strategies are exempt);
2. keeps the system message and the last user message;
3. keeps the relative order of the messages it keeps;
4. never mutates its input;
5. gives the same output for the same input after reset.

Examples include empty histories, one giant message, non-ASCII text and budgets barely
above system plus query. The defaults need no model: a deterministic auxiliary model and
a hashing embedder stand in, both held to the same budget rules as the runner's.
"""

from __future__ import annotations

import copy
import hashlib
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_budgetbench.budget import ApproxCounter, BudgetCheck, TokenCounter, enforce
from pytest_budgetbench.messages import Message, split_ends, text_of
from pytest_budgetbench.strategies.base import Strategy, StrategyContext
from pytest_budgetbench.strategies.plain import plain_strategy_class, wrap_instance


class EchoAuxModel:
    """A deterministic stand-in for the auxiliary model: replies with the first words of
    the prompt's last message. Its prompts are held to the budget like the runner's."""

    def __init__(self, tokens: TokenCounter, budget: int) -> None:
        self.tokens = tokens
        self.budget = budget
        self.calls = 0

    def complete(self, messages: Sequence[Message], *, max_tokens: int, purpose: str) -> str:
        check = BudgetCheck(self.tokens.count_messages(messages), self.budget)
        enforce(f"conformance (auxiliary call '{purpose}')", purpose, check, self.tokens)
        self.calls += 1
        words = text_of(messages[-1]).split() if messages else []
        reply: list[str] = []
        for word in words:
            if self.tokens.count_text(" ".join([*reply, word])) > max_tokens:
                break
            reply.append(word)
        return " ".join(reply)


class HashingEmbedder:
    """Bag-of-words vectors hashed into 64 dimensions: deterministic and dependency-free."""

    name = "hashing-64"
    dimensions = 64

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [self._one(text) for text in texts]

    def _one(self, text: str) -> list[float]:
        vector = [0.0] * self.dimensions
        for word in re.findall(r"\w+", text.lower()):
            digest = hashlib.blake2b(word.encode(), digest_size=2).digest()
            vector[int.from_bytes(digest, "big") % self.dimensions] += 1.0
        norm = math.sqrt(sum(v * v for v in vector)) or 1.0
        return [v / norm for v in vector]


WORDS = st.sampled_from(
    ["memory", "budget", "token", "Lisbon", "dog", "Biscuit", "tea", "piano", "date",
     "über", "naïve", "東京", "🙂", "Ωmega", "the", "and", "a", "moved", "prefer", "lesson"]
)


@st.composite
def _content(draw: st.DrawFn, max_words: int = 60) -> str:
    words = draw(st.lists(WORDS, min_size=1, max_size=max_words))
    return " ".join(words)


@st.composite
def histories(draw: st.DrawFn) -> list[Message]:
    """A system message, a history of 0-12 turns (sometimes one giant message), a query."""
    messages: list[Message] = [{"role": "system", "content": draw(_content(max_words=15))}]
    turns = draw(st.integers(min_value=0, max_value=12))
    for index in range(turns):
        role = "user" if index % 2 == 0 else "assistant"
        messages.append({"role": role, "content": draw(_content())})
    if draw(st.booleans()) and draw(st.integers(0, 3)) == 0:
        giant = " ".join(draw(st.lists(WORDS, min_size=400, max_size=800)))
        messages.insert(1, {"role": "user", "content": giant})
    messages.append({"role": "user", "content": draw(_content(max_words=12)) + "?"})
    return messages


def floor_tokens(tokens: TokenCounter, messages: Sequence[Message]) -> int:
    """Tokens of system plus query alone: below this no strategy can fit."""
    head, _history, query = split_ends(messages)
    return tokens.count_messages(head + query)


def default_context(tokens: TokenCounter, budget: int) -> StrategyContext:
    return StrategyContext(
        tokens=tokens,
        item_id="conformance",
        aux=EchoAuxModel(tokens, budget),
        embedder_factory=HashingEmbedder,
    )


def check_output(
    strategy: Strategy, messages: list[Message], budget: int, output: list[Message],
    tokens: TokenCounter,
) -> None:
    """Assert properties 1-3 on one output."""
    head, _history, query = split_ends(messages)
    name = strategy.name
    if not strategy.reference and floor_tokens(tokens, messages) <= budget:
        counted = tokens.count_messages(output)
        assert counted <= budget, f"'{name}' sent {counted} tokens over budget {budget}"
    for kept in head + query:
        assert kept in output, f"'{name}' dropped the {kept['role']} message {kept!r:.60}"
    cursor = 0  # kept messages must form a subsequence of the input (duplicates allowed)
    for message in output:
        if message not in messages:
            continue  # rewritten content (e.g. compression) has no input position
        assert message in messages[cursor:], f"'{name}' reordered the messages it kept"
        cursor = messages.index(message, cursor) + 1


def strategy_factory(target: Any) -> Callable[[], Strategy]:
    """What makes the strategy ``target`` names: a Strategy class, a plain strategy (wrapped
    as the runner wraps it), or a factory of either."""
    if isinstance(target, type) and issubclass(target, Strategy):
        return target
    name = str(getattr(target, "__name__", type(target).__name__))
    plain = plain_strategy_class(name, target)
    if plain is not None:
        return plain

    def make() -> Strategy:
        made = target()
        return made if isinstance(made, Strategy) else wrap_instance(made, name)

    return make


def check_strategy(
    factory: Callable[..., Any],
    *,
    tokens: TokenCounter | None = None,
    context_factory: Callable[[TokenCounter, int], StrategyContext] = default_context,
    max_examples: int = 60,
) -> None:
    """Run the conformance properties with generated inputs on the strategy ``factory``
    names: a Strategy class, a plain callable strategy, or a factory of either."""
    counter = tokens or ApproxCounter()
    make = strategy_factory(factory)

    @settings(max_examples=max_examples, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(messages=histories(), slack=st.one_of(st.integers(0, 8), st.integers(0, 3000)))
    def run(messages: list[Message], slack: int) -> None:
        budget = floor_tokens(counter, messages) + slack
        _check_one(make, messages, budget, counter, context_factory)

    run()


def _check_one(
    factory: Callable[[], Strategy],
    messages: list[Message],
    budget: int,
    counter: TokenCounter,
    context_factory: Callable[[TokenCounter, int], StrategyContext],
) -> None:
    strategy = factory()
    pristine = copy.deepcopy(messages)
    strategy.reset(context_factory(counter, budget))
    first = strategy.apply(messages, budget)
    assert messages == pristine, f"'{strategy.name}' mutated its input"
    check_output(strategy, messages, budget, first, counter)
    strategy.reset(context_factory(counter, budget))
    second = strategy.apply(copy.deepcopy(pristine), budget)
    assert first == second, f"'{strategy.name}' gave a different output after reset"


__all__: list[Any] = [
    "EchoAuxModel",
    "HashingEmbedder",
    "check_output",
    "check_strategy",
    "default_context",
    "floor_tokens",
    "histories",
    "strategy_factory",
]
