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

The core's own options (:data:`pytest_budgetbench.settings.config.OPTIONS`) are Options too, with
``dest`` the field of Settings they fill, and the same parsers: one family, where a parser
raises ``ValueError("must be ...")`` and :meth:`Option.read` names the option and the value
(``--budgetbench-items must be a positive integer (got '0')``). A parser whose message must
quote part of the value (one entry of a list) raises a complete ConfigError instead. Choices
are case-insensitive everywhere: ``--budgetbench-report=OFF`` is ``off``.

This module is at the bottom of the package: it imports nothing heavy, so reading a
class's declarations costs no more than importing the class.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pytest_budgetbench.errors import ConfigError

V = TypeVar("V")

Parser = Callable[[str], Any]
"""Turns the raw text of a value into the value; raises ValueError whose message says
what is expected, e.g. ``must be a positive integer``."""


@dataclass(frozen=True)
class Option:
    """One option: of a task or strategy, or of the core (``dest`` and ``section`` set)."""

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
    dest: str = ""
    """The argparse dest of its flag, ``budgetbench_<dest>``, and its ini ``budgetbench_<dest>``;
    for a core option, the field of Settings it fills (the ``key`` when not given)."""
    section: Literal["", "data", "task", "strategy"] = ""
    """Where a flag's value goes: "" a core option, a field of Settings; "data"
    (``Settings.data_paths``), "task" (``Settings.task_flags``) or "strategy"
    (``Settings.strategy_flags``), under ``key`` (for "data": the task's name)."""
    ini_type: Literal["string", "args", "linelist"] = "string"
    """pytest's ini type; "args" also takes a TOML list (``budgetbench_budgets = [512, 2048]``),
    "linelist" one entry per line (or a TOML list)."""
    flag_names: tuple[str, ...] = ()
    """The flags, where they are not ``--budgetbench-<flag or dest, dashed>``."""

    def __post_init__(self) -> None:
        if not self.dest:
            object.__setattr__(self, "dest", self.key)

    def read(self, raw: str, where: str) -> Any:
        """The parsed value; a bad one is a ConfigError naming ``where`` and the value."""
        try:
            return self.parse(str(raw).strip())
        except ValueError as exc:
            raise ConfigError(f"{where} {exc} (got {raw!r})") from None

    @property
    def flags(self) -> tuple[str, ...]:
        """Its flags, the first the one messages name."""
        return self.flag_names or ("--budgetbench-" + (self.flag or self.dest).replace("_", "-"),)

    @property
    def ini(self) -> str:
        return "budgetbench_" + self.dest

    @property
    def ini_default(self) -> str | list[str]:
        return "" if self.ini_type == "string" else []

    @property
    def default_text(self) -> str:
        """The default as a user would type it: ``full_context,truncation,rag``."""
        if isinstance(self.default, tuple):
            return ",".join(str(part) for part in self.default)
        return str(self.default)


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


def is_count(raw: str) -> bool:
    """ASCII digits only: str.isdigit() also accepts '²', which int() rejects."""
    return raw.isascii() and raw.isdigit()


def positive_int(raw: str) -> int:
    if not is_count(raw) or int(raw) <= 0:
        raise ValueError("must be a positive integer")
    return int(raw)


def integer(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError("must be an integer") from None


def _float(raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        return math.nan  # fails every range check below


def rate(raw: str) -> float:
    value = _float(raw)
    if not 0.0 <= value <= 1.0:
        raise ValueError("must be a rate between 0 and 1, e.g. 0.05")
    return value


def non_negative(raw: str) -> float:
    value = _float(raw)
    if not value >= 0:  # also rejects nan
        raise ValueError("must be a number >= 0")
    return value


def seconds(raw: str) -> float:
    value = _float(raw)
    if not 0 < value < math.inf:  # also rejects nan
        raise ValueError("must be a number of seconds > 0, e.g. 30")
    return value


def name_list(raw: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in raw.split(",") if part.strip())
    if not names:
        raise ValueError("must name at least one entry, e.g. a,b")
    return names


def keyed(option: str, raw: str | None, pairs: Iterable[tuple[str, V]],
          named: Callable[[str], str] = repr) -> dict[str, V]:
    """The ``(key, value)`` pairs of the list option ``option`` (its text ``raw``) as a
    dict, in order: the one rule of every keyed list option. A key given twice with the
    same value is taken once; with different values it is a ConfigError, never last-wins
    (``--budgetbench-min-retention=truncation@2048=0.5,truncation@2048=0`` would silently
    keep the weaker floor). ``named`` says a key in the message."""
    values: dict[str, V] = {}
    for key, value in pairs:
        if key in values and values[key] != value:
            raise ConfigError(
                f"{option} sets {named(key)} twice with different values, "
                f"{_shown(values[key])} and {_shown(value)}: keep the one you mean"
                + ("" if raw is None else f" (got {raw!r})"))
        values[key] = value
    return values


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else repr(value)


def choice(*choices: str) -> Parser:
    """One of ``choices`` (lower case), in any case: ``OFF`` is ``off``."""
    def parse(raw: str) -> str:
        if raw.lower() not in choices:
            raise ValueError(f"must be one of {'|'.join(choices)}")
        return raw.lower()

    return parse
