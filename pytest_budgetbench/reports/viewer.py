"""The per-cell viewer's data: for each item, every cell's row and post-strategy prompt.

The report's tables read a few typed columns of every row; the viewer needs the rest of a
row (reply, extracted answer, gold, grader, auxiliary calls) and the prompt, which only
``prompts.jsonl`` holds (``--budgetbench-audit=full``; ``hash`` keeps its sha256 only).
So it streams the run's files once more, and keeps the rows of at most
:data:`MAX_ROWS` rows' worth of items: the first items in the records' order, shown sorted.
Rows are decoded as :mod:`~pytest_budgetbench.records.rows` defines them, the fields shown
being the schema's (``PAGE_KEYS``); prompts and episodes are read through
:class:`~pytest_budgetbench.records.store.RunStore`, which skips other cells' lines on
their leading ``cell_id`` without parsing them.

The document (:func:`viewer_data`) is what the page's script renders on demand::

    cells  [{side, task, strategy, budget, reference, ref}]   ref: the cell index that
           wins and losses are counted against (the task's reference; in a diff, run A)
    items  [{key, task, item, category, gold, msgs, full, rows}]
           msgs  every distinct message of the item's prompts once: [role, text] or
                 [role, text, {"calls": [[id, name, arguments as pretty JSON]]}] for an
                 assistant's tool calls, [role, text, {"call": id, "name"?}] for a tool
                 result
           full  the full history (a reference cell's prompt) as indices into msgs, or null
           rows  one per cell and repeat, keys as in records.rows.PAGE_KEYS, "p" the prompt's msgs
                 indices (null when not kept) and "pm" why ("full", "hash", "none", "cap");
                 "ev" the item's evidence spans with the prompt, [[span, kept]] (where
                 prompts.jsonl records them: audit=full, an item with evidence);
                 an episode cell's row (``calls`` set) has "ep" (see :func:`_episode`), or
                 "em" why not ("none": no record in episodes.jsonl, "cap")
    note   why items or prompts were left out, or ""

An episode cell's record comes from ``<run_dir>/episodes.jsonl`` (the last record of a
cell wins), read only when a picked row is an episode's; a missing file or a record it
cannot read leaves that cell without an episode view, never the page without a viewer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_budgetbench.messages import text_of, tool_calls_of
from pytest_budgetbench.records.cells import cells_file, read_rows
from pytest_budgetbench.records.episodes import CALL_PAGE_KEYS, CallRecord, EpisodeRecord
from pytest_budgetbench.records.prompts import PromptRecord
from pytest_budgetbench.records.rows import PAGE_KEYS
from pytest_budgetbench.records.store import RunStore

MAX_ROWS = 25_000
"""Rows embedded in one page (a 25-cell sweep of 1,000 items); beyond, items are left out
and the page says how many. The tables above it always cover every item."""
MAX_PROMPT_CHARS = 16_000_000
"""Prompt text embedded in one page; the prompts of later items are left out beyond it."""
MAX_TEXT_CHARS = 20_000
"""A message, reply or error longer than this is cut, and says by how much."""
MAX_AUX_CALLS = 50
MAX_EPISODE_CALLS = 500
"""Calls of one episode shown; a longer episode says how many it had."""

# The row fields shown, and each one's short key on the page, are the schema's
# (records.rows.PAGE_KEYS); these are the free texts among them, cut when long.
_CLIPPED = frozenset({"prediction", "error", "extracted"})


@dataclass(frozen=True)
class Side:
    """Runs read as one: a report's runs (label ""), or one run of a diff ("A", "B")."""

    label: str
    run_dirs: Sequence[Path]


@dataclass(frozen=True)
class ViewerCell:
    side: str
    task: str
    strategy: str
    budget: int
    reference: bool = False
    ref: int | None = None

    def public(self) -> dict[str, Any]:
        return {"side": self.side, "task": self.task, "strategy": self.strategy,
                "budget": self.budget, "reference": self.reference, "ref": self.ref}


CellKey = tuple[str, str, str, int]
"""(side, task, strategy, budget)"""


