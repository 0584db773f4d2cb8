"""``rag``: retrieve the history chunks most similar to the query, in an in-memory chromadb.

Per cell: when the whole prompt fits it is sent unchanged. Otherwise the history is cut
into chunks, each chunk is embedded with the run's embedder (cached by content) and stored
in an in-memory chromadb collection, the collection is queried with the final user
message, and retrieval units are packed best first into what remains after the system
messages and the query, then put back in chronological order.

Chunk size (``options["rag_chunk"]``): a fixed token count makes chunks and units of that
size. "adaptive" (the default) embeds 64-token chunks, the same at every budget, so an
item's vectors and chromadb collection serve every budget tier and every retrieval
strategy; the unit packed at a budget is ``room // 8`` rounded down to a power of two within
64..256 tokens (room: the budget less system messages and query), made of consecutive
chunks of one message, and it ranks by its best chunk (small-to-big retrieval). A message
within the unit size is one unit.

Units of one message packed together become one message with the original role, joined
by the original text between neighbours and by ``" […] "`` across left-out text, with a
``[…]`` marker where the message's beginning or end is missing; a message whose units were
all kept is sent unchanged (see :mod:`~pytest_budgetbench.strategies._packing`).

An agent's trajectory (tool calls and results) is retrieved by whole units instead
(``messages.exchanges``: a call with its results, or one message), so no pair is ever
broken: the system messages, the first user turn and the last unit (what the model answers
now) are kept, the other units are ranked by similarity to the latest user turn, packed
best first into the room left, and sent in their order.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from pytest_budgetbench.errors import MissingDependency, Requirement
from pytest_budgetbench.messages import Message, text_of, tool_calls_of
from pytest_budgetbench.strategies._agent import (
    Trajectory,
    Unit,
    fit_agent,
    split_trajectory,
    unit_cost,
)
from pytest_budgetbench.strategies._chunking import Chunking, Piece, piece_text
from pytest_budgetbench.strategies._packing import ChunkRanking, units_by_chunk_order
from pytest_budgetbench.strategies.base import Regime

# Collections of the most recent items/chunk sizes kept in memory (an item usually needs
# one to three: adaptive chunk sizes are powers of two).
COLLECTIONS_KEPT = 16


class ChunkStore:
    """In-memory chromadb collections keyed by the chunks they hold and the embedder.

    A key is a hash of content, not an item id, so reusing a collection can never change a
    result: it is exactly the collection the cell would have built. chromadb is always
    given precomputed vectors and no embedding function, so it never fetches a model.
    """

    def __init__(self, capacity: int = COLLECTIONS_KEPT) -> None:
        self.capacity = capacity
        self._client: Any = None
        self._collections: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def client(self) -> Any:
        if self._client is None:
            try:
                import chromadb
                from chromadb.config import Settings
            except ImportError as exc:
                raise MissingDependency("chromadb", "retrieval", "the rag strategy") from exc
            self._client = chromadb.EphemeralClient(
                settings=Settings(anonymized_telemetry=False, allow_reset=True)
            )
        return self._client

    def collection(
        self, embedder: str, texts: Sequence[str], vectors: Sequence[Sequence[float]]
    ) -> Any:
        digest = hashlib.sha256("\x1f".join([embedder, *texts]).encode("utf-8")).hexdigest()
        name = f"budgetbench-{digest[:40]}"
        with self._lock:
            found = self._collections.get(name)
            if found is not None:
                self._collections.move_to_end(name)
                return found
            client = self.client()
            # Default l2 space on unit vectors ranks as cosine, on every chromadb version.
            collection = client.get_or_create_collection(name=name, embedding_function=None)
            if collection.count() != len(texts):
                self._add(client, collection, texts, vectors)
            self._collections[name] = collection
            while len(self._collections) > self.capacity:
                client.delete_collection(self._collections.popitem(last=False)[0])
            return collection

    def clear(self) -> None:
        """Drop every kept collection (benchmarks: a new process starts without them)."""
        with self._lock:
            while self._collections:
                self.client().delete_collection(self._collections.popitem()[0])

    @staticmethod
    def _add(
        client: Any, collection: Any, texts: Sequence[str], vectors: Sequence[Sequence[float]]
    ) -> None:
        step = max(1, int(client.get_max_batch_size()))
        for start in range(0, len(texts), step):
            stop = start + step
            collection.upsert(
                ids=[str(i) for i in range(start, min(stop, len(texts)))],
                embeddings=[unit_vector(v) for v in vectors[start:stop]],
                documents=list(texts[start:stop]),
            )

    @staticmethod
    def nearest(collection: Any, vector: Sequence[float], count: int) -> list[int]:
        """Indices of all ``count`` stored chunks, nearest first (ties: older first)."""
        result = collection.query(
            query_embeddings=[unit_vector(vector)], n_results=count, include=["distances"]
        )
        pairs = sorted(zip(result["distances"][0], map(int, result["ids"][0]), strict=True))
        order = [index for _distance, index in pairs]
        # HNSW may return fewer than asked: the rest follow, newest first.
        seen = set(order)
        return order + [i for i in reversed(range(count)) if i not in seen]


STORE = ChunkStore()


def latest_request(messages: Sequence[Message]) -> str:
    """The text of the newest user turn: what an agent is working on now."""
    return next((text_of(m) for m in reversed(messages) if m.get("role") == "user"), "")


def unit_text(unit: Unit) -> str:
    """What a unit says, for embedding: its text, and each call as ``name(arguments)``."""
    parts: list[str] = []
    for message in unit:
        parts.extend(f"{call.get('function', {}).get('name')}("
                     f"{call.get('function', {}).get('arguments')})"
                     for call in tool_calls_of(message))
        parts.append(text_of(message))
    return "\n".join(part for part in parts if part)


def unit_vector(vector: Sequence[float]) -> list[float]:
    """``vector`` scaled to length 1 (any embedder's vectors then rank by cosine)."""
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector]


