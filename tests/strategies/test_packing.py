"""Shared chunking and packing, and the tightness of every packing strategy."""

from __future__ import annotations

import re
from collections.abc import Sequence

import pytest

from pytest_budgetbench.errors import ConfigError
from pytest_budgetbench.messages import Message, split_ends, text_of
from pytest_budgetbench.strategies import load_strategy
from pytest_budgetbench.strategies._chunking import (
    Piece,
    chunk_for_retrieval,
    chunk_history,
    chunk_size,
    fit_prefix,
    sentence_history,
)
from pytest_budgetbench.strategies._packing import Packer
from pytest_budgetbench.strategies.base import StrategyContext
from pytest_budgetbench.testing import HashingEmbedder
from pytest_budgetbench.tokens.approximate import ApproxCounter
from pytest_budgetbench.tokens.base import TokenCounter
from pytest_budgetbench.tokens.gguf import GGUFCounter
from tests.strategy_helpers import ScriptedAux, memory_items

PACKING_STRATEGIES = ("rag", "lean_retrieval", "checkpoint_context", "compression",
                      "summary_buffer")


class PairPenaltyCounter(ApproxCounter):
    """A template that costs more than the sum of its messages (two tokens per message
    after the first): per-message estimates undercount, so only exact checks keep fits."""

    def _count_prompt(self, messages: Sequence[Message]) -> int:
        return super()._count_prompt(messages) + 2 * max(0, len(messages) - 1)


def test_adaptive_chunk_size_is_a_clamped_power_of_two() -> None:
    assert chunk_size("adaptive", 440) == 64
    assert chunk_size("adaptive", 1900) == 128
    assert chunk_size("adaptive", 8000) == 256
    assert chunk_size(None, 10) == 64
    assert chunk_size("200", 10) == 200
    with pytest.raises(ConfigError):
        chunk_size("zero", 100)


def test_adaptive_units_join_the_same_chunks_at_every_budget() -> None:
    tokens = ApproxCounter()
    text = " ".join(f"Sentence number {i} talks about lesson {i}." for i in range(200))
    history = [{"role": "user", "content": text}, {"role": "assistant", "content": "Short."}]
    small = chunk_for_retrieval(tokens, history, "adaptive", 500)
    large = chunk_for_retrieval(tokens, history, "adaptive", 4000)
    assert small.chunks == large.chunks  # embedded once for every budget
    assert len(large.units) < len(small.units)
    for unit, group in zip(large.units, large.members, strict=True):
        assert group == list(range(group[0], group[-1] + 1))
        chunks = [large.chunks[i] for i in group]
        assert {c.msg for c in chunks} == {unit.msg}
        assert (unit.start, unit.end) == (chunks[0].start, chunks[-1].end)
        assert unit.tokens <= chunk_size("adaptive", 4000)
    fixed = chunk_for_retrieval(tokens, history, "40", 4000)
    assert fixed.units == fixed.chunks and all(c.tokens <= 40 for c in fixed.chunks)


def test_chunks_keep_order_cover_the_words_and_respect_the_size() -> None:
    tokens = ApproxCounter()
    text = " ".join(f"Sentence number {i} talks about lesson {i}." for i in range(60))
    history = [{"role": "user", "content": text}, {"role": "assistant", "content": "Short."}]
    pieces = chunk_history(tokens, history, 32)
    assert [p.msg for p in pieces] == sorted(p.msg for p in pieces)
    assert all(p.tokens <= 32 for p in pieces)
    kept = " ".join(text_of(history[p.msg])[p.start : p.end] for p in pieces)
    assert kept.split() == (text + " Short.").split()


def test_sentences_and_giant_words_are_cut() -> None:
    tokens = ApproxCounter()
    history = [{"role": "user", "content": "First one. " + "x" * 400 + " tail, more words here"}]
    units = sentence_history(tokens, history, 20)
    assert all(u.tokens <= 20 for u in units)
    assert text_of(history[0])[units[0].start : units[0].end] == "First one."


def test_fit_prefix_cuts_after_a_word() -> None:
    tokens = ApproxCounter()
    text = "alpha beta gamma delta epsilon"
    stop = fit_prefix(tokens, text, 0, len(text), 3)
    assert text[:stop] == "alpha beta"
    assert fit_prefix(tokens, text, 0, len(text), 0) == 0


def _history() -> list[Message]:
    return [
        {"role": "user", "content": "One. Two. Three. Four."},
        {"role": "assistant", "content": "Kept whole."},
    ]


def test_partial_messages_keep_role_and_mark_gaps() -> None:
    tokens = ApproxCounter()
    history = _history()
    packer = Packer(tokens, history)
    first, _two, third, _four = sentence_history(tokens, history[:1], 10)
    whole = chunk_history(tokens, history[1:], 10)[0]
    rendered = packer.render([third, Piece(1, whole.start, whole.end, whole.tokens), first])
    assert rendered[0] == {"role": "user", "content": "One. […] Three. […]"}
    assert rendered[1] == history[1] and rendered[1] is not history[1]


def test_packer_never_exceeds_when_estimates_undercount() -> None:
    tokens = PairPenaltyCounter()
    head = [{"role": "system", "content": "sys"}]
    history = [{"role": "user" if i % 2 else "assistant", "content": f"message {i} " * 8}
               for i in range(40)]
    query = [{"role": "user", "content": "what?"}]
    pieces = chunk_history(tokens, history, 16)
    for budget in range(30, 400, 17):
        prompt = Packer(tokens, history).pack(head, query, pieces[::-1], budget)
        assert tokens.count_messages(prompt) <= budget
        assert prompt[0] == head[0] and prompt[-1] == query[0]


def _context(tokens: TokenCounter) -> StrategyContext:
    # The auxiliary model answers with the first max_tokens words of the prompt.
    aux = ScriptedAux(tokens, reply=lambda sent: text_of(sent[-1]), words=True)
    return StrategyContext(tokens=tokens, item_id="memory/x", aux=aux,
                           embedder_factory=HashingEmbedder, options={"rag_chunk": "adaptive"})


@pytest.mark.parametrize("name", PACKING_STRATEGIES)
def test_utilisation_on_memory_items_with_the_exact_counter(gguf: GGUFCounter, name: str) -> None:
    items = memory_items(5, history_tokens=4000)
    strategy = load_strategy(name)
    ratios = []
    for item in items:
        for budget in (512, 1024, 2048):
            strategy.reset(_context(gguf))
            prompt = strategy.apply(list(item.messages), budget)
            counted = gguf.count_messages(prompt)
            assert counted <= budget, f"{name} sent {counted} > {budget}"
            head, _history, query = split_ends(item.messages)
            assert prompt[: len(head)] == head and prompt[-1] == query[-1]
            ratios.append(counted / budget)
    assert sum(ratios) / len(ratios) >= 0.9, ratios


def test_gap_marker_is_the_only_rewrite() -> None:
    # A retrieval prompt's partial messages are the source text plus markers, nothing else.
    tokens = ApproxCounter()
    history = [{"role": "user", "content": " ".join(f"Fact {i} is here." for i in range(50))}]
    pieces = chunk_history(tokens, history, 16)
    prompt = Packer(tokens, history).pack([], [{"role": "user", "content": "q"}],
                                          pieces[::3], 80)
    body = prompt[0]["content"]
    for part in re.split(r"\s*\[…\]\s*", body):
        assert not part or part in history[0]["content"]
