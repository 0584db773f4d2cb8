"""episodes.jsonl: an agent episode's record, one per episode cell, written and read here.

The runner writes the record before the cell's row (a row never exists without its
trajectory), so that ``regrade`` and the viewer need no model call. Each call's prompt is
kept as references into the trajectory (``{"t": i}``) and the messages the strategy made
(``{"m": message}``); :meth:`CallRecord.prompt_parts` decodes them.

A record::

    {"cell_id": ..., "run_id": ..., "ended": "done", "tools": [...],
     "trajectory": [message, ...], "calls": [CallRecord, ...]}
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

from pytest_budgetbench.messages import Message, Tool
from pytest_budgetbench.records.jsonl import append_jsonl, cell_records, read_jsonl
from pytest_budgetbench.records.rows import Status

EPISODES_FILE = "episodes.jsonl"
"""An episode cell's trajectory and its calls, one record a cell."""

_PAGE = "page"
"""Field metadata: the short key the per-cell viewer's page gives a call's field."""


class Ended(StrEnum):
    """How an episode ended (the record's and the row's ``ended``). A violation and an
    error are the row's :class:`Status` of those names, not a second spelling of them; the
    other two say why an episode that was graded stopped."""

    DONE = "done"
    """The environment said it was over."""
    VIOLATION = Status.VIOLATION.value
    """A call's prompt was over budget; nothing more was sent."""
    MAX_CALLS = "max_calls"
    """The runner's cap on calls (--budgetbench-max-calls) ended it."""
    ERROR = Status.ERROR.value


@dataclass
class CallRecord:
    """One model call of an episode, as episodes.jsonl keeps it."""

    call: int
    """1-based."""
    seen: int
    """How many trajectory messages existed when the prompt was built."""
    prompt: list[dict[str, Any]]
    """The prompt as sent: ``{"t": i}`` for trajectory[i] as it is, ``{"m": message}`` for
    a message the strategy made."""
    tools: int = field(metadata={_PAGE: "nt"})
    """How many tools were sent with the prompt."""
    counted_tokens: int = field(metadata={_PAGE: "t"})
    prompt_sha256: str = ""
    """The prompt's sha256 with its tools (empty in a record that kept none)."""
    server_prompt_tokens: int | None = field(default=None, metadata={_PAGE: "st"})
    estimated_tokens: int | None = field(default=None, metadata={_PAGE: "es"})
    """The strategy's own count of this prompt (a framework policy's counter), or None."""
    prefix_tokens: int | None = None
    """Leading tokens this prompt shares with the previous call's (what a server's prompt
    cache reuses); None where the counter cannot give token ids."""
    model_s: float = field(default=0.0, metadata={_PAGE: "ms"})
    cached: bool | None = field(default=None, metadata={_PAGE: "ca"})
    output_tokens: int | None = field(default=None, metadata={_PAGE: "o"})
    parsed_tool_calls: int = 0
    evidence_total: int | None = field(default=None, metadata={_PAGE: "et"})
    """The item's evidence spans the trajectory had held by this call (an agent's evidence
    arrives in tool results); None where the item declares none, or in an older record."""
    evidence_kept: int | None = field(default=None, metadata={_PAGE: "ek"})
    """Of those, the spans this call's prompt held verbatim (engine.evidence)."""
    evidence: list[list[Any]] | None = None
    """Those spans, each ``[span, kept]`` (the viewer marks them); None as the counts."""
    answer_kept: bool | None = field(default=None, metadata={_PAGE: "ak"})
    """A teacher-forced call's: whether its prompt held the values of the reference step's
    arguments that the trajectory's tool results had shown (engine.answers); None where
    they had shown none, or in a free-running episode."""
    answer_unique: bool | None = field(default=None, metadata={_PAGE: "au"})
    """Whether those values occur in the trajectory only in tool results."""
    step: int | None = field(default=None, metadata={_PAGE: "sp"})
    """A teacher-forced call's reference step (1-based, of all the reference's steps)."""
    predicted: Message | None = None
    """A teacher-forced call's reply: the model's predicted action (the trajectory goes on
    with the reference's)."""
    exact: bool | None = field(default=None, metadata={_PAGE: "sx"})
    """Whether the prediction is the reference step, by the task's step checker."""
    name_ok: bool | None = field(default=None, metadata={_PAGE: "sn"})
    """Whether it calls the reference's functions (names only)."""

    def record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> CallRecord:
        """A call read back; keys this version does not know are dropped, missing ones take
        their defaults (a required one missing raises ValueError)."""
        missing = [name for name in _CALL_REQUIRED if name not in record]
        if missing:
            raise ValueError(f"an episodes.jsonl call lacks the field '{missing[0]}'")
        return cls(**{name: record[name] for name in CALL_FIELDS if name in record})

    def prompt_parts(self) -> Iterator[int | Message]:
        """The prompt's entries in order, decoded: an int ``i`` for trajectory[i] sent as it
        is, a message for one the strategy made; a damaged entry is left out."""
        for entry in self.prompt if isinstance(self.prompt, list) else []:
            if not isinstance(entry, dict):
                continue
            at = entry.get("t")
            if isinstance(at, int):
                yield at
            elif "m" in entry:
                yield entry["m"]