class Rag(ChunkRanking):
    """Dense retrieval of history chunks by similarity to the query, via chromadb."""

    name = "rag"
    requires = (Requirement("chromadb", "retrieval"),)
    uses_embedder = True
    regimes = frozenset({Regime.LOCAL_ONLY, Regime.RESET_PER_ITEM})
    handles_tools = True

    def apply(self, messages: Sequence[Message], budget: int) -> list[Message]:
        if not any(m.get("role") == "tool" or tool_calls_of(m) for m in messages):
            return super().apply(messages, budget)
        tokens = self.context.tokens
        if tokens.count_messages(messages) <= budget:
            return [dict(m) for m in messages]
        trajectory = split_trajectory(messages)
        if len(trajectory.units) <= 1:
            return fit_agent(tokens, trajectory, trajectory.units, budget)
        return self._retrieve_units(trajectory, latest_request(messages), budget)

    def _retrieve_units(self, trajectory: Trajectory, query: str, budget: int) -> list[Message]:
        """The front, the units most similar to ``query`` that fit, and the last unit."""
        tokens = self.context.tokens
        earlier, last = trajectory.units[:-1], trajectory.units[-1]
        front = next((f for f in (trajectory.front, trajectory.head)
                      if tokens.count_messages([*f, *last]) <= budget), trajectory.head)
        embedder = self.context.embedder
        texts = [unit_text(unit) for unit in earlier]
        vectors = embedder.embed([*texts, query])
        collection = STORE.collection(embedder.name, texts, vectors[:-1])
        ranked = STORE.nearest(collection, vectors[-1], len(texts))
        used = tokens.count_messages([*front, *last])
        chosen: list[int] = []
        for index in ranked:
            cost = unit_cost(tokens, earlier[index])
            if used + cost <= budget:
                chosen.append(index)
                used += cost
        while True:  # planned on per-message counts: the exact count has the last word
            kept = [earlier[index] for index in sorted(chosen)]
            prompt = [dict(m) for m in [*front, *(m for u in kept for m in u), *last]]
            if not chosen or tokens.count_messages(prompt) <= budget:
                return prompt
            chosen.pop()  # the least similar goes first

    def rank(self, history: Sequence[Message], chunking: Chunking, query: str) -> list[Piece]:
        """Units by their chunk most similar to ``query``; newest first without a query."""
        if not chunking.units:
            return []
        if not query.strip():
            return sorted(chunking.units, key=lambda p: (-p.msg, -p.start))
        sources = [text_of(m) for m in history]
        texts = [piece_text(sources, p) for p in chunking.chunks]
        embedder = self.context.embedder
        vectors = embedder.embed([*texts, query])
        collection = STORE.collection(embedder.name, texts, vectors[:-1])
        order = STORE.nearest(collection, vectors[-1], len(texts))
        return units_by_chunk_order(chunking, order)
