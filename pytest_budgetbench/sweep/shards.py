"""Which shard this process runs under ``--budgetbench-shard=auto``: the index and count,
read from the job engine that started it.

``auto`` reads exactly one of these conventions from the environment::

    engine                   its index variable (base)             the count
    Kubernetes Indexed Job   JOB_COMPLETION_INDEX (0)              BUDGETBENCH_SHARD_COUNT
    SLURM job array          SLURM_ARRAY_TASK_ID (SLURM_ARRAY_TASK_MIN, step
                             SLURM_ARRAY_TASK_STEP)                SLURM_ARRAY_TASK_COUNT
    explicit                 BUDGETBENCH_SHARD_INDEX (0)           BUDGETBENCH_SHARD_COUNT

A Kubernetes pod is told its index but not the Job's ``.spec.completions``, so its manifest
sets BUDGETBENCH_SHARD_COUNT. A SLURM array may start at any id and step by any stride
(``--array=1-8``, ``--array=0-18:2``); its ids must be that range, since a shard no task
runs would leave items out of the merged report unnoticed. Shards are numbered from 1, as
``--budgetbench-shard=i/n`` numbers them, whatever the engine's base.

Anything that leaves the shard unknown (no convention's variables, two conventions' at
once, an index without a count, ids that are not a range) is a :class:`ConfigError` that
names the variables and says how to fix them, before any cell runs. The controller resolves
the shard once, when it loads its settings, and hands it to its xdist workers with the
run's state (``BudgetBenchSession.worker_state``), whose settings take it instead of their
own environment's (``arguments.settings_of``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_budgetbench.errors import ConfigError

if TYPE_CHECKING:
    from pytest_budgetbench.sweep.cells import Cell

AUTO = "auto"
"""``--budgetbench-shard=auto``."""

K8S_INDEX = "JOB_COMPLETION_INDEX"
SLURM_ID = "SLURM_ARRAY_TASK_ID"
SLURM_MIN = "SLURM_ARRAY_TASK_MIN"
SLURM_MAX = "SLURM_ARRAY_TASK_MAX"
SLURM_COUNT = "SLURM_ARRAY_TASK_COUNT"
SLURM_STEP = "SLURM_ARRAY_TASK_STEP"
INDEX = "BUDGETBENCH_SHARD_INDEX"
COUNT = "BUDGETBENCH_SHARD_COUNT"

_FIX = "or pass --budgetbench-shard=i/n"


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (from 1) of ``count``, and where that came from (for run.json)."""

    index: int
    count: int
    source: str


def shard_from_environment(environ: Mapping[str, str]) -> Shard:
    """The shard the job engine's variables in ``environ`` give; a ConfigError when they
    leave it unknown. An empty variable counts as unset."""
    env = {name: value.strip() for name, value in environ.items() if value.strip()}
    engines: dict[str, Callable[[dict[str, str]], Shard]] = {
        K8S_INDEX: _kubernetes, SLURM_ID: _slurm, INDEX: _explicit}
    found = [name for name in engines if name in env]
    if not found:
        raise ConfigError(
            f"--budgetbench-shard=auto found no job engine's variables: it reads {K8S_INDEX} "
            f"and {COUNT} (a Kubernetes Indexed Job), {SLURM_ID} (a SLURM array) or {INDEX} "
            f"(0-based) and {COUNT}; set them, {_FIX}")
    if len(found) > 1:
        given = ", ".join(f"{name}={env[name]}" for name in found)
        raise ConfigError(
            f"--budgetbench-shard=auto found the variables of more than one convention "
            f"({given}): unset all but one, {_FIX}")
    return engines[found[0]](env)


def _kubernetes(env: dict[str, str]) -> Shard:
    index = _number(env, K8S_INDEX, minimum=0)
    if COUNT not in env:
        raise ConfigError(
            f"--budgetbench-shard=auto: {K8S_INDEX}={index} (a Kubernetes Indexed Job) gives "
            f"the index but not the count: set {COUNT} in the pod's env to the Job's "
            f".spec.completions, {_FIX}")
    count = _within(env, K8S_INDEX, index, "Kubernetes Indexed Job")
    return Shard(index + 1, count,
                 f"Kubernetes Indexed Job: {K8S_INDEX}={index} of {COUNT}={count}")