CALL_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(CallRecord))
CALL_PAGE_KEYS: dict[str, str] = {f.name: f.metadata[_PAGE] for f in fields(CallRecord)
                                  if _PAGE in f.metadata}
"""Call field -> the short key the per-cell viewer's page gives it: the fields it shows."""
_CALL_REQUIRED: tuple[str, ...] = tuple(
    f.name for f in fields(CallRecord) if f.default is MISSING and f.default_factory is MISSING
)


@dataclass
class EpisodeRecord:
    """One episodes.jsonl record: an episode cell's trajectory and its calls."""

    cell_id: str
    run_id: str
    ended: str
    tools: list[Tool] = field(default_factory=list)
    trajectory: list[Message] = field(default_factory=list)
    calls: list[CallRecord] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        """The JSON object written to episodes.jsonl."""
        return {"cell_id": self.cell_id, "run_id": self.run_id, "ended": self.ended,
                "tools": self.tools, "trajectory": self.trajectory,
                "calls": [call.record() for call in self.calls]}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> EpisodeRecord:
        """A record read back. Raises ValueError where it is not an episode record (a
        damaged line): its caller skips it."""
        trajectory, tools, calls = (record.get(key) for key in ("trajectory", "tools", "calls"))
        if not isinstance(trajectory, list) or not all(isinstance(m, dict) for m in trajectory):
            raise ValueError("an episodes.jsonl record without a trajectory")
        if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
            raise ValueError("an episodes.jsonl record without its calls")
        try:
            decoded = [CallRecord.from_record(call) for call in calls]
        except TypeError as exc:
            raise ValueError(f"an episodes.jsonl call is damaged: {exc}") from None
        return cls(cell_id=str(record.get("cell_id")), run_id=str(record.get("run_id", "")),
                   ended=str(record.get("ended", Ended.ERROR)),
                   tools=tools if isinstance(tools, list) else [],
                   trajectory=trajectory, calls=decoded)


def decode_episodes(records: Iterable[Mapping[str, Any]]) -> Iterator[EpisodeRecord]:
    """The episode records among ``records`` (JSON objects read from episodes.jsonl); a
    damaged one is skipped, as a torn line is."""
    for record in records:
        try:
            yield EpisodeRecord.from_record(record)
        except ValueError:
            continue


def append_episode(path: Path, episode: EpisodeRecord) -> None:
    """Append an episode's record (one locked line: workers may write at once)."""
    append_jsonl(path, episode.record())


def read_episodes(path: Path) -> dict[str, EpisodeRecord]:
    """The recorded episodes by cell id, the last record of each (a damaged record is
    skipped, as a torn line is)."""
    return {episode.cell_id: episode for episode in decode_episodes(read_jsonl(path))}


def episodes_of(path: Path, cell_ids: Collection[str]) -> Iterator[EpisodeRecord]:
    """The records of these cells, in the file's order (a rerun's comes last); a damaged
    record is skipped, other cells' lines unparsed."""
    return decode_episodes(record for _cell_id, record in cell_records(path, cell_ids))
