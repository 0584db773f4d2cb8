"""Cutting history messages into pieces: token-sized chunks or sentence-level units.

A :class:`Piece` is a character span of one history message's text with its token count
(``TokenCounter.count_text``, cached by content, so a chunk is tokenized once per run
whatever the budget or strategy). Pieces never span two messages, so a packed piece can
always be rendered with its message's role.

Text is cut at sentence ends and line breaks first, then at clause punctuation, then
between words, and only a single word longer than the limit is cut between characters.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_budgetbench.errors import ConfigError
from pytest_budgetbench.messages import Message, text_of
from pytest_budgetbench.options import Option
from pytest_budgetbench.tokens.base import TokenCounter

# Adaptive retrieval: chunks of BASE tokens are embedded once per item; the unit packed at
# a budget is room // SLOTS rounded down to a power of two within [MIN, MAX], made of
# consecutive chunks of one message (small-to-big retrieval).
ADAPTIVE_BASE = 64  # smaller chunks lose the context an embedding needs
ADAPTIVE_SLOTS = 8  # at least ~8 units fit, so retrieval can combine several sources
ADAPTIVE_MIN = 64
ADAPTIVE_MAX = 256  # larger units would pack coarsely: each is all or nothing

_SENTENCE = re.compile(r"(?<=[.!?])\s+|(?<=[。！？])|\n\s*")
_CLAUSE = re.compile(r"(?<=[,;:])\s+")
_WORD = re.compile(r"\s+")
_LEVELS = (_SENTENCE, _CLAUSE, _WORD)


@dataclass(frozen=True)
class Piece:
    """Characters ``start:end`` of history message ``msg``'s text, costing ``tokens``."""

    msg: int
    start: int
    end: int
    tokens: int


@dataclass(frozen=True)
class Chunking:
    """A history cut for retrieval: ``chunks`` are embedded (the same at every budget when
    adaptive), ``units`` are packed; unit ``u`` joins chunks ``members[u]``, consecutive
    chunks of one message."""

    chunks: list[Piece]
    units: list[Piece]
    members: list[list[int]]


def _chunk_option(raw: str) -> str:
    if raw == "adaptive" or (raw.isascii() and raw.isdigit() and int(raw) > 0):
        return raw
    raise ValueError("must be 'adaptive' or a positive token count")


RAG_CHUNK = Option(
    "rag_chunk", "chunk size of retrieval strategies: adaptive or a token count",
    _chunk_option, "adaptive", flag="rag-chunk", metavar="adaptive|TOKENS")
"""Declared by every strategy that cuts the history with :func:`chunk_for_retrieval`."""


def _fixed_size(option: object) -> int | None:
    """The fixed chunk size ``options["rag_chunk"]`` asks for; None for adaptive."""
    if option is None or option == "" or option == "adaptive":
        return None
    try:
        size = int(str(option))
    except ValueError:
        size = 0
    if size <= 0:
        raise ConfigError(
            f"rag_chunk must be 'adaptive' or a positive token count (got {option!r})"
        )
    return size