def viewer_data(
    sides: Sequence[Side],
    cells: Sequence[ViewerCell],
    *,
    max_rows: int = MAX_ROWS,
    max_prompt_chars: int = MAX_PROMPT_CHARS,
) -> dict[str, Any]:
    """The viewer's document for these cells (see the module docstring)."""
    index = {(c.side, c.task, c.strategy, c.budget): i for i, c in enumerate(cells)}
    picked = _Picked(max_rows)
    for side in sides:
        for run_dir in side.run_dirs:
            for row in _rows_of(cells_file(run_dir), picked):
                key = (side.label, str(row.get("task")), str(row.get("strategy")),
                       _integer(row.get("budget")))
                if key in index:
                    picked.add(side.label, index[key], row)
    prompts = _prompts(sides, picked)
    episodes = _episodes(sides, picked)
    items, capped = _items(cells, picked, prompts, episodes, max_prompt_chars)
    notes = []
    if picked.left_out:
        total = len(picked.items) + len(picked.left_out)
        notes.append(f"The viewer holds {len(picked.items)} of {total} items (the first in "
                     f"the records, up to {max_rows:,} rows); the tables cover every item.")
    if capped:
        notes.append(f"The prompts of {capped} items are left out (over "
                     f"{max_prompt_chars:,} characters of prompt text in one page).")
    return {"cells": [c.public() for c in cells], "items": items, "note": " ".join(notes)}


class _Picked:
    """The items the page holds and their rows, chosen in the records' order."""

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self.items: dict[tuple[str, str], dict[tuple[str, int, int], dict[str, Any]]] = {}
        self.left_out: set[tuple[str, str]] = set()
        self.rows = 0
        self.item_ids: set[str] = set()

    @property
    def full(self) -> bool:
        return self.rows >= self.max_rows

    def add(self, side: str, cell: int, row: dict[str, Any]) -> None:
        item = (str(row.get("task")), str(row.get("item_id")))
        rows = self.items.get(item)
        if rows is None:
            if self.full:
                self.left_out.add(item)
                return
            rows = self.items[item] = {}
            self.item_ids.add(item[1])
        key = (side, cell, _integer(row.get("repeat")))
        if key not in rows:
            self.rows += 1
        rows[key] = row  # a resumed cell's last row wins


def _rows_of(path: Path, picked: _Picked) -> Iterator[dict[str, Any]]:
    """The rows of a cells file, read as the report's loader reads them (records.cells);
    once the page is full, only those of picked items: a row of another item is counted as
    left out. A file that cannot be read gives none: the tables, read before, said so."""
    try:
        for row in read_rows(path):
            if picked.full and "task" in row and "item_id" in row:
                item = (str(row["task"]), str(row["item_id"]))
                if item[1] not in picked.item_ids:
                    picked.left_out.add(item)
                    continue
            yield row
    except OSError:
        return


def _wanted(picked: _Picked, episodes: bool = False) -> dict[tuple[str, str], str | None]:
    """(side, cell_id) -> the prompt sha256 of each picked row (of each episode row's when
    ``episodes``)."""
    wanted: dict[tuple[str, str], str | None] = {}
    for rows in picked.items.values():
        for (label, _cell, _repeat), row in rows.items():
            if not episodes or row.get("calls") is not None:
                wanted[(label, str(row.get("cell_id")))] = row.get("prompt_sha256")
    return wanted


def _prompts(sides: Sequence[Side], picked: _Picked) -> dict[tuple[str, str], PromptRecord]:
    """(side, cell_id) -> the prompts.jsonl record of each picked row, the one whose sha256
    the row names when a resumed cell wrote several."""
    wanted = _wanted(picked)
    found: dict[tuple[str, str], PromptRecord] = {}
    for side in sides:
        cell_ids = {c for s, c in wanted if s == side.label}
        for run_dir in side.run_dirs:
            for prompt in RunStore.of(run_dir).prompts_of(cell_ids):
                key = (side.label, prompt.cell_id)
                if key not in found or prompt.prompt_sha256 == wanted[key]:
                    found[key] = prompt
    return found


def _episodes(sides: Sequence[Side], picked: _Picked) -> dict[tuple[str, str], EpisodeRecord]:
    """(side, cell_id) -> the episodes.jsonl record of each picked episode row: the last
    one of its cell (a rerun's). No file is opened when no picked row is an episode's."""
    wanted = _wanted(picked, episodes=True)
    found: dict[tuple[str, str], EpisodeRecord] = {}
    for side in sides:
        cell_ids = {c for s, c in wanted if s == side.label}
        for run_dir in side.run_dirs:
            for episode in RunStore.of(run_dir).episodes_of(cell_ids):
                found[(side.label, episode.cell_id)] = episode
    return found


