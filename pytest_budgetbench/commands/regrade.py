"""Re-grade a run's recorded replies with the current graders, without model calls.

``budgetbench regrade RUN_DIR`` reads ``RUN_DIR/cells.jsonl`` and ``run.json``, rebuilds
each task from the run's recorded settings (data paths, seed, chunking, split), and grades
every ``ok`` row's recorded ``prediction`` again. The re-graded rows go to a NEW run
directory (default ``RUN_DIR/regraded``; never an existing one), with a copy of
``run.json`` that says where they came from, so ``budgetbench report`` reads them as any
run. Rows that are not ``ok`` (violations, errors) are copied unchanged, and so are
LLM-judged rows (a judge is a model call).

A row records its item's gold: when the data now gives the item another gold, the
regrade is refused, naming the item, unless ``accept_new_golds`` grades against the new
golds (and records them in the re-graded rows).
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from pytest_budgetbench.engine.catalog import make_task
from pytest_budgetbench.errors import ConfigError, DataError
from pytest_budgetbench.records import cells, run_json
from pytest_budgetbench.records.cells import CELLS_FILE
from pytest_budgetbench.records.definition import same_gold, show
from pytest_budgetbench.records.episodes import EPISODES_FILE, EpisodeRecord
from pytest_budgetbench.records.rows import Status
from pytest_budgetbench.records.run_json import RunInfo
from pytest_budgetbench.records.store import RunStore
from pytest_budgetbench.settings.config import Settings
from pytest_budgetbench.tasks import EpisodicTask, Grade, Item, Task

DEFAULT_OUT = "regraded"
_JUDGED = "llm-judge"


@dataclass
class CellChange:
    """Old and new mean quality of one task x strategy@budget over its re-graded rows."""

    old: list[float] = field(default_factory=list)
    """The old qualities that are numbers: a row without one (see :func:`old_quality`) has
    none here, so the old mean is over the rows that had one."""
    new: list[float] = field(default_factory=list)
    changed: int = 0
    graders: set[str] = field(default_factory=set)

    @staticmethod
    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else float("nan")


@dataclass
class RegradeResult:
    out_dir: Path
    rows: int
    regraded: int
    kept: int
    changes: dict[tuple[str, str, int], CellChange]
    new_golds: int = 0
    """Rows graded against a gold that differs from the one they recorded."""
    no_old_quality: list[tuple[str, Any]] = field(default_factory=list)
    """Re-graded rows whose recorded quality was not a number: (cell id, what it was)."""


def regrade_run(
    run_dir: Path,
    out_dir: Path | None = None,
    *,
    variants: dict[str, str] | None = None,
    data_paths: dict[str, str] | None = None,
    accept_new_golds: bool = False,
) -> RegradeResult:
    """Re-grade ``run_dir``'s rows into ``out_dir`` (see the module docstring)."""
    path = cells.cells_file(run_dir)
    if not path.is_file():
        raise DataError(f"regrade: no {CELLS_FILE} in {run_dir}: pass a run directory "
                        f"(<out>/<run_id>) or its {CELLS_FILE}")
    source = RunStore(path.parent)
    out = RunStore(out_dir or source.run_dir / DEFAULT_OUT)
    if out.cells_path.exists():
        raise ConfigError(f"regrade: {out.cells_path} already exists; pass --out to a new "
                          "directory, or remove it (it is never overwritten)")
    info = _run_info(source)
    settings = _settings(run_json.settings_of(info), variants or {}, data_paths or {})
    rows = list(cells.read_rows(path))
    _check_rows(path, rows)
    graders = _Graders(settings, source.episodes())
    changes: dict[tuple[str, str, int], CellChange] = defaultdict(CellChange)
    regraded, written = 0, []
    no_old_quality: list[tuple[str, Any]] = []
    for row in rows:
        new = graders.regrade(row)
        if new is not None:
            regraded += 1
            change = changes[(str(row["task"]), str(row["strategy"]), int(row["budget"]))]
            old = old_quality(row)
            if old is None:
                no_old_quality.append((str(row.get("cell_id")), row.get("quality")))
            else:
                change.old.append(old)
            change.new.append(float(new["quality"]))
            change.changed += new["quality"] != row.get("quality")
            change.graders.add(str(new["grader"]))
            row = new
        written.append(row)
    if graders.new_golds and not accept_new_golds:
        raise DataError(graders.new_golds_message())
    # Written once all rows are graded: a failure leaves no partial run behind.
    for row in written:
        cells.append_row(out.cells_path, row)
    if source.episodes_path.is_file():  # the regraded run's viewer shows them too
        shutil.copyfile(source.episodes_path, out.episodes_path)
    _write_run_info(out, info, source.run_dir, settings)
    return RegradeResult(out.run_dir, len(rows), regraded, len(rows) - regraded, dict(changes),
                         len(graders.new_golds), no_old_quality)


