"""Helpers shared by the strategy tests (``tests/strategies/``).

Each test module keeps its own module-scoped ``gguf`` fixture, a one-line wrapper of
:func:`load_gguf` (a fixture imported from here would trip ruff's F811 where it is used).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.errors import EmbeddedServerError
from pytest_budgetbench.messages import Message, text_of
from pytest_budgetbench.model.structured import Schema
from pytest_budgetbench.strategies.base import Strategy, StrategyContext
from pytest_budgetbench.tasks.base import Item, TaskOptions
from pytest_budgetbench.tasks.memory import MemoryTask
from pytest_budgetbench.tokens.base import TokenCounter
from pytest_budgetbench.tokens.gguf import GGUFCounter
from tests.fake_openai import FakeOpenAI, reading_responder


def load_gguf() -> GGUFCounter:
    """The small embedded model's (SmolLM2's) exact counter; skips the test when it is not
    available. Unit tests count with it: it ships in a package, so it is always there."""
    pytest.importorskip("llama_cpp")
    from pytest_budgetbench.embedded_server.models import embedded_gguf_path

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


class ScriptedAux:
    """An auxiliary model for the memory-system tests: ``reply(prompt)`` answers; every call
    is recorded (purpose, counted tokens, prompt, and the schema it asked for) and must fit
    ``limit`` tokens."""

    def __init__(self, tokens: TokenCounter, limit: int,
                 reply: Callable[[Sequence[Message]], str]) -> None:
        self.tokens, self.limit, self.reply = tokens, limit, reply
        self.calls: list[tuple[str, int, list[Message]]] = []
        self.schemas: dict[str, Schema | None] = {}
        """The schema each purpose's calls asked for (the last call's)."""

    def complete(self, messages: Sequence[Message], *, max_tokens: int, purpose: str,
                 schema: Schema | None = None) -> str:
        counted = self.tokens.count_messages(messages)
        assert counted <= self.limit, f"{purpose} sent {counted} > {self.limit}"
        self.calls.append((purpose, counted, list(messages)))
        self.schemas[purpose] = schema
        return self.reply(messages)

    def purposes(self) -> list[str]:
        return [purpose for purpose, _count, _prompt in self.calls]

    def prompts(self) -> list[str]:
        return [text_of(m) for _p, _c, sent in self.calls for m in sent]


def scripted_responder(kind_of: Callable[[Sequence[Message]], str], replies: dict[str, str]
                       ) -> Callable[[list[dict[str, Any]]], str]:
    """A fake endpoint's responder: the scripted reply for the prompt's kind, a reader's
    answer for the answer prompt (kind ``answer``)."""

    def respond(messages: list[dict[str, Any]]) -> str:
        kind = kind_of(messages)
        return reading_responder(messages) if kind == "answer" else replies[kind]

    return respond


def graded_sweep(pytester: pytest.Pytester, tmp_path: Path,
                 responder: Callable[[list[dict[str, Any]]], str] | None, cells: int,
                 *args: str, fake: FakeOpenAI | None = None) -> list[dict[str, Any]]:
    """Run a sweep against a fake endpoint answering with ``responder`` (``fake``, when
    given: the test's, started and stopped by it); every one of its ``cells`` cells must
    pass, be ok, fit its budget and be graded. Returns the rows."""
    from tests.test_plugin import rows_of, sweep_args

    if fake is not None:
        if responder:
            fake.responder = responder
        result = pytester.runpytest(*sweep_args(fake, tmp_path, *args))
    else:
        fake = FakeOpenAI(responder=responder).start() if responder else FakeOpenAI().start()
        try:
            result = pytester.runpytest(*sweep_args(fake, tmp_path, *args))
        finally:
            fake.stop()
    result.assert_outcomes(passed=cells)
    rows = rows_of(tmp_path)
    assert len(rows) == cells and {r["status"] for r in rows} == {"ok"}
    for row in rows:
        assert row["counted_tokens"] <= row["budget"] and row["quality"] is not None
    return rows


def run_with_aux(strategy: Strategy, messages: list[Message], budget: int,
                 reply: Callable[[Sequence[Message]], str], options: dict[str, Any]
                 ) -> tuple[list[Message], ScriptedAux, StrategyContext]:
    """One cell of a memory-system strategy with a scripted aux model (``reply``) held to
    ``budget``, the approximate counter and the hashing embedder: the prompt, the aux
    model (its calls) and the context (``info``, ``aux_failures``)."""
    from pytest_budgetbench.testing import HashingEmbedder
    from pytest_budgetbench.tokens.approximate import ApproxCounter

    tokens = ApproxCounter()
    aux = ScriptedAux(tokens, budget, reply)
    context = StrategyContext(tokens=tokens, aux=aux, embedder_factory=HashingEmbedder,
                              options=options)
    strategy.reset(context)
    return strategy.apply(messages, budget), aux, context


def longest_allowed(schema: dict[str, Any]) -> Any:
    """The longest value ``schema`` allows: every array full, every string at its bound."""
    if "enum" in schema:
        return max(schema["enum"], key=len)
    if schema["type"] == "object":
        return {key: longest_allowed(value) for key, value in schema["properties"].items()}
    if schema["type"] == "array":
        return [longest_allowed(schema["items"])] * schema["maxItems"]
    if schema["type"] == "string":
        return "x" * schema["maxLength"]
    return True
