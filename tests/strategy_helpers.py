"""Helpers shared by the strategy tests (``tests/strategies/``).

The exact counter is the session-scoped ``gguf`` fixture of ``tests/conftest.py`` (a
wrapper of :func:`load_gguf`); the scripted auxiliary model every strategy test drives is
:class:`ScriptedAux`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

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


class AuxCall(NamedTuple):
    """One call a :class:`ScriptedAux` answered."""

    purpose: str
    counted: int
    """The prompt's tokens, by the aux model's counter."""
    prompt: list[Message]


class ScriptedAux:
    """The scripted auxiliary model of the strategy tests. ``reply`` answers each call: a
    text, or a function of the prompt. Every call is recorded (:class:`AuxCall`, and the
    schema each purpose asked for) and, where ``limit`` is given, must fit it. ``words=True``
    cuts a reply to ``max_tokens`` words, as a model's own cap would."""

    def __init__(self, tokens: TokenCounter, limit: int | None = None,
                 reply: str | Callable[[Sequence[Message]], str] = "a reply", *,
                 words: bool = False) -> None:
        self.tokens, self.limit, self.reply, self.words = tokens, limit, reply, words
        self.calls: list[AuxCall] = []
        self.schemas: dict[str, Schema | None] = {}
        """The schema each purpose's calls asked for (the last call's)."""

    def complete(self, messages: Sequence[Message], *, max_tokens: int, purpose: str,
                 schema: Schema | None = None) -> str:
        counted = self.tokens.count_messages(messages)
        if self.limit is not None:
            assert counted <= self.limit, f"{purpose} sent {counted} > {self.limit}"
        self.calls.append(AuxCall(purpose, counted, list(messages)))
        self.schemas[purpose] = schema
        reply = self.reply if isinstance(self.reply, str) else self.reply(messages)
        return " ".join(reply.split()[:max_tokens]) if self.words else reply

    def purposes(self) -> list[str]:
        return [call.purpose for call in self.calls]

    def prompts(self) -> list[str]:
        return [text_of(m) for call in self.calls for m in call.prompt]


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
    from tests.sweeps import rows_of, sweep_args

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