def old_quality(row: dict[str, Any]) -> float | None:
    """The row's recorded quality when it is a finite number, else None (absent, null, or
    damaged: "n/a", a list, a bool, NaN). Such a row is still re-graded: its new quality
    does not depend on the old one, and a hand-edited or damaged row should not stop the
    command."""
    quality = row.get("quality")
    if isinstance(quality, bool) or not isinstance(quality, int | float):
        return None
    return float(quality) if math.isfinite(quality) else None


def _check_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """Raise a one-line DataError when there is nothing to re-grade, or a row lacks what
    re-grading reads (a cell key with an integer budget)."""
    if not rows:
        raise DataError(f"regrade: {path} holds no row (it is empty, or no line is a JSON "
                        f"object): nothing to re-grade; pass a run's {CELLS_FILE}")
    for row in rows:
        cell = row.get("cell_id", "(no cell_id)")
        absent = [key for key in ("task", "item_id", "strategy", "budget") if key not in row]
        if absent:
            raise DataError(f"regrade: {path} row {cell!r} lacks {', '.join(absent)}: it "
                            f"is not a budgetbench cell row; pass a run's {CELLS_FILE}")
        budget = row["budget"]
        if isinstance(budget, bool) or not isinstance(budget, int):
            raise DataError(f"regrade: {path} row {cell!r} has budget {repr(budget)[:40]}, "
                            "not an integer; the file is damaged or hand-edited: fix that row")


class _Graders:
    """Tasks built from the run's settings, loaded once each, with items by id."""

    def __init__(self, settings: Settings, episodes: dict[str, EpisodeRecord]) -> None:
        self.settings = settings
        self.episodes = episodes
        """The run's agent episodes by cell id: an episode is graded from its trajectory."""
        self._tasks: dict[str, tuple[Task, dict[str, Item]]] = {}
        self.new_golds: list[tuple[dict[str, Any], Any]] = []
        """Rows whose recorded gold the data no longer gives, with the data's gold."""

    def regrade(self, row: dict[str, Any]) -> dict[str, Any] | None:
        """The row graded again, or None when it is kept as it is."""
        if row.get("status") != Status.OK or not isinstance(row.get("prediction"), str):
            return None
        if _JUDGED in str(row.get("grader") or ""):
            return None
        task, items = self._task(str(row["task"]))
        item = items.get(str(row["item_id"]))
        if item is None:
            raise DataError(f"regrade: row {row.get('cell_id')} names item {row['item_id']!r}, "
                            f"which task {task.name!r} no longer loads from its data; pass "
                            f"--data {task.name}=PATH with the run's data")
        graded = dict(row)
        if row.get("gold") is not None and not same_gold(row["gold"], item.answer):
            self.new_golds.append((row, item.answer))
            graded["gold"] = item.answer
        grade = self._grade(task, item, row)
        return {**graded, "quality": grade.quality, "extracted": grade.extracted,
                "grader": grade.grader}

    def _grade(self, task: Task, item: Item, row: dict[str, Any]) -> Grade:
        if not isinstance(task, EpisodicTask):
            return task.grade(item, row["prediction"])
        episode = self.episodes.get(str(row.get("cell_id")))
        if episode is None:
            raise DataError(f"regrade: episode cell {row.get('cell_id')} has no trajectory in "
                            f"{EPISODES_FILE}: regrade the run directory it was recorded in")
        return task.grade_trajectory(item, episode.trajectory)

    def new_golds_message(self) -> str:
        row, gold = self.new_golds[0]
        items = {(str(r["task"]), str(r["item_id"])) for r, _ in self.new_golds}
        more = f" (and {len(items) - 1} more items)" if len(items) > 1 else ""
        return (f"regrade: task {row['task']!r} item {row['item_id']} was answered against "
                f"gold {show(row['gold'])}, the data now gives {show(gold)}{more}: the data "
                "changed since the run; pass --data TASK=PATH with the run's data, or "
                "--accept-new-golds to grade against the new golds")

    def _task(self, name: str) -> tuple[Task, dict[str, Item]]:
        if name not in self._tasks:
            task = make_task(name, self.settings)
            self._tasks[name] = (task, {item.item_id: item for item in task.load()})
        return self._tasks[name]


