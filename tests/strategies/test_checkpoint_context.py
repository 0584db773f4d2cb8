"""checkpoint_context: conformance, the three shares, never over budget."""

from __future__ import annotations

import pytest

from pytest_budgetbench.messages import Message
from pytest_budgetbench.strategies.base import Regime
from pytest_budgetbench.strategies.checkpoint_context import (
    CHECKPOINT_HEADER,
    CHECKPOINT_SHARE,
    CheckpointContext,
)
from pytest_budgetbench.testing import HashingEmbedder, check_strategy
from pytest_budgetbench.tokens.approximate import ApproxCounter
from pytest_budgetbench.tokens.gguf import GGUFCounter
from tests.strategy_helpers import run_strategy


def test_declares_name_and_regimes() -> None:
    assert CheckpointContext.name == "checkpoint_context"
    assert CheckpointContext.regimes == {Regime.LOCAL_ONLY, Regime.RESET_PER_ITEM}


def test_conforms() -> None:
    check_strategy(CheckpointContext)


def test_conforms_with_the_exact_counter(gguf: GGUFCounter) -> None:
    check_strategy(CheckpointContext, tokens=gguf, max_examples=12)


def _messages() -> list[Message]:
    messages: list[Message] = [{"role": "system", "content": "Answer briefly."}]
    for day in range(1, 41):
        opener = f"[May {day}, 2024] Could you give me ideas for a rainy weekend?"
        if day == 7:
            opener = f"[May {day}, 2024] Today I adopted a tortoise named Sheldon."
        messages.append({"role": "user", "content": opener})
        messages.append({"role": "assistant", "content": "Sure. Read a book. Bake bread."})
    messages.append({"role": "user", "content": "What is my tortoise called?"})
    return messages


def _apply(budget: int) -> tuple[list[Message], ApproxCounter]:
    tokens = ApproxCounter()
    prompt = run_strategy(CheckpointContext(), _messages(), budget, tokens,
                          embedder_factory=HashingEmbedder)
    return prompt, tokens


def test_checkpoint_tail_and_evidence() -> None:
    prompt, tokens = _apply(300)
    assert tokens.count_messages(prompt) <= 300
    checkpoint = prompt[1]
    assert checkpoint["role"] == "system" and checkpoint["content"].startswith(CHECKPOINT_HEADER)
    # The salient, rare sentence is in the checkpoint, under its session's date.
    line = "[May 7, 2024]\n- user: Today I adopted a tortoise named Sheldon."
    assert line in checkpoint["content"]
    # The recent tail is verbatim, and the prompt still ends with the query.
    assert prompt[-2] == _messages()[-2] and prompt[-1] == _messages()[-1]


@pytest.mark.parametrize("budget", [200, 300, 400, 800])
def test_checkpoint_stays_within_its_share(budget: int) -> None:
    # Budgets at which the history does not fit and the share holds at least one dated line
    # (below ~200 tokens it holds none; from ~1600 the whole history fits): every one of
    # them has a checkpoint, so its share is checked every time.
    prompt, tokens = _apply(budget)
    room = budget - tokens.count_messages([prompt[0], prompt[-1]])
    checkpoints = [m for m in prompt if m["content"].startswith(CHECKPOINT_HEADER)]
    assert len(checkpoints) == 1 and prompt[1] is checkpoints[0]
    assert tokens.count_message(checkpoints[0]) <= room * CHECKPOINT_SHARE
    assert tokens.count_messages(prompt) <= budget
