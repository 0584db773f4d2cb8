"""``compression``: query-focused extractive compression of the history, sentence by sentence.

Rather than dropping whole messages, every history message is cut into sentences (a
sentence over ``MAX_UNIT_TOKENS`` into clauses or word runs), and the units are ordered by
maximal marginal relevance (Carbonell & Goldstein, 1998)::

    next = argmax  LAMBDA * relevance(unit, query) - (1 - LAMBDA) * max_sim(unit, chosen)

where relevance is a hybrid of embedding cosine, BM25, recency and salience (the
``_scoring`` signals) and ``max_sim`` is the embedding cosine to the units already chosen,
so near-repeats are kept once; verbatim repeats come only after every distinct unit (they
can still fill a budget that distinct text cannot). The shared packer admits units in
that order up to the budget (the last one may be cut to a phrase) and each message is
rebuilt from its kept units in their original order, same role, joined by a space; a
message with no kept unit disappears, one with all its units kept is sent unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pytest_budgetbench.errors import Requirement, require
from pytest_budgetbench.messages import Message, text_of
from pytest_budgetbench.strategies._chunking import Piece, piece_text, sentence_history
from pytest_budgetbench.strategies._packing import PROSE, HistoryStrategy, Packer, query_text
from pytest_budgetbench.strategies._scoring import (
    Weights,
    combine,
    cosine,
    embed_all,
    recency_of,
    terms,
)
from pytest_budgetbench.strategies.base import Regime

LAMBDA = 0.7  # relevance against redundancy; 0.7 is the usual MMR setting for summaries
MAX_UNIT_TOKENS = 40
WEIGHTS = Weights(dense=0.45, lexical=0.35, recency=0.1, salience=0.1)
# MMR-order units until their cost passes this multiple of the room; the rest, which only
# the packer's top-up can reach, follow by plain relevance.
ORDER_HORIZON = 1.25


class Compression(HistoryStrategy):
    """Query-focused MMR selection of sentences and phrases from every history message."""

    name = "compression"
    requires = (Requirement("numpy", "retrieval"),)
    uses_embedder = True
    regimes = frozenset({Regime.LOCAL_ONLY, Regime.RESET_PER_ITEM})

    def fit(self, head: list[Message], history: list[Message], query: list[Message],
            room: int, budget: int) -> list[Message]:
        tokens = self.context.tokens
        units = sentence_history(tokens, history, MAX_UNIT_TOKENS)
        ranked = self.order(history, units, query_text(query), room)
        return Packer(tokens, history, PROSE).pack(head, query, ranked, budget)

    def order(
        self, history: Sequence[Message], units: list[Piece], query: str, room: int
    ) -> list[Piece]:
        """``units`` in MMR order for ``query`` (see the module docstring)."""
        if not units:
            return []
        sources = [text_of(m) for m in history]
        texts = [piece_text(sources, u) for u in units]
        recency = recency_of([u.msg for u in units], len(history))
        embedded = embed_all(self.context, [*texts, query])
        dense = [0.0] * len(texts)
        if embedded is not None and query.strip():
            dense = [cosine(v, embedded[-1]) for v in embedded[:-1]]
        relevance = combine(WEIGHTS, dense, texts, recency, query)
        vectors = embedded[:-1] if embedded is not None else _bag_vectors(texts)
        # A verbatim repeat adds nothing: it waits behind every distinct unit.
        first = _first_occurrences(texts)
        distinct = [i for i in range(len(units)) if i in first]
        order = _mmr([relevance[i] for i in distinct], [vectors[i] for i in distinct],
                     [units[i].tokens for i in distinct], room * ORDER_HORIZON)
        repeats = sorted((i for i in range(len(units)) if i not in first),
                         key=lambda i: (-relevance[i], i))
        return [units[distinct[i]] for i in order] + [units[i] for i in repeats]


def _mmr(
    relevance: Sequence[float], vectors: Any, costs: Sequence[int], horizon: float
) -> list[int]:
    """Indices in MMR order until their summed cost passes ``horizon``, then by relevance."""
    np: Any = require("numpy", "retrieval", "the compression strategy")
    matrix = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    matrix = matrix / np.where(norms > 0, norms, 1.0)
    score = np.asarray(relevance, dtype=np.float64)
    redundancy = np.zeros(len(score))
    remaining = np.ones(len(score), dtype=bool)
    order: list[int] = []
    spent = 0.0
    while spent <= horizon and remaining.any():
        mmr = LAMBDA * score - (1 - LAMBDA) * redundancy
        # argmax takes the first maximum: ties go to the earlier unit, deterministically.
        best = int(np.argmax(np.where(remaining, mmr, -np.inf)))
        order.append(best)
        remaining[best] = False
        spent += costs[best]
        redundancy = np.maximum(redundancy, np.clip(matrix @ matrix[best], 0.0, None))
    rest = sorted(np.flatnonzero(remaining).tolist(), key=lambda i: (-score[i], i))
    return order + [int(i) for i in rest]


def _first_occurrences(texts: Sequence[str]) -> set[int]:
    """Indices of the first unit with each text (case and spacing ignored)."""
    seen: dict[str, int] = {}
    for index, text in enumerate(texts):
        seen.setdefault(" ".join(text.lower().split()), index)
    return set(seen.values())


def _bag_vectors(texts: Sequence[str]) -> list[list[float]]:
    """Word-count vectors, for redundancy when the run has no embedder."""
    vocabulary: dict[str, int] = {}
    bags = [terms(t) for t in texts]
    for bag in bags:
        for word in bag:
            vocabulary.setdefault(word, len(vocabulary))
    vectors = [[0.0] * max(1, len(vocabulary)) for _ in bags]
    for vector, bag in zip(vectors, bags, strict=True):
        for word in bag:
            vector[vocabulary[word]] += 1.0
    return vectors
