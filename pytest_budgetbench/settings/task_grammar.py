"""The grammar of task definitions: ``NAME=TASK(KEY=VALUE, ...)``.

``--budgetbench-tasks`` and ``--budgetbench-named-tasks`` (``budgetbench_named_tasks``)
take such definitions; :mod:`pytest_budgetbench.tasks.named` turns one into a task class.
The text is parsed here, at the bottom of the package, because settings are validated
(:mod:`pytest_budgetbench.settings.config`) below the layer where tasks are resolved: a malformed
definition is a usage error before any task module is imported.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pytest_budgetbench.errors import ConfigError
from pytest_budgetbench.options import keyed


def split_top_level(raw: str) -> list[str]:
    """``raw`` split at the commas outside parentheses and quotes, each part stripped,
    empty parts dropped: ``a,b=jsonl(path=x, grader=f1)`` is two parts."""
    parts: list[str] = []
    current: list[str] = []
    depth, quote = 0, ""
    for char in raw:
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        current.append(char)
    parts.append("".join(current))
    return [part.strip() for part in parts if part.strip()]


TaskDefinition = tuple[str, dict[str, str]]
"""A named task instance: (the task it is an instance of, its KEY=VALUE options as text)."""

_DEFINITION = re.compile(
    r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*=\s*(?P<kind>[A-Za-z0-9_.:]+)\s*"
    r"(?:\((?P<params>.*)\))?", re.DOTALL)
DEFINITION_EXAMPLE = "support_chats=jsonl(path=data/chats.jsonl, grader=f1)"


def parse_task_definition(text: str, option: str) -> tuple[str, TaskDefinition]:
    """``NAME=TASK(KEY=VALUE, ...)`` -> (NAME, (TASK, {KEY: VALUE})); a value may be quoted
    ("..." or '...') to hold commas or parentheses."""
    match = _DEFINITION.fullmatch(text.strip())
    if match is None or _unbalanced(text):
        raise ConfigError(
            f"{option}: {text!r} is not a task definition NAME=TASK(KEY=VALUE, ...), e.g. "
            f"{option}={DEFINITION_EXAMPLE}"
        )
    params: list[tuple[str, str]] = []
    for part in split_top_level(match["params"] or ""):
        key, eq, value = part.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise ConfigError(
                f"{option}: task '{match['name']}' option {part!r} is not KEY=VALUE, e.g. "
                f"{DEFINITION_EXAMPLE}"
            )
        params.append((key.strip(), _unquote(value.strip())))
    return match["name"], (match["kind"], keyed(
        f"{option}: task '{match['name']}'", text, params))


def _unbalanced(text: str) -> bool:
    stripped = re.sub(r"\"[^\"]*\"|'[^']*'", "", text)
    return stripped.count("(") != stripped.count(")") or '"' in stripped or "'" in stripped


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def parse_named_tasks(raw: str) -> dict[str, TaskDefinition]:
    """``--budgetbench-named-tasks``: definitions separated by commas (or ini lines)."""
    option = "--budgetbench-named-tasks"
    return keyed(option, raw, (parse_task_definition(part, option)
                               for part in split_top_level(raw)),
                 named=lambda name: f"task {name!r}")


def parse_task_list(raw: str) -> tuple[str, ...]:
    """``--budgetbench-tasks``: names, ``module:attr`` or inline definitions, split at the
    commas outside parentheses (:func:`task_entries` separates the definitions)."""
    entries = tuple(split_top_level(raw))
    if not entries:
        raise ConfigError("--budgetbench-tasks must name at least one entry, e.g. "
                          "--budgetbench-tasks=a,b (got '')")
    return entries


def task_entries(entries: Sequence[str]) -> tuple[tuple[str, ...], dict[str, TaskDefinition]]:
    """The task names of ``--budgetbench-tasks`` entries, and the instances defined inline
    (``NAME=TASK(...)`` selects NAME and defines it)."""
    names: list[str] = []
    defined: dict[str, TaskDefinition] = {}
    for entry in entries:
        if "=" in entry:
            name, definition = parse_task_definition(entry, "--budgetbench-tasks")
            defined[name] = definition
            entry = name
        if entry in names:
            raise ConfigError(f"--budgetbench-tasks: '{entry}' is listed twice; list it once")
        names.append(entry)
    return tuple(names), defined
