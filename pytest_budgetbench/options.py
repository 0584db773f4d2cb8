"""Options a task or strategy declares, as class data (in the spirit of inspect_ai's ``-T``).

A task or strategy lists what it reads in its ``declared_options`` class attribute; the core never
names one. From these declarations the plugin builds flags, ini twins and validation::

    class MyTask(Task):
        name = "my_task"
        data = DataFile("my_task.jsonl")            # --budgetbench-data-my_task=PATH
        declared_options = (*Task.declared_options,
                            Option("max_turns", "turns kept per item", positive_int, 20),)

A value is given as ``--budgetbench-task-options=max_turns=12`` (or
``--budgetbench-strategy-options=KEY=VALUE`` for a strategy); an option with a ``flag``
also gets its own ``--budgetbench-<flag>``, its ini twin ``budgetbench_<flag>`` (dashes as
underscores) and, when ``env`` is set, an environment variable. Keys are flat: a key is
accepted when a task (strategy) of the sweep declares it, and each declaring class parses
it. Keys carry their owner in their name where they are not shared (``budgetmem_axis``).

This module is at the bottom of the package: it imports nothing heavy, so reading a
class's declarations costs no more than importing the class.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pytest_budgetbench.errors import ConfigError

Parser = Callable[[str], Any]
"""Turns the raw text of a value into the value; raises ValueError whose message says
what is expected, e.g. ``must be a positive integer``."""


@dataclass(frozen=True)
class Option:
    """One option of a task or strategy."""

    key: str
    help: str
    parse: Parser = str
    default: Any = None
    flag: str | None = None
    """Its own flag, ``--budgetbench-<flag>`` (e.g. ``memory-history``), besides KEY=VALUE."""
    env: str | None = None
    metavar: str | None = None
    required: bool = False
    """No usable default (e.g. a model directory): a sweep with a class that declares it
    must give it, or it is a usage error before collection (:func:`check_required`)."""

    def read(self, raw: str, where: str) -> Any:
        """The parsed value; a bad one is a ConfigError naming ``where`` and the value."""
        try:
            return self.parse(str(raw).strip())
        except ValueError as exc:
            raise ConfigError(f"{where} {exc} (got {raw!r})") from None


@dataclass(frozen=True)
class DataFile:
    """The official file or directory a task reads, from ``--budgetbench-data-<task>``."""

    what: str
    """What the path names, for help, e.g. ``data.json`` or ``a directory of .txt files``."""
    required: bool = True
    """False when the task also runs without it (e.g. on generated filler)."""


def owner_name(cls: type[Any]) -> str:
    return str(getattr(cls, "name", "") or cls.__name__)


def declared(cls: type[Any]) -> tuple[Option, ...]:
    return tuple(getattr(cls, "declared_options", ()) or ())


def resolve_values(cls: type[Any], given: Mapping[str, str], where: str) -> dict[str, Any]:
    """Every option ``cls`` declares, parsed from ``given`` or at its default."""
    values: dict[str, Any] = {}
    for option in declared(cls):
        raw = given.get(option.key)
        values[option.key] = option.default if raw is None else option.read(
            raw, f"{where} {option.key} ({_kind(cls)} '{owner_name(cls)}')")
    return values


def check_keys(
    kind: str, flag: str, given: Mapping[str, str], classes: Iterable[type[Any]]
) -> None:
    """Each key of ``given`` must be declared by one of ``classes``, and valid for each.

    ``kind`` is "task" or "strategy"; ``flag`` is the option the keys came from.
    """
    owners = {owner_name(cls): cls for cls in classes}
    accepted: dict[str, list[str]] = {}
    for name, cls in owners.items():
        for option in declared(cls):
            accepted.setdefault(option.key, []).append(name)
    for key, raw in given.items():
        if key not in accepted:
            keys = ", ".join(sorted(accepted)) or "none"
            raise ConfigError(
                f"{flag}: unknown key '{key}': no {kind} of this sweep "
                f"({', '.join(owners)}) declares it; accepted keys: {keys}"
            )
        for name in accepted[key]:
            option = next(o for o in declared(owners[name]) if o.key == key)
            option.read(raw, f"{flag}: {key} ({kind} '{name}')")


def check_required(
    kind: str, flag: str, given: Mapping[str, str], classes: Iterable[type[Any]]
) -> None:
    """Each required option of ``classes`` must be in ``given`` (its KEY=VALUE pairs and
    own flags); else a ConfigError that says how to give it."""
    for cls in classes:
        for option in declared(cls):
            if option.required and option.key not in given:
                own = f" (or --budgetbench-{option.flag})" if option.flag else ""
                raise ConfigError(
                    f"{kind} '{owner_name(cls)}' needs {option.key}, {option.help}: pass "
                    f"{flag}={option.key}={option.metavar or 'VALUE'}{own}"
                )


def _kind(cls: type[Any]) -> str:
    # Duck-typed so this module imports neither tasks nor strategies.
    return "task" if hasattr(cls, "grader_version") else "strategy"


# -- parsers: raise ValueError("must be ...") ------------------------------------------
def text(raw: str) -> str:
    if not raw:
        raise ValueError("must not be empty")
    return raw


def positive_int(raw: str) -> int:
    if not (raw.isascii() and raw.isdigit()) or int(raw) <= 0:
        raise ValueError("must be a positive integer")
    return int(raw)


def choice(*choices: str) -> Parser:
    def parse(raw: str) -> str:
        if raw.lower() not in choices:
            raise ValueError(f"must be one of {'|'.join(choices)}")
        return raw.lower()

    return parse