def _items(
    cells: Sequence[ViewerCell],
    picked: _Picked,
    prompts: Mapping[tuple[str, str], PromptRecord],
    episodes: Mapping[tuple[str, str], EpisodeRecord],
    max_prompt_chars: int,
) -> tuple[list[dict[str, Any]], int]:
    items = []
    budget = max_prompt_chars
    capped = 0
    for (task, item_id), rows in sorted(picked.items.items()):
        messages = _Messages()
        entries = []
        for (side, cell, repeat), row in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][2])):
            cell_id = str(row.get("cell_id"))
            prompt = prompts.get((side, cell_id))
            entry = _entry(row, cell, repeat)
            if prompt is None:
                entry["pm"] = "none"
            elif prompt.messages is None:
                entry["pm"] = "hash"
            else:
                entry["p"] = messages.indices(prompt.messages)
                entry["pm"] = "full"
                if prompt.evidence:
                    entry["ev"] = [[clip(mark.span), mark.kept] for mark in prompt.evidence]
                    messages.chars += sum(len(mark[0]) + 8 for mark in entry["ev"])
            if row.get("calls") is not None:
                episode = _episode(episodes.get((side, cell_id)), messages)
                if episode is None:
                    entry["em"] = "none"
                else:
                    entry["ep"] = episode
            entries.append(entry)
        if messages.chars > budget:
            capped += 1
            for entry in entries:
                if entry.pop("p", None) is not None:
                    entry["pm"] = "cap"
                entry.pop("ev", None)  # the prompt's evidence marks go with it
                if entry.pop("ep", None) is not None:
                    entry["em"] = "cap"
            messages = _Messages()
        else:
            budget -= messages.chars
        first = next(iter(rows.values()))
        items.append({
            "key": f"{task}/{item_id}",
            "task": task,
            "item": item_id,
            "category": first.get("category"),
            "gold": next((r["gold"] for r in rows.values() if r.get("gold") is not None), None),
            "msgs": messages.table,
            "full": _full_history(cells, entries),
            "rows": entries,
        })
    return items, capped


def _episode(record: EpisodeRecord | None, messages: _Messages) -> dict[str, Any] | None:
    """An episode's record for the page, its messages held in the item's table::

        {"traj": msgs indices of the trajectory, "tools": [tool names], "ended": str,
         "calls": [{"k": call number, "p": msgs indices of the prompt as sent,
                    "n": positions in "p" of messages the strategy made,
                    "d": msgs indices of trajectory messages it dropped (before "seen"),
                    "seen", and the call's fields by their short keys (records.episodes'
                    CALL_PAGE_KEYS: "t" counted tokens, "st", "o", "ms", "ca", "nt",
                    "et", "ek" evidence shown and kept; teacher-forced: "sp" the reference
                    step, "sx" / "sn" exact / name-right, "pr" msgs index of the prediction;
                    "ev" the evidence spans shown so far, [[span, kept]])}],
         "callsn": the episode's calls when more than MAX_EPISODE_CALLS}

    None when there is no record (a record without a trajectory and calls is none)."""
    if record is None:
        return None
    calls = record.calls
    positions = messages.indices(record.trajectory)
    shown = [_episode_call(call, positions, messages) for call in calls[:MAX_EPISODE_CALLS]]
    episode: dict[str, Any] = {
        "traj": positions, "ended": record.ended, "calls": shown,
        "tools": [_tool_name(tool) for tool in record.tools],
    }
    if len(calls) > MAX_EPISODE_CALLS:
        episode["callsn"] = len(calls)
    return episode


def _episode_call(call: CallRecord, positions: list[int], messages: _Messages
                  ) -> dict[str, Any]:
    """One call: its prompt rebuilt from its parts (a trajectory message as is, or one the
    strategy made); what it dropped is every trajectory message before ``seen`` that no
    part names."""
    sent: list[int] = []
    made: list[int] = []
    named: set[int] = set()
    for part in call.prompt_parts():
        if isinstance(part, int):
            if 0 <= part < len(positions):
                named.add(part)
                sent.append(positions[part])
        else:
            made.append(len(sent))
            sent.extend(messages.indices([part]))
    seen = min(call.seen, len(positions)) if isinstance(call.seen, int) else len(positions)
    dropped = [positions[i] for i in range(seen) if i not in named]
    messages.chars += 4 * (len(sent) + len(dropped))  # the indices weigh on the page too
    entry: dict[str, Any] = {"k": call.call, "p": sent, "n": made, "d": dropped,
                             "seen": seen}
    for name, key in CALL_PAGE_KEYS.items():
        value = getattr(call, name)
        if value is not None:
            entry[key] = value
    if call.predicted is not None:  # teacher-forced: the model's step, beside the reference's
        (entry["pr"],) = messages.indices([call.predicted])
    if call.evidence:  # the spans shown by this call, each kept or dropped
        entry["ev"] = [[clip(str(span)), bool(kept)] for span, kept in call.evidence]
        messages.chars += sum(len(mark[0]) + 8 for mark in entry["ev"])
    return entry


