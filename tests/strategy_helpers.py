"""Helpers shared by the strategy tests (``tests/test_strategies_*.py``).

Each test module keeps its own module-scoped ``gguf`` fixture, a one-line wrapper of
:func:`load_gguf` (a fixture imported from here would trip ruff's F811 where it is used).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from pytest_budgetbench.budget import GGUFCounter, TokenCounter
from pytest_budgetbench.errors import EmbeddedServerError
from pytest_budgetbench.messages import Message
from pytest_budgetbench.strategies.base import Strategy, StrategyContext
from pytest_budgetbench.tasks.base import Item, TaskOptions
from pytest_budgetbench.tasks.memory import MemoryTask


def load_gguf() -> GGUFCounter:
    """The small embedded model's (SmolLM2's) exact counter; skips the test when it is not
    available. Unit tests count with it: it ships in a package, so it is always there."""
    pytest.importorskip("llama_cpp")
    from pytest_budgetbench.model import embedded_gguf_path

    try:
        return GGUFCounter(embedded_gguf_path("smollm2"))
    except EmbeddedServerError as exc:
        pytest.skip(str(exc))


def run_strategy(
    strategy: Strategy,
    messages: Sequence[Message],
    budget: int,
    tokens: TokenCounter,
    **context: Any,
) -> list[Message]:
    """``strategy`` reset with ``StrategyContext(tokens=tokens, **context)``, applied once."""
    strategy.reset(StrategyContext(tokens=tokens, **context))
    return strategy.apply(messages, budget)


def memory_items(items: int, history_tokens: int) -> list[Item]:
    """The first ``items`` memory-task items, each with about ``history_tokens`` of history."""
    return MemoryTask(TaskOptions(items=items, extra={"history_tokens": history_tokens})).load()
