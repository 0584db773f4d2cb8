"""Task registry: built-in names, the ``budgetbench.tasks`` entry points, ``module:attr``."""

from __future__ import annotations

from pytest_budgetbench.registry import Registry
from pytest_budgetbench.tasks.base import Grade, Item, Task, TaskOptions

__all__ = ["REGISTRY", "Grade", "Item", "Task", "TaskOptions"]

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
        "tau2_retail": "pytest_budgetbench.tasks.tau2_retail:Tau2RetailTask",
        "image_probe": "pytest_budgetbench.tasks.image_probe:ImageProbeTask",
    },
)
