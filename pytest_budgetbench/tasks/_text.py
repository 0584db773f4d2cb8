"""Text helpers shared by the real-benchmark tasks: answer normalisation, token F1, reply
cleaning, phrase containment, and chunking long documents into several messages.

Every task that scores text uses these functions, so that two graders never disagree on
what "normalised" means. The normalisation follows the official SQuAD / HotpotQA /
LoCoMo scripts: lower-case, drop ``string.punctuation``, drop articles by the same word-
boundary regex, collapse whitespace.
"""

from __future__ import annotations

import functools
import re
import string
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from pytest_budgetbench.errors import require
from pytest_budgetbench.messages import Message, text_of

CHARS_PER_TOKEN = 4
"""How tasks approximate tokens when chunking: the tokenizer is not known at load time."""

SQUAD_ARTICLES: tuple[str, ...] = ("a", "an", "the")
LOCOMO_ARTICLES: tuple[str, ...] = ("a", "an", "the", "and")

_PUNCTUATION = frozenset(string.punctuation)

ABSTAIN_PHRASES: tuple[str, ...] = (
    "unknown",
    "dont know",
    "do not know",
    "not mentioned",
    "no information",
    "not enough",
    "insufficient information",
    "no mention",
    "not stated",
    "not specified",
    "not provided",
    "cannot determine",
    "cant determine",
    "cannot be determined",
    "cannot answer",
    "cant answer",
    "unanswerable",
    "not sure",
    "did not mention",
    "didnt mention",
    "never mentioned",
)
"""Normalised phrases that mark a reply as "the history does not say"."""


# -- normalisation and F1 ---------------------------------------------------------------
def normalize_answer(text: str, articles: Sequence[str] = SQUAD_ARTICLES) -> str:
    """SQuAD-style normalisation: lower, no punctuation, no articles, single spaces."""
    lowered = str(text).lower()
    no_punct = "".join(ch for ch in lowered if ch not in _PUNCTUATION)
    if articles:
        pattern = r"\b(" + "|".join(re.escape(a) for a in articles) + r")\b"
        no_punct = re.sub(pattern, " ", no_punct)
    return " ".join(no_punct.split())


def token_f1(prediction: Sequence[str], gold: Sequence[str]) -> tuple[float, float, float]:
    """(F1, precision, recall) of two token lists by multiset overlap; 0 when either is empty."""
    common = Counter(prediction) & Counter(gold)
    same = sum(common.values())
    if same == 0:
        return 0.0, 0.0, 0.0
    precision = same / len(prediction)
    recall = same / len(gold)
    return 2 * precision * recall / (precision + recall), precision, recall


@functools.cache
def _nltk_stemmer() -> Callable[[str], str]:
    stem_module: Any = require("nltk.stem", "locomo", "LoCoMo's official F1 (Porter stems)")
    # LoCoMo's evaluation.py builds PorterStemmer() with its default mode, NLTK_EXTENSIONS.
    stem: Callable[[str], str] = stem_module.PorterStemmer().stem
    return stem


@functools.lru_cache(maxsize=65536)
def porter_stem(word: str) -> str:
    """``nltk.stem.PorterStemmer().stem(word)``, exactly as LoCoMo's scorer stems."""
    return _nltk_stemmer()(word)


def stemmed_tokens(text: str, articles: Sequence[str] = LOCOMO_ARTICLES) -> list[str]:
    """Normalised, Porter-stemmed tokens (LoCoMo's F1 input)."""
    return [porter_stem(word) for word in normalize_answer(text, articles).split()]


# -- replies ----------------------------------------------------------------------------
_ANSWER_LABEL = re.compile(r"^\s*(?:final\s+|short\s+)?answer\s*[:\-]\s*", re.IGNORECASE)


def clean_reply(reply: str | None) -> str:
    """The reply without markdown emphasis (``*``) and surrounding whitespace."""
    return (reply or "").replace("*", "").strip()


