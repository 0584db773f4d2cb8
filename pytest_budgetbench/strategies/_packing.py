"""Packing ranked pieces of history into what the budget leaves, tightly and safely.

Shared by every strategy that selects pieces (rag, lean_retrieval, checkpoint_context,
compression, summary_buffer), as is their common flow (:class:`HistoryStrategy`). Given
pieces in order of preference, the packer

1. admits them greedily on cached per-piece counts (a piece that does not fit is skipped,
   so smaller later pieces can still fill the room);
2. renders the admitted pieces in chronological order, one message per source message,
   with the source message's role (a chunk of a user message stays a user message);
3. counts the assembled prompt exactly (``count_messages``) and drops the least preferred
   pieces until it fits: the result never exceeds the budget;
4. tops up what exact counting left free with more pieces, and finally with the best
   remaining piece cut to the free room, so the prompt ends close to the budget.

A message whose pieces were all admitted is sent unchanged. Otherwise its kept pieces are
joined in their original order: neighbouring pieces with the original text between them,
others with the layout's gap marker (``" […] "`` for retrieval), and a marker where the
message's beginning or end was left out.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pytest_budgetbench.messages import Message, split_ends, text_of
from pytest_budgetbench.strategies._chunking import (
    RAG_CHUNK,
    Chunking,
    Piece,
    chunk_for_retrieval,
    fit_prefix,
)
from pytest_budgetbench.strategies.base import Strategy, StrategyContext
from pytest_budgetbench.tokens.base import TokenCounter

# Below this many free tokens a cut piece is more noise than evidence.
MIN_PARTIAL_TOKENS = 8
# How many of the best remaining pieces the final fill tries to cut to size.
PARTIAL_TRIES = 3
TOP_UP_ROUNDS = 4


@dataclass(frozen=True)
class Layout:
    """How the kept parts of a partially kept message are joined."""

    gap: str = " […] "
    lead: str = "[…] "
    trail: str = " […]"


RETRIEVAL = Layout()
"""Chunks retrieved out of context: omissions are marked."""
PROSE = Layout(gap=" ", lead="", trail="")
"""Sentences kept by compression: the message simply reads shorter."""


def prompt_fits(tokens: TokenCounter, messages: Sequence[Message], budget: int) -> bool:
    """Whether the untouched prompt fits (estimate first: it is cached and cheap)."""
    return tokens.estimate(messages) <= budget and tokens.count_messages(messages) <= budget


def history_room(
    tokens: TokenCounter, head: Sequence[Message], query: Sequence[Message], budget: int
) -> int:
    """Tokens left for history after the system messages and the query."""
    return budget - tokens.count_messages([*head, *query])


class Packer:
    """Packs pieces of one history; see the module docstring."""

    def __init__(
        self, tokens: TokenCounter, history: Sequence[Message], layout: Layout = RETRIEVAL
    ) -> None:
        self.tokens = tokens
        self.history = history
        self.texts = [text_of(m) for m in history]
        self.layout = layout
        self._gap = self._marker_tokens(layout.gap)
        self._edges = self._marker_tokens(layout.lead) + self._marker_tokens(layout.trail)

    def _marker_tokens(self, marker: str) -> int:
        return self.tokens.count_text(marker) if marker.strip() else (1 if marker else 0)

    def framing(self, msg: int) -> int:
        """What opening a message costs beyond its text (cached per role by the counter)."""
        return self.tokens.count_message({"role": self.history[msg].get("role"), "content": ""})

    # -- the packing ---------------------------------------------------------------------
    def pack(
        self,
        head: Sequence[Message],
        query: Sequence[Message],
        ranked: Sequence[Piece],
        budget: int,
        fixed: Sequence[Message] = (),
    ) -> list[Message]:
        """``head + fixed + packed history + query``, within ``budget`` when head and
        query alone fit. ``fixed`` (e.g. a summary) is dropped if it alone does not fit."""
        if fixed and self.tokens.count_messages([*head, *fixed, *query]) > budget:
            fixed = ()
        frame = _Frame(list(head), list(fixed), list(query))
        room = budget - self.tokens.count_messages(frame.assemble([]))
        if room <= 0 or not ranked:
            return frame.assemble([])
        chosen = self._greedy(ranked, room, [])
        prompt, counted = self._fit(frame, chosen, budget)
        return self._top_up(frame, ranked, chosen, prompt, counted, budget)

    def _cost(self, piece: Piece, opened: set[int]) -> int:
        if piece.msg in opened:
            return piece.tokens + self._gap
        return piece.tokens + self.framing(piece.msg) + (0 if self._whole(piece) else self._edges)

    def _whole(self, piece: Piece) -> bool:
        """Whether ``piece`` is all of its message's text (no markers needed)."""
        text = self.texts[piece.msg]
        return not text[: piece.start].strip() and not text[piece.end :].strip()

    def _greedy(self, ranked: Iterable[Piece], room: int, chosen: list[Piece]) -> list[Piece]:
        """Admit pieces in order while their estimated cost fits; returns the new ones."""
        taken = set(chosen)
        opened = {p.msg for p in chosen}
        admitted: list[Piece] = []
        for piece in ranked:
            if piece in taken:
                continue
            cost = self._cost(piece, opened)
            if cost <= room:
                room -= cost
                admitted.append(piece)
                taken.add(piece)
                opened.add(piece.msg)
        return admitted

    def _fit(
        self, frame: _Frame, chosen: list[Piece], budget: int
    ) -> tuple[list[Message], int]:
        """Drop the least preferred pieces (in place) until the exact count fits."""
        prompt = frame.assemble(self.render(chosen))
        counted = self.tokens.count_messages(prompt)
        while counted > budget and chosen:
            excess, dropped = counted - budget, 0
            while chosen and dropped < excess:
                dropped += chosen.pop().tokens + 1
            prompt = frame.assemble(self.render(chosen))
            counted = self.tokens.count_messages(prompt)
        return prompt, counted

    def _top_up(
        self,
        frame: _Frame,
        ranked: Sequence[Piece],
        chosen: list[Piece],
        prompt: list[Message],
        counted: int,
        budget: int,
    ) -> list[Message]:
        """Fill what the exact count left free; keep the last prompt known to fit."""
        shortfall = 0  # how much the estimates undercounted so far: plan with that less
        for _ in range(TOP_UP_ROUNDS):
            slack = budget - counted - shortfall
            if slack <= 0:
                break
            extra = self._greedy(ranked, slack, chosen)
            final = not extra  # a cut piece is the last fill: nothing smaller remains
            if final:
                extra = self._partial(ranked, chosen, slack)
            if not extra:
                break
            trial = chosen + extra
            trial_prompt = frame.assemble(self.render(trial))
            trial_count = self.tokens.count_messages(trial_prompt)
            if trial_count > budget:
                shortfall += trial_count - budget
                continue
            chosen, prompt, counted = trial, trial_prompt, trial_count
            if final:
                break
        return prompt

    def _partial(self, ranked: Sequence[Piece], chosen: list[Piece], slack: int) -> list[Piece]:
        """The best remaining piece whose beginning, cut to the free room, is worth it."""
        taken = set(chosen)
        opened = {p.msg for p in chosen}
        tries = 0
        for piece in ranked:
            if piece in taken or _overlaps(piece, chosen):
                continue
            tries += 1
            if tries > PARTIAL_TRIES:
                break
            overhead = self._gap if piece.msg in opened else self.framing(piece.msg)
            limit = slack - overhead - self._edges
            if limit < MIN_PARTIAL_TOKENS:
                continue
            text = self.texts[piece.msg]
            stop = fit_prefix(self.tokens, text, piece.start, piece.end, limit)
            if stop > piece.start:
                count = self.tokens.count_text(text[piece.start : stop])
                return [Piece(piece.msg, piece.start, stop, count)]
        return []

    # -- rendering -----------------------------------------------------------------------
    def render(self, pieces: Iterable[Piece]) -> list[Message]:
        """The pieces as messages, in chronological order."""
        by_message: dict[int, list[Piece]] = {}
        for piece in pieces:
            by_message.setdefault(piece.msg, []).append(piece)
        return [self._render_one(msg, by_message[msg]) for msg in sorted(by_message)]

    def _render_one(self, msg: int, pieces: list[Piece]) -> Message:
        text = self.texts[msg]
        segments = _segments(text, pieces)
        source = self.history[msg]
        first, last = segments[0][0], segments[-1][1]
        whole_start = not text[:first].strip()
        whole_end = not text[last:].strip()
        if len(segments) == 1 and whole_start and whole_end:
            return dict(source)
        layout = self.layout
        body = layout.gap.join(text[s:e] for s, e in segments)
        content = ("" if whole_start else layout.lead) + body + ("" if whole_end else layout.trail)
        return {**source, "content": content}


