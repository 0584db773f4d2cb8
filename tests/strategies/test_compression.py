"""compression: conformance, shorter output that keeps the query-relevant sentence."""

from __future__ import annotations

import pytest

from pytest_budgetbench.messages import Message
from pytest_budgetbench.strategies.base import Regime
from pytest_budgetbench.strategies.compression import Compression
from pytest_budgetbench.testing import HashingEmbedder, check_strategy
from pytest_budgetbench.tokens.approximate import ApproxCounter
from pytest_budgetbench.tokens.gguf import GGUFCounter
from tests.strategy_helpers import run_strategy


def test_declares_name_and_regimes() -> None:
    assert Compression.name == "compression"
    assert Compression.regimes == {Regime.LOCAL_ONLY, Regime.RESET_PER_ITEM}


def test_conforms() -> None:
    check_strategy(Compression)


def test_conforms_with_the_exact_counter(gguf: GGUFCounter) -> None:
    check_strategy(Compression, tokens=gguf, max_examples=12)


FILLER = "Use what you already have at home. Keep a short list of what worked."


def _messages() -> list[Message]:
    messages: list[Message] = [{"role": "system", "content": "Answer briefly."}]
    for i in range(20):
        user = f"Could you give me tips for week {i}? {FILLER}"
        if i == 4:
            user = f"Could you give me tips for week {i}? My cello teacher is Ines. {FILLER}"
        messages.append({"role": "user", "content": user})
        messages.append({"role": "assistant", "content": f"Sure, here are tips. {FILLER}"})
    messages.append({"role": "user", "content": "Who is my cello teacher?"})
    return messages


@pytest.mark.parametrize("budget", [60, 150, 300])
def test_output_is_shorter_and_keeps_the_relevant_sentence(budget: int) -> None:
    tokens = ApproxCounter()
    messages = _messages()
    prompt = run_strategy(Compression(), messages, budget, tokens,
                          embedder_factory=HashingEmbedder)
    assert tokens.count_messages(prompt) <= budget < tokens.count_messages(messages)
    body = [m for m in prompt[1:-1]]
    assert sum(len(m["content"]) for m in body) < sum(len(m["content"]) for m in messages[1:-1])
    # The sentence is kept on its own, cut out of its message, with the message's role.
    kept = [m for m in body if "My cello teacher is Ines." in m["content"]]
    assert kept and kept[0]["role"] == "user" and kept[0] != messages[9]


def test_repeated_sentences_are_kept_once() -> None:
    tokens = ApproxCounter()
    prompt = run_strategy(Compression(), _messages(), 150, tokens,
                          embedder_factory=HashingEmbedder)
    text = " ".join(m["content"] for m in prompt[1:-1])
    assert text.count("Use what you already have at home.") <= 1
    assert text.count("Sure, here are tips.") <= 1
    assert text.count("Could you give me tips for week") >= 5