def short_answer(reply: str | None) -> str:
    """The first non-empty line of a reply, without markdown and an "Answer:" label.

    Short-answer benchmarks score the answer span; a model that adds an explanation on
    later lines should not be charged for it, nor credited for words it hedged with there.
    """
    for line in clean_reply(reply).splitlines():
        line = _ANSWER_LABEL.sub("", line).strip()
        if line:
            return line
    return ""


_SHORT_LINE_WORDS = 6
_HEDGE_OPENERS = frozenset({"or", "maybe", "perhaps", "possibly", "alternatively"})
_SENTENCE = re.compile(r"^\S+(?:\s+\S+){2,}[.!?]$")


def first_line_unless_hedged(reply: str | None) -> str:
    """The ``first-line`` grader variant's answer: ``short_answer(reply)``, unless the
    reply hedges, then the raw reply (scored as upstream scores it).

    Chatty small models put the answer on the first line and an explanation after it; the
    variant scores that line. A hedge must never gain from this, so the reply is returned
    whole when its words hold both "yes" and "no", when a later line opens with "or",
    "maybe", "perhaps", "possibly" or "alternatively", or when two or more lines are
    different short answers (at most six words, and not a sentence of three or more words
    ending in ``.``, ``!`` or ``?``), e.g. ``"Paris\nLyon"``.
    """
    raw = reply or ""
    lines = [_ANSWER_LABEL.sub("", line).strip() for line in clean_reply(raw).splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return ""
    if {"yes", "no"} <= set(normalize_answer(raw).split()):
        return raw
    openers = {(normalize_answer(line).split() or [""])[0] for line in lines[1:]}
    if openers & _HEDGE_OPENERS:
        return raw
    candidates = {normalize_answer(line) for line in lines
                  if len(line.split()) <= _SHORT_LINE_WORDS and not _SENTENCE.match(line)}
    if len(candidates) > 1:
        return raw
    return lines[0]


def contains_phrase(haystack: str, needle: str) -> bool:
    """Whether the normalised ``needle`` occurs in the normalised ``haystack`` as whole words.

    An empty needle is never contained: an empty gold answer must not make everything right.
    """
    wanted = normalize_answer(needle)
    return bool(wanted) and f" {wanted} " in f" {normalize_answer(haystack)} "


def says_unanswerable(reply: str | None) -> bool:
    """Whether a reply states that the information is not available."""
    # A typographic apostrophe is not in string.punctuation: drop it as "'" is dropped.
    said = f" {normalize_answer((reply or '').replace(chr(0x2019), ''))} "
    return any(f" {phrase} " in said for phrase in ABSTAIN_PHRASES)


# -- choice letters and numbers ---------------------------------------------------------
_LETTER_IN_PARENS = re.compile(r"\(([A-Z])\)")
_LETTER_STATED = re.compile(r"\banswer\s*(?:is|:)\s*\(?([A-Z])\b(?![a-z])", re.IGNORECASE)
_LETTER_LEADING = re.compile(r"^\s*([A-Z])\s*(?:[).:\]]|$)", re.MULTILINE)


def choice_letter(reply: str | None) -> str | None:
    """The option letter a reply picks: "(B)", "The answer is B", or a line that opens
    with "B", "B)", "B." or "B:"; None when it states none, or several different ones (a
    hedge). A leading word such as "A dog" is not a letter."""
    text = clean_reply(reply)
    for pattern in (_LETTER_IN_PARENS, _LETTER_STATED, _LETTER_LEADING):
        stated = {letter.upper() for letter in pattern.findall(text)}
        if len(stated) == 1:
            return stated.pop()
        if stated:
            return None
    return None


_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+")


def first_number(text: str | None) -> float | None:
    """The first number written in ``text`` in digits ("1,200.5", "-3", ".5"), or None."""
    match = _NUMBER.search(text or "")
    return float(match.group().replace(",", "")) if match else None


# -- chunking ---------------------------------------------------------------------------
_BREAKS: tuple[str, ...] = ("\n\n", "\n", ". ", "? ", "! ", "; ", ", ", " ")


def chunk_text(text: str, chunk_tokens: int) -> list[str]:
    """Split ``text`` into pieces of at most ``4 * chunk_tokens`` characters.

    Cuts prefer paragraph, then line, then sentence, then word boundaries, but only in
    the second half of a window, so pieces stay near the target size. The split is
    lossless: ``"".join(chunk_text(t, n)) == t``.
    """
    limit = max(1, chunk_tokens) * CHARS_PER_TOKEN
    chunks: list[str] = []
    start = 0
    while len(text) - start > limit:
        cut = _cut_point(text, start, limit)
        chunks.append(text[start:cut])
        start = cut
    if start < len(text):
        chunks.append(text[start:])
    return chunks


def _cut_point(text: str, start: int, limit: int) -> int:
    window = text[start : start + limit]
    for mark in _BREAKS:
        at = window.rfind(mark)
        if at >= limit // 2:
            return start + at + len(mark)
    return start + limit


def document_messages(
    text: str,
    chunk_tokens: int,
    *,
    role: str = "user",
    header: str = "",
    numbered: bool = False,
) -> list[Message]:
    """A long text as several messages of about ``chunk_tokens`` tokens each.

    ``header`` (e.g. a session date) is repeated on every piece, so a strategy that keeps
    only some pieces still knows where each came from; ``numbered`` adds "(part i/n)".
    Whitespace-only pieces are dropped.
    """
    pieces = [p for p in chunk_text(text, chunk_tokens) if p.strip()]
    messages: list[Message] = []
    for index, piece in enumerate(pieces, start=1):
        label = header
        if numbered and len(pieces) > 1:
            label = f"{header} (part {index}/{len(pieces)})" if header else f"(part {index})"
        content = f"{label}\n{piece}" if label else piece
        messages.append({"role": role, "content": content})
    return messages


def evidence_in_messages(spans: Iterable[str], messages: Sequence[Message]) -> tuple[str, ...]:
    """A task's evidence (:attr:`~pytest_budgetbench.tasks.base.Item.evidence`) as the
    history holds it: each span verbatim in one message, in order, each once, blank ones out.

    The one rule for every task: a span that :func:`chunk_text` cut at a message boundary
    (a turn ending in a blank line, a turn longer than a chunk) is in no one message, so it
    becomes its parts, each counted as a span (a part of punctuation or whitespace alone,
    such as a closing quote, holds nothing to keep and is left out). A span that is not in
    the history at all, whole or in parts, is left out.
    """
    texts = [text_of(message) for message in messages]
    kept: dict[str, None] = {}
    for span in spans:
        if not span.strip():
            continue
        parts = [span] if any(span in text for text in texts) else _cut_parts(span, texts)
        kept.update(dict.fromkeys(part for part in parts if part not in kept))
    return tuple(kept)


def _cut_parts(span: str, texts: Sequence[str]) -> list[str]:
    """The parts of ``span`` that a chunk boundary cut it into: each but the last ends one
    text (where the chunk ended), the last is in a text; [] when it was not cut so."""
    parts: list[str] = []
    rest = span
    while not any(rest in text for text in texts):
        length = _longest_ending(rest, texts)
        if not length:
            return []
        parts.append(rest[:length])
        rest = rest[length:]
    parts.append(rest)
    return [part.strip() for part in parts if any(char.isalnum() for char in part)]


def _longest_ending(span: str, texts: Sequence[str]) -> int:
    """The length of the longest proper prefix of ``span`` that some text ends with."""
    best = 0
    for text in texts:
        start = max(0, len(text) - len(span) + 1)
        while (start := text.find(span[0], start)) != -1:
            if span.startswith(text[start:]):
                best = max(best, len(text) - start)
                break  # the first match from the left is this text's longest
            start += 1
    return best
