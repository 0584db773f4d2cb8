"""prompts.jsonl: the post-strategy prompt of a cell (``--budgetbench-audit``), written and
read here (the runner writes through :class:`~pytest_budgetbench.records.store.RunStore`).

A record is ``{"cell_id": ..., "prompt_sha256": ..., "messages": [...], "evidence": [...]}``;
with ``--budgetbench-audit=hash`` it has no ``messages`` and no ``evidence``. ``evidence``
(issue 33) is, where the item declares evidence, each span and whether the prompt kept it
verbatim (``[{"span": str, "kept": bool}]``, engine.evidence's rule); records written
before it, and items without evidence, have none. A resumed cell writes a second record:
the one whose sha256 its row names is its prompt.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_budgetbench.messages import Message
from pytest_budgetbench.records import jsonl

PROMPTS_FILE = "prompts.jsonl"


@dataclass(frozen=True)
class SpanKept:
    """One evidence span of an item, and whether the prompt held it verbatim."""

    span: str
    kept: bool

    def record(self) -> dict[str, Any]:
        return {"span": self.span, "kept": self.kept}

    @classmethod
    def from_record(cls, record: object) -> SpanKept | None:
        """A record read back; None where it is not ``{"span": str, "kept": bool}``."""
        if not isinstance(record, Mapping):
            return None
        span, kept = record.get("span"), record.get("kept")
        if not isinstance(span, str) or not isinstance(kept, bool):
            return None
        return cls(span, kept)


@dataclass(frozen=True)
class PromptRecord:
    """One prompts.jsonl record."""

    cell_id: str
    prompt_sha256: str | None
    messages: list[Message] | None = None
    """The prompt as sent; None where only its sha256 was kept."""
    evidence: list[SpanKept] | None = None
    """The item's evidence spans, each kept or not by the prompt; None where the item
    declares none, only the sha256 was kept, or the record predates the field."""

    def record(self) -> dict[str, Any]:
        """The JSON object written to prompts.jsonl (``cell_id`` first: readers skip other
        cells' lines on it)."""
        record: dict[str, Any] = {"cell_id": self.cell_id, "prompt_sha256": self.prompt_sha256}
        if self.messages is not None:
            record["messages"] = self.messages
        if self.evidence is not None:
            record["evidence"] = [span.record() for span in self.evidence]
        return record

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> PromptRecord:
        """A record read back; ``messages`` that are not a list count as not kept, and so
        does ``evidence`` (an entry that is not a span and a mark is skipped)."""
        messages = record.get("messages")
        sha256 = record.get("prompt_sha256")
        marks = record.get("evidence")
        evidence = None
        if isinstance(marks, list):
            evidence = [span for span in map(SpanKept.from_record, marks) if span is not None]
        return cls(cell_id=str(record.get("cell_id")),
                   prompt_sha256=sha256 if isinstance(sha256, str) else None,
                   messages=messages if isinstance(messages, list) else None,
                   evidence=evidence)


def append_prompt(path: Path, prompt: PromptRecord) -> None:
    """Append one cell's record, whole, under the file's lock (xdist workers share it)."""
    jsonl.append_jsonl(path, prompt.record())


def read_prompts(path: Path, cell_ids: Collection[str]) -> Iterator[PromptRecord]:
    """The records of these cells, in the file's order (a resumed cell has one per
    attempt); other cells' lines are skipped unparsed, and so is a torn line."""
    for _cell_id, record in jsonl.cell_records(path, cell_ids):
        yield PromptRecord.from_record(record)


def write_prompts(path: Path, prompts: Iterable[PromptRecord]) -> None:
    """Write a whole prompts.jsonl at once (a synthetic run's; a sweep appends)."""
    jsonl.write_lines(path, (prompt.record() for prompt in prompts))
