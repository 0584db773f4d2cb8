"""Evidence retention: how many of an item's evidence spans a prompt keeps, verbatim.

An item may declare ``evidence`` (:attr:`~pytest_budgetbench.tasks.Item.evidence`): spans
of text its answer needs, each verbatim in its history. The runner counts them on the
prompt as sent, after the strategy: a single-call cell's one prompt (a violating cell's
too, the prompt that would have been sent), and each call of an agent episode (there, of
the spans the trajectory holds so far).

A span is *kept* when one text of the prompt holds it verbatim, a text being a message's
content (a string, or its text parts joined; image parts hold none), a tool result's
content (a ``tool`` message's), or one tool call's arguments (its JSON text). A span that
runs across two messages is never kept, nor is one a strategy rewrote: a summary or a
compression that paraphrases the evidence loses it, and the row says so rather than
guessing whether the meaning survived. The same test (:func:`is_held`) says whether a
history holds its evidence (the preflight's check of each item, :func:`missing_evidence`),
and which spans a single-call prompt kept (:func:`spans_kept`, which prompts.jsonl records
with ``--budgetbench-audit=full`` and the count is taken of).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pytest_budgetbench.messages import Message, text_of, tool_calls_of
from pytest_budgetbench.records.prompts import SpanKept
from pytest_budgetbench.records.rows import CellRow


def texts_of(messages: Iterable[Message]) -> list[str]:
    """The texts a span is looked for in: each message's content text, and each of its
    tool calls' arguments, in order (empty texts left out)."""
    texts: list[str] = []
    for message in messages:
        text = text_of(message)
        if text:
            texts.append(text)
        for call in tool_calls_of(message):
            function = call.get("function") if isinstance(call, dict) else None
            arguments = function.get("arguments") if isinstance(function, dict) else None
            if isinstance(arguments, str) and arguments:
                texts.append(arguments)
    return texts


def is_held(span: str, texts: Sequence[str]) -> bool:
    """Whether one of ``texts`` holds ``span`` verbatim: the one rule of this module."""
    return any(span in text for text in texts)


def held(spans: Iterable[str], texts: Sequence[str]) -> list[str]:
    """The spans, of ``spans``, that one of ``texts`` holds verbatim (in their order)."""
    return [span for span in spans if is_held(span, texts)]


def spans_kept(evidence: Sequence[str], prompt: Sequence[Message]) -> list[SpanKept]:
    """Each span of ``evidence``, in order, and whether the prompt keeps it (what
    prompts.jsonl records beside the prompt, and what :func:`retention` counts). A span
    given twice (own data may list one twice) is one span: counted once, it cannot weigh
    twice in the item's retention."""
    texts = texts_of(prompt)
    return [SpanKept(span, is_held(span, texts)) for span in dict.fromkeys(evidence)]


def tally(spans: Sequence[SpanKept]) -> Retention | None:
    """The count of :func:`spans_kept`'s result; None where there were no spans."""
    if not spans:
        return None
    return Retention(total=len(spans), kept=sum(span.kept for span in spans))


@dataclass(frozen=True)
class Retention:
    """The evidence a prompt could keep (``total``) and kept (``kept``)."""

    total: int
    kept: int

    @property
    def ratio(self) -> float | None:
        """kept / total, rounded to 4 places; None when there was nothing to keep."""
        return round(self.kept / self.total, 4) if self.total else None


def retention(evidence: Sequence[str], prompt: Sequence[Message]) -> Retention | None:
    """How much of ``evidence`` the prompt keeps; None where the item declares none."""
    return tally(spans_kept(evidence, prompt))


def fill_retention(row: CellRow, found: Retention | None) -> None:
    """The row's evidence fields: all null where there is no evidence to count."""
    if found is None:
        row.evidence_total = row.evidence_kept = row.evidence_retention = None
        return
    row.evidence_total, row.evidence_kept = found.total, found.kept
    row.evidence_retention = found.ratio


def missing_evidence(evidence: Sequence[str], history: Sequence[Message]) -> str | None:
    """The first span of ``evidence`` that ``history`` does not hold verbatim, or None."""
    texts = texts_of(history)
    return next((span for span in evidence if not is_held(span, texts)), None)


@dataclass
class TrajectoryEvidence:
    """An agent episode's evidence, call by call: the spans its trajectory has shown so far
    (an agent's evidence arrives in tool results), and of those, the ones each call's
    prompt keeps. The trajectory only grows, so each message is read once."""

    evidence: Sequence[str]
    shown: list[str] = field(default_factory=list)
    """The spans the trajectory has held so far, in the order they first appeared."""
    _read: int = 0

    def at_call(self, trajectory: Sequence[Message],
                prompt: Sequence[Message]) -> list[SpanKept] | None:
        """The spans shown so far, each marked kept where the prompt holds it (their
        :func:`tally` is the call's count); None where the item declares no evidence."""
        if not self.evidence:
            return None
        unseen = [span for span in self.evidence if span not in self.shown]
        self.shown += held(unseen, texts_of(trajectory[self._read:]))
        self._read = len(trajectory)
        return spans_kept(self.shown, prompt)
