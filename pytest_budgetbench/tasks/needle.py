"""``needle``: RULER-style needle-in-a-haystack retrieval (Hsieh et al., 2024).

A generator, deterministic from ``TaskOptions.seed``. The haystack is the ``.txt`` files of
the directory given by ``--budgetbench-data-needle`` (sorted by name, concatenated, and
repeated when more text is needed, as RULER does with its essay haystack), or, without a
directory, filler sentences this module generates itself. Each item hides ``k`` needles in
RULER's multi-value form, "One of the special magic numbers for <key> is: <7 digits>.",
at a given depth of the haystack, then asks for all the numbers for that key.

The haystack is about ``history_tokens`` tokens (the declared option shared with ``memory``:
``--budgetbench-memory-history``, default 2500), split into user messages of about
``chunk_tokens`` tokens; the needles sit between sentences.

Evidence (:attr:`Item.evidence`): the needles' sentences, each as hidden ("One of the
special magic numbers for <key> is: <7 digits>."); one that a tiny ``chunk_tokens`` splits
across two messages is left out, as no message holds it whole.

Category: ``depth-<d>/needles-<k>`` for depth d in 0, 25, 50, 75, 100 (percent of the
haystack before the first needle) and k in 1, 2, 4, cycled over items.

Grader ``ruler-string-match-all/1``: RULER's ``string_match_all``, the fraction of the
gold numbers found in the reply as case-insensitive substrings. An empty reply scores 0.
"""

from __future__ import annotations

import random
import re

from pytest_budgetbench.messages import Message
from pytest_budgetbench.options import DataFile
from pytest_budgetbench.tasks._data import missing
from pytest_budgetbench.tasks._text import (
    CHARS_PER_TOKEN,
    document_messages,
    evidence_in_messages,
)
from pytest_budgetbench.tasks.base import HISTORY_TOKENS, GoldAnswers, Grade, Item, Task

DEPTHS = (0, 25, 50, 75, 100)
NEEDLE_COUNTS = (1, 2, 4)
DEFAULT_ITEMS = len(DEPTHS) * len(NEEDLE_COUNTS) * 2

INSTRUCTION = (
    "Some special magic numbers are hidden within the following text. Make sure to "
    "memorize it. I will quiz you about the numbers afterwards."
)
QUESTION = (
    "What are all the special magic numbers for {key} mentioned in the provided text? "
    "The special magic numbers for {key} mentioned in the provided text are"
)
NEEDLE = "One of the special magic numbers for {key} is: {value}."

_KEY_ADJECTIVES = (
    "amber", "brisk", "calm", "dusty", "eager", "fancy", "gentle", "hollow", "icy", "jolly",
    "lively", "mellow", "nimble", "odd", "plucky", "quiet", "rustic", "shiny", "tidy", "vivid",
)
_KEY_NOUNS = (
    "anchor", "badger", "candle", "dolphin", "engine", "falcon", "garden", "harbor", "island",
    "jacket", "kettle", "lantern", "meadow", "needle", "orchard", "pepper", "quarry", "river",
    "saddle", "tunnel", "violin", "walrus",
)
_FILLER_SUBJECTS = (
    "The committee", "A small village", "The old library", "Our research team", "The river",
    "A traveling musician", "The city council", "The morning train", "An apprentice baker",
    "The museum", "A local farmer", "The weather station",
)
_FILLER_VERBS = (
    "reviewed", "described", "ignored", "celebrated", "measured", "questioned", "repaired",
    "painted", "recorded", "discussed", "postponed", "welcomed",
)
_FILLER_OBJECTS = (
    "the annual report", "a long winter", "the harvest festival", "several letters",
    "the northern bridge", "an unusual map", "the spring rainfall", "a quiet afternoon",
    "the new schedule", "a forgotten song", "the lighthouse", "a crowded market",
)
_FILLER_TAILS = (
    "without much fuss.", "before anyone noticed.", "with great care.", "for the third time.",
    "as the sun went down.", "while the town slept.", "in plain language.",
    "after a short delay.", "to everyone's surprise.", "once again.",
)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def filler_sentence(rng: random.Random) -> str:
    """One sentence of generated haystack, drawn with ``rng``."""
    return " ".join((rng.choice(_FILLER_SUBJECTS), rng.choice(_FILLER_VERBS),
                     rng.choice(_FILLER_OBJECTS), rng.choice(_FILLER_TAILS)))


