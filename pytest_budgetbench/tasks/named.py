"""Named task instances: one task class, a name of its own, and its options preset.

``support_chats=jsonl(path=data/chats.jsonl, grader=f1)`` (in ``--budgetbench-tasks`` or
``budgetbench_named_tasks``) makes a subclass of the ``jsonl`` task named
``support_chats``: its cells and rows carry that name, its data flag is
``--budgetbench-data-support_chats``, ``path`` is its data file unless that flag gives
another, and every other KEY=VALUE becomes the default of the option the task declares
under that key (``--budgetbench-task-options`` still overrides it, for every task that
declares the key). Any task can be instantiated so, a built-in, an entry point or a
``module:attr`` class alike. The definition's text is read by
:mod:`pytest_budgetbench.settings.task_grammar` (below the settings, which check it before any
task is imported); this module turns a parsed definition into its class.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from pytest_budgetbench.errors import ConfigError
from pytest_budgetbench.registry import Registry
from pytest_budgetbench.settings.task_grammar import TaskDefinition
from pytest_budgetbench.tasks.base import Task

PATH_KEY = "path"
"""The instance option that names its data file."""


def instance_class(registry: Registry[Task], name: str, definition: TaskDefinition) -> type[Task]:
    """The task class of the instance ``name``; the same class for the same definition."""
    kind, params = definition
    return _instance(registry, name, kind, tuple(sorted(params.items())))


@functools.cache
def _instance(registry: Registry[Task], name: str, kind: str,
              params: tuple[tuple[str, str], ...]) -> type[Task]:
    where = f"task '{name}' ({name}={kind}(...))"
    if name in registry.available():
        raise ConfigError(f"{where}: '{name}' is already the name of a registered task; "
                          "give the instance another name")
    base = registry.resolve(kind)
    given = dict(params)
    path = given.pop(PATH_KEY, None)
    if path is not None and base.data is None:
        raise ConfigError(f"{where}: task '{base.name or kind}' reads no data file, so it "
                          f"takes no {PATH_KEY}=")
    declared = {option.key: option for option in base.declared_options}
    for key in given:
        if key not in declared:
            accepted = ", ".join([PATH_KEY, *sorted(declared)] if base.data else sorted(declared))
            raise ConfigError(f"{where}: task '{base.name or kind}' declares no option "
                              f"'{key}'; accepted keys: {accepted}")
    values = {key: declared[key].read(raw, f"{where}: {key}") for key, raw in given.items()}
    options = tuple(dataclasses.replace(option, default=values[option.key])
                    if option.key in values else option for option in base.declared_options)
    attrs: dict[str, Any] = {
        "name": name,
        "declared_options": options,
        "default_data_path": path if path is not None else base.default_data_path,
        "instance_of": base.name or kind,
        "__module__": base.__module__,
        "__qualname__": f"{base.__qualname__}[{name}]",
    }
    return type(f"{base.__name__}[{name}]", (base,), attrs)
