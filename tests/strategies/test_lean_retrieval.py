"""lean_retrieval: conformance, and the hybrid ranking's lexical signal."""

from __future__ import annotations

import pytest

from pytest_budgetbench.messages import Message
from pytest_budgetbench.strategies._chunking import chunk_for_retrieval
from pytest_budgetbench.strategies.base import Regime, StrategyContext
from pytest_budgetbench.strategies.lean_retrieval import LeanRetrieval, rank_hybrid
from pytest_budgetbench.testing import HashingEmbedder, check_strategy
from pytest_budgetbench.tokens.approximate import ApproxCounter
from pytest_budgetbench.tokens.gguf import GGUFCounter
from tests.strategy_helpers import run_strategy


def test_declares_name_and_regimes() -> None:
    assert LeanRetrieval.name == "lean_retrieval"
    assert Regime.LOCAL_ONLY in LeanRetrieval.regimes
    assert Regime.AUXILIARY_MODEL not in LeanRetrieval.regimes


def test_conforms() -> None:
    check_strategy(LeanRetrieval)


def test_conforms_with_the_exact_counter(gguf: GGUFCounter) -> None:
    check_strategy(LeanRetrieval, tokens=gguf, max_examples=12)


def _history() -> list[Message]:
    # Generic chatter, newer than the match and as salient (first person, numbers, names).
    messages: list[Message] = [
        {"role": "user", "content": "I keep my surfboard in the garage of the Zanzibar house."},
    ]
    for i in range(12):
        messages.append({"role": "assistant", "content": f"I think Tom said day {i} was fine."})
        messages.append({"role": "user", "content": f"My plan for week {i} is to rest, Ann."})
    return messages


class ConstantEmbedder:
    """Every text the same vector: the dense signal says nothing."""

    name = "constant"

    def embed(self, texts: list[str]) -> list[list[float]]:
        return [[1.0, 0.0] for _ in texts]


@pytest.mark.parametrize("embedder", [ConstantEmbedder, HashingEmbedder])
def test_a_lexical_match_ranks_first(embedder: type) -> None:
    tokens = ApproxCounter()
    history = _history()
    context = StrategyContext(tokens=tokens, embedder_factory=embedder)
    chunking = chunk_for_retrieval(tokens, history, "adaptive", 200)
    ranked = rank_hybrid(context, history, chunking, "Where is the surfboard kept?")
    assert ranked[0].msg == 0  # the oldest message, against recency


def test_only_the_lexical_match_survives_a_tight_budget() -> None:
    tokens = ApproxCounter()
    messages = [{"role": "system", "content": "Be brief."}, *_history(),
                {"role": "user", "content": "Where is the surfboard kept?"}]
    budget = tokens.count_messages([messages[0], messages[1], messages[-1]])
    prompt = run_strategy(LeanRetrieval(), messages, budget, tokens,
                          embedder_factory=HashingEmbedder)
    assert prompt == [messages[0], messages[1], messages[-1]]


def test_works_without_an_embedder() -> None:
    tokens = ApproxCounter()
    messages = [{"role": "system", "content": "Be brief."}, *_history(),
                {"role": "user", "content": "Where is the surfboard kept?"}]
    prompt = run_strategy(LeanRetrieval(), messages, 60, tokens)
    assert messages[1] in prompt and tokens.count_messages(prompt) <= 60
