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

Evidence (:attr:`Item.evidence`): the text of each turn marked ``has_answer: true``
(without its surrounding whitespace); a turn split into several messages gives each of its
parts, as every task's evidence does (an abstention question's marked turns are those its
false premise twists).

Category: ``question_type``, except that abstention questions (``question_id`` ending in
``_abs``) form their own category ``abstention``.

Graders:

- ``longmemeval-contains-diagnostic/2`` (no judge): a deterministic DIAGNOSTIC, not the
  official metric. Correct iff the normalised reply contains the normalised gold answer
  (or its first clause) as whole words, number words read as digits; abstention needs an
  explicit "not mentioned / unknown"-style phrase; preference questions (whose gold is a
  rubric) score the fraction of the rubric's content words found in the reply.
- ``longmemeval-llm-judge/2`` (``TaskOptions.judge`` set): upstream's
  ``evaluate_qa.py``: the judge gets upstream's ``get_anscheck_prompt`` text for the
  question type, byte for byte (abstention when ``_abs`` is in the question id), with the
  raw reply as the model response, as one user message at temperature 0 with
  ``max_tokens`` 10; the label is correct iff "yes" is in the judge's stripped, lower-cased
  reply. The row's grader id names the judge model
  (``longmemeval-llm-judge/2;judge=<model>``; upstream uses gpt-4o-2024-08-06);
  ``Grade.detail`` also has the raw label. An empty (or whitespace-only) reply scores 0
  without a judge call. A judge failure raises (it is an endpoint error, never a grade).

export(): the upstream evaluator's JSONL, ``{"question_id", "hypothesis"}`` per line, one
file per strategy and budget (``longmemeval_hypotheses.<strategy>-<budget>.jsonl``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_budgetbench import lexicon
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
    evidence_in_messages,
    normalize_answer,
    says_unanswerable,
)
from pytest_budgetbench.tasks.base import GoldAnswers, Grade, Item, Task

if TYPE_CHECKING:
    from pytest_budgetbench.model.backend import ChatBackend

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
JUDGE_GRADER = "longmemeval-llm-judge/2"
JUDGE_PROMPT_VERSION = "longmemeval-anscheck@9e0b455"
JUDGE_MAX_TOKENS = 10
"""Upstream's call settings: n=1, temperature 0 (the judge ChatModel's), max_tokens 10."""

_NUMBER_WORDS = {
    word: str(value)
    for value, word in enumerate((
        "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
        "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
        "eighteen", "nineteen", "twenty",
    ))
}
# The diagnostic's rubric-word recall drops the shared stop words and the words every
# preference rubric is phrased in.
_RUBRIC_WORDS = (
    "user users response responses answer answers prefer prefers preferred preference "
    "preferences"
)
_STOPWORDS = lexicon.STOPWORDS | frozenset(_RUBRIC_WORDS.split())


def is_abstention(question_id: str) -> bool:
    return str(question_id).endswith("_abs")


def category_of(record: dict[str, Any]) -> str:
    return "abstention" if is_abstention(record["question_id"]) else str(record["question_type"])


