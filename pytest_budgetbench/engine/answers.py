"""What a prompt keeps of the answer, without an answering model: ``answer_kept``.

Evidence retention (:mod:`.evidence`) counts verbatim spans, so a summary or a compression
that keeps a fact in other words reads 0. This looks for less: the gold answer itself, as
the item's grader normalises it (:meth:`~pytest_budgetbench.tasks.Task.gold_answers`), in
the prompt as sent. Steps, for an item whose task gives its gold answers:

1. The answer must occur in the item's evidence (one span, normalised, holds it: as whole
   words, or as a substring for a grader that matches substrings). Where it does not (an
   answer the history implies but never states, a date worked out from a session's date),
   the row's ``answer_kept`` and ``answer_unique`` are null: nothing here can say whether a
   prompt kept it.
2. ``answer_kept``: whether one text of the prompt (a message's content, a tool result, a
   tool call's arguments, as :func:`.evidence.texts_of` reads them) holds it once the
   question is cut out of it, so a question that names the answer keeps nothing. The
   question is the item's final message, wherever a strategy put it (a prompt that embeds
   it with retrieved context keeps the context).
3. ``answer_unique``: whether the history (the item's messages before the question) holds
   the answer only inside its evidence spans. A memory assistant's "Noted: your dog is
   called Rex." echoes the answer, and a short answer may occur by chance; there a prompt
   may keep the answer without its evidence, and reports give the mean over unique items
   apart.

Several gold answers follow the grader: where any one is right (own data's list,
LongMemEval's answer and its first clause), the answers the evidence holds are watched and
one kept is enough; where every one is needed (needle's values, a LoCoMo multi-hop gold's
parts), every one must be in the evidence (else null) and every one kept. An answer is
unique when none of the watched ones occurs in the history outside the evidence.

Teacher-forced agent episodes (:class:`StepAnswers`): a reference step's tool-call
arguments play the answer's part. The values of its arguments (strings and numbers, SQuAD-
normalised) that the trajectory's tool results have shown are watched; the step's prompt
keeps them when it holds every one; unique when no message but a tool result holds them.
The episode's row keeps its answer when every step that watched values kept them.

What it cannot see: an answer a summary restates in other words ("his dog" for "Rex"), a
date it rewrites, a number it spells out; and a prompt that keeps the answer without the
evidence that makes it the answer (an echo, where ``answer_unique`` is false).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_budgetbench.engine.evidence import texts_of
from pytest_budgetbench.messages import Message, text_of
from pytest_budgetbench.records.rows import CellRow
from pytest_budgetbench.tasks._text import normalize_answer
from pytest_budgetbench.tasks.base import GoldAnswers, Item

_CUT = "\n"
"""What a cut-out span or question leaves: a word boundary, so nothing joins across it."""


@functools.lru_cache(maxsize=1 << 14)
def normalised(normalise: Callable[[str], str], text: str) -> str:
    """``normalise(text)`` padded with a space each side, so a whole-words answer is found
    as `` answer `` in it. Cached: a sweep normalises each history message once for all
    the strategies and budgets of its item."""
    return f" {normalise(text)} "


def occurs(answer: str, texts: Iterable[str], whole_words: bool) -> bool:
    """Whether one of the padded, normalised ``texts`` holds the normalised ``answer``."""
    wanted = f" {answer} " if whole_words else answer
    return any(wanted in text for text in texts)


def cut(text: str, spans: Iterable[str]) -> str:
    """``text`` with every occurrence of each span replaced by a line break."""
    for span in spans:
        if span and span in text:
            text = text.replace(span, _CUT)
    return text


@dataclass(frozen=True)
class AnswerWatch:
    """An item's gold answers that its evidence holds, normalised: what each prompt of the
    item is searched for (:func:`watch`)."""

    answers: tuple[str, ...]
    gold: GoldAnswers
    question: str
    """The item's final message's text, cut out of each prompt text before the search."""
    unique: bool
    """No watched answer occurs in the history outside the evidence spans."""

    def kept(self, prompt: Sequence[Message]) -> bool:
        """Whether the prompt holds the answer outside the question (every watched one
        where the grader needs every one, else any)."""
        texts = [normalised(self.gold.normalise, cut(text, (self.question,)))
                 for text in texts_of(prompt)]
        found = (occurs(answer, texts, self.gold.whole_words) for answer in self.answers)
        return all(found) if self.gold.every else any(found)


def watch(gold: GoldAnswers | None, item: Item) -> AnswerWatch | None:
    """What to search ``item``'s prompts for, or None where nothing can be said: the task
    gives no gold answers, the item declares no evidence, or the evidence does not hold the
    answer (every answer, where the grader needs every one)."""
    if gold is None or not item.evidence or not item.messages:
        return None
    answers = [answer for answer in dict.fromkeys(gold.normalise(a) for a in gold.answers)
               if answer.strip()]
    spans = [normalised(gold.normalise, span) for span in item.evidence]
    found = tuple(answer for answer in answers if occurs(answer, spans, gold.whole_words))
    if not found or (gold.every and len(found) < len(answers)):
        return None
    outside = [normalised(gold.normalise, cut(text, item.evidence))
               for text in texts_of(item.messages[:-1])]
    unique = not any(occurs(answer, outside, gold.whole_words) for answer in found)
    return AnswerWatch(found, gold, text_of(item.messages[-1]), unique)


def fill_answer(row: CellRow, found: AnswerWatch | None, prompt: Sequence[Message]) -> None:
    """The row's ``answer_kept`` and ``answer_unique`` for ``prompt`` (null without a
    watch)."""
    if found is None:
        row.answer_kept = row.answer_unique = None
        return
    row.answer_kept, row.answer_unique = found.kept(prompt), found.unique


# -- teacher-forced episodes ------------------------------------------------------------------
def argument_values(action: Message) -> list[str]:
    """The values of a message's tool-call arguments, depth first: strings and numbers as
    text (booleans and nulls say nothing a history could hold)."""
    values: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for inner in value.values():
                walk(inner)
        elif isinstance(value, list):
            for inner in value:
                walk(inner)
        elif isinstance(value, str | int | float) and not isinstance(value, bool):
            values.append(str(value))

    for call in action.get("tool_calls") or []:
        raw = (call.get("function") or {}).get("arguments") if isinstance(call, dict) else None
        try:
            walk(json.loads(raw) if isinstance(raw, str) else raw)
        except ValueError:
            continue
    return values


@dataclass
class StepAnswers:
    """A teacher-forced episode's answers, step by step: each reference step's argument
    values that the trajectory's tool results have shown (:func:`argument_values`), and
    whether the step's prompt kept them. The trajectory only grows, so each message is
    normalised once (and cached)."""

    marks: list[tuple[bool, bool]] = field(default_factory=list)
    """(kept, unique) of each step that watched values, in order."""

    def at_step(self, action: Message, trajectory: Sequence[Message],
                prompt: Sequence[Message]) -> tuple[bool, bool] | None:
        """(kept, unique) for the step whose reference action is ``action``, predicted from
        ``prompt`` with ``trajectory`` so far; None where no tool result holds one of its
        values."""
        values = [v for v in dict.fromkeys(map(normalize_answer, argument_values(action))) if v]
        if not values:
            return None
        results = [normalised(normalize_answer, text_of(message)) for message in trajectory
                   if message.get("role") == "tool"]
        shown = [value for value in values if occurs(value, results, True)]
        if not shown:
            return None
        others = [normalised(normalize_answer, text)
                  for text in texts_of(m for m in trajectory if m.get("role") != "tool")]
        texts = [normalised(normalize_answer, text) for text in texts_of(prompt)]
        mark = (all(occurs(value, texts, True) for value in shown),
                not any(occurs(value, others, True) for value in shown))
        self.marks.append(mark)
        return mark

    def fill(self, row: CellRow) -> None:
        """The episode's row: kept when every step that watched values kept them, unique
        when each of those steps' values were unique; null where no step watched any."""
        if not self.marks:
            row.answer_kept = row.answer_unique = None
            return
        row.answer_kept = all(kept for kept, _ in self.marks)
        row.answer_unique = all(unique for _, unique in self.marks)
