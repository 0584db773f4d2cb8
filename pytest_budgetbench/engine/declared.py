"""The options tasks and strategies declare, gathered from their registries.

The core names no task: this module reads each registered class's ``data`` and
``options`` (:mod:`pytest_budgetbench.options`) and turns them into

- flags with ini twins, as more :class:`~pytest_budgetbench.options.Option` objects: one
  ``--budgetbench-data-<task>`` per task with a data file, and one flag per option that
  names a ``flag`` (one flag for a key several classes declare);
- the check, before collection, of ``--budgetbench-task-options`` and
  ``--budgetbench-strategy-options`` against the sweep's tasks and strategies.

The values a task or strategy receives are parsed with no registry, by the settings
(:func:`~pytest_budgetbench.settings.config.task_values`).

Reading the declarations imports the task and strategy modules, which import nothing
heavy at module level (models, torch and embedders load on first use).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pytest_budgetbench.errors import ConfigError
from pytest_budgetbench.options import (
    Option,
    Parser,
    check_keys,
    check_required,
    declared,
    owner_name,
)
from pytest_budgetbench.settings.config import (
    OPTIONS,
    STRATEGY_OPTIONS_FLAG,
    TASK_OPTIONS_FLAG,
    Settings,
)
from pytest_budgetbench.settings.task_grammar import TaskDefinition
from pytest_budgetbench.strategies import REGISTRY as STRATEGIES
from pytest_budgetbench.strategies import Strategy
from pytest_budgetbench.tasks import REGISTRY as TASKS
from pytest_budgetbench.tasks import Task, resolve_task


def flag_specs(
    tasks: Iterable[str] = (),
    strategies: Iterable[str] = (),
    *,
    registered: bool = True,
    known: Iterable[Option] = (),
    named: Mapping[str, TaskDefinition] | None = None,
) -> list[Option]:
    """The declared flags of the registered tasks and strategies (unless not
    ``registered``), of the ``module:attr`` ones among ``tasks`` and ``strategies`` and of
    the ``named`` task instances, in registry order; none whose dest is among ``known`` or
    the core's. A named instance that does not resolve gets no flags here: the settings
    check reports it."""
    specs: dict[str, Option] = {spec.dest: spec for spec in (*OPTIONS, *known)}
    taken = set(specs)
    task_classes = TASKS.classes(tasks, registered=registered)
    for name in named or {}:
        try:
            task_classes.append(resolve_task(name, named))
        except ConfigError:
            # Its data flag still parses, so the settings check can name the real problem.
            specs.setdefault(f"data_{name}", _data_spec(name, "its data file"))
    for task in task_classes:
        if task.data is not None:
            name = owner_name(task)
            specs.setdefault(f"data_{name}", _data_spec(name, task.data.what))
        _add_flags(specs, task, "task")
    for strategy in STRATEGIES.classes(strategies, registered=registered):
        _add_flags(specs, strategy, "strategy")
    return [spec for dest, spec in specs.items() if dest not in taken]


def _data_spec(name: str, what: str) -> Option:
    dest = f"data_{name}"
    # Named after the task exactly (--budgetbench-data-longbench_v2), and all dashes.
    dashed = "--budgetbench-data-" + name.replace("_", "-")
    flags = dict.fromkeys(("--budgetbench-data-" + name, dashed))
    return Option(name, f"path of the {name} data ({what})", str,
                  env=f"BUDGETBENCH_DATA_{name.upper()}", metavar="PATH", dest=dest,
                  section="data", flag_names=tuple(flags))


def _add_flags(
    specs: dict[str, Option], cls: type[Any], section: Literal["task", "strategy"]
) -> None:
    for option in declared(cls):
        if option.flag is None:
            continue
        dest = option.flag.replace("-", "_")
        # The first declaration of a flag wins; a clash with a core option is dropped.
        specs.setdefault(dest, dataclasses.replace(
            option, help=f"{option.help} ({section} option {option.key})",
            parse=_validator(option), dest=dest, section=section))


def _validator(option: Option) -> Parser:
    flag = "--budgetbench-" + option.flag.replace("_", "-") if option.flag else option.key

    def validate(raw: str) -> str:
        option.read(raw, flag)
        return raw.strip()

    return validate


def check_options(
    settings: Settings, tasks: Iterable[type[Task]], strategies: Iterable[type[Strategy]]
) -> None:
    """KEY=VALUE task and strategy options: each key declared by the sweep, each value
    valid for every class that declares it, each required option given; else a
    ConfigError naming them."""
    tasks, strategies = list(tasks), list(strategies)
    check_keys("task", TASK_OPTIONS_FLAG, settings.task_options or {}, tasks)
    check_keys("strategy", STRATEGY_OPTIONS_FLAG, settings.strategy_options or {}, strategies)
    check_required("task", TASK_OPTIONS_FLAG, settings.raw_task_options(), tasks)
    check_required("strategy", STRATEGY_OPTIONS_FLAG, settings.raw_strategy_options(), strategies)

