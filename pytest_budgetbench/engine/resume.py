"""Which run directory a session writes to, and whether it may go on with a run there.

A new run gets a fresh directory under --budgetbench-out; --budgetbench-resume names one
(or ``latest``). A resume is refused, with one ConfigError naming the first difference,
when this session would define the run's cells otherwise (the ``definition`` block of
run.json, :mod:`~pytest_budgetbench.records.definition`) or when a row's recorded gold is
not its item's gold now: old rows would otherwise stand under new items' ids.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_budgetbench.errors import BudgetBenchError, ConfigError
from pytest_budgetbench.records import definition, run_json
from pytest_budgetbench.records.cells import CELLS_FILE
from pytest_budgetbench.records.run_json import RUN_FILE, RunInfo
from pytest_budgetbench.records.store import RunStore
from pytest_budgetbench.settings.config import Settings, strategy_values, task_values
from pytest_budgetbench.strategies import strategy_classes

if TYPE_CHECKING:
    from pytest_budgetbench.engine.catalog import Catalog


def new_run_id(shard: tuple[int, int] | None = None) -> str:
    run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)
    return f"{run_id}-shard{shard[0]}of{shard[1]}" if shard else run_id


def resolve_run_dir(settings: Settings) -> Path:
    """A new run directory under --budgetbench-out, or the one --budgetbench-resume names."""
    out = Path(settings.out)
    if settings.resume is None:
        return out / new_run_id(settings.shard)
    if settings.resume == "latest":
        # run.json is written after the checks and before the first cell, so a directory
        # that has it is a run, even one killed in its first cell with no row yet; one
        # without it is a start that failed (it may hold the embedded server's log).
        runs = [d for d in out.glob("*") if RunStore(d).has_run_info()]
        if not runs:
            raise ConfigError(
                f"--budgetbench-resume=latest found no run in {out}; "
                "pass the run directory, or --budgetbench-out=DIR where the runs are"
            )
        return max(runs, key=started_at)
    run_dir = Path(settings.resume)
    store = RunStore(run_dir)
    if not store.has_run_info() and not store.cells_path.is_file():
        raise ConfigError(
            f"--budgetbench-resume={settings.resume}: not a run directory (no {RUN_FILE} or "
            f"{CELLS_FILE}); pass a directory under --budgetbench-out, or 'latest'"
        )
    return run_dir


def started_at(run_dir: Path) -> float:
    """When a run first started (run.json keeps it across resumes); run ids made in the
    same second do not sort by time."""
    store = RunStore(run_dir)
    try:
        started = run_json.started(store.run_info() or {})
    except (OSError, ValueError):
        started = None
    if started is not None:
        return started
    path = store.run_info_path
    return path.stat().st_mtime if path.exists() else 0.0


def earlier_run_info(settings: Settings, store: RunStore) -> RunInfo | None:
    """The run.json a resumed run has (None for a new run, or one that cannot be read)."""
    if settings.resume is None:
        return None
    try:
        return store.run_info()
    except ValueError:
        return None


# -- what defines a run's cells ------------------------------------------------------------
def sweep_definition(settings: Settings, catalog: Catalog, model: str | None, tokenizer: str,
                     aux_models: dict[str, str | None]) -> dict[str, Any]:
    """What defines this sweep's cells (see :mod:`~pytest_budgetbench.records.definition`):
    :func:`run_definition`, with each task's grader, data digest and item digests."""
    block = run_definition(settings, model, tokenizer, aux_models)
    for name, entry in block["tasks"].items():
        task = catalog.task(name)
        path = task.options.data_path
        entry["grader"] = task.grader_id
        entry["data"] = None if path is None else {
            "path": str(path), "sha256": definition.content_sha256(path)}
        entry["items"] = {item.item_id: definition.item_digest(
            item.item_id, item.messages, item.answer, item.category)
            for item in catalog.items(name)}
    return block