def _run_info(store: RunStore) -> RunInfo:
    try:
        return store.run_info() or {}
    except ValueError as exc:
        raise DataError(f"regrade: {store.run_info_path} is not JSON ({exc}); restore it or "
                        "remove it to re-grade with default settings") from None


def _settings(recorded: dict[str, Any], variants: dict[str, str],
              data_paths: dict[str, str]) -> Settings:
    """The run's settings, as far as grading needs them: no judge (no model calls)."""
    known = {f.name for f in fields(Settings)}
    values: dict[str, Any] = {key: tuple(value) if isinstance(value, list) else value
              for key, value in recorded.items() if key in known}
    values["data_paths"] = {**(recorded.get("data_paths") or {}), **data_paths}
    values["judge_endpoint"] = None
    values["grader"] = variants or None
    try:
        return Settings(**values)
    except TypeError as exc:
        raise DataError(f"regrade: run.json settings are not this version's ({exc})") from None


def _write_run_info(out: RunStore, info: RunInfo, source: Path, settings: Settings) -> None:
    out.write_run_info(run_json.regraded(info, source, time.time(), settings.grader or {}))


def format_changes(result: RegradeResult) -> Iterable[str]:
    """Lines of old vs new mean quality per task and strategy@budget."""
    yield (f"budgetbench: re-graded {result.regraded} of {result.rows} rows "
           f"({result.kept} kept: not ok, or judged) -> {RunStore(result.out_dir).cells_path}")
    if result.new_golds:
        yield (f"budgetbench: {result.new_golds} rows were graded against golds that changed "
               "since the run (--accept-new-golds); their rows record the new gold")
    if result.no_old_quality:
        cell, value = result.no_old_quality[0]
        yield (f"budgetbench: {len(result.no_old_quality)} re-graded rows had no numeric old "
               f"quality (e.g. row {cell!r}: {json.dumps(value, default=str)[:40]}); the old "
               "means leave them out, their new quality is in the new means")
    yield f"{'task':<14} {'strategy@budget':<28} {'n':>5} {'old':>7} {'new':>7} " \
          f"{'delta':>7} {'changed':>7}  grader"
    for (task, strategy, budget), change in sorted(result.changes.items()):
        old, new = CellChange.mean(change.old), CellChange.mean(change.new)
        yield (f"{task:<14} {f'{strategy}@{budget}':<28} {len(change.new):>5} {old:>7.4f} "
               f"{new:>7.4f} {new - old:>+7.4f} {change.changed:>7}  "
               f"{', '.join(sorted(change.graders))}")