@dataclass
class _Frame:
    """The fixed parts of the prompt, around the packed history."""

    head: list[Message]
    fixed: list[Message]
    query: list[Message]

    def assemble(self, history: list[Message]) -> list[Message]:
        return [dict(m) for m in self.head + self.fixed] + history + [dict(m) for m in self.query]


def _segments(text: str, pieces: list[Piece]) -> list[tuple[int, int]]:
    """Kept spans, neighbours (only whitespace between) merged, in text order."""
    spans: list[tuple[int, int]] = []
    for piece in sorted(pieces, key=lambda p: (p.start, p.end)):
        if spans and not text[spans[-1][1] : piece.start].strip():
            spans[-1] = (spans[-1][0], max(spans[-1][1], piece.end))
        else:
            spans.append((piece.start, piece.end))
    return spans


def _overlaps(piece: Piece, chosen: Sequence[Piece]) -> bool:
    return any(p.msg == piece.msg and p.start < piece.end and piece.start < p.end for p in chosen)


class HistoryStrategy(Strategy):
    """The common flow of the strategies that choose among the history: send the prompt
    unchanged when it fits; else split it into system messages, history and query, and keep
    only those two when they leave no room; else let :meth:`fit` choose."""

    def apply(self, messages: Sequence[Message], budget: int) -> list[Message]:
        tokens = self.context.tokens
        if prompt_fits(tokens, messages, budget):
            return [dict(m) for m in messages]
        head, history, query = split_ends(messages)
        room = history_room(tokens, head, query, budget)
        if room <= 0:
            return [dict(m) for m in head + query]
        return self.fit(head, history, query, room, budget)

    @abstractmethod
    def fit(self, head: list[Message], history: list[Message], query: list[Message],
            room: int, budget: int) -> list[Message]:
        """The prompt for a history that does not fit; ``room`` (> 0) is what the budget
        leaves after ``head`` and ``query``."""


