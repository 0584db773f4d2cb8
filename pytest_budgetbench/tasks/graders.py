"""The graders a declared task (``jsonl``, ``csv``) chooses from with ``grader=``.

Each built-in scores a reply against an item's gold answers (a tuple of strings: the best
gold wins) with the project's one normalisation (:mod:`pytest_budgetbench.tasks._text`):

==========  ==================================================================  ==========
name        correct when                                                        extracted
==========  ==================================================================  ==========
exact       the reply's first line, normalised, equals a gold answer            first line
contains    a gold answer occurs in the reply as whole words, normalised        reply
f1          token F1 of the normalised reply and gold (SQuAD's), the best gold  reply
regex       a gold answer, read as a regular expression, matches (no case)      the match
choice      the option letter the reply picks is the gold letter                letter
numeric     the reply's first number is within ``tolerance`` of the gold        number
judge       an LLM judge says yes, given question, gold answers and rubric      reply
==========  ==================================================================  ==========

or ``module:attr``, a callable ``(prediction, item) -> Grade | float | bool``. An empty
reply is always wrong. A grader id is ``jsonl-<name>/1`` (with the tolerance, or the
judge's model), or ``<module:attr>/<grader_version>`` for a callable that sets one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_budgetbench.registry import import_object
from pytest_budgetbench.tasks._text import (
    choice_letter,
    clean_reply,
    contains_phrase,
    first_number,
    normalize_answer,
    short_answer,
    token_f1,
)
from pytest_budgetbench.tasks.base import GoldAnswers, Grade, Item

if TYPE_CHECKING:
    from pytest_budgetbench.model.backend import ChatBackend

VERSION = 1
"""Bump when a built-in's scores can change: it is in every grader id."""

Score = tuple[float, str]
"""(quality, extracted) of one reply."""


def _exact(reply: str, golds: Sequence[str]) -> Score:
    line = short_answer(reply)
    said = normalize_answer(line)
    return float(bool(said) and any(said == normalize_answer(g) for g in golds)), line


def _contains(reply: str, golds: Sequence[str]) -> Score:
    return float(any(contains_phrase(reply, g) for g in golds)), clean_reply(reply)


def _f1(reply: str, golds: Sequence[str]) -> Score:
    said = normalize_answer(reply).split()
    best = max(token_f1(said, normalize_answer(g).split())[0] for g in golds)
    return best, clean_reply(reply)


def _regex(reply: str, golds: Sequence[str]) -> Score:
    for pattern in golds:
        match = re.search(pattern, reply, re.IGNORECASE)
        if match:
            return 1.0, match.group()
    return 0.0, ""


def _choice(reply: str, golds: Sequence[str]) -> Score:
    letter = choice_letter(reply)
    return float(letter is not None and letter in {g.strip().upper() for g in golds}), letter or ""


SCORERS: dict[str, Callable[[str, Sequence[str]], Score]] = {
    "exact": _exact, "contains": _contains, "f1": _f1, "regex": _regex, "choice": _choice,
}
BUILT_IN = (*SCORERS, "numeric", "judge")
TEXT_MATCHERS = frozenset({"exact", "contains", "f1"})
"""The built-ins that look for a normalised gold answer in a reply: a prompt that holds
the answer is what they need (:meth:`AnswerGrader.gold_answers`)."""


# -- what a gold answer must look like, per grader (checked when the data loads) ----------
def gold_problem(grader: str, gold: str) -> str | None:
    """Why ``gold`` cannot be graded by ``grader``, or None."""
    if not gold.strip():
        return "is empty"
    if grader == "choice" and not re.fullmatch(r"[A-Za-z]", gold.strip()):
        return f"is {gold!r}, not one option letter (grader=choice)"
    if grader == "numeric" and first_number(gold) is None:
        return f"is {gold!r}, not a number (grader=numeric)"
    if grader == "regex":
        try:
            re.compile(gold)
        except re.error as exc:
            return f"is not a regular expression ({exc}) (grader=regex)"
    return None


# -- options ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tolerance:
    """How far a number may be from the gold: absolute, or relative to the gold."""

    value: float
    relative: bool = False

    def admits(self, said: float, gold: float) -> bool:
        room = self.value * abs(gold) if self.relative else self.value
        return abs(said - gold) <= room + 1e-12

    def __str__(self) -> str:
        return f"{self.value * 100:g}%" if self.relative else f"{self.value:g}"


def parse_tolerance(raw: str) -> Tolerance:
    """``0.5`` (absolute) or ``2%`` (of the gold)."""
    text = raw.strip()
    relative = text.endswith("%")
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        value = -1.0
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError("must be a number >= 0, or a percentage of the gold such as 2%")
    return Tolerance(value / 100 if relative else value, relative)


