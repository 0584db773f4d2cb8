"""``longbench_v2``: LongBench v2 multiple choice over long documents (Bai et al., 2024).

Reads the official ``data.json`` (a JSON list of records ``_id, domain, sub_domain,
difficulty, length, question, choice_A..choice_D, answer, context``) given by
``--budgetbench-data-longbench_v2``.

Prompt: the official 0-shot template, split into messages. The system message carries
the opening instruction; the document follows as several user messages of about
``chunk_tokens`` tokens, the first opening ``<text>`` and the last closing ``</text>``;
the final user message holds the question, the four choices and the instruction to
answer "The correct answer is (X)". Joined, the messages are the official prompt.

Category: the item's ``difficulty`` (easy/hard), as the paper reports it; ``length``,
``domain`` and ``sub_domain`` are kept in ``Item.meta`` for other splits.

Grader ``longbench-v2-official-extract/2``: the official ``extract_answer``: remove
``*``, then ``The correct answer is \\(([A-D])\\)``, else ``The correct answer is
([A-D])``, else no answer (wrong); the first match wins.

Variant ``word-guard`` (``--budgetbench-grader=longbench_v2:word-guard``), stricter: no
answer when a bare letter begins a longer word ("The correct answer is Because ...", which
upstream reads as B) or when the reply states different letters; otherwise upstream's.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from pytest_budgetbench.messages import Message
from pytest_budgetbench.options import DataFile
from pytest_budgetbench.tasks._data import malformed, read_json, records, require, resolve_file
from pytest_budgetbench.tasks._text import document_messages
from pytest_budgetbench.tasks.base import Grade, Item, Task

FIELDS = (
    "_id", "domain", "sub_domain", "difficulty", "length", "question",
    "choice_A", "choice_B", "choice_C", "choice_D", "answer", "context",
)
LETTERS = ("A", "B", "C", "D")

INSTRUCTION = "Please read the following text and answer the question below."
QUESTION_TEMPLATE = """What is the correct answer to this question: {question}
Choices:
(A) {choice_A}
(B) {choice_B}
(C) {choice_C}
(D) {choice_D}

Format your response as follows: "The correct answer is (insert answer here)"."""

_WITH_PARENS = re.compile(r"The correct answer is \(([A-D])\)")
_BARE = re.compile(r"The correct answer is ([A-D])")
_BARE_WORD = re.compile(r"The correct answer is [A-D][A-Za-z]")


def extract_answer(reply: str | None) -> str | None:
    """The official LongBench v2 extraction (first match wins), or None."""
    text = (reply or "").replace("*", "")
    match = _WITH_PARENS.search(text) or _BARE.search(text)
    return match.group(1) if match else None


def extract_answer_guarded(reply: str | None) -> str | None:
    """The ``word-guard`` variant: upstream's letter, or None when it may be misread.

    Never more lenient than upstream: it returns upstream's letter or nothing.
    """
    text = (reply or "").replace("*", "")
    if _BARE_WORD.search(text):
        return None
    stated = set(_WITH_PARENS.findall(text)) | set(_BARE.findall(text))
    return extract_answer(text) if len(stated) == 1 else None


class LongBenchV2Task(Task):
    name = "longbench_v2"
    grader_version = "longbench-v2-official-extract/2"
    grader_variants: ClassVar[dict[str, str]] = {
        "word-guard": "no answer when the letter begins a word ('The correct answer is "
                      "Because') or the reply states different letters",
    }
    data = DataFile("data.json")

    def load(self) -> list[Item]:
        path = resolve_file(self.name, self.options.data_path, ("data.json",))
        rows = records(self.name, path, read_json(self.name, path, "data.json"), "data.json")
        items = []
        for index, row in enumerate(rows):
            require(self.name, path, row, index, FIELDS, key="_id")
            if str(row["answer"]).strip() not in LETTERS:
                raise malformed(self.name, path, f"record {index} (_id={row['_id']!r}) has "
                                f"answer {row['answer']!r}, not one of A-D", "data.json")
            items.append(self._item(row))
        return items

    def _item(self, row: dict[str, Any]) -> Item:
        document = f"<text>\n{str(row['context']).strip()}\n</text>"
        messages: list[Message] = [{"role": "system", "content": INSTRUCTION}]
        messages += document_messages(document, self.options.chunk_tokens)
        fields = {key: str(row[key]).strip() for key in ("question", *_choice_keys())}
        messages.append({"role": "user", "content": QUESTION_TEMPLATE.format(**fields)})
        return Item(
            item_id=str(row["_id"]),
            messages=tuple(messages),
            answer=str(row["answer"]).strip(),
            category=str(row["difficulty"]),
            meta={
                "difficulty": row["difficulty"],
                "length": row["length"],
                "domain": row["domain"],
                "sub_domain": row["sub_domain"],
                "context_chars": len(str(row["context"])),
            },
        )

    def grade(self, item: Item, prediction: str) -> Grade:
        guarded = self.grader_variant == "word-guard"
        letter = extract_answer_guarded(prediction) if guarded else extract_answer(prediction)
        quality = 1.0 if letter is not None and letter == item.answer else 0.0
        return Grade(quality=quality, extracted=letter or "", grader=self.grader_id,
                     detail={"gold": item.answer})


def _choice_keys() -> tuple[str, ...]:
    return tuple(f"choice_{letter}" for letter in LETTERS)
