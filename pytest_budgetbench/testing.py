"""The strategy conformance kit: hypothesis checks for strategy authors.

Call :func:`check_strategy` from your own test suite::

    from pytest_budgetbench.testing import check_strategy

    def test_my_strategy_conforms():
        check_strategy(MyStrategy)

A plain strategy (a function ``(messages, budget) -> messages``, an object with
``__call__``, or such a class) is checked as the runner wraps it: ``check_strategy(keep_last)``.
A factory that takes no argument, e.g. ``lambda: MyStrategy(top_k=3)``, works too.

A strategy conforms when, for generated histories and budgets, it

1. fits the budget whenever system plus query fit (reference strategies, and those that
   trim by a counter of their own, ``fits_budget = False``, are exempt);
2. keeps the system message and the last user message;
3. keeps the relative order of the messages it keeps;
4. never mutates its input;
5. gives the same output for the same input after reset.

A strategy that declares ``handles_tools`` is also run through generated agent episodes
(:func:`agent_trajectories`: parallel tool calls, content-less calls, giant results, later
user turns), called at every point where the model is called, as the runner does, with one
reset per episode. At every call it must

6. break no tool-call pair (``messages.check_tool_pairs``) and return valid messages;
7. fit the budget whenever the system messages and the last unit (what the model answers
   now: the last user turn, or the last call with its results) fit, keep the system
   messages first and end with the last unit unchanged (reference strategies are exempt
   from fitting);
8. keep the order of what it keeps, never mutate its input, and give the same outputs
   for the same episode after reset.

Agent episodes are counted by ``agent_tokens``, by default :func:`tool_counter` bound to
the episode's tools (:data:`TOOLS`), as the runner's counter for an episode is: tool calls
and tool schemas cost tokens. (``tokens`` counts the chat histories.)

Examples include empty histories, one giant message, non-ASCII text and budgets barely
above system plus query. The defaults need no model: a deterministic auxiliary model and
a hashing embedder stand in, both held to the same budget rules as the runner's.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_budgetbench.engine.calls import CallSite, budgeted_call
from pytest_budgetbench.errors import BudgetExceeded
from pytest_budgetbench.messages import (
    Message,
    Tool,
    check_messages,
    check_tool_pairs,
    exchanges,
    split_ends,
    text_of,
)
from pytest_budgetbench.model.chat import Completion
from pytest_budgetbench.model.structured import Schema
from pytest_budgetbench.strategies.base import Strategy, StrategyContext
from pytest_budgetbench.strategies.plain import plain_strategy_class, wrap_instance
from pytest_budgetbench.tokens.approximate import ApproxCounter
from pytest_budgetbench.tokens.base import TokenCounter


class EchoAuxModel:
    """A deterministic stand-in for the auxiliary model: replies with the first words of
    the prompt's last message. Its prompts are held to the budget by the runner's own
    budgeted call; ``strategy`` is what a violation calls the strategy."""

    def __init__(self, tokens: TokenCounter, budget: int, strategy: str = "under test") -> None:
        self.tokens = tokens
        self.budget = budget
        self.strategy = strategy
        self.calls = 0

    def complete(self, messages: Sequence[Message], *, max_tokens: int, purpose: str,
                 schema: Schema | None = None) -> str:
        """``schema`` is taken and ignored, as by an endpoint that takes none."""
        site = CallSite("conformance", self.strategy, purpose=purpose)
        outcome = budgeted_call(site, messages, budget=self.budget, tokens=self.tokens,
                                send=lambda: self._echo(messages, max_tokens))
        if outcome.completion is None:
            raise BudgetExceeded(outcome.violation)
        self.calls += 1
        return outcome.completion.text

    def _echo(self, messages: Sequence[Message], max_tokens: int) -> Completion:
        words = text_of(messages[-1]).split() if messages else []
        reply: list[str] = []
        for word in words:
            if self.tokens.count_text(" ".join([*reply, word])) > max_tokens:
                break
            reply.append(word)
        return Completion(" ".join(reply), prompt_tokens=None, completion_tokens=None,
                          latency_s=0.0)


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


def tool_counter(tools: Sequence[Tool] = ()) -> TokenCounter:
    """The approximate counter bound to ``tools`` (their schemas in every whole prompt, a
    call's name and arguments in its message): the kind of counter an episode's strategy
    gets as ``context.tokens``, without a tokenizer."""
    return ApproxCounter().with_tools(tools)


TOOL_NAMES = ("get_weather", "search_files", "book_flight")
TOOLS: list[Tool] = [
    {"type": "function", "function": {
        "name": name, "description": f"The {name} tool.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}}
    for name in TOOL_NAMES
]
"""The tools of the generated agent episodes."""


@st.composite
def _tool_step(draw: st.DrawFn, first_id: int) -> list[Message]:
    """An assistant message with 1-3 (parallel) calls, content None or text, and a result
    per call, sometimes a giant one."""
    calls = [
        {"id": f"call_{first_id + k}", "type": "function",
         "function": {"name": draw(st.sampled_from(TOOL_NAMES)),
                      "arguments": json.dumps({"query": draw(_content(max_words=6))})}}
        for k in range(draw(st.integers(1, 3)))
    ]
    step: list[Message] = [{"role": "assistant", "tool_calls": calls,
                            "content": draw(st.one_of(st.none(), _content(max_words=10)))}]
    for call in calls:
        if draw(st.integers(0, 5)) == 0:
            result = " ".join(draw(st.lists(WORDS, min_size=300, max_size=600)))
        else:
            result = draw(_content())
        step.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    return step


@st.composite
def agent_trajectories(draw: st.DrawFn) -> list[Message]:
    """An agent episode in the OpenAI format: a system message (usually), the first user
    turn, then 0-10 steps, each tool calls with their results or a reply and the next user
    turn."""
    messages: list[Message] = []
    if draw(st.integers(0, 3)):
        messages.append({"role": "system", "content": draw(_content(max_words=15))})
    messages.append({"role": "user", "content": draw(_content(max_words=30))})
    calls = 0
    for _ in range(draw(st.integers(0, 10))):
        if draw(st.integers(0, 3)):
            step = draw(_tool_step(calls))
            calls += len(step) - 1
            messages += step
        else:
            messages += [{"role": "assistant", "content": draw(_content(max_words=20))},
                         {"role": "user", "content": draw(_content(max_words=20)) + "?"}]
    return messages


def call_points(messages: Sequence[Message]) -> list[int]:
    """The lengths of the trajectory at which the runner calls the model: after a user turn
    or a step's last tool result (where an assistant message follows, or at the end)."""
    return [
        end for end in range(1, len(messages) + 1)
        if messages[end - 1].get("role") in ("user", "tool")
        and (end == len(messages) or messages[end].get("role") == "assistant")
    ]


def last_unit(messages: Sequence[Message]) -> list[Message]:
    """What the model answers now: the last user turn, or the last call with its results."""
    head, _history, _query = split_ends(messages)
    units = exchanges(messages[len(head):])
    return units[-1] if units else []


def agent_floor(tokens: TokenCounter, messages: Sequence[Message]) -> int:
    """Tokens of the system messages and the last unit alone: below this no strategy can
    fit a call of the episode."""
    head, _history, _query = split_ends(messages)
    return tokens.count_messages([*head, *last_unit(messages)])


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
    if _held_to_budget(strategy) and floor_tokens(tokens, messages) <= budget:
        counted = tokens.count_messages(output)
        assert counted <= budget, f"'{name}' sent {counted} tokens over budget {budget}"
    for kept in head + query:
        assert kept in output, f"'{name}' dropped the {kept['role']} message {kept!r:.60}"
    _check_order(name, messages, output)


def _held_to_budget(strategy: Strategy) -> bool:
    """Whether properties 1 and 7 hold it to fitting: not a reference, nor a policy that
    trims by a counter of its own (``Strategy.fits_budget``)."""
    return not strategy.reference and getattr(strategy, "fits_budget", True)


def _check_order(name: str, messages: list[Message], output: list[Message]) -> None:
    cursor = 0  # kept messages must form a subsequence of the input (duplicates allowed)
    for message in output:
        if message not in messages:
            continue  # rewritten content (e.g. compression) has no input position
        assert message in messages[cursor:], f"'{name}' reordered the messages it kept"
        cursor = messages.index(message, cursor) + 1


def check_agent_output(
    strategy: Strategy, messages: list[Message], budget: int, output: list[Message],
    tokens: TokenCounter,
) -> None:
    """Assert properties 6-7 and the order of property 8 on one call's output."""
    name = strategy.name
    check_messages(output, f"'{name}'")
    check_tool_pairs(output, f"'{name}'")
    head, _history, _query = split_ends(messages)
    last = last_unit(messages)
    if agent_floor(tokens, messages) <= budget:
        if _held_to_budget(strategy):
            counted = tokens.count_messages(output)
            assert counted <= budget, f"'{name}' sent {counted} tokens over budget {budget}"
        assert output[:len(head)] == head, f"'{name}' did not open with the system messages"
        assert output[len(output) - len(last):] == last, (
            f"'{name}' did not end with the last unit {last!r:.80}")
    _check_order(name, messages, output)


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
    agent_tokens: TokenCounter | None = None,
) -> None:
    """Run the conformance properties with generated inputs on the strategy ``factory``
    names: a Strategy class, a plain callable strategy, or a factory of either; agent
    episodes too when it declares ``handles_tools``."""
    counter = tokens or ApproxCounter()
    make = strategy_factory(factory)

    @settings(max_examples=max_examples, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(messages=histories(), slack=st.one_of(st.integers(0, 8), st.integers(0, 3000)))
    def run(messages: list[Message], slack: int) -> None:
        budget = floor_tokens(counter, messages) + slack
        _check_calls(make, messages, budget, counter, context_factory)

    run()
    if make().handles_tools:
        check_agent_episodes(make, tokens=agent_tokens, context_factory=context_factory,
                             max_examples=max_examples)


def check_agent_episodes(
    factory: Callable[..., Any],
    *,
    tokens: TokenCounter | None = None,
    context_factory: Callable[[TokenCounter, int], StrategyContext] = default_context,
    max_examples: int = 60,
) -> None:
    """Properties 6-8 on generated agent episodes (whatever ``handles_tools`` says)."""
    counter = tokens or tool_counter(TOOLS)
    make = strategy_factory(factory)

    @settings(max_examples=max_examples, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(messages=agent_trajectories(),
           slack=st.one_of(st.integers(0, 8), st.integers(0, 400), st.integers(0, 3000)))
    def run(messages: list[Message], slack: int) -> None:
        budget = agent_floor(counter, messages) + slack
        _check_calls(make, messages, budget, counter, context_factory, episode=True)

    run()


def _check_calls(
    factory: Callable[[], Strategy],
    messages: list[Message],
    budget: int,
    counter: TokenCounter,
    context_factory: Callable[[TokenCounter, int], StrategyContext],
    *,
    episode: bool = False,
) -> None:
    """The strategy applied to ``messages`` (an ``episode``: at every call point, to the
    trajectory so far), each output checked, then again after a reset: it mutates no input
    and gives the same outputs."""
    strategy = factory()
    pristine = copy.deepcopy(messages)
    prompts = [messages[:end] for end in call_points(messages)] if episode else [messages]
    check = check_agent_output if episode else check_output
    strategy.reset(context_factory(counter, budget))
    outputs = []
    for prompt in prompts:
        output = strategy.apply(prompt, budget)
        assert messages == pristine, f"'{strategy.name}' mutated its input"
        check(strategy, prompt, budget, output, counter)
        outputs.append(output)
    strategy.reset(context_factory(counter, budget))
    again = [strategy.apply(copy.deepcopy(prompt), budget) for prompt in prompts]
    assert again == outputs, f"'{strategy.name}' gave a different output after reset"


__all__: list[Any] = [
    "TOOLS",
    "EchoAuxModel",
    "HashingEmbedder",
    "agent_floor",
    "agent_trajectories",
    "call_points",
    "check_agent_episodes",
    "check_agent_output",
    "check_output",
    "check_strategy",
    "default_context",
    "floor_tokens",
    "histories",
    "last_unit",
    "strategy_factory",
    "tool_counter",
]