def _tool_name(tool: Any) -> str:
    function = tool.get("function") if isinstance(tool, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    return str(name) if name is not None else json.dumps(tool, default=str)[:80]


def _entry(row: Mapping[str, Any], cell: int, repeat: int) -> dict[str, Any]:
    entry: dict[str, Any] = {"c": cell, "r": repeat}
    for name, key in PAGE_KEYS.items():
        value = row.get(name)
        if value is None or value == "":
            continue
        entry[key] = clip(value) if name in _CLIPPED and isinstance(value, str) else value
    calls = row.get("aux_calls")
    if isinstance(calls, list) and calls:
        entry["aux"] = calls[:MAX_AUX_CALLS]
        if len(calls) > MAX_AUX_CALLS:
            entry["auxn"] = len(calls)
    return entry


def _full_history(cells: Sequence[ViewerCell], entries: list[dict[str, Any]]) -> list[int] | None:
    """The longest prompt a reference cell (full_context) sent: the item's whole history."""
    prompts = [e["p"] for e in entries if e.get("p") is not None and cells[e["c"]].reference]
    return max(prompts, key=len) if prompts else None


class _Messages:
    """An item's distinct messages, each held once however many prompts share it."""

    def __init__(self) -> None:
        self.table: list[list[Any]] = []
        self._index: dict[str, int] = {}
        self.chars = 0

    def indices(self, messages: Iterable[Any]) -> list[int]:
        out = []
        for message in messages:
            shown = _shown(message)
            key = json.dumps(shown, ensure_ascii=False)
            position = self._index.get(key)
            if position is None:
                position = self._index[key] = len(self.table)
                self.table.append(shown)
                self.chars += len(key)
            out.append(position)
        return out


def _shown(message: Any) -> list[Any]:
    """A message as the page shows it: [role, text], and for tool traffic a third part,
    ``{"calls": [[id, name, arguments]]}`` (an assistant's calls, arguments as pretty
    JSON) or ``{"call": id, "name"?: str}`` (a tool result and the call it answers)."""
    if not isinstance(message, dict):
        return ["?", clip(json.dumps(message, ensure_ascii=False, default=str))]
    text = text_of(message)
    content = message.get("content")
    if isinstance(content, list):
        other = sum(1 for part in content if isinstance(part, dict) and part.get("type") != "text")
        if other:
            text += f"\n[{other} non-text part{'s' if other > 1 else ''}]"
    result = message.get("role") == "tool"
    extra = {k: v for k, v in message.items() if k not in (
        "role", "content", "tool_calls", "tool_call_id", *(("name",) if result else ()))}
    if extra:  # names and the like: shown as data
        text += ("\n" if text else "") + json.dumps(extra, ensure_ascii=False, default=str)
    shown: list[Any] = [str(message.get("role", "?")), clip(text)]
    calls = tool_calls_of(message)
    if calls:
        shown.append({"calls": [_call(call) for call in calls]})
    elif result:
        shown.append({"call": str(message.get("tool_call_id"))}
                     | ({"name": str(message["name"])} if message.get("name") else {}))
    return shown


def _call(call: Any) -> list[str]:
    """[id, name, arguments]: arguments that are JSON, indented; any other text as it is."""
    if not isinstance(call, dict):
        return ["", "?", clip(json.dumps(call, ensure_ascii=False, default=str))]
    function = call.get("function")
    if not isinstance(function, dict):
        function = {}
    arguments = function.get("arguments", "")
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        pretty = json.dumps(parsed, ensure_ascii=False, indent=2, default=str)
    except ValueError:
        pretty = str(arguments)
    return [str(call.get("id", "")), str(function.get("name", "?")), clip(pretty)]


def clip(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"… [{len(text) - limit:,} more characters]"


def _integer(value: object) -> int:
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return 0
