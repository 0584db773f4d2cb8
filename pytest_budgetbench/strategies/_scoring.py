"""Cheap relevance signals shared by the retrieval-style strategies.

Every signal is normalised to [0, 1] over the candidates of one prompt, so weights are
comparable: dense (cosine to the query), lexical (BM25 over the candidates as the corpus),
recency (position in the history) and salience (numbers, names, first-person statements:
the kind of sentence a memory question is usually about).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_budgetbench.lexicon import content_words
from pytest_budgetbench.strategies.base import StrategyContext

_FIRST_PERSON = re.compile(r"\b(I|I'm|I've|I'd|my|me|mine|we|our)\b")
_NUMBER = re.compile(r"\d")
# A capitalised word that does not open a sentence: most often a name or a place.
_NAME = re.compile(r"(?<![.!?]\s)(?<!^)\b[A-Z][a-z]+")

BM25_K1 = 1.2
BM25_B = 0.75


@dataclass(frozen=True)
class Weights:
    dense: float
    lexical: float
    recency: float
    salience: float


def terms(text: str) -> list[str]:
    """Lower-cased word tokens without stopwords."""
    return content_words(text)


def normalise(values: Sequence[float]) -> list[float]:
    """Min-max scaling to [0, 1]; all zeros when the values do not vary."""
    if not values:
        return []
    low, high = min(values), max(values)
    if high - low <= 1e-12:
        return [0.0] * len(values)
    return [(v - low) / (high - low) for v in values]


def bm25(query: str, documents: Sequence[str]) -> list[float]:
    """Okapi BM25 of each document for ``query``, the documents being the corpus."""
    docs = [Counter(terms(d)) for d in documents]
    if not docs:
        return []
    lengths = [sum(d.values()) for d in docs]
    average = (sum(lengths) / len(docs)) or 1.0
    frequency: Counter[str] = Counter()
    for doc in docs:
        frequency.update(doc.keys())
    scores = []
    query_terms = set(terms(query))
    for doc, length in zip(docs, lengths, strict=True):
        score = 0.0
        for term in query_terms & doc.keys():
            idf = math.log(1 + (len(docs) - frequency[term] + 0.5) / (frequency[term] + 0.5))
            tf = doc[term]
            norm = BM25_K1 * (1 - BM25_B + BM25_B * length / average)
            score += idf * tf * (BM25_K1 + 1) / (tf + norm)
        scores.append(score)
    return scores


def salience(text: str) -> float:
    """A third each for a number, a name-like word, and a first-person statement."""
    features = (_NUMBER.search(text), _NAME.search(text), _FIRST_PERSON.search(text))
    return sum(1.0 for feature in features if feature) / len(features)


def dot(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=False))


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    norm = math.sqrt(dot(a, a) * dot(b, b))
    return dot(a, b) / norm if norm > 0 else 0.0


def embed_all(context: StrategyContext, texts: Sequence[str]) -> list[list[float]] | None:
    """Embeddings of ``texts`` through the run's (cached) embedder, or None when the run
    has no embedder: the dense signal then drops out and the lexical ones remain."""
    if not callable(context.embedder_factory) and context._embedder is None:
        return None
    return context.embedder.embed(list(texts))


def dense_scores(
    context: StrategyContext, texts: Sequence[str], query: str
) -> list[float] | None:
    """Cosine of each text to ``query``, or None without an embedder or a query."""
    vectors = embed_all(context, [*texts, query]) if texts and query.strip() else None
    if vectors is None:
        return None
    return [cosine(v, vectors[-1]) for v in vectors[:-1]]


def combine(
    weights: Weights,
    dense: Sequence[float],
    texts: Sequence[str],
    recency: Sequence[float],
    query: str,
) -> list[float]:
    """The weighted sum of the four signals, each scaled to [0, 1] over ``texts``."""
    signals = zip(
        normalise(dense), normalise(bm25(query, texts)), recency, map(salience, texts),
        strict=True,
    )
    return [
        weights.dense * d + weights.lexical * lx + weights.recency * r + weights.salience * s
        for d, lx, r, s in signals
    ]


def recency_of(indices: Sequence[int], count: int) -> list[float]:
    """0 for the oldest history message, 1 for the newest."""
    span = max(1, count - 1)
    return [index / span for index in indices]
