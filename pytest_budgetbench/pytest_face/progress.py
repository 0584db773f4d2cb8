"""Live progress of a sweep, written through pytest's terminal reporter.

One line per task: cells done of total, an ETA from the pace of the newest cells (a
resumed run's cached cells, done in an instant, would otherwise promise minutes for what
takes an hour), the running mean
quality of each strategy at the newest budget, and cache hits. On a tty the line is
updated in place (the cells' own dots are left out, so the line owns the row); otherwise
a line is written every ``--budgetbench-progress`` seconds. Silent under ``-q``.

The numbers come from the cells' test reports (``user_properties``), so the controller
of an xdist run sees every worker's cells.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pytest_budgetbench.records.rows import Status

if TYPE_CHECKING:
    import pytest

    from pytest_budgetbench.records.rows import CellRow
    from pytest_budgetbench.settings.config import Settings
    from pytest_budgetbench.sweep.cells import Cell

PROPERTY = "budgetbench"
"""The name of the one user property a cell's report carries."""
PACE_CELLS = 25
"""The ETA's pace is that of the newest this many cells."""


def cell_properties(cell: Cell, row: CellRow) -> list[tuple[str, Any]]:
    """What the progress line needs of a cell and its row, as report user properties."""
    return [(PROPERTY, {
        "task": cell.task,
        "strategy": cell.strategy_label,
        "budget": cell.budget,
        "status": row.status.value,  # plain text: xdist serialises user properties
        "quality": None if row.quality is None else float(row.quality),
        "cached": bool(row.get("cached")),
    })]


def _fmt_duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


@dataclass
class TaskProgress:
    total: int
    done: int = 0
    cached: int = 0
    violations: int = 0
    errors: int = 0
    quality: dict[tuple[str, int], list[float]] = field(default_factory=lambda: defaultdict(list))
    finished_at: deque[float] = field(default_factory=lambda: deque(maxlen=PACE_CELLS + 1))
    """When the newest cells finished, in seconds since the sweep started."""

    def add(self, note: dict[str, Any], elapsed: float) -> None:
        self.done += 1
        self.finished_at.append(elapsed)
        self.cached += bool(note.get("cached"))
        self.violations += note.get("status") == Status.VIOLATION
        self.errors += note.get("status") == Status.ERROR
        if note.get("quality") is not None:
            self.quality[(str(note["strategy"]), int(note["budget"]))].append(
                float(note["quality"])
            )

    def line(self, task: str, elapsed: float) -> str:
        parts = [f"{task}: {self.done}/{self.total} cells"]
        if 0 < self.done < self.total:
            parts.append(f"ETA {_fmt_duration(self.pace(elapsed) * (self.total - self.done))}")
        elif self.done:
            parts.append(f"took {_fmt_duration(elapsed)}")
        if self.quality:
            newest = max(budget for _strategy, budget in self.quality)
            means = ", ".join(
                f"{strategy} {sum(q) / len(q):.2f}"
                for (strategy, budget), q in sorted(self.quality.items()) if budget == newest
            )
            parts.append(f"quality@{newest}: {means}")
        parts.append(f"cache hits {self.cached}")
        if self.violations:
            parts.append(f"{self.violations} over budget")
        if self.errors:
            parts.append(f"{self.errors} errors")
        return " | ".join(parts)

    def pace(self, elapsed: float) -> float:
        """Seconds a cell: over the newest :data:`PACE_CELLS` cells once that many are done,
        else over all."""
        if self.done <= PACE_CELLS:
            return elapsed / self.done
        return (self.finished_at[-1] - self.finished_at[0]) / (len(self.finished_at) - 1)


class SweepProgress:
    """Counts cells as their reports arrive and writes the progress line."""

    def __init__(
        self,
        reporter: Any,
        *,
        interval: float,
        in_place: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reporter = reporter
        self.interval = interval
        self.in_place = in_place
        self.clock = clock
        self.tasks: dict[str, TaskProgress] = {}
        self.started = clock()
        self._last_write = self.started
        self._dirty_line = False

    def expect(self, totals: dict[str, int]) -> None:
        """How many cells of each task this session will run."""
        self.tasks = {task: TaskProgress(total) for task, total in totals.items() if total}
        self.started = self._last_write = self.clock()

    def add(self, properties: Iterable[tuple[str, Any]]) -> None:
        for name, note in properties:
            if name == PROPERTY and isinstance(note, dict):
                task = self.tasks.setdefault(str(note["task"]), TaskProgress(0))
                task.total = max(task.total, task.done + 1)
                task.add(note, self.clock() - self.started)
                self._maybe_write()

    def lines(self) -> list[str]:
        elapsed = self.clock() - self.started
        return [progress.line(task, elapsed) for task, progress in self.tasks.items()]

    def _maybe_write(self) -> None:
        if self.in_place:
            # One row, rewritten: the newest task's line (each task's cells are adjacent).
            task = next((t for t, p in self.tasks.items() if p.done < p.total),
                        next(reversed(self.tasks)))
            line = self.tasks[task].line(task, self.clock() - self.started)
            # Prefixed like pytest's own row for the node, which the rewrite replaces.
            self.reporter.rewrite(f"budgetbench {line}", erase=True)
            self._dirty_line = True
            return
        if self.clock() - self._last_write >= self.interval:
            self._last_write = self.clock()
            for line in self.lines():
                self.reporter.write_line(f"budgetbench progress: {line}")

    def close(self) -> None:
        """End the in-place row so what follows starts on a line of its own."""
        if self._dirty_line:
            self.reporter.write_line("")
            self._dirty_line = False


class Sweep(Protocol):
    """What the progress reads of the session: ``--budgetbench-progress`` among its
    settings, and its cells (built on first use, so read only when progress is shown)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def cells(self) -> Sequence[Cell]: ...


def sweep_progress(config: pytest.Config, session: Sweep, ids: list[str],
                   cells: list[Cell | None] | None = None) -> SweepProgress | None:
    """The progress of the cells ``ids`` (with their ``cells`` where known), or None when
    it is not shown (no terminal, ``--budgetbench-progress=0``, ``-q``, no cells)."""
    from collections import Counter

    from pytest_budgetbench.pytest_face import nodeids

    reporter = config.pluginmanager.get_plugin("terminalreporter")
    interval = session.settings.progress
    if reporter is None or interval == 0 or config.get_verbosity() < 0 or not ids:
        return None
    by_id = {c.cell_id: c.task for c in session.cells}
    tasks = Counter(
        cell.task if cell is not None else by_id.get(nodeids.params_of(nodeid), "?")
        for nodeid, cell in zip(ids, cells or [None] * len(ids), strict=True)
    )
    tty = reporter.isatty  # a bool on pytest 8, a method on 9
    in_place = bool(tty() if callable(tty) else tty) and config.get_verbosity() == 0
    progress = SweepProgress(reporter, interval=interval, in_place=in_place)
    progress.expect(dict(tasks))
    return progress
