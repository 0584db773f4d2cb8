"""``lean_retrieval``: a cheap hybrid ranking of history chunks, packed like ``rag``.

No vector database: each chunk's score is a weighted sum of four signals, each scaled to
[0, 1] over the item's chunks (see :mod:`~pytest_budgetbench.strategies._scoring`):

- dense: cosine of the chunk's embedding to the query's (the run's cached embedder; a
  unit of several chunks takes its best chunk's, as in rag);
- lexical: BM25 of the query's words (stopwords removed) in the chunk;
- recency: the chunk's message position, oldest 0 to newest 1;
- salience: numbers, name-like capitalised words, first-person statements.

Lexical evidence weighs as much as dense similarity because memory questions usually
repeat a rare word of the answer's sentence ("turtle", "cello"), which small embedding
models blur. Chunking and packing are rag's (same chunk sizes, same rendering).
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_budgetbench.messages import Message, text_of
from pytest_budgetbench.strategies._chunking import Chunking, Piece, piece_text
from pytest_budgetbench.strategies._packing import ChunkRanking
from pytest_budgetbench.strategies._scoring import Weights, combine, dense_scores, recency_of
from pytest_budgetbench.strategies.base import Regime, StrategyContext

WEIGHTS = Weights(dense=0.4, lexical=0.4, recency=0.1, salience=0.1)


def rank_hybrid(
    context: StrategyContext,
    history: Sequence[Message],
    chunking: Chunking,
    query: str,
    weights: Weights = WEIGHTS,
) -> list[Piece]:
    """``chunking.units`` best first by the hybrid score (ties: newer first). A unit's
    dense signal is its best chunk's, so vectors are the per-item chunks' at any budget."""
    units = chunking.units
    if not units:
        return []
    sources = [text_of(m) for m in history]
    chunk_cosines = dense_scores(context, [piece_text(sources, c) for c in chunking.chunks], query)
    dense = [0.0] * len(units)
    if chunk_cosines is not None:
        dense = [max(chunk_cosines[c] for c in group) for group in chunking.members]
    texts = [piece_text(sources, u) for u in units]
    scores = combine(weights, dense, texts, recency_of([u.msg for u in units], len(history)),
                     query)
    order = sorted(range(len(units)), key=lambda i: (-scores[i], -units[i].msg, units[i].start))
    return [units[i] for i in order]


class LeanRetrieval(ChunkRanking):
    """Hybrid dense + BM25 + recency + salience ranking of chunks, without a vector store."""

    name = "lean_retrieval"
    uses_embedder = True
    regimes = frozenset({Regime.LOCAL_ONLY, Regime.RESET_PER_ITEM})

    def rank(self, history: Sequence[Message], chunking: Chunking, query: str) -> list[Piece]:
        return rank_hybrid(self.context, history, chunking, query)
