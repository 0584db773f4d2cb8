"""What a run is: the ``definition`` block of run.json, and how two of them are compared.

(run.json itself, and the block's place in it, are :mod:`~pytest_budgetbench.records.
run_json`'s.)

A cell id (task, item, strategy, budget) names a cell; the definition says what the cell
held: the settings that change a prompt, a request or a grade, and per task its option
values, its grader, a sha256 of its data file's content and a digest of each item::

    {"version": 1,
     "settings": {"model": ..., "seed": 0, "items": 10, "max_tokens": 32, ...},
     "tasks": {"memory": {"options": {...}, "grader": "memory-contains/1",
                          "data": {"path": "data/x.jsonl", "sha256": "..."} | null,
                          "items": {"0000": "<16 hex digits>", ...}}},
     "strategies": {"rag": {"options": {...}}}}

A resume must match its run's definition (:func:`differences`); ``budgetbench diff``
needs only the items to match (``items_only``), as a model or a strategy is what a diff
compares. Tasks or strategies that only one side has are new cells, not changed ones.
This module reads no settings and no task: the session builds the block.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_budgetbench.canonical import canonical_json, json_sha256

VERSION = 1

CELL_SETTINGS: tuple[str, ...] = (
    "model", "seed", "items", "max_tokens", "agent_max_tokens", "max_calls", "temperature",
    "tokenizer", "grader", "episodes", "chat_template_kwargs",
    "judge_model", "embedding_model", "embedding_backend", "aux_models",
)
"""The core settings that change what a cell is (its prompt, its request or its grade).
Others (concurrency, timeouts, retries, the out dir, gates, audit, shard, budgets and
strategies, which only select cells) may differ between a run and its resume."""
ITEM_SETTINGS: tuple[str, ...] = ("seed",)
"""The core settings that change a task's items."""
_LABELS = {"model": "model", "grader": "--budgetbench-grader (variants)",
           "tokenizer": "token counter"}
_DIGEST_CHARS = 16


@dataclass(frozen=True)
class Difference:
    """One way two definitions differ: what, its value in the first, in the second."""

    what: str
    old: Any
    new: Any


def differences(old: Mapping[str, Any], new: Mapping[str, Any], *,
                items_only: bool = False) -> list[Difference]:
    """How ``new`` differs from ``old`` in what defines cells (with ``items_only``: the
    items), most telling first: a setting, a task option, a data file, an item."""
    found: list[Difference] = []
    keys = ITEM_SETTINGS if items_only else CELL_SETTINGS
    old_settings, new_settings = old.get("settings") or {}, new.get("settings") or {}
    for key in keys:
        if key in old_settings and key in new_settings \
                and _canonical(old_settings[key]) != _canonical(new_settings[key]):
            found.append(Difference(_LABELS.get(key, "--budgetbench-" + key.replace("_", "-")),
                                    old_settings[key], new_settings[key]))
    old_tasks, new_tasks = old.get("tasks") or {}, new.get("tasks") or {}
    for name in (n for n in old_tasks if n in new_tasks):
        found += _task_differences(name, old_tasks[name], new_tasks[name], items_only)
    if not items_only:
        old_strategies, new_strategies = old.get("strategies") or {}, new.get("strategies") or {}
        for name in (n for n in old_strategies if n in new_strategies):
            found += _option_differences(f"strategy '{name}'", old_strategies[name],
                                         new_strategies[name])
    return found


def _task_differences(name: str, old: Mapping[str, Any], new: Mapping[str, Any],
                      items_only: bool) -> list[Difference]:
    found = _option_differences(f"task '{name}'", old, new)
    old_data, new_data = old.get("data") or {}, new.get("data") or {}
    if old_data.get("sha256") and new_data.get("sha256") \
            and old_data["sha256"] != new_data["sha256"]:
        found.append(Difference(f"task '{name}' data {new_data.get('path')} of sha256",
                                old_data["sha256"][:12], new_data["sha256"][:12]))
    if not items_only and "grader" in old and "grader" in new and old["grader"] != new["grader"]:
        found.append(Difference(f"task '{name}' grader", old["grader"], new["grader"]))
    old_items, new_items = old.get("items") or {}, new.get("items") or {}
    changed = [i for i in old_items if i in new_items and old_items[i] != new_items[i]]
    if changed:
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        found.append(Difference(f"task '{name}' item {changed[0]}{more} (digest of its "
                                "messages and answer)", old_items[changed[0]],
                                new_items[changed[0]]))
    return found


def _option_differences(owner: str, old: Mapping[str, Any], new: Mapping[str, Any]
                        ) -> list[Difference]:
    old_options, new_options = old.get("options") or {}, new.get("options") or {}
    return [Difference(f"{owner} option {key}", old_options[key], new_options[key])
            for key in old_options
            if key in new_options and _canonical(old_options[key]) != _canonical(new_options[key])]


def describe(found: list[Difference], template: str = "{what}: {old}, then {new}") -> str:
    """The first difference in words (``template`` places ``what``, ``old`` and ``new``),
    and how many more there are."""
    head = found[0]
    text = template.format(what=head.what, old=show(head.old), new=show(head.new))
    if len(found) > 1:
        text += f" (and {len(found) - 1} more difference{'s' if len(found) > 2 else ''})"
    return text


def show(value: Any, limit: int = 80) -> str:
    """A value for a one-line message: a string quoted, anything else as JSON; cut short."""
    text = repr(value) if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def plain(value: Any) -> Any:
    """``value`` as JSON holds it: an option's parsed value (a number, a dataclass) becomes
    something run.json can store and a later session compares equal."""
    return json.loads(_canonical(value))


def _canonical(value: Any) -> str:
    return canonical_json(value, ensure_ascii=True, default=_stable_text)


def _stable_text(value: object) -> str:
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))  # no address: same next session


def same_gold(recorded: Any, current: Any) -> bool:
    """Whether a row's recorded gold is the item's gold now (tuples read back as lists)."""
    return _canonical(recorded) == _canonical(current)


def item_digest(item_id: str, messages: Any, answer: Any, category: Any) -> str:
    """A short digest of what an item is: its messages, answer and category."""
    digest = json_sha256([item_id, messages, answer, category], default=_stable_text)
    return digest[:_DIGEST_CHARS]


def content_sha256(path: Path) -> str | None:
    """The sha256 of a data file's content, or of every file under a data directory (by
    relative path and content); None when nothing is there."""
    if path.is_file():
        files = [(path.name, path)]
    elif path.is_dir():
        files = sorted((str(p.relative_to(path)), p) for p in path.rglob("*") if p.is_file())
    else:
        return None
    digest = hashlib.sha256()
    for name, file in files:
        if path.is_dir():  # names and sizes too: moving bytes between files changes it
            digest.update(f"{name}\0{file.stat().st_size}\0".encode())
        with file.open("rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()
