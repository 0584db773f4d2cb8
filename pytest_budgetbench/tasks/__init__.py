"""Task registry: built-in names, the ``budgetbench.tasks`` entry points, ``module:attr``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pytest_budgetbench.errors import ConfigError
from pytest_budgetbench.registry import Registry
from pytest_budgetbench.settings.task_grammar import TaskDefinition
from pytest_budgetbench.tasks.base import (
    Environment,
    EpisodicTask,
    GoldAnswers,
    Grade,
    Item,
    ReferenceStep,
    StepScore,
    Task,
    TaskOptions,
)

__all__ = ["REGISTRY", "Environment", "EpisodicTask", "GoldAnswers", "Grade", "Item",
           "ReferenceStep", "StepScore", "Task", "TaskOptions",
           "resolve_task", "sweep_tasks"]

REGISTRY: Registry[Task] = Registry(
    kind="task",
    option="--budgetbench-tasks",
    group="budgetbench.tasks",
    base=Task,
    builtin={
        "memory": "pytest_budgetbench.tasks.memory:MemoryTask",
        "longbench_v2": "pytest_budgetbench.tasks.longbench_v2:LongBenchV2Task",
        "longmemeval": "pytest_budgetbench.tasks.longmemeval:LongMemEvalTask",
        "locomo": "pytest_budgetbench.tasks.locomo:LoCoMoTask",
        "hotpotqa": "pytest_budgetbench.tasks.hotpotqa:HotpotQATask",
        "swe_verified": "pytest_budgetbench.tasks.swe_verified:SWEVerifiedTask",
        "needle": "pytest_budgetbench.tasks.needle:NeedleTask",
        "agent_lookup": "pytest_budgetbench.tasks.agent_lookup:AgentLookupTask",
        "tau2_retail": "pytest_budgetbench.tasks.tau2_retail:Tau2RetailTask",
        "bfcl_multi_turn_base": "pytest_budgetbench.tasks.bfcl:BFCLMultiTurnBase",
        "bfcl_multi_turn_long_context": "pytest_budgetbench.tasks.bfcl:BFCLMultiTurnLongContext",
        "bfcl_multi_turn_miss_func": "pytest_budgetbench.tasks.bfcl:BFCLMultiTurnMissFunc",
        "bfcl_multi_turn_miss_param": "pytest_budgetbench.tasks.bfcl:BFCLMultiTurnMissParam",
        "image_probe": "pytest_budgetbench.tasks.image_probe:ImageProbeTask",
        "jsonl": "pytest_budgetbench.tasks.jsonl:JsonlTask",
        "csv": "pytest_budgetbench.tasks.jsonl:CsvTask",
    },
)


def resolve_task(spec: str, named: Mapping[str, TaskDefinition] | None = None) -> type[Task]:
    """The class of a task the sweep names: a named instance, a registered task, or
    ``module:attr``."""
    definition = (named or {}).get(spec)
    if definition is None:
        return REGISTRY.resolve(spec)
    from pytest_budgetbench.tasks.named import instance_class

    return instance_class(REGISTRY, spec, definition)


def task_name(spec: str, cls: type[Task]) -> str:
    """What cells and rows call a task: its class's ``name`` (``spec`` if it has none)."""
    return cls.name or spec


def sweep_tasks(
    specs: Iterable[str], named: Mapping[str, TaskDefinition] | None = None
) -> dict[str, type[Task]]:
    """Each task of a sweep by its name, in order; two specs of one name are a ConfigError."""
    classes: dict[str, type[Task]] = {}
    spec_of: dict[str, str] = {}
    for spec in specs:
        cls = resolve_task(spec, named)
        name = task_name(spec, cls)
        if name in classes:
            raise ConfigError(
                f"--budgetbench-tasks: '{spec_of[name]}' and '{spec}' are both named '{name}', "
                "so their cells and rows would mix; give one another name"
            )
        classes[name], spec_of[name] = cls, spec
    return classes