def run_definition(settings: Settings, model: str | None, tokenizer: str,
                   aux_models: dict[str, str | None]) -> dict[str, Any]:
    """The definition of a sweep with ``settings``, as far as settings tell it: the
    session adds each task's grader, data digest and item digests.

    Every name in :data:`definition.CELL_SETTINGS` is recorded, so every one is compared on
    a resume: those the session resolves (the model, the counter, each auxiliary
    endpoint's model) from the arguments, the rest from the Settings field of that name."""
    resolved: dict[str, Any] = {
        "model": model, "tokenizer": tokenizer, "aux_models": dict(sorted(aux_models.items())),
        "grader": dict(sorted((settings.grader or {}).items()))}
    block: dict[str, Any] = {"version": definition.VERSION, "settings": {
        key: definition.plain(resolved[key] if key in resolved else getattr(settings, key))
        for key in definition.CELL_SETTINGS}}
    from pytest_budgetbench.tasks import sweep_tasks

    block["tasks"] = {name: {"options": definition.plain(task_values(cls, settings))}
                      for name, cls in sweep_tasks(settings.tasks, settings.named_tasks).items()}
    block["strategies"] = {
        cls.name: {"options": definition.plain(strategy_values(cls, settings))}
        for cls in strategy_classes(settings.strategies).values()}
    return block


def settings_from_record(recorded: dict[str, Any]) -> Settings:
    """The Settings a run.json recorded (JSON lists back as tuples). Raises TypeError for
    settings of another version."""
    from dataclasses import fields

    known = {f.name for f in fields(Settings)}
    values: dict[str, Any] = {key: tuple(value) if isinstance(value, list) else value
                              for key, value in recorded.items() if key in known}
    return Settings(**values)


# -- the resume checks ---------------------------------------------------------------------
def check_resume(run_id: str, earlier: RunInfo, current: dict[str, Any], *,
                 settings: Settings, catalog: Catalog,
                 recorded: Iterable[Mapping[str, Any]]) -> list[str]:
    """Refuse to resume a run whose cells this session would define otherwise: one
    line naming the first difference (or the first recorded gold, of the ``recorded``
    rows, that differs). Returns lines for the terminal (a resume not fully checked)."""
    notes = []
    found_definition = run_json.definition_of(earlier)
    if found_definition is None:
        found_definition = legacy_definition(earlier)
        notes.append(
            f"run {run_id} was made before run.json recorded a definition: its "
            "settings were checked, the content of its data files and items could not be")
        current = {**current, "settings": {**current["settings"],
                                           "tokenizer": settings.tokenizer}}
    found = definition.differences(found_definition, current)
    if found:
        raise ConfigError(
            f"--budgetbench-resume: run {run_id} was made with "
            f"{definition.describe(found, '{what} {old}, this session asks {new}')}; "
            "resume with the run's settings, or start a new run (drop --budgetbench-resume)")
    check_recorded_golds(run_id, catalog, recorded)
    return notes


def legacy_definition(earlier: RunInfo) -> dict[str, Any]:
    """What a run.json of an older version tells of its definition: its settings
    (option values as this version reads them), no data or item digests."""
    recorded = run_json.settings_of(earlier)
    try:
        block = run_definition(settings_from_record(recorded), earlier.get("model"),
                               str(recorded.get("tokenizer", "auto")), {})
        del block["settings"]["aux_models"]  # not recorded: targets, not their models
    except (TypeError, ValueError, ImportError, BudgetBenchError):  # another version's
        block = {"settings": {"model": earlier.get("model")}}
    if block["settings"]["model"] is None:  # a run.json that names no model
        del block["settings"]["model"]
    return block


def check_recorded_golds(run_id: str, catalog: Catalog,
                         recorded: Iterable[Mapping[str, Any]]) -> None:
    """The golds the run's rows recorded must be those of this session's items: a
    changed seed or data file would otherwise keep old rows under new items' ids."""
    golds: dict[tuple[Any, Any], Any] = {}
    for name in catalog.names:
        for item in catalog.items(name):
            golds[(name, item.item_id)] = item.answer
    changed = [(row, golds[key]) for row in recorded if "gold" in row
               and (key := (row.get("task"), row.get("item_id"))) in golds
               and not definition.same_gold(row["gold"], golds[key])]
    if changed:
        row, gold = changed[0]
        items = {(r["task"], r["item_id"]) for r, _ in changed}
        more = f" (and {len(items) - 1} more items)" if len(items) > 1 else ""
        raise ConfigError(
            f"--budgetbench-resume: run {run_id} recorded task '{row['task']}' item "
            f"{row['item_id']} with gold {definition.show(row['gold'])}, this session's "
            f"item {row['item_id']} has {definition.show(gold)}{more}: the items changed "
            "since the run (seed, data or task); resume with the run's settings and data, "
            "or start a new run (drop --budgetbench-resume)")