def string_match_all(prediction: str, golds: list[str]) -> float:
    """RULER's string_match_all: the share of gold strings in the reply (case-insensitive)."""
    said = (prediction or "").lower()
    if not said.strip() or not golds:
        return 0.0
    return sum(gold.lower() in said for gold in golds) / len(golds)


class NeedleTask(Task):
    name = "needle"
    grader_version = "ruler-string-match-all/1"
    data = DataFile("a directory of .txt haystack files", required=False)
    declared_options = (*Task.declared_options, HISTORY_TOKENS)

    def load(self) -> list[Item]:
        sentences = self._haystack_sentences()
        count = self.options.items or DEFAULT_ITEMS
        return [self._item(index, sentences) for index in range(count)]

    # -- haystack -------------------------------------------------------------------------
    def _haystack_sentences(self) -> list[str] | None:
        """Sentences of the user's essays, or None to generate filler per item."""
        path = self.options.data_path
        if path is None:
            return None
        if not path.is_dir():
            raise missing(self.name, "a directory of .txt haystack files",
                          f"not a directory: {path}")
        texts = [p.read_text(encoding="utf-8", errors="replace")
                 for p in sorted(path.glob("*.txt"))]
        flat = [" ".join(text.split()) for text in texts]
        sentences = [s.strip() for text in flat for s in _SENTENCE_END.split(text) if s.strip()]
        if not sentences:
            raise missing(self.name, "a directory of .txt haystack files",
                          f"no text in {path}/*.txt")
        return sentences

    def _target_chars(self) -> int:
        tokens = int(self.option("history_tokens"))
        return max(1, tokens) * CHARS_PER_TOKEN

    def _take(self, rng: random.Random, sentences: list[str] | None) -> list[str]:
        target, used, taken = self._target_chars(), 0, []
        start = rng.randrange(len(sentences)) if sentences else 0
        position = start
        while used < target:
            if sentences:
                sentence = sentences[position % len(sentences)]
                position += 1
            else:
                sentence = filler_sentence(rng)
            taken.append(sentence)
            used += len(sentence) + 1
        return taken

    # -- items ----------------------------------------------------------------------------
    def _item(self, index: int, sentences: list[str] | None) -> Item:
        rng = random.Random(f"needle/{self.options.seed}/{index}")
        depth = DEPTHS[index % len(DEPTHS)]
        count = NEEDLE_COUNTS[(index // len(DEPTHS)) % len(NEEDLE_COUNTS)]
        key = f"{rng.choice(_KEY_ADJECTIVES)}-{rng.choice(_KEY_NOUNS)}"
        values = [str(v) for v in rng.sample(range(1_000_000, 10_000_000), count)]
        haystack = self._take(rng, sentences)
        at = round(len(haystack) * depth / 100)
        needles = [NEEDLE.format(key=key, value=value) for value in values]
        for offset, needle in enumerate(needles):
            # Needles follow one another, one haystack sentence apart, from the depth on.
            haystack.insert(min(at + 2 * offset, len(haystack)), needle)
        messages: list[Message] = [{"role": "system", "content": INSTRUCTION}]
        messages += document_messages(" ".join(haystack), self.options.chunk_tokens)
        messages.append({"role": "user", "content": QUESTION.format(key=key)})
        # Chunks are cut after ". " where the window allows, so a needle stays whole unless
        # chunk_tokens is about a needle's length; one that is cut is declared in its parts.
        evidence = evidence_in_messages(needles, messages[1:-1])
        return Item(
            item_id=f"{index:04d}",
            messages=tuple(messages),
            answer=values,
            category=f"depth-{depth}/needles-{count}",
            meta={"key": key, "depth": depth, "needles": count,
                  "haystack": "files" if sentences else "generated"},
            evidence=evidence,
        )

    def gold_answers(self, item: Item) -> GoldAnswers:
        """Every value, as :func:`string_match_all` looks for it: a case-insensitive
        substring, all of them for a full score."""
        return GoldAnswers(tuple(str(v) for v in item.answer), str.lower, whole_words=False,
                           every=True)

    def grade(self, item: Item, prediction: str) -> Grade:
        golds = [str(v) for v in item.answer]
        quality = string_match_all(prediction, golds)
        found = [g for g in golds if g.lower() in (prediction or "").lower()]
        return Grade(quality, " ".join(found), self.grader_version, {"gold": golds})