def retrieval_chunking(context: StrategyContext, history: Sequence[Message], room: int) -> Chunking:
    """The history cut for retrieval as ``options["rag_chunk"]`` asks (default adaptive)."""
    option = context.options.get("rag_chunk", "adaptive")
    return chunk_for_retrieval(context.tokens, history, option, room)


def query_text(query: Sequence[Message]) -> str:
    """The final user query's text ("" when the prompt has none)."""
    return text_of(query[-1]) if query else ""


class ChunkRanking(HistoryStrategy):
    """The flow of rag and lean_retrieval: cut the history for retrieval
    (``options["rag_chunk"]``), rank the units, pack the best."""

    declared_options = (RAG_CHUNK,)

    def fit(self, head: list[Message], history: list[Message], query: list[Message],
            room: int, budget: int) -> list[Message]:
        ranked = self.rank(history, retrieval_chunking(self.context, history, room),
                           query_text(query))
        return Packer(self.context.tokens, history).pack(head, query, ranked, budget)

    @abstractmethod
    def rank(self, history: Sequence[Message], chunking: Chunking, query: str) -> list[Piece]:
        """``chunking.units`` in order of preference for ``query``."""


def units_by_chunk_order(chunking: Chunking, order: Sequence[int]) -> list[Piece]:
    """Units ranked by their best chunk in ``order`` (chunk indices, best first)."""
    unit_of = {c: u for u, group in enumerate(chunking.members) for c in group}
    ranked: list[int] = []
    seen: set[int] = set()
    for chunk in order:
        unit = unit_of[chunk]
        if unit not in seen:
            seen.add(unit)
            ranked.append(unit)
    return [chunking.units[u] for u in ranked]
