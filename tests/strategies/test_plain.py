"""A plain callable is a strategy: a function (messages, budget) -> messages, or an object
with __call__ and an optional reset(), wrapped with the declared defaults."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from pytest_budgetbench.errors import ConfigError
from pytest_budgetbench.messages import Message, split_ends
from pytest_budgetbench.strategies import REGISTRY, Regime, Strategy, load_strategy
from pytest_budgetbench.testing import check_strategy
from tests.fake_openai import FakeOpenAI
from tests.sweeps import rows_of, sweep_args

PLAIN = '''
from pytest_budgetbench.messages import split_ends


def keep_ends(messages, budget):
    """System and question only: always within any budget they fit."""
    head, _history, query = split_ends(messages)
    return head + query


def send_everything(messages, budget):
    return list(messages)


class Counting:
    """An object strategy whose reset() is called before every item."""

    def __init__(self):
        self.resets = 0

    def reset(self):
        self.resets += 1

    def __call__(self, messages, budget):
        return [*messages[:1], {"role": "user", "content": f"resets={self.resets}"}]


counting = Counting()
'''


def keep_ends(messages: Sequence[Message], budget: int) -> list[Message]:
    head, _history, query = split_ends(messages)
    return head + query


class LastTwo:
    regimes = ("local-only",)

    def __init__(self) -> None:
        self.calls = 0

    def reset(self) -> None:
        self.calls = 0

    def __call__(self, messages: Sequence[Message], budget: int) -> list[Message]:
        self.calls += 1
        head, history, query = split_ends(messages)
        return head + query if budget < 400 else head + history[-2:] + query


# -- resolution ---------------------------------------------------------------------------
def test_a_function_resolves_to_a_strategy_with_the_declared_defaults() -> None:
    cls = REGISTRY.resolve("tests.strategies.test_plain:keep_ends")
    assert issubclass(cls, Strategy)
    assert cls.name == "keep_ends"
    assert cls.regimes == frozenset({Regime.LOCAL_ONLY, Regime.RESET_PER_ITEM})
    assert cls.reference is False
    strategy = load_strategy("tests.strategies.test_plain:keep_ends")
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "old"},
                {"role": "user", "content": "q?"}]
    assert strategy.apply(messages, 10) == [messages[0], messages[2]]


def test_a_class_with_call_gets_one_instance_per_strategy_and_its_own_regimes() -> None:
    cls = REGISTRY.resolve("tests.strategies.test_plain:LastTwo")
    assert cls.name == "LastTwo" and cls.regimes == frozenset({Regime.LOCAL_ONLY})
    first, second = cls(), cls()
    messages = [{"role": "user", "content": "q?"}]
    first.apply(messages, 1000)
    assert first.call.calls == 1 and second.call.calls == 0  # type: ignore[attr-defined]


def test_what_is_neither_a_strategy_nor_a_plain_callable_is_still_rejected() -> None:
    with pytest.raises(ConfigError, match=r"must be a Strategy subclass or a callable "
                                          r"\(messages, budget\) -> messages"):
        REGISTRY.resolve("pytest_budgetbench.strategies:load_strategy")  # takes one argument


# -- the conformance kit ------------------------------------------------------------------
def test_conformance_kit_accepts_a_function_a_class_and_a_factory() -> None:
    check_strategy(keep_ends, max_examples=15)
    check_strategy(LastTwo, max_examples=15)
    check_strategy(lambda: LastTwo(), max_examples=15)


def test_conformance_kit_still_catches_a_plain_strategy_over_budget() -> None:
    def send_everything(messages: Sequence[Message], budget: int) -> list[Message]:
        return list(messages)

    with pytest.raises(AssertionError, match=r"'send_everything' sent .* tokens over budget"):
        check_strategy(send_everything, max_examples=30)


# -- in a sweep ---------------------------------------------------------------------------
def _plain_module(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(plain=PLAIN)
    pytester.syspathinsert()


def test_a_function_strategy_runs_in_a_sweep_with_its_name_and_regimes(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    _plain_module(pytester)
    result = pytester.runpytest(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=512", "--budgetbench-items=2",
        "--budgetbench-strategies=plain:keep_ends"))
    result.assert_outcomes(passed=2)
    rows = rows_of(tmp_path)
    assert [r["cell_id"] for r in rows] == ["memory-0000-keep_ends-512",
                                            "memory-0001-keep_ends-512"]
    assert {r["regime"] for r in rows} == {"local-only,reset-per-item"}
    assert all(len(request["messages"]) == 2 for request in fake_endpoint.requests)


def test_a_function_strategy_over_budget_is_never_sent_and_fails_its_cell(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    _plain_module(pytester)
    result = pytester.runpytest(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=256", "--budgetbench-items=1",
        "--budgetbench-strategies=plain:send_everything"))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*BudgetExceeded: cell memory-0000-send_everything-256 would "
                                 "send * prompt tokens (budget 256*"])
    assert fake_endpoint.requests == []
    (row,) = rows_of(tmp_path)
    assert row["status"] == "violation"


def test_an_object_strategy_is_reset_before_every_item(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    _plain_module(pytester)
    result = pytester.runpytest(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=4096", "--budgetbench-items=3",
        "--budgetbench-strategies=plain:counting", "--budgetbench-cache=off"))
    result.assert_outcomes(passed=3)
    asked = [request["messages"][-1]["content"] for request in fake_endpoint.requests]
    assert asked == ["resets=1", "resets=2", "resets=3"]
