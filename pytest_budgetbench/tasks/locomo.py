"""``locomo``: LoCoMo very-long-term conversation QA (Maharana et al., ACL 2024).

Reads the official ``locomo10.json`` (a JSON list of samples ``{sample_id, conversation,
qa, ...}``) given by ``--budgetbench-data-locomo``. One item per QA pair, in file order.

History: every session in order. Each becomes one or more user messages (about
``chunk_tokens`` tokens each) that start with the session number and its
``conversation.session_N_date_time``; turns are written as upstream does,
``Speaker said, "text"``, with ``and shared <blip_caption>`` for shared photos. The
final user message is upstream's short-answer QA prompt; temporal questions ask for an
approximate date from the session dates, and adversarial questions offer upstream's two
options ("Not mentioned in the conversation" and the adversarial answer) in a seeded order.

Split (the declared option ``locomo_samples``: ``--budgetbench-locomo-samples``, env
``BUDGETBENCH_LOCOMO_SAMPLES``, or ``--budgetbench-task-options=locomo_samples=...``):
``first`` (the first conversation: BudgetMem's router training split), ``rest`` (every
other one: its evaluation split), ``all`` (the default), or comma-separated sample ids.
Items are numbered as in the whole file either way.

Evidence (:attr:`Item.evidence`): the turns a QA's ``evidence`` names by dialogue id
(``"D1:3"``), each as the history writes it (``Speaker said, "text"``, with its caption);
a turn that a chunk cut splits (one ending in a blank line is cut there) gives each of its
parts, and an id that names no turn is left out.

Category: the QA category, named ``multi-hop`` (1), ``temporal`` (2), ``open-domain``
(3), ``single-hop`` (4), ``adversarial`` (5).

Grader ``locomo-official-f1/2``: upstream's ``eval_question_answering`` on the raw reply
(stripped), as ``task_eval/evaluation.py`` scores it: token F1 after normalisation
(lower-case, no punctuation, no a/an/the/and) with ``nltk.stem.PorterStemmer()`` stems;
category 1 splits prediction and gold on commas and averages, over gold parts, the best
F1; category 3 scores against the gold before the first ``;``; category 5 first maps an
option-letter reply to its option's text as upstream's ``get_cat_5_answer`` does (a
one-character reply containing "a" is option (a), any other one-character reply (b); a
three-character reply containing "(a)" is (a), any other three-character reply (b)),
then scores 1 iff it contains "no information available" or "not mentioned", on any
line. An empty reply scores 0. Needs nltk (``pip install 'pytest-budgetbench[locomo]'``).

Variant ``first-line`` (``--budgetbench-grader=locomo:first-line``): the same rules on the
reply's first non-empty line (markdown and an "Answer:" label removed), for chatty small
models; a hedge (both yes and no, or several different short answers on separate lines)
is scored whole, as upstream scores it.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any, ClassVar

from pytest_budgetbench.errors import ConfigError, Requirement
from pytest_budgetbench.messages import Message
from pytest_budgetbench.options import DataFile, Option
from pytest_budgetbench.tasks._data import malformed, read_json, records, require, resolve_file
from pytest_budgetbench.tasks._text import (
    document_messages,
    evidence_in_messages,
    first_line_unless_hedged,
    stemmed_tokens,
    token_f1,
)
from pytest_budgetbench.tasks.base import GoldAnswers, Grade, Item, Task

CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop",
                  5: "adversarial"}
NOT_MENTIONED = "Not mentioned in the conversation"
ADVERSARIAL_MARKERS = ("no information available", "not mentioned")

SYSTEM_TEMPLATE = (
    "Below is a conversation between two people: {a} and {b}. The conversation takes place "
    "over multiple days and the date of each conversation is written at the beginning of "
    "the conversation."
)
QA_TEMPLATE = (
    "Based on the above context, write an answer in the form of a short phrase for the "
    "following question. Answer with exact words from the context whenever possible.\n\n"
    "Question: {question} Short answer:"
)
TEMPORAL_HINT = " Use DATE of CONVERSATION to answer with an approximate date."

_SESSION_KEY = re.compile(r"session_(\d+)")
_DIA_ID = re.compile(r"D\d+:\d+")
"""A turn's dialogue id; a QA's ``evidence`` entry may hold several ("D8:6; D9:17")."""


# -- scoring (upstream task_eval/evaluation.py and gpt_utils.py, re-implemented) ------------
def cat_5_answer(prediction: str, options: tuple[str, str]) -> str:
    """Upstream's ``get_cat_5_answer``: an option letter becomes its option's text.

    Upstream tests lengths of the stripped, lower-cased reply: one character means a
    letter ("a" -> option (a), anything else -> (b)), three characters a parenthesised
    one ("(a)" -> (a), anything else -> (b)); any other reply is kept (lower-cased).
    """
    said = prediction.strip().lower()
    if len(said) == 1:
        return options[0] if "a" in said else options[1]
    if len(said) == 3:
        return options[0] if "(a)" in said else options[1]
    return said


def f1_score(prediction: str, gold: str) -> float:
    return token_f1(stemmed_tokens(prediction), stemmed_tokens(gold))[0]


def f1_multi(prediction: str, gold: str) -> float:
    """Category 1: the mean over comma-separated gold parts of the best part F1."""
    predictions = [p.strip() for p in prediction.split(",")]
    golds = [g.strip() for g in gold.split(",")]
    return sum(max(f1_score(p, g) for p in predictions) for g in golds) / len(golds)


def stemmed_text(text: str) -> str:
    """A text as LoCoMo's F1 reads it: its normalised, Porter-stemmed tokens, joined."""
    return " ".join(stemmed_tokens(text))


