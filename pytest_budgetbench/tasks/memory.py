"""``memory``: a deterministic synthetic agent-memory task.

Each item is a multi-session chat between a user and an assistant, with dated sessions,
small talk and distractor facts about other people, ending in one question about the
user. The evidence sits in one session chosen at random (seeded) among the oldest quarter
of the sessions (``evidence_position=early``, the default: the question asks about
something said long ago, as a long-running agent's user does), or among all of them
(``anywhere``). With ``early``, a strategy that keeps only recent history loses the
evidence whenever its budget is short of the history; with ``anywhere`` it finds it about
as often as the budget covers. Categories:

- ``single-session-fact``: a fact stated once ("my dog is called Biscuit");
- ``knowledge-update``: a fact stated, then changed in a later session; the new value wins;
- ``temporal-reasoning``: when something happened, read from the session's date;
- ``preference``: which of two things the user prefers;
- ``abstention``: something never mentioned; the answer must say "unknown".

Evidence (:attr:`Item.evidence`): the user's turn that states the answer ("Please remember
this: ..."; for an update, the later one), and for ``temporal-reasoning`` also its session's
date tag (``[March 4, 2024]``); none for ``abstention``.

Grader ``memory-contains/1``: the reply's first line, normalised (lower case, no
punctuation or articles), must contain the gold answer as whole words; for updates it must
not also contain the old value; abstention needs an explicit "unknown"-style phrase.
An empty reply is always wrong.
"""

from __future__ import annotations

import datetime as dt
import random
import re
from typing import Any

from pytest_budgetbench.messages import Message
from pytest_budgetbench.options import Option, choice
from pytest_budgetbench.tasks.base import HISTORY_TOKENS, GoldAnswers, Grade, Item, Task

CATEGORIES = (
    "single-session-fact",
    "knowledge-update",
    "temporal-reasoning",
    "preference",
    "abstention",
)

# Short instructions and a "Reply with just the ..." cue on the question: SmolLM2-135M
# answered 5-6 of 8 planted-fact questions this way, against 1 of 8 with a longer
# system prompt, which it tended to ignore in favour of echoing the history.
SYSTEM_PROMPT = (
    "You are a helpful assistant. Answer from the conversation. "
    "If the user never said it, answer unknown."
)

ABSTAIN_PHRASES = (
    "unknown",
    "dont know",
    "do not know",
    "not mentioned",
    "no information",
    "not stated",
    "cannot determine",
    "cant determine",
    "not sure",
)


PET_NAMES = ("Biscuit", "Pepper", "Mochi", "Rufus", "Ziggy", "Olive", "Nugget", "Pickle")
PETS = ("dog", "cat", "parrot", "rabbit", "turtle", "hamster")
CITIES = ("Lisbon", "Oslo", "Denver", "Kyoto", "Dublin", "Austin", "Zurich", "Porto", "Seattle")
INSTRUMENTS = ("piano", "violin", "cello", "guitar", "flute", "drums", "saxophone")
CARS = ("Volvo", "Toyota", "Subaru", "Tesla", "Honda", "Mazda", "Skoda")
PAIRS = (
    ("tea", "coffee"), ("mountains", "beaches"), ("jazz", "rock"), ("cats", "dogs"),
    ("running", "swimming"), ("novels", "podcasts"), ("mornings", "evenings"),
)
ABSENT = (
    "What is my sister's name? Reply with just the name.",
    "What is my favourite football team called? Reply with just the name.",
    "Which city was I born in? Reply with just the city.",
    "What was the name of my first school? Reply with just the name.",
    "On what date did I run my first marathon? Reply with just the date.",
)
FRIENDS = ("Tom", "Priya", "Marco", "Aiko", "Lena", "Sam", "Noor")
TOPICS = (
    ("a recipe for {x}", ("lentil soup", "banana bread", "fried rice", "pesto pasta", "chili")),
    ("tips for {x}", ("sleeping better", "learning Spanish", "saving money", "public speaking")),
    ("a short history of {x}", ("the printing press", "the bicycle", "tea", "the telescope")),
    ("ideas for {x}", ("a rainy weekend", "a birthday gift", "a garden", "a team lunch")),
    ("how {x} works", ("a heat pump", "compound interest", "a vaccine", "a solar panel")),
)
ADVICE = (
    "Start small and keep it simple.", "Plan ahead and write things down.",
    "Ask a friend to join you, it helps.", "Check the details twice before you begin.",
    "Take short breaks so you stay fresh.", "Use what you already have at home.",
    "Read a little about it every day.", "Keep a short list of what worked.",
    "Try it once, then adjust to your taste.", "Compare two or three options first.",
)


