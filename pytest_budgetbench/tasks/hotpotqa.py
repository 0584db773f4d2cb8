"""``hotpotqa``: HotpotQA distractor setting, dev split (Yang et al., 2018).

Reads ``hotpot_dev_distractor_v1.json`` (a JSON list of ``{_id, question, answer,
supporting_facts, context: [[title, [sentence, ...]], ...], type, level}``) given by
``--budgetbench-data-hotpotqa``.

History: each of the ten titled paragraphs (two gold, eight distractors) is one user
message ``Title: <title>`` + its sentences; a paragraph longer than ``chunk_tokens``
becomes several. The final user message asks for the answer span alone.

Evidence (:attr:`Item.evidence`): the supporting-fact sentences (``supporting_facts``:
[title, sentence index] into ``context``), each without its surrounding whitespace; a
sentence a chunk cut splits gives each of its parts, and a fact whose index is past its
paragraph is left out.

Category: the question ``type`` (``bridge`` or ``comparison``); ``level`` and the
supporting titles are in ``Item.meta``.

Grader ``hotpotqa-official-f1/2``: the official ``hotpot_evaluate_v1.py`` answer metrics on
the raw reply: SQuAD normalisation, exact match, token F1, F1 = 0 when either side
normalises to yes / no / noanswer and they differ. ``Grade.quality`` is the F1; EM,
precision and recall are in ``Grade.detail``. An empty reply scores 0.

Variant ``first-line`` (``--budgetbench-grader=hotpotqa:first-line``): the same metrics on
the reply's first non-empty line (markdown and an "Answer:" label removed), for chatty
small models; a hedge (both yes and no, or several different short answers on separate
lines) is scored whole, as upstream scores it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from pytest_budgetbench.messages import Message
from pytest_budgetbench.options import DataFile
from pytest_budgetbench.tasks._data import malformed, read_json, records, require, resolve_file
from pytest_budgetbench.tasks._text import (
    document_messages,
    evidence_in_messages,
    first_line_unless_hedged,
    normalize_answer,
    token_f1,
)
from pytest_budgetbench.tasks.base import GoldAnswers, Grade, Item, Task

OFFICIAL_FILES = ("hotpot_dev_distractor_v1.json",)
FIELDS = ("_id", "question", "answer", "context")
_SPECIAL = ("yes", "no", "noanswer")

SYSTEM_PROMPT = (
    "Answer the question using the Wikipedia paragraphs provided. Reply with the answer "
    "only: a short span copied from the paragraphs, or yes or no."
)


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction: str, gold: str) -> tuple[float, float, float]:
    """(F1, precision, recall) as in hotpot_evaluate_v1.py."""
    pred, truth = normalize_answer(prediction), normalize_answer(gold)
    if (pred in _SPECIAL or truth in _SPECIAL) and pred != truth:
        return 0.0, 0.0, 0.0
    return token_f1(pred.split(), truth.split())


class HotpotQATask(Task):
    name = "hotpotqa"
    grader_version = "hotpotqa-official-f1/2"
    grader_variants: ClassVar[dict[str, str]] = {
        "first-line": "score the reply's first non-empty line, without markdown and an "
                      "'Answer:' label; a hedge is scored whole",
    }
    data = DataFile(OFFICIAL_FILES[0])

    def load(self) -> list[Item]:
        path = resolve_file(self.name, self.options.data_path, OFFICIAL_FILES)
        rows = records(self.name, path, read_json(self.name, path, OFFICIAL_FILES[0]),
                       OFFICIAL_FILES[0])
        return [self._item(path, index, row) for index, row in enumerate(rows)]

    def _item(self, path: Path, index: int, row: dict[str, Any]) -> Item:
        require(self.name, path, row, index, FIELDS, key="_id")
        messages: list[Message] = [{"role": "system", "content": SYSTEM_PROMPT}]
        paragraphs: dict[str, list[str]] = {}
        for paragraph in row["context"]:
            title, sentences = _paragraph(self.name, path, index, paragraph)
            paragraphs.setdefault(title, sentences)
            messages += document_messages("".join(sentences), self.options.chunk_tokens,
                                          header=f"Title: {title}")
        messages.append({"role": "user", "content": f"Question: {row['question']}\nAnswer:"})
        return Item(
            item_id=str(row["_id"]),
            messages=tuple(messages),
            answer=str(row["answer"]),
            category=str(row.get("type", "unknown")),
            evidence=evidence_in_messages(_supporting_sentences(row, paragraphs), messages[1:-1]),
            meta={
                "level": row.get("level"),
                "supporting_titles": sorted({fact[0] for fact in row.get("supporting_facts", [])
                                             if isinstance(fact, list) and fact}),
            },
        )

    def gold_answers(self, item: Item) -> GoldAnswers | None:
        """The answer span, SQuAD-normalised as the F1 is; none for a yes/no answer, which
        a comparison question derives and no paragraph states."""
        if normalize_answer(str(item.answer)) in _SPECIAL:
            return None
        return GoldAnswers((str(item.answer),), normalize_answer)

    def grade(self, item: Item, prediction: str) -> Grade:
        extracted = prediction or ""
        if self.grader_variant == "first-line":
            extracted = first_line_unless_hedged(extracted)
        if not extracted.strip():
            return Grade(0.0, "", self.grader_id, {"em": 0.0, "precision": 0.0,
                                                    "recall": 0.0})
        f1, precision, recall = f1_score(extracted, str(item.answer))
        em = exact_match(extracted, str(item.answer))
        return Grade(f1, extracted, self.grader_id,
                     {"em": em, "precision": precision, "recall": recall})


def _supporting_sentences(row: dict[str, Any], paragraphs: dict[str, list[str]]) -> list[str]:
    """The text of each ``[title, sentence index]`` supporting fact that names a sentence."""
    found = []
    for fact in row.get("supporting_facts") or []:
        if not (isinstance(fact, list) and len(fact) == 2 and isinstance(fact[1], int)):
            continue
        sentences = paragraphs.get(str(fact[0]), [])
        if 0 <= fact[1] < len(sentences):
            found.append(sentences[fact[1]].strip())
    return found


def _paragraph(task: str, path: Path, index: int, paragraph: Any) -> tuple[str, list[str]]:
    if (
        not isinstance(paragraph, list)
        or len(paragraph) != 2
        or not isinstance(paragraph[1], list)
    ):
        raise malformed(task, path, f"record {index} has a context entry that is not "
                        "[title, [sentences]]")
    return str(paragraph[0]), [str(s) for s in paragraph[1]]
