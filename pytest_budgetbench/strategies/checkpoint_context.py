"""``checkpoint_context``: an extractive checkpoint, a recent tail, and query evidence.

When the prompt does not fit, the room left after the system messages and the query is
shared out by fixed constants:

- ``CHECKPOINT_SHARE`` (20%): a checkpoint of the history older than the tail, in one
  system message after the leading system messages: its most informative sentences
  (salient, rare, the user's own first), deduplicated, in chronological order, grouped under
  the latest leading ``[tag]`` (e.g. a session date) seen before them;
- ``TAIL_SHARE`` (30%): the newest history units (rag's chunking), verbatim;
- ``EVIDENCE_SHARE`` (50%): units ranked by the ``lean_retrieval`` hybrid score for the
  query. Evidence also takes whatever the checkpoint and tail leave unused.

Nothing needs a model beyond the run's (cached) embedder. Tail and evidence go through the
shared packer, which verifies the exact count, so the prompt never exceeds the budget.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

from pytest_budgetbench.messages import Message, text_of
from pytest_budgetbench.strategies._chunking import RAG_CHUNK, Piece, sentence_history
from pytest_budgetbench.strategies._packing import (
    HistoryStrategy,
    Packer,
    query_text,
    retrieval_chunking,
)
from pytest_budgetbench.strategies._scoring import normalise, salience, terms
from pytest_budgetbench.strategies.base import Regime
from pytest_budgetbench.strategies.lean_retrieval import rank_hybrid

CHECKPOINT_SHARE = 0.20
TAIL_SHARE = 0.30
EVIDENCE_SHARE = 1.0 - CHECKPOINT_SHARE - TAIL_SHARE  # documented; evidence takes the rest
CHECKPOINT_HEADER = "Checkpoint of the earlier conversation (extracted sentences):"
MAX_SENTENCE_TOKENS = 48  # longer sentences enter the checkpoint clause by clause
DUPLICATE_JACCARD = 0.5  # a sentence this close in words to a chosen one adds nothing
# Checkpoint sentence score: what a later question is likely to be about.
SALIENCE_WEIGHT, RARITY_WEIGHT, USER_WEIGHT = 0.4, 0.3, 0.3

LINE_TOKENS = 4  # "- user: " and the line break, roughly

_TAG = re.compile(r"\s*\[([^\]\n]{1,40})\]\s*")


class CheckpointContext(HistoryStrategy):
    """Checkpoint of older history + recent tail + query-relevant evidence, by shares."""

    name = "checkpoint_context"
    uses_embedder = True
    regimes = frozenset({Regime.LOCAL_ONLY, Regime.RESET_PER_ITEM})
    declared_options = (RAG_CHUNK,)

    def fit(self, head: list[Message], history: list[Message], query: list[Message],
            room: int, budget: int) -> list[Message]:
        packer = Packer(self.context.tokens, history)
        chunking = retrieval_chunking(self.context, history, room)
        tail = self._tail(packer, chunking.units, int(room * TAIL_SHARE))
        older = min((p.msg for p in tail), default=len(history))
        fixed = self._checkpoint(history[:older], int(room * CHECKPOINT_SHARE))
        in_tail = set(tail)
        ranked = rank_hybrid(self.context, history, chunking, query_text(query))
        evidence = [p for p in ranked if p not in in_tail]
        return packer.pack(head, query, tail + evidence, budget, fixed)

    @staticmethod
    def _tail(packer: Packer, pieces: Sequence[Piece], share: int) -> list[Piece]:
        """The newest pieces whose estimated cost fits ``share``, newest first."""
        tail: list[Piece] = []
        opened: set[int] = set()
        for piece in sorted(pieces, key=lambda p: (-p.msg, -p.start)):
            cost = piece.tokens + (1 if piece.msg in opened else packer.framing(piece.msg))
            if cost > share:
                break
            share -= cost
            tail.append(piece)
            opened.add(piece.msg)
        return tail

    # -- the checkpoint ------------------------------------------------------------------
    def _checkpoint(self, older: Sequence[Message], share: int) -> list[Message]:
        """The checkpoint message, within ``share`` tokens, or none."""
        tokens = self.context.tokens
        limit = share - tokens.count_message({"role": "system", "content": CHECKPOINT_HEADER})
        units = sentence_history(tokens, older, MAX_SENTENCE_TOKENS)
        if limit <= 0 or not units:
            return []
        texts = [text_of(m) for m in older]
        lines = [_TAG.sub("", texts[u.msg][u.start : u.end], count=1).strip() for u in units]
        chosen = self._choose(older, units, lines, limit)
        while chosen:
            content = CHECKPOINT_HEADER + _render(older, units, lines, chosen)
            if tokens.count_message({"role": "system", "content": content}) <= share:
                return [{"role": "system", "content": content}]
            chosen.pop()  # the least informative: headers and joins cost more than estimated
        return []

    def _choose(
        self, older: Sequence[Message], units: Sequence[Piece], lines: Sequence[str], limit: int
    ) -> list[int]:
        """Unit indices, most informative first, deduplicated, within ``limit`` (estimated)."""
        scores = _informativeness(older, units, lines)
        chosen: list[int] = []
        seen: list[set[str]] = []
        for index in sorted(range(len(units)), key=lambda i: (-scores[i], units[i].msg)):
            words = set(terms(lines[index]))
            cost = units[index].tokens + LINE_TOKENS
            if not words or cost > limit or _duplicate(words, seen):
                continue
            limit -= cost
            chosen.append(index)
            seen.append(words)
        return chosen


def _informativeness(
    older: Sequence[Message], units: Sequence[Piece], lines: Sequence[str]
) -> list[float]:
    """Salience, rarity (mean inverse document frequency of the words) and authorship."""
    bags = [set(terms(line)) for line in lines]
    frequency: Counter[str] = Counter()
    for bag in bags:
        frequency.update(bag)
    rarity = normalise(
        [sum(math.log(len(bags) / frequency[w]) for w in bag) / len(bag) if bag else 0.0
         for bag in bags]
    )
    return [
        SALIENCE_WEIGHT * salience(line)
        + RARITY_WEIGHT * rare
        + USER_WEIGHT * (older[unit.msg].get("role") == "user")
        for unit, line, rare in zip(units, lines, rarity, strict=True)
    ]


def _render(
    older: Sequence[Message], units: Sequence[Piece], lines: Sequence[str], chosen: Sequence[int]
) -> str:
    """Chosen lines in chronological order, under the latest ``[tag]`` seen before each."""
    tags = _tags(older)
    out: list[str] = []
    current: str | None = None
    for index in sorted(chosen, key=lambda i: (units[i].msg, units[i].start)):
        tag = tags[units[index].msg]
        if tag is not None and tag != current:
            out.append(f"[{tag}]")
            current = tag
        out.append(f"- {older[units[index].msg].get('role')}: {lines[index]}")
    return "\n" + "\n".join(out)


def _tags(history: Sequence[Message]) -> list[str | None]:
    """For each message, the latest leading ``[tag]`` at or before it."""
    tags: list[str | None] = []
    current: str | None = None
    for message in history:
        match = _TAG.match(text_of(message))
        if match:
            current = match.group(1)
        tags.append(current)
    return tags


def _duplicate(words: set[str], seen: Sequence[set[str]]) -> bool:
    """Whether ``words`` overlap a chosen line's words by the Jaccard threshold."""
    return any(len(words & s) >= DUPLICATE_JACCARD * len(words | s) for s in seen)
