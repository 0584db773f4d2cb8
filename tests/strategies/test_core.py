"""truncation and full_context: conformance, newest-first truncation, the registry."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_budgetbench.errors import ConfigError
from pytest_budgetbench.messages import Message, check_tool_pairs
from pytest_budgetbench.strategies import REGISTRY, Regime, Strategy, load_strategy
from pytest_budgetbench.strategies.full_context import FullContext
from pytest_budgetbench.strategies.truncation import Truncation
from pytest_budgetbench.testing import check_strategy, floor_tokens, histories
from pytest_budgetbench.tokens.approximate import ApproxCounter
from pytest_budgetbench.tokens.base import TokenCounter
from pytest_budgetbench.tokens.gguf import GGUFCounter
from tests.strategy_helpers import run_strategy


@pytest.fixture(params=["approx", "gguf"])
def counter(request: pytest.FixtureRequest) -> TokenCounter:
    if request.param == "approx":
        return ApproxCounter()
    return request.getfixturevalue("gguf")


def _conversation(turns: int) -> list[Message]:
    messages: list[Message] = [{"role": "system", "content": "You are a helpful assistant."}]
    for index in range(turns):
        messages.append({"role": "user", "content": f"Question number {index}: what now?"})
        messages.append({"role": "assistant", "content": f"Answer number {index}: wait."})
    messages.append({"role": "user", "content": "What did I ask first?"})
    return messages


# -- conformance -------------------------------------------------------------------------
@pytest.mark.parametrize("factory", [Truncation, FullContext])
def test_conforms_with_the_default_counter(factory: type[Strategy]) -> None:
    check_strategy(factory)


@pytest.mark.parametrize("factory", [Truncation, FullContext])
def test_conforms_with_the_exact_counter(factory: type[Strategy], gguf: GGUFCounter) -> None:
    check_strategy(factory, tokens=gguf, max_examples=12)


# -- truncation ----------------------------------------------------------------------------
@pytest.mark.parametrize("keep", [1, 2, 4])
def test_truncation_keeps_the_newest_history(counter: TokenCounter, keep: int) -> None:
    messages = _conversation(turns=5)
    head, history, query = messages[:1], messages[1:-1], messages[-1:]
    expected = head + history[-keep:] + query
    budget = counter.count_messages(expected)  # fits exactly these, not one more
    assert counter.count_messages(head + history[-keep - 1:] + query) > budget
    output = run_strategy(Truncation(), messages, budget, counter)
    assert output == expected
    assert counter.count_messages(output) <= budget


def test_truncation_keeps_everything_when_it_fits(counter: TokenCounter) -> None:
    messages = _conversation(turns=3)
    budget = counter.count_messages(messages)
    assert run_strategy(Truncation(), messages, budget, counter) == messages
    assert run_strategy(Truncation(), messages, budget - 1, counter) == messages[:1] + messages[2:]


def test_truncation_at_the_floor_keeps_only_system_and_query(counter: TokenCounter) -> None:
    messages = _conversation(turns=3)
    budget = floor_tokens(counter, messages)
    assert run_strategy(Truncation(), messages, budget, counter) == [messages[0], messages[-1]]


def test_truncation_under_the_floor_still_keeps_system_and_query() -> None:
    messages = _conversation(turns=2)
    output = run_strategy(Truncation(), messages, 1, ApproxCounter())
    assert output == [messages[0], messages[-1]]


def test_truncation_returns_copies_and_does_not_mutate() -> None:
    messages = _conversation(turns=2)
    pristine = copy.deepcopy(messages)
    output = run_strategy(Truncation(), messages, 10_000, ApproxCounter())
    output[0]["content"] = "changed"
    assert messages == pristine


@settings(max_examples=80, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(messages=histories(), slack=st.integers(0, 2000))
def test_truncation_never_exceeds_a_feasible_budget(messages: list[Message], slack: int) -> None:
    tokens = ApproxCounter()
    budget = floor_tokens(tokens, messages) + slack
    output = run_strategy(Truncation(), messages, budget, tokens)
    assert tokens.count_messages(output) <= budget
    assert output[0] == messages[0] and output[-1] == messages[-1]
    # What it keeps of the history is a suffix: the newest messages.
    kept = output[1:-1]
    history = messages[1:-1]
    assert kept == (history[len(history) - len(kept):] if kept else [])
    # And it is the longest suffix that fits.
    if len(kept) < len(history):
        longer = [messages[0], *history[len(history) - len(kept) - 1:], messages[-1]]
        assert tokens.count_messages(longer) > budget


def test_truncation_drops_a_tool_call_with_its_results() -> None:
    tokens = ApproxCounter()
    calls = [{"id": f"c{k}", "type": "function",
              "function": {"name": "lookup", "arguments": "{}"}} for k in range(3)]
    step = [{"role": "assistant", "content": None, "tool_calls": calls},
            *({"role": "tool", "tool_call_id": f"c{k}", "content": f"result {k} " * 20}
              for k in range(3))]
    messages = _conversation(turns=1)[:-1] + step + _conversation(turns=1)[1:]
    head, query = messages[:1], messages[-1:]
    # Room for the last two results but not the call: the call goes, and its results too.
    budget = tokens.count_messages(head + step[-2:] + messages[-3:])
    output = run_strategy(Truncation(), messages, budget, tokens)
    assert output == head + messages[-3:-1] + query
    check_tool_pairs(output, "truncation")
    assert Truncation.handles_tools and FullContext.handles_tools


def test_truncation_declarations() -> None:
    assert Truncation.name == "truncation"
    assert Truncation.reference is False
    assert Truncation.regimes == {Regime.LOCAL_ONLY, Regime.RESET_PER_ITEM}


# -- full_context --------------------------------------------------------------------------
@pytest.mark.parametrize("budget", [1, 100, 1_000_000])
def test_full_context_returns_its_input_unchanged(budget: int) -> None:
    messages = _conversation(turns=4)
    pristine = copy.deepcopy(messages)
    output = run_strategy(FullContext(), messages, budget, ApproxCounter())
    assert output == pristine
    assert messages == pristine
    assert output is not messages
    assert all(o is not m for o, m in zip(output, messages, strict=True))


def test_full_context_is_the_reference() -> None:
    assert FullContext.reference is True
    assert FullContext.name == "full_context"
    assert load_strategy("full_context").reference is True


# -- registry ------------------------------------------------------------------------------
def test_registry_resolves_builtins() -> None:
    assert REGISTRY.resolve("truncation") is Truncation
    assert REGISTRY.resolve("full_context") is FullContext
    assert isinstance(load_strategy("truncation"), Truncation)
    assert REGISTRY.resolve("pytest_budgetbench.strategies.truncation:Truncation") is Truncation


def test_registry_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as info:
        REGISTRY.resolve("no_such_strategy")
    message = str(info.value)
    assert "no_such_strategy" in message
    assert "--budgetbench-strategies" in message
    for name in ("full_context", "truncation", "rag"):
        assert name in message


@pytest.mark.parametrize(
    "spec", ["collections:OrderedDict", "pytest_budgetbench.strategies.base:Regime",
             "pytest_budgetbench.strategies:load_strategy"],
)
def test_registry_rejects_what_is_not_a_strategy(spec: str) -> None:
    with pytest.raises(ConfigError, match="must be a Strategy subclass"):
        REGISTRY.resolve(spec)


@pytest.mark.parametrize(
    "spec", ["no_such_module_xyz:Thing", "pytest_budgetbench.strategies.truncation:Nope"],
)
def test_registry_unimportable_targets_raise_config_error(spec: str) -> None:
    with pytest.raises(ConfigError, match="cannot import"):
        REGISTRY.resolve(spec)


class _Nameless(Strategy):
    def apply(self, messages: list[Message], budget: int) -> list[Message]:  # type: ignore[override]
        return list(messages)


def test_a_strategy_without_a_name_is_refused() -> None:
    with pytest.raises(ConfigError, match="no name"):
        load_strategy(f"{__name__}:_Nameless")