def score(category: int, prediction: str, gold: str) -> float:
    if not prediction.strip():
        return 0.0
    if category == 5:
        lowered = prediction.lower()
        return float(any(marker in lowered for marker in ADVERSARIAL_MARKERS))
    if category == 1:
        return f1_multi(prediction, gold)
    if category == 3:
        gold = gold.split(";")[0].strip()
    return f1_score(prediction, gold)


SAMPLES = Option(
    "locomo_samples", "which LoCoMo conversations the locomo task reads: all, first "
    "(BudgetMem's router training split), rest, or sample ids", str, "all",
    flag="locomo-samples", env="BUDGETBENCH_LOCOMO_SAMPLES", metavar="all|first|rest|IDS")


class LoCoMoTask(Task):
    name = "locomo"
    grader_version = "locomo-official-f1/2"
    grader_variants: ClassVar[dict[str, str]] = {
        "first-line": "score the reply's first non-empty line, without markdown and an "
                      "'Answer:' label; a hedge is scored whole",
    }
    data = DataFile("locomo10.json")
    declared_options = (*Task.declared_options, SAMPLES)
    requires = (Requirement("nltk", "locomo"),)  # the official F1 stems with nltk

    def load(self) -> list[Item]:
        path = resolve_file(self.name, self.options.data_path, ("locomo10.json",))
        samples = records(self.name, path, read_json(self.name, path, "locomo10.json"),
                          "locomo10.json")
        items: list[Item] = []
        chosen = self._split(path, samples)
        for index, sample in enumerate(samples):
            require(self.name, path, sample, index, ("sample_id", "conversation", "qa"),
                    key="sample_id")
            if index not in chosen:
                continue
            history = self._history(path, sample)
            turns = _turn_lines(sample["conversation"])
            for q_index, qa in enumerate(sample["qa"]):
                items.append(self._item(path, sample, history, q_index, qa, turns))
        return items

    def _split(self, path: Path, samples: list[Any]) -> set[int]:
        """Indices of the samples the split selects (see the module docstring)."""
        split = str(self.option("locomo_samples") or "all").strip()
        if split == "all":
            return set(range(len(samples)))
        if split == "first":
            return {0}
        if split == "rest":
            return set(range(1, len(samples)))
        wanted = {s.strip() for s in split.split(",") if s.strip()}
        ids = [str(s.get("sample_id")) if isinstance(s, dict) else "" for s in samples]
        unknown = wanted - set(ids)
        if unknown:
            raise ConfigError(f"locomo split {split!r} names unknown sample ids "
                              f"{', '.join(sorted(unknown))} in {path} (known: "
                              f"{', '.join(ids)}; or first, rest, all)")
        return {i for i, sample_id in enumerate(ids) if sample_id in wanted}

    def _history(self, path: Path, sample: dict[str, Any]) -> tuple[Message, ...]:
        conversation = sample["conversation"]
        sample_id = sample["sample_id"]
        if not isinstance(conversation, dict):
            raise malformed(self.name, path, f"sample {sample_id!r} has no conversation object")
        system = SYSTEM_TEMPLATE.format(a=conversation.get("speaker_a", "A"),
                                        b=conversation.get("speaker_b", "B"))
        messages: list[Message] = [{"role": "system", "content": system}]
        for number in _session_numbers(conversation):
            date = conversation.get(f"session_{number}_date_time")
            if not date:
                raise malformed(self.name, path, f"sample {sample_id!r} lacks "
                                f"conversation.session_{number}_date_time")
            text = _session_text(conversation[f"session_{number}"])
            messages += document_messages(text, self.options.chunk_tokens, numbered=True,
                                          header=f"DATE: {date} (session {number})")
        if len(messages) == 1:
            raise malformed(self.name, path, f"sample {sample_id!r} has no session_N turns")
        return tuple(messages)

    def _item(
        self,
        path: Path,
        sample: dict[str, Any],
        history: tuple[Message, ...],
        q_index: int,
        qa: Any,
        turns: dict[str, str],
    ) -> Item:
        sample_id = str(sample["sample_id"])
        label = f"{sample_id}/qa {q_index}"
        if not isinstance(qa, dict) or "question" not in qa or qa.get("category") not in (
            CATEGORY_NAMES
        ):
            raise malformed(self.name, path, f"{label} needs a question and category 1-5")
        category = int(qa["category"])
        if category != 5 and "answer" not in qa:
            raise malformed(self.name, path, f"{label} (category {category}) lacks answer")
        item_id = f"{sample_id}/{q_index}"
        question = str(qa["question"])
        meta: dict[str, Any] = {"sample_id": sample_id, "qa_category": category,
                                "evidence": qa.get("evidence", [])}
        if category == 2:
            question += TEMPORAL_HINT
        if category == 5:
            adversarial = str(qa.get("adversarial_answer", qa.get("answer", "")))
            options = [NOT_MENTIONED, adversarial]
            random.Random(f"locomo/{self.options.seed}/{item_id}").shuffle(options)
            question += f" Select the correct answer: (a) {options[0]} (b) {options[1]}."
            meta["adversarial_answer"] = adversarial
            meta["options"] = tuple(options)
            answer = NOT_MENTIONED
        else:
            answer = str(qa["answer"])
        final: Message = {"role": "user", "content": QA_TEMPLATE.format(question=question)}
        named = [turns[dia_id] for dia_id in _DIA_ID.findall(str(meta["evidence"]))
                 if dia_id in turns]
        return Item(item_id=item_id, messages=(*history, final), answer=answer,
                    category=CATEGORY_NAMES[category], meta=meta,
                    evidence=evidence_in_messages(named, history[1:]))

    def gold_answers(self, item: Item) -> GoldAnswers | None:
        """The gold as :func:`score` reads it, in LoCoMo's normalisation (no punctuation,
        no a/an/the/and, Porter stems): a multi-hop gold's comma-separated parts, every
        one needed; an open-domain gold's part before ";"; none for an adversarial
        question, whose answer is that the conversation does not say."""
        category = int(item.meta["qa_category"])
        gold = str(item.answer)
        if category == 5:
            return None
        if category == 1:
            parts = tuple(part.strip() for part in gold.split(",") if part.strip())
            return GoldAnswers(parts, stemmed_text, every=True)
        if category == 3:
            gold = gold.split(";")[0].strip()
        return GoldAnswers((gold,), stemmed_text)

    def grade(self, item: Item, prediction: str) -> Grade:
        reply = prediction or ""
        if self.grader_variant == "first-line":
            reply = first_line_unless_hedged(reply)
        category = int(item.meta["qa_category"])
        if category == 5:
            reply = cat_5_answer(reply, item.meta["options"])
        extracted = reply.strip()
        quality = score(category, extracted, str(item.answer))
        return Grade(quality=quality, extracted=extracted, grader=self.grader_id)


def _session_numbers(conversation: dict[str, Any]) -> list[int]:
    numbers = []
    for key, value in conversation.items():
        match = _SESSION_KEY.fullmatch(key)
        if match and isinstance(value, list):
            numbers.append(int(match.group(1)))
    return sorted(numbers)


def _session_text(turns: list[Any]) -> str:
    return "\n".join(_turn_line(turn) for turn in turns if isinstance(turn, dict))


def _turn_line(turn: dict[str, Any]) -> str:
    line = f'{turn.get("speaker", "?")} said, "{turn.get("text", "")}"'
    if turn.get("blip_caption"):
        line += f" and shared {turn['blip_caption']}."
    return line


def _turn_lines(conversation: dict[str, Any]) -> dict[str, str]:
    """Each turn's line as the history writes it, by its dialogue id (``D1:3``)."""
    return {str(turn["dia_id"]): _turn_line(turn)
            for number in _session_numbers(conversation)
            for turn in conversation[f"session_{number}"]
            if isinstance(turn, dict) and turn.get("dia_id")}