def _explicit(env: dict[str, str]) -> Shard:
    index = _number(env, INDEX, minimum=0)
    if COUNT not in env:
        raise ConfigError(f"--budgetbench-shard=auto: {INDEX}={index} needs {COUNT}, the "
                          f"number of shards: set it, {_FIX}")
    count = _within(env, INDEX, index, "0-based")
    return Shard(index + 1, count, f"{INDEX}={index} of {COUNT}={count}")


def _within(env: dict[str, str], name: str, index: int, what: str) -> int:
    """BUDGETBENCH_SHARD_COUNT, which must exceed the 0-based ``index``."""
    count = _number(env, COUNT, minimum=1)
    if index >= count:
        raise ConfigError(
            f"--budgetbench-shard=auto: {name}={index} ({what}) is not below {COUNT}={count}: "
            f"set {COUNT} to the number of shards the job runs, {_FIX}")
    return count


def _slurm(env: dict[str, str]) -> Shard:
    task = _number(env, SLURM_ID, minimum=0)
    missing = [name for name in (SLURM_MIN, SLURM_COUNT) if name not in env]
    if SLURM_COUNT in missing and COUNT in env:
        missing.remove(SLURM_COUNT)  # an older SLURM: the script says the count
    if missing:
        raise ConfigError(
            f"--budgetbench-shard=auto: {SLURM_ID}={task} comes without "
            f"{' and '.join(missing)}, so its shard is unknown: run it as a task of an sbatch "
            f"--array, {_FIX}")
    first = _number(env, SLURM_MIN, minimum=0)
    count = _number(env, SLURM_COUNT if SLURM_COUNT in env else COUNT, minimum=1)
    step = _number(env, SLURM_STEP, minimum=1) if SLURM_STEP in env else 1
    if SLURM_COUNT in env and COUNT in env and _number(env, COUNT, minimum=1) != count:
        raise ConfigError(
            f"--budgetbench-shard=auto: {COUNT}={env[COUNT]} disagrees with "
            f"{SLURM_COUNT}={count}: unset {COUNT} (the array's count is used)")
    last = first + (count - 1) * step
    offset = task - first
    if (SLURM_MAX in env and _number(env, SLURM_MAX, minimum=0) != last) \
            or offset < 0 or offset % step or offset // step >= count:
        shown = ", ".join(f"{name}={env[name]}" for name in
                          (SLURM_ID, SLURM_MIN, SLURM_MAX, SLURM_COUNT, SLURM_STEP)
                          if name in env)
        raise ConfigError(
            f"--budgetbench-shard=auto: the SLURM array's ids are not one range ({shown}), "
            "so a shard could go unrun: submit a range, --array=0-N or --array=0-N:STEP, "
            f"{_FIX}")
    stride = f", {SLURM_STEP}={step}" if step != 1 else ""
    counted_by = SLURM_COUNT if SLURM_COUNT in env else COUNT
    return Shard(offset // step + 1, count, f"SLURM array: {SLURM_ID}={task} "
                 f"({SLURM_MIN}={first}{stride}, {counted_by}={count})")


def _number(env: dict[str, str], name: str, *, minimum: int) -> int:
    raw = env[name]
    if not (raw.isascii() and raw.isdigit()) or int(raw) < minimum:
        kind = "a non-negative integer" if minimum == 0 else "a positive integer"
        raise ConfigError(f"--budgetbench-shard=auto: {name} must be {kind} (got {raw!r})")
    return int(raw)


def shard_cells(
    cells: list[Cell], items: dict[str, list[str]], index: int, count: int
) -> list[Cell]:
    """Shard ``index`` of ``count`` (1-based): every count-th item across all tasks, so
    shards are even and an item's cells, which pair with each other, stay together."""
    positions: dict[tuple[str, int], int] = {}
    for task, item_ids in items.items():
        for item_index in range(len(item_ids)):
            positions[(task, item_index)] = len(positions)
    return [c for c in cells if positions[(c.task, c.item_index)] % count == index - 1]
