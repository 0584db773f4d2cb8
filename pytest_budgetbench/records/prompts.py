"""prompts.jsonl: the post-strategy prompt of a cell (``--budgetbench-audit``), written and
read here.

A record is ``{"cell_id": ..., "prompt_sha256": ..., "messages": [...]}``; with
``--budgetbench-audit=hash`` it has no ``messages``. A resumed cell writes a second record:
the one whose sha256 its row names is its prompt.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_budgetbench.messages import Message


@dataclass(frozen=True)
class PromptRecord:
    """One prompts.jsonl record."""

    cell_id: str
    prompt_sha256: str | None
    messages: list[Message] | None = None
    """The prompt as sent; None where only its sha256 was kept."""

    def record(self) -> dict[str, Any]:
        """The JSON object written to prompts.jsonl (``cell_id`` first: readers skip other
        cells' lines on it)."""
        record: dict[str, Any] = {"cell_id": self.cell_id, "prompt_sha256": self.prompt_sha256}
        if self.messages is not None:
            record["messages"] = self.messages
        return record

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> PromptRecord:
        """A record read back; ``messages`` that are not a list count as not kept."""
        messages = record.get("messages")
        sha256 = record.get("prompt_sha256")
        return cls(cell_id=str(record.get("cell_id")),
                   prompt_sha256=sha256 if isinstance(sha256, str) else None,
                   messages=messages if isinstance(messages, list) else None)