def _date_text(day: dt.date) -> str:
    return f"{day.strftime('%B')} {day.day}, {day.year}"


def normalise(text: str) -> str:
    text = text.lower().replace("'", "").replace("\u2019", "")
    text = re.sub(r"[^a-z0-9 ]+", " ", text)
    words = [w for w in text.split() if w not in ("a", "an", "the")]
    return " ".join(words)


def contains_words(haystack: str, needle: str) -> bool:
    needle = normalise(needle)
    return bool(needle) and f" {needle} " in f" {normalise(haystack)} "


EVIDENCE_POSITION = Option(
    "evidence_position", "where the memory task plants its evidence: early (the oldest "
    "quarter of the sessions) | anywhere", choice("early", "anywhere"), "early",
    flag="memory-evidence", metavar="early|anywhere")
PLANTED = "Please remember this:"
"""How every planted user turn opens (filler turns never do)."""
EARLY_SHARE = 4
"""``early`` evidence sits in the first 1/EARLY_SHARE of the sessions."""


class MemoryTask(Task):
    name = "memory"
    grader_version = "memory-contains/1"
    declared_options = (*Task.declared_options, HISTORY_TOKENS, EVIDENCE_POSITION)

    def load(self) -> list[Item]:
        count = self.options.items or 50
        return [self._make_item(index) for index in range(count)]

    def _make_item(self, index: int) -> Item:
        rng = random.Random(f"memory/{self.options.seed}/{index}")
        category = CATEGORIES[index % len(CATEGORIES)]
        target_chars = 4 * int(self.option("history_tokens"))
        start = dt.date(2024, 1, 8) + dt.timedelta(days=rng.randrange(0, 300))
        sessions = self._filler_sessions(rng, start, target_chars)
        answer, question, meta = self._plant(rng, category, sessions)
        evidence = self._evidence(category, sessions, meta)
        messages: list[Message] = [{"role": "system", "content": SYSTEM_PROMPT}]
        for session in sessions:
            turns = session["messages"]
            dated = f"[{_date_text(session['date'])}] {turns[0]['content']}"
            messages.append({**turns[0], "content": dated})
            messages.extend(turns[1:])
        messages.append({"role": "user", "content": question})
        return Item(
            item_id=f"{index:04d}",
            messages=tuple(messages),
            answer=answer,
            category=category,
            meta=meta,
            evidence=evidence,
        )

    @staticmethod
    def _evidence(
        category: str, sessions: list[dict[str, Any]], meta: dict[str, Any]
    ) -> tuple[str, ...]:
        """The planted user turn's own text (verbatim: a session's first turn only gains a
        date prefix before it), and the date tag for a temporal question."""
        where = meta["evidence_session"]
        if where is None:
            return ()
        session = sessions[where]
        # The session's last planted turn: an update planted in the same session as the
        # fact it changes comes after it (``_say(last=True)``).
        stated = [str(turn["content"]) for turn in session["messages"]
                  if turn["role"] == "user" and str(turn["content"]).startswith(PLANTED)][-1]
        if category == "temporal-reasoning":
            return (stated, f"[{_date_text(session['date'])}]")
        return (stated,)

    def _filler_sessions(
        self, rng: random.Random, start: dt.date, target_chars: int
    ) -> list[dict[str, Any]]:
        sessions: list[dict[str, Any]] = []
        used = 0
        day = start
        while used < target_chars:
            turns: list[Message] = []
            for _ in range(rng.randint(2, 3)):
                topic, fills = rng.choice(TOPICS)
                subject = topic.format(x=rng.choice(fills))
                friend = rng.choice(FRIENDS)
                user = f"Could you give me {subject}? My friend {friend} asked me about it."
                # No "Sure, here is ..." openers: the small model copies them as its answer.
                reply = " ".join(rng.sample(ADVICE, 4))
                turns += [{"role": "user", "content": user},
                          {"role": "assistant", "content": reply}]
            sessions.append({"date": day, "messages": turns})
            used += sum(len(str(m["content"])) for m in turns)
            day += dt.timedelta(days=rng.randint(2, 9))
        return sessions

    def _plant(
        self, rng: random.Random, category: str, sessions: list[dict[str, Any]]
    ) -> tuple[Any, str, dict[str, Any]]:
        reach = len(sessions)
        if self.option("evidence_position") == "early":
            reach = max(1, reach // EARLY_SHARE)
        where = rng.randrange(reach)
        if category == "single-session-fact":
            pet, name = rng.choice(PETS), rng.choice(PET_NAMES)
            self._say(rng, sessions[where],
                      f"{PLANTED} my {pet} is called {name}.",
                      f"Noted: your {pet} is called {name}.")
            return (name, f"What is my {pet} called? Reply with just the name.",
                    {"evidence_session": where})
        if category == "knowledge-update":
            old, new = rng.sample(CITIES, 2)
            first = rng.randrange(max(1, reach - 1))
            later = rng.randrange(first + 1, reach) if first + 1 < reach else first
            self._say(rng, sessions[first], f"{PLANTED} I live in {old}.",
                      f"Noted: you live in {old}.")
            self._say(rng, sessions[later],
                      f"{PLANTED} I moved from {old} to {new}, so now I live in {new}.",
                      f"Noted: you now live in {new}.",
                      last=first == later)  # one session: the update must come second
            question = "Which city do I live in now? Reply with just the city."
            return ({"answer": new, "old": old}, question,
                    {"evidence_session": later, "old_session": first})
        if category == "temporal-reasoning":
            instrument = rng.choice(INSTRUMENTS)
            day = sessions[where]["date"]
            self._say(rng, sessions[where],
                      f"{PLANTED} today I had my very first {instrument} lesson.",
                      f"Noted: your first {instrument} lesson was today.")
            return (_date_text(day), f"On what date did I have my first {instrument} lesson? "
                    "Reply with just the date.",
                    {"evidence_session": where})
        if category == "preference":
            liked, other = rng.sample(rng.choice(PAIRS), 2)
            self._say(rng, sessions[where], f"{PLANTED} I prefer {liked} to {other}.",
                      f"Noted: you prefer {liked}.")
            options = sorted([liked, other])
            return (liked, f"Which do I prefer, {options[0]} or {options[1]}? "
                    "Reply with just one word.",
                    {"evidence_session": where})
        return "unknown", rng.choice(ABSENT), {"evidence_session": None}

    @staticmethod
    def _say(
        rng: random.Random, session: dict[str, Any], user: str, reply: str, last: bool = False
    ) -> None:
        turns: list[Message] = session["messages"]
        at = len(turns) if last else 2 * rng.randint(0, len(turns) // 2)
        turns[at:at] = [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]

    def grade(self, item: Item, prediction: str) -> Grade:
        reply = (prediction or "").strip().splitlines()[0] if (prediction or "").strip() else ""
        quality = 0.0
        if reply:
            quality = float(self._correct(item, reply))
        return Grade(quality=quality, extracted=reply, grader=self.grader_version)

    def gold_answers(self, item: Item) -> GoldAnswers | None:
        """What :meth:`_correct` looks for: the new city of an update (the old one must be
        absent, which no prompt can keep), the month and day of a date; none for an
        abstention, whose "unknown" no history states."""
        if item.category == "abstention":
            return None
        if item.category == "knowledge-update":
            return GoldAnswers((str(item.answer["answer"]),), normalise)
        if item.category == "temporal-reasoning":
            return GoldAnswers((" ".join(str(item.answer).split(",")[0].split()),), normalise)
        return GoldAnswers((str(item.answer),), normalise)

    @staticmethod
    def _correct(item: Item, reply: str) -> bool:
        said = normalise(reply)
        if item.category == "abstention":
            return any(f" {p} " in f" {said} " for p in ABSTAIN_PHRASES)
        if item.category == "knowledge-update":
            return contains_words(reply, item.answer["answer"]) and not contains_words(
                reply, item.answer["old"]
            )
        if item.category == "temporal-reasoning":
            month_day = " ".join(str(item.answer).split(",")[0].split())
            return contains_words(reply, month_day)
        return contains_words(reply, str(item.answer))
