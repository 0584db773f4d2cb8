"""prompts.jsonl: the post-strategy prompt of a cell (``--budgetbench-audit``), written and
read here.

A record is ``{"cell_id": ..., "prompt_sha256": ..., "messages": [...], "evidence": [...]}``;
with ``--budgetbench-audit=hash`` it has no ``messages`` and no ``evidence``. ``evidence``
(issue 33) is, where the item declares evidence, each span and whether the prompt kept it
verbatim (``[{"span": str, "kept": bool}]``, engine.evidence's rule); records written
before it, and items without evidence, have none. A resumed cell writes a second record:
the one whose sha256 its row names is its prompt.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_budgetbench.messages import Message


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
