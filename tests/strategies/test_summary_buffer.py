"""summary_buffer: conformance, budgeted auxiliary calls, map-reduce over long evictions."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from pytest_budgetbench.messages import Message, text_of
from pytest_budgetbench.strategies.base import Regime
from pytest_budgetbench.strategies.summary_buffer import SUMMARY_HEADER, SummaryBuffer
from pytest_budgetbench.testing import check_strategy
from pytest_budgetbench.tokens.approximate import ApproxCounter
from pytest_budgetbench.tokens.base import TokenCounter
from pytest_budgetbench.tokens.gguf import GGUFCounter
from tests.strategy_helpers import ScriptedAux, memory_items, run_strategy


def numbered_summaries() -> Callable[[Sequence[Message]], str]:
    """A reply per call: a numbered summary."""
    numbers = itertools.count(1)
    return lambda _prompt: f"summary {next(numbers)}: the user likes tea"


def _messages(turns: int) -> list[Message]:
    messages: list[Message] = [{"role": "system", "content": "Answer briefly."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"On day {i} I walked the dog to the park."})
        messages.append({"role": "assistant", "content": f"Noted, a walk on day {i}. " * 3})
    messages.append({"role": "user", "content": "What do I like to drink?"})
    return messages


def _run(tokens: TokenCounter, messages: list[Message], budget: int
         ) -> tuple[list[Message], ScriptedAux]:
    aux = ScriptedAux(tokens, reply=numbered_summaries())
    return run_strategy(SummaryBuffer(), messages, budget, tokens, aux=aux), aux


def test_declares_name_and_regimes() -> None:
    assert SummaryBuffer.name == "summary_buffer"
    assert Regime.AUXILIARY_MODEL in SummaryBuffer.regimes
    assert Regime.LOCAL_ONLY not in SummaryBuffer.regimes


def test_conforms() -> None:
    check_strategy(SummaryBuffer, max_examples=40)


def test_conforms_with_the_exact_counter(gguf: GGUFCounter) -> None:
    check_strategy(SummaryBuffer, tokens=gguf, max_examples=8)


def test_no_call_when_everything_fits() -> None:
    messages = _messages(3)
    prompt, aux = _run(ApproxCounter(), messages, 10_000)
    assert prompt == messages and aux.calls == []


def test_one_summary_call_when_the_eviction_fits_one_prompt() -> None:
    tokens = ApproxCounter()
    messages = _messages(12)
    budget = 400
    evicted_tokens = tokens.count_messages(messages) - budget
    assert evicted_tokens < budget
    prompt, aux = _run(tokens, messages, budget)
    assert [c[0] for c in aux.calls] == ["summary"]
    summary = SUMMARY_HEADER + "summary 1: the user likes tea"
    assert prompt[1] == {"role": "system", "content": summary}
    assert tokens.count_messages(prompt) <= budget
    # The oldest turns went to the summary prompt, the newest stayed verbatim.
    assert "On day 0 I walked" in text_of(aux.calls[0].prompt[-1])
    assert messages[-2] in prompt


@pytest.mark.parametrize("budget", [200, 300, 500])
def test_long_evictions_are_summarised_in_pieces_within_budget(budget: int) -> None:
    tokens = ApproxCounter()
    messages = _messages(60)
    assert tokens.count_messages(messages) > 4 * budget
    prompt, aux = _run(tokens, messages, budget)
    purposes = [c[0] for c in aux.calls]
    assert purposes.count("summary") >= 3  # map over several pieces ...
    assert purposes[-1] == "summary-reduce"  # ... then reduce to one
    assert all(counted <= budget for _p, counted, _msgs in aux.calls)
    # Every evicted turn was read by some map call.
    read = "\n".join(text_of(c.prompt[-1]) for c in aux.calls if c.purpose == "summary")
    assert "On day 0 I walked" in read and "On day 30 I walked" in read
    assert tokens.count_messages(prompt) <= budget
    assert prompt[1]["content"].startswith(SUMMARY_HEADER)


def test_exact_counter_keeps_every_call_within_budget(gguf: GGUFCounter) -> None:
    messages = _messages(40)
    prompt, aux = _run(gguf, messages, 256)
    assert len(aux.calls) >= 3
    assert all(counted <= 256 for _p, counted, _msgs in aux.calls)
    assert gguf.count_messages(prompt) <= 256


def test_needs_an_auxiliary_model() -> None:
    with pytest.raises(RuntimeError, match="auxiliary model"):
        run_strategy(SummaryBuffer(), _messages(30), 200, ApproxCounter())


@pytest.mark.integration
def test_real_model_summaries_are_recorded_and_within_budget(
    gguf: GGUFCounter, tmp_path: Path
) -> None:
    from pytest_budgetbench.embedded_server.models import SMOLLM2
    from pytest_budgetbench.embedded_server.process import EmbeddedServer
    from pytest_budgetbench.engine.aux_calls import RecordedAuxModel
    from pytest_budgetbench.model.chat import ChatModel

    # Small on purpose: the model reads ~150 tokens/s and writes slower on two cores.
    item = memory_items(1, history_tokens=500)[0]
    server = EmbeddedServer(n_ctx=1024, threads=2, log_path=tmp_path / "server.log",
                            model_name=SMOLLM2.name)
    server.start()
    try:
        aux = RecordedAuxModel(ChatModel(server.base_url, SMOLLM2.alias), gguf, 256,
                               "memory-0000-summary_buffer-256", strategy="summary_buffer")
        prompt = run_strategy(SummaryBuffer(), list(item.messages), 256, gguf, aux=aux)
    finally:
        server.stop()
    assert len(aux.calls) >= 2  # the eviction needs more than one call at this budget
    assert all(call.input_tokens <= 256 for call in aux.calls)
    assert gguf.count_messages(prompt) <= 256
    assert prompt[1]["content"].startswith(SUMMARY_HEADER)