class LongMemEvalTask(Task):
    name = "longmemeval"
    grader_version = "longmemeval-contains-diagnostic/2"
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
        evidence: list[str] = []
        for date, session in zip(dates, sessions, strict=True):
            messages += self._session_messages(path, index, str(date), session)
            evidence += self._answer_turns(session)
        messages.append({"role": "user", "content": (
            f"Current date: {row['question_date']}\nQuestion: {row['question']}\n"
            "Answer briefly from our earlier conversations."
        )})
        return Item(
            item_id=str(row["question_id"]),
            messages=tuple(messages),
            answer=str(row["answer"]),
            category=category_of(row),
            evidence=evidence_in_messages(evidence, messages[1:]),
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

    def _answer_turns(self, session: list[dict[str, Any]]) -> list[str]:
        """The text of the session's ``has_answer`` turns (a turn the chunker cut becomes
        its parts in :func:`evidence_in_messages`, as every task's evidence does)."""
        return [str(turn.get("content", "")).strip() for turn in session
                if turn.get("has_answer") is True]

    # -- grading --------------------------------------------------------------------------
    def gold_answers(self, item: Item) -> GoldAnswers | None:
        """The gold answer and its first clause, as the diagnostic looks for either
        (normalised, number words as digits), whichever grader runs: the judge reads the
        same answer. None for an abstention (nothing to find) and a preference question
        (its answer is a rubric, not a phrase of the history)."""
        if item.category in ("abstention", "single-session-preference"):
            return None
        return GoldAnswers(tuple(_gold_variants(str(item.answer))), _digits)

    def grade(self, item: Item, prediction: str) -> Grade:
        if self.options.judge is not None:
            return self._judge(self.options.judge, item, prediction or "")
        reply = (prediction or "").strip()
        if not reply:
            return Grade(0.0, "", self.grader_version, {"mode": "empty"})
        quality, mode = diagnostic_score(item.category, item.answer, reply)
        return Grade(quality, reply, self.grader_version, {"mode": mode})

    def _judge(self, judge: ChatBackend, item: Item, reply: str) -> Grade:
        model = str(getattr(judge, "model", type(judge).__name__))
        grader = f"{JUDGE_GRADER};judge={model}"
        detail: dict[str, Any] = {"judge_model": model,
                                  "judge_prompt_version": JUDGE_PROMPT_VERSION}
        if not reply.strip():
            # An empty reply is wrong whatever a judge might say about it.
            return Grade(0.0, "", grader, {**detail, "label": None})
        question = str(item.meta.get("question", item.messages[-1]["content"]))
        prompt = judge_prompt(str(item.meta.get("question_type", item.category)), question,
                              item.answer, reply, abstention="_abs" in item.item_id)
        label = judge.complete([{"role": "user", "content": prompt}],
                               max_tokens=JUDGE_MAX_TOKENS).text
        quality = 1.0 if judge_label(label) else 0.0
        return Grade(quality, reply, grader, {**detail, "label": label})

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


# -- the judge (upstream src/evaluation/evaluate_qa.py, byte for byte) ---------------------
_INTRO = ("I will give you a question, a correct answer, and a response from a model. Please "
          "answer yes if the response contains the correct answer. Otherwise, answer no. ")
_STEPS = ("If the response is equivalent to the correct answer or contains all the "
          "intermediate steps to get the correct answer, you should also answer yes. If the "
          "response only contains a subset of the information required by the answer, "
          "answer no. ")
_FIELDS = "\n\nQuestion: {}\n\nCorrect Answer: {}\n\nModel Response: {}\n\n"
_ASK = "Is the model response correct? Answer yes or no only."

JUDGE_TEMPLATES: dict[str, str] = {
    "default": _INTRO + _STEPS + _FIELDS + _ASK,
    "temporal-reasoning": (
        _INTRO + _STEPS + "In addition, do not penalize off-by-one errors for the number of "
        "days. If the question asks for the number of days/weeks/months, etc., and the model "
        "makes off-by-one errors (e.g., predicting 19 days when the answer is 18), the "
        "model's response is still correct. " + _FIELDS + _ASK
    ),
    "knowledge-update": (
        _INTRO + "If the response contains some previous information along with an updated "
        "answer, the response should be considered as correct as long as the updated answer "
        "is the required answer." + _FIELDS + _ASK
    ),
    "single-session-preference": (
        "I will give you a question, a rubric for desired personalized response, and a "
        "response from a model. Please answer yes if the response satisfies the desired "
        "response. Otherwise, answer no. The model does not need to reflect all the points "
        "in the rubric. The response is correct as long as it recalls and utilizes the "
        "user's personal information correctly.\n\nQuestion: {}\n\nRubric: {}\n\n"
        "Model Response: {}\n\n" + _ASK
    ),
    "abstention": (
        "I will give you an unanswerable question, an explanation, and a response from a "
        "model. Please answer yes if the model correctly identifies the question as "
        "unanswerable. The model could say that the information is incomplete, or some "
        "other information is given but the asked information is not.\n\nQuestion: {}\n\n"
        "Explanation: {}\n\nModel Response: {}\n\nDoes the model correctly identify the "
        "question as unanswerable? Answer yes or no only."
    ),
}
_DEFAULT_TYPES = ("single-session-user", "single-session-assistant", "multi-session")


def judge_prompt(
    question_type: str, question: str, answer: str, response: str, *, abstention: bool = False
) -> str:
    """Upstream's ``get_anscheck_prompt(question_type, question, answer, response,
    abstention)``: the judge's prompt for one question type, byte for byte."""
    if abstention:
        template = JUDGE_TEMPLATES["abstention"]
    elif question_type in _DEFAULT_TYPES:
        template = JUDGE_TEMPLATES["default"]
    elif question_type in JUDGE_TEMPLATES:
        template = JUDGE_TEMPLATES[question_type]
    else:
        raise ValueError(f"longmemeval has no judge prompt for question_type "
                         f"{question_type!r} (known: {', '.join(QUESTION_TYPES)})")
    return template.format(question, answer, response)


def judge_label(reply: str | None) -> bool:
    """Upstream's label rule: correct iff "yes" is in the stripped, lower-cased reply."""
    return "yes" in (reply or "").strip().lower()
