"""The sweep's tasks and their items: each task built once per process from the settings,
its items loaded once (collection needs them as much as the runner does), and what each
item's prompts are searched for to say whether they kept its answer (engine.answers)."""

from __future__ import annotations

from pathlib import Path

from pytest_budgetbench.engine.answers import AnswerWatch, watch
from pytest_budgetbench.model.chat import ChatModel
from pytest_budgetbench.settings.config import Settings, task_values
from pytest_budgetbench.tasks import Item, Task, TaskOptions, resolve_task, sweep_tasks
from pytest_budgetbench.tasks.base import CHUNK_TOKENS


class Catalog:
    """Tasks and their items, loaded once per process (collection needs them too)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._tasks: dict[str, Task] = {}
        self._items: dict[str, list[Item]] = {}
        self._watches: dict[tuple[str, int], AnswerWatch | None] = {}

    @property
    def names(self) -> list[str]:
        """The sweep's task names, as cells and rows carry them (a class's ``name``, not
        the ``module:attr`` that selected it)."""
        return list(sweep_tasks(self.settings.tasks, self.settings.named_tasks))

    def provide(self, task: Task, items: list[Item]) -> None:
        """Use ``task`` and ``items``, already loaded, for cells of ``task.name``."""
        self._tasks[task.name] = task
        self._items[task.name] = items

    def task(self, name: str) -> Task:
        if name not in self._tasks:
            self._tasks[name] = make_task(name, self.settings)
        return self._tasks[name]

    def items(self, task_name: str) -> list[Item]:
        if task_name not in self._items:
            self._items[task_name] = self.task(task_name).load()[: self.settings.items]
        return self._items[task_name]

    def answers(self, task_name: str, index: int) -> AnswerWatch | None:
        """What the prompts of item ``index`` of the task are searched for (its answer, as
        its grader normalises it, where its evidence holds it), worked out once per item
        (threads may work it out twice: the same value)."""
        key = (task_name, index)
        if key not in self._watches:
            item = self.items(task_name)[index]
            self._watches[key] = watch(self.task(task_name).gold_answers(item), item)
        return self._watches[key]


def make_task(name: str, settings: Settings) -> Task:
    """The task ``name`` (as cells and rows call it, or as --budgetbench-tasks names it)."""
    cls = (sweep_tasks(settings.tasks, settings.named_tasks).get(name)
           or resolve_task(name, settings.named_tasks))
    data = settings.data_paths.get(cls.name or name) or cls.default_data_path
    values = task_values(cls, settings)
    judge = None
    # Built here, not by wiring.make_chat as every other client is: the judge is pinned at
    # temperature 0 with no seed (make_chat applies --budgetbench-temperature and -seed),
    # and takes neither the response cache nor request slots, which live in a run directory
    # that a Catalog is never given (it has the settings alone); and wiring imports this
    # module, so this one cannot import wiring (a cycle, tests/test_layers.py). Routing it
    # through make_chat would change what the judge is sent and whether it is replayed.
    if settings.judge_endpoint:
        judge = ChatModel(settings.judge_endpoint, settings.judge_model or "",
                          api_key=settings.api_key, timeout=settings.timeout,
                          attempts=settings.retries, temperature=0.0)
    options = TaskOptions(
        seed=settings.seed,
        judge=judge,
        items=settings.items,
        data_path=Path(data) if data else None,
        chunk_tokens=int(values.get(CHUNK_TOKENS.key, CHUNK_TOKENS.default)),
        extra={**values, "grader_variants": settings.grader or {}},
    )
    return cls(options)