def chunk_size(option: object, room: int) -> int:
    """The retrieval unit in tokens for ``options["rag_chunk"]`` and the room left for
    history: a fixed count, or for "adaptive" ``room // 8`` rounded down to a power of two
    within 64..256 (powers of two: few distinct unit sizes across budgets)."""
    size = _fixed_size(option)
    if size is not None:
        return size
    target = max(1, room // ADAPTIVE_SLOTS)
    return min(ADAPTIVE_MAX, max(ADAPTIVE_MIN, 1 << (target.bit_length() - 1)))


def chunk_for_retrieval(
    tokens: TokenCounter, history: Sequence[Message], option: object, room: int
) -> Chunking:
    """Chunks of the base size (a fixed size, or 64 when adaptive) grouped into units of
    :func:`chunk_size`; with a fixed size every unit is one chunk."""
    base = _fixed_size(option) or ADAPTIVE_BASE
    chunks = chunk_history(tokens, history, base)
    size = chunk_size(option, room)
    if size <= base:
        return Chunking(chunks, list(chunks), [[i] for i in range(len(chunks))])
    texts = [text_of(m) for m in history]
    units: list[Piece] = []
    members: list[list[int]] = []
    estimate = 0
    for index, chunk in enumerate(chunks):
        if members and chunks[members[-1][-1]].msg == chunk.msg and (
            estimate + chunk.tokens + 1 <= size
        ):
            members[-1].append(index)
            estimate += chunk.tokens + 1
        else:
            members.append([index])
            estimate = chunk.tokens
    for group in members:
        first, last = chunks[group[0]], chunks[group[-1]]
        text = texts[first.msg][first.start : last.end]
        units.append(Piece(first.msg, first.start, last.end, tokens.count_text(text)))
    return Chunking(chunks, units, members)


def _trimmed(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _split(text: str, start: int, end: int, pattern: re.Pattern[str]) -> list[tuple[int, int]]:
    """Non-blank spans of ``text[start:end]`` between matches of ``pattern``."""
    spans: list[tuple[int, int]] = []
    cursor = start
    for match in pattern.finditer(text, start, end):
        if match.end() == match.start() and match.start() in (start, end):
            continue
        span = _trimmed(text, cursor, match.start())
        if span[1] > span[0]:
            spans.append(span)
        cursor = match.end()
    span = _trimmed(text, cursor, end)
    if span[1] > span[0]:
        spans.append(span)
    return spans


def fit_prefix(tokens: TokenCounter, text: str, start: int, end: int, limit: int) -> int:
    """The largest ``stop`` in ``start..end`` with ``text[start:stop]`` at most ``limit``
    tokens, cut after a word when one fits, else between characters; ``start`` if none."""
    if limit <= 0 or end <= start:
        return start
    if tokens.count_text(text[start:end]) <= limit:
        return end
    stops = [m.start() for m in _WORD.finditer(text, start, end) if m.start() > start]
    best = _search(tokens, text, start, stops, limit)
    if best > start:
        return best
    first_word_end = stops[0] if stops else end
    return _search(tokens, text, start, list(range(start + 1, first_word_end + 1)), limit)


def _search(tokens: TokenCounter, text: str, start: int, stops: list[int], limit: int) -> int:
    """Binary search over increasing ``stops`` for the last one that fits."""
    low, high, best = 0, len(stops) - 1, start
    while low <= high:
        middle = (low + high) // 2
        if tokens.count_text(text[start : stops[middle]]) <= limit:
            best, low = stops[middle], middle + 1
        else:
            high = middle - 1
    return best


def _cut(
    tokens: TokenCounter, text: str, start: int, end: int, limit: int, level: int
) -> list[tuple[int, int, int]]:
    """``text[start:end]`` as spans of at most ``limit`` tokens, at the coarsest level."""
    count = tokens.count_text(text[start:end])
    if count <= limit:
        return [(start, end, count)]
    while level < len(_LEVELS):
        spans = _split(text, start, end, _LEVELS[level])
        level += 1
        if len(spans) > 1:
            parts = [p for s, e in spans for p in _cut(tokens, text, s, e, limit, level)]
            return _merge(tokens, text, parts, limit)
    return _cut_chars(tokens, text, start, end, limit)


def _cut_chars(
    tokens: TokenCounter, text: str, start: int, end: int, limit: int
) -> list[tuple[int, int, int]]:
    parts = []
    while start < end:
        stop = _search(tokens, text, start, list(range(start + 1, end + 1)), max(1, limit))
        stop = max(stop, start + 1)  # one character even if it alone is over the limit
        parts.append((start, stop, tokens.count_text(text[start:stop])))
        start = stop
    return parts


def _merge(
    tokens: TokenCounter, text: str, parts: list[tuple[int, int, int]], limit: int
) -> list[tuple[int, int, int]]:
    """Join neighbouring parts while their summed count stays within ``limit``."""
    merged: list[tuple[int, int, int]] = []
    group_start, group_end, group_tokens = parts[0]
    for start, end, count in parts[1:]:
        if group_tokens + count + 1 <= limit:
            group_end, group_tokens = end, group_tokens + count + 1
            continue
        merged.append((group_start, group_end, group_tokens))
        group_start, group_end, group_tokens = start, end, count
    merged.append((group_start, group_end, group_tokens))
    # Summed counts were estimates: store each chunk's exact (cached) count.
    return [(s, e, tokens.count_text(text[s:e])) for s, e, _ in merged]


def chunk_history(tokens: TokenCounter, history: Sequence[Message], size: int) -> list[Piece]:
    """Every history message cut into chunks of at most ``size`` tokens, in order.

    A message within ``size`` stays one chunk; longer ones are cut at sentence ends and
    the sentences merged back up to ``size``. Messages without text have no pieces.
    """
    pieces: list[Piece] = []
    for index, message in enumerate(history):
        text = text_of(message)
        start, end = _trimmed(text, 0, len(text))
        if end > start:
            pieces += [Piece(index, s, e, n) for s, e, n in _cut(tokens, text, start, end, size, 0)]
    return pieces


RECENT_CHUNK_TOKENS = 64  # granularity of a newest-history fill (its oldest message may be cut)


def newest_first(tokens: TokenCounter, history: Sequence[Message],
                 size: int = RECENT_CHUNK_TOKENS) -> list[Piece]:
    """The history in chunks of at most ``size`` tokens, newest first: what a strategy
    packs to keep the most recent history that fits (a FIFO tail)."""
    return sorted(chunk_history(tokens, history, size), key=lambda p: (-p.msg, -p.start))


def sentence_history(
    tokens: TokenCounter, history: Sequence[Message], max_unit: int
) -> list[Piece]:
    """Every history message cut into sentences; a sentence over ``max_unit`` tokens is
    cut further into clauses or word runs (phrases)."""
    pieces: list[Piece] = []
    for index, message in enumerate(history):
        text = text_of(message)
        for s, e in _split(text, 0, len(text), _SENTENCE):
            pieces += [Piece(index, a, b, n) for a, b, n in _cut(tokens, text, s, e, max_unit, 1)]
    return pieces


def piece_text(history_texts: Sequence[str], piece: Piece) -> str:
    return history_texts[piece.msg][piece.start : piece.end]
