"""rag: conformance, chromadb retrieval of the evidence with the real MiniLM embedder."""

from __future__ import annotations

import pytest

from pytest_budgetbench.messages import Message
from pytest_budgetbench.strategies._chunking import chunk_size
from pytest_budgetbench.strategies.base import Regime, StrategyContext
from pytest_budgetbench.strategies.rag import STORE, Rag
from pytest_budgetbench.testing import HashingEmbedder, check_strategy, default_context
from pytest_budgetbench.tokens.approximate import ApproxCounter
from pytest_budgetbench.tokens.base import TokenCounter
from pytest_budgetbench.tokens.gguf import GGUFCounter
from tests.strategy_helpers import memory_items

pytest.importorskip("chromadb")


def _context(tokens: TokenCounter, embedder: object = HashingEmbedder, chunk: str = "adaptive"
             ) -> StrategyContext:
    factory = embedder if callable(embedder) else (lambda: embedder)
    return StrategyContext(tokens=tokens, item_id="t", embedder_factory=factory,
                           options={"rag_chunk": chunk})


def test_declares_name_and_regimes() -> None:
    assert Rag.name == "rag"
    assert Rag.regimes == {Regime.LOCAL_ONLY, Regime.RESET_PER_ITEM}


def test_conforms() -> None:
    check_strategy(Rag)


def test_conforms_with_the_exact_counter(gguf: GGUFCounter) -> None:
    check_strategy(Rag, tokens=gguf, max_examples=12)


def test_conforms_with_a_fixed_chunk_size() -> None:
    def context(tokens: TokenCounter, budget: int) -> StrategyContext:
        ctx = default_context(tokens, budget)
        ctx.options["rag_chunk"] = "16"
        return ctx

    check_strategy(Rag, context_factory=context, max_examples=25)


def _history() -> list[Message]:
    filler = "We talked about the weather and the garden again today, nothing special."
    messages: list[Message] = [{"role": "system", "content": "Answer briefly."}]
    for i in range(30):
        messages.append({"role": "user", "content": f"{filler} ({i})"})
        messages.append({"role": "assistant", "content": f"Sounds nice ({i})."})
    messages[21] = {"role": "user", "content": f"{filler} My violin teacher is called Ada."}
    messages.append({"role": "user", "content": "Who is my violin teacher?"})
    return messages


def test_retrieves_the_matching_chunk_and_keeps_its_role() -> None:
    tokens = ApproxCounter()
    messages = _history()
    rag = Rag()
    rag.reset(_context(tokens, chunk="12"))
    prompt = rag.apply(messages, 80)
    assert tokens.count_messages(prompt) <= 80
    evidence = [m for m in prompt if "violin teacher is called Ada" in m["content"]]
    # A chunk of the user's message, rendered as a user message with the omission marked.
    assert evidence and evidence[0]["role"] == "user" and "[…]" in evidence[0]["content"]


def test_one_collection_serves_every_budget() -> None:
    tokens = ApproxCounter()
    messages = _history()
    for index in (1, 3):  # long messages: several chunks each
        messages[index] = {"role": "user", "content": " ".join(
            f"Line {i} of a long note about the garden shed." for i in range(60))}
    rag = Rag()
    created = []
    sizes = set()
    for budget in (300, 1200, 2200):  # three adaptive unit sizes
        assert tokens.count_messages(messages) > budget
        sizes.add(chunk_size("adaptive", budget - 10))
        rag.reset(_context(tokens))
        rag.apply(messages, budget)
        created.append(next(reversed(STORE._collections)))
    assert len(sizes) == 3 and len(set(created)) == 1


def test_whole_prompt_is_sent_unchanged_when_it_fits() -> None:
    messages = _history()
    rag = Rag()
    rag.reset(_context(ApproxCounter()))
    assert rag.apply(messages, 100_000) == messages


EVIDENCE = {"single-session-fact": "remember this: my", "preference": "remember this: I prefer"}


def test_finds_memory_evidence_with_minilm(gguf: GGUFCounter) -> None:
    pytest.importorskip("sentence_transformers")
    from pytest_budgetbench.embeddings import make_embedder

    embedder = make_embedder("all-MiniLM-L6-v2")
    items = memory_items(4, history_tokens=1000)
    for item in items:
        if item.category not in EVIDENCE:
            continue
        rag = Rag()
        rag.reset(_context(gguf, embedder))
        prompt = rag.apply(list(item.messages), 256)
        assert gguf.count_messages(prompt) <= 256
        assert any(EVIDENCE[item.category] in m["content"] for m in prompt[1:-1]), item.category
