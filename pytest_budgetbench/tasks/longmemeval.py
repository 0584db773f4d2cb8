"""``longmemeval``: LongMemEval long-term chat memory (Wu et al., 2024), oracle or S file.

Reads ``longmemeval_oracle.json`` / ``longmemeval_s.json`` / ``longmemeval_m.json``
(a JSON list of ``{question_id, question_type, question, answer, question_date,
haystack_session_ids, haystack_dates, haystack_sessions, answer_session_ids}``) given by
``--budgetbench-data-longmemeval``; a directory is searched for those names in that order.

History: the haystack sessions in file order; each turn is a message with its own role,
prefixed with its session's timestamp (``[2023/05/20 (Sat) 02:21]``) so that a strategy
that keeps any subset of messages still knows when each was said. Turns longer than
``chunk_tokens`` become several messages. The final user message gives the question date
and the question.

Category: ``question_type``, except that abstention questions (``question_id`` ending in
``_abs``) form their own category ``abstention``.

Graders:

- ``longmemeval-contains-diagnostic/1`` (no judge): a deterministic DIAGNOSTIC, not the
  official metric. Correct iff the normalised reply contains the normalised gold answer
  (or its first clause) as whole words, number words read as digits; abstention needs an
  explicit "not mentioned / unknown"-style phrase; preference questions (whose gold is a
  rubric) score the fraction of the rubric's content words found in the reply.
- ``longmemeval-llm-judge/1`` (``TaskOptions.judge`` set): the upstream protocol with
  instructions in our own words per question type; the label is correct iff "yes" is in
  the judge's reply. ``Grade.detail`` records the judge model, the judge prompt version
  and the raw label. A judge failure raises (it is an endpoint error, never a grade).

export(): the upstream evaluator's JSONL, ``{"question_id", "hypothesis"}`` per line, one
file per strategy and budget (``longmemeval_hypotheses.<strategy>-<budget>.jsonl``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_budgetbench.messages import Message
from pytest_budgetbench.options import DataFile
from pytest_budgetbench.tasks._data import (
    cell_suffix,
    malformed,
    read_json,
    records,
    require,
    resolve_file,
)
from pytest_budgetbench.tasks._text import (
    contains_phrase,
    document_messages,
    normalize_answer,
    says_unanswerable,
)
from pytest_budgetbench.tasks.base import Grade, Item, Task

if TYPE_CHECKING:
    from pytest_budgetbench.model import ChatModel

OFFICIAL_FILES = ("longmemeval_oracle.json", "longmemeval_s.json", "longmemeval_m.json")
FIELDS = ("question_id", "question_type", "question", "answer", "question_date",
          "haystack_dates", "haystack_sessions")
QUESTION_TYPES = (
    "single-session-user", "single-session-assistant", "single-session-preference",
    "temporal-reasoning", "knowledge-update", "multi-session",
)

SYSTEM_PROMPT = (
    "Below are earlier chat sessions between you and the user, each message marked with "
    "its session's date. Answer the user's final question from this chat history."
)
JUDGE_GRADER = "longmemeval-llm-judge/1"
JUDGE_PROMPT_VERSION = "longmemeval-judge-prompt/1"
JUDGE_MAX_TOKENS = 10

_NUMBER_WORDS = {
    word: str(value)
    for value, word in enumerate((
        "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
        "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
        "eighteen", "nineteen", "twenty",
    ))
}
_STOPWORDS = frozenset(" ".join((
    "a an the and or of to in on for with by at from as is are was were be been being "
    "that this these those it its their they them he she his her user users would should "
    "could may might will can do does did not no yes response responses answer answers "
    "prefer prefers preferred preference preferences which who whom what when where how "
    "about such any some more most other than then also just only very into over",
)).split())


def is_abstention(question_id: str) -> bool:
    return str(question_id).endswith("_abs")


def category_of(record: dict[str, Any]) -> str:
    return "abstention" if is_abstention(record["question_id"]) else str(record["question_type"])


class LongMemEvalTask(Task):
    name = "longmemeval"
    grader_version = "longmemeval-contains-diagnostic/1"
    data = DataFile(OFFICIAL_FILES[0])

    # -- loading --------------------------------------------------------------------------
    def load(self) -> list[Item]:
        path = resolve_file(self.name, self.options.data_path, OFFICIAL_FILES)
        rows = records(self.name, path, read_json(self.name, path, OFFICIAL_FILES[0]))
        return [self._item(path, index, row) for index, row in enumerate(rows)]

    def _item(self, path: Path, index: int, row: dict[str, Any]) -> Item:
        require(self.name, path, row, index, FIELDS, key="question_id")
        dates, sessions = row["haystack_dates"], row["haystack_sessions"]
        if not isinstance(sessions, list) or not isinstance(dates, list) or len(dates) != len(
            sessions
        ):
            raise malformed(self.name, path, f"record {index} (question_id="
                            f"{row['question_id']!r}) needs haystack_dates and "
                            "haystack_sessions as lists of equal length")
        messages: list[Message] = [{"role": "system", "content": SYSTEM_PROMPT}]
        for date, session in zip(dates, sessions, strict=True):
            messages += self._session_messages(path, index, str(date), session)
        messages.append({"role": "user", "content": (
            f"Current date: {row['question_date']}\nQuestion: {row['question']}\n"
            "Answer briefly from our earlier conversations."
        )})
        return Item(
            item_id=str(row["question_id"]),
            messages=tuple(messages),
            answer=str(row["answer"]),
            category=category_of(row),
            meta={
                "question": str(row["question"]),
                "question_type": row["question_type"],
                "question_date": row["question_date"],
                "answer_session_ids": row.get("answer_session_ids", []),
                "sessions": len(sessions),
            },
        )

    def _session_messages(
        self, path: Path, index: int, date: str, session: Any
    ) -> list[Message]:
        if not isinstance(session, list):
            raise malformed(self.name, path, f"record {index} has a session that is not a list")
        messages: list[Message] = []
        for turn in session:
            if not isinstance(turn, dict) or turn.get("role") not in ("user", "assistant"):
                raise malformed(self.name, path, f"record {index} has a turn without role "
                                "user/assistant")
            messages += document_messages(str(turn.get("content", "")),
                                          self.options.chunk_tokens,
                                          role=turn["role"], header=f"[{date}]")
        return messages

    # -- grading --------------------------------------------------------------------------
    def grade(self, item: Item, prediction: str) -> Grade:
        reply = (prediction or "").strip()
        if self.options.judge is not None:
            return self._judge(self.options.judge, item, reply)
        if not reply:
            return Grade(0.0, "", self.grader_version, {"mode": "empty"})
        quality, mode = diagnostic_score(item.category, item.answer, reply)
        return Grade(quality, reply, self.grader_version, {"mode": mode})

    def _judge(self, judge: ChatModel, item: Item, reply: str) -> Grade:
        model = str(getattr(judge, "model", type(judge).__name__))
        detail: dict[str, Any] = {"judge_model": model,
                                  "judge_prompt_version": JUDGE_PROMPT_VERSION}
        if not reply:
            # An empty reply is wrong whatever a judge might say about it.
            return Grade(0.0, "", JUDGE_GRADER, {**detail, "label": None})
        question = str(item.meta.get("question", item.messages[-1]["content"]))
        prompt = judge_prompt(item.category, question, item.answer, reply)
        label = judge.complete([{"role": "user", "content": prompt}],
                               max_tokens=JUDGE_MAX_TOKENS).text
        quality = 1.0 if "yes" in (label or "").lower() else 0.0
        return Grade(quality, reply, JUDGE_GRADER, {**detail, "label": label})

    def export(self, item: Item, prediction: str, cell_id: str) -> tuple[str, dict[str, Any]]:
        name = f"longmemeval_hypotheses.{cell_suffix(cell_id)}.jsonl"
        return name, {"question_id": item.item_id, "hypothesis": prediction or ""}


# -- the diagnostic ------------------------------------------------------------------------
def _digits(text: str) -> str:
    return " ".join(_NUMBER_WORDS.get(word, word) for word in normalize_answer(text).split())


def _gold_variants(answer: str) -> list[str]:
    """The gold answer, and its first clause when it goes on ("7 days. 8 days is also ...")."""
    first = re.split(r"[.;(]|\bor\b", answer, maxsplit=1)[0]
    return [variant for variant in dict.fromkeys([answer, first]) if normalize_answer(variant)]


def diagnostic_score(category: str, answer: str, reply: str) -> tuple[float, str]:
    """(quality, mode) of the deterministic diagnostic; see the module docstring."""
    if category == "abstention":
        return float(says_unanswerable(reply)), "abstention-phrase"
    if category == "single-session-preference":
        words = [w for w in normalize_answer(answer).split() if w not in _STOPWORDS]
        said = set(normalize_answer(reply).split())
        if not words:
            return 0.0, "rubric-word-recall"
        return sum(w in said for w in words) / len(words), "rubric-word-recall"
    found = any(contains_phrase(_digits(reply), _digits(v)) for v in _gold_variants(answer))
    return float(found), "contains"


# -- the judge -----------------------------------------------------------------------------
_JUDGE_RULES = {
    "default": (
        "Say yes if the response gives the correct answer, or something equivalent to it. "
        "Say yes also if the response contains the correct answer along with other text, "
        "and no if it gives only part of the answer or a different answer."
    ),
    "temporal-reasoning": (
        "Say yes if the response gives the correct answer or an equivalent one. When the "
        "answer is a count of days, weeks or months, a count that is off by one is still "
        "acceptable. Say no if the response gives a different answer or only part of it."
    ),
    "knowledge-update": (
        "The user's information changed over time and the correct answer is the latest "
        "value. Say yes if the response gives the updated answer, even if it also mentions "
        "the earlier information; say no if it gives only the old information."
    ),
    "single-session-preference": (
        "The correct answer below is a rubric describing what a personalised response "
        "should do. Say yes if the response follows the rubric and uses the user's personal "
        "information correctly; it need not cover every point of the rubric."
    ),
    "abstention": (
        "This question cannot be answered from the conversation history. Say yes if the "
        "response says so (that the information is not available, or that it cannot "
        "answer), and no if it tries to give a concrete answer."
    ),
}


def judge_prompt(category: str, question: str, answer: str, response: str) -> str:
    """The judge's instruction for one question type (our wording; upstream protocol)."""
    rules = _JUDGE_RULES.get(category, _JUDGE_RULES["default"])
    gold = "Explanation" if category == "abstention" else "Correct answer"
    if category == "single-session-preference":
        gold = "Rubric"
    return (
        "You are grading a chat assistant's answer to a question about its past "
        f"conversations with a user. {rules}\n\n"
        f"Question: {question}\n\n{gold}: {answer}\n\nResponse: {response}\n\n"
        "Is the response correct? Answer only yes or no."
    )