def parse_grader(raw: str) -> str:
    """A built-in's name, or ``module:attr`` of a callable (imported now, so a typo is a
    usage error before any cell runs)."""
    if raw in BUILT_IN:
        return raw
    if ":" in raw:
        load_callable(raw)
        return raw
    raise ValueError(f"must be one of {'|'.join(BUILT_IN)} or module:attr of a callable")


def load_callable(target: str) -> Callable[..., Any]:
    try:
        found = import_object(target)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"names no callable (cannot import {target}: {exc})") from None
    if not callable(found):
        raise ValueError(f"names {type(found).__name__} {target}, which is not callable")
    return found


# -- the grader of one task ---------------------------------------------------------------
JUDGE_MAX_TOKENS = 10
JUDGE_PROMPT = """You are grading an assistant's reply to a user's question about an \
earlier conversation.

Question: {question}
Reference answer(s): {gold}
{rubric}Reply: {reply}

Is the reply correct{by_rubric}? Answer yes or no."""


@dataclass(frozen=True)
class AnswerGrader:
    """Grades replies by one built-in or a callable; ``grader_id`` is on every row."""

    name: str
    tolerance: Tolerance = Tolerance(0.0)
    judge: ChatBackend | None = None
    prefix: str = "jsonl"

    @property
    def grader_id(self) -> str:
        if self.name in SCORERS:
            return f"{self.prefix}-{self.name}/{VERSION}"
        if self.name == "numeric":
            return f"{self.prefix}-numeric/{VERSION};tolerance={self.tolerance}"
        if self.name == "judge":
            model = str(getattr(self.judge, "model", type(self.judge).__name__))
            return f"{self.prefix}-judge/{VERSION};judge={model}"
        version = getattr(load_callable(self.name), "grader_version", None)
        return f"{self.name}/{version}" if version else self.name

    def grade(self, item: Item, prediction: str | None) -> Grade:
        reply = prediction or ""
        golds = tuple(item.answer)
        if not reply.strip():
            return Grade(0.0, "", self.grader_id, {"gold": list(golds)})
        if self.name in SCORERS:
            quality, extracted = SCORERS[self.name](reply, golds)
        elif self.name == "numeric":
            quality, extracted = self._numeric(reply, golds)
        elif self.name == "judge":
            return self._judged(item, reply, golds)
        else:
            return self._called(item, reply)
        return Grade(quality, extracted, self.grader_id, {"gold": list(golds)})

    def gold_answers(self, item: Item) -> GoldAnswers | None:
        """The gold answers as a text-matching built-in (exact, contains, f1) reads them,
        any one right; None for the others (:meth:`Task.gold_answers`)."""
        if self.name not in TEXT_MATCHERS or not item.answer:
            return None
        return GoldAnswers(tuple(str(gold) for gold in item.answer), normalize_answer)

    def _numeric(self, reply: str, golds: Sequence[str]) -> Score:
        said = first_number(reply)
        if said is None:
            return 0.0, ""
        right = any(self.tolerance.admits(said, gold) for g in golds
                    if (gold := first_number(g)) is not None)
        return float(right), f"{said:g}"

    def _judged(self, item: Item, reply: str, golds: Sequence[str]) -> Grade:
        assert self.judge is not None  # the task refuses grader=judge without one
        rubric = str(item.meta.get("rubric") or "")
        prompt = JUDGE_PROMPT.format(
            question=item.meta.get("question", ""), gold=" | ".join(golds) or "(none)",
            rubric=f"Rubric: {rubric}\n" if rubric else "", reply=reply.strip(),
            by_rubric=" by the reference answer and the rubric" if rubric
            else " by the reference answer")
        label = self.judge.complete([{"role": "user", "content": prompt}],
                                    max_tokens=JUDGE_MAX_TOKENS).text
        said = normalize_answer(label or "").split()
        quality = 1.0 if said[:1] == ["yes"] else 0.0
        return Grade(quality, clean_reply(reply), self.grader_id,
                     {"gold": list(golds), "label": label, "rubric": rubric or None})

    def _called(self, item: Item, reply: str) -> Grade:
        result = load_callable(self.name)(reply, item)
        if isinstance(result, Grade):
            return result
        if isinstance(result, bool) or (isinstance(result, (int, float))
                                        and 0.0 <= float(result) <= 1.0):
            return Grade(float(result), clean_reply(reply), self.grader_id)
        raise TypeError(f"grader {self.name} must return a Grade, a bool or a number in "
                        f"[0, 1] (got {result!r:.60} that is a {type(result).__name__})")
