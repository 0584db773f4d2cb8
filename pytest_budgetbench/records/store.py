"""The run directory: every file and folder name in it, and :class:`RunStore`, its paths.

Layout of a run directory; each file has one owner, the module that names it, writes it
and reads it (every other module goes through the owner or a :class:`RunStore` method that
calls it); the other names are this module's constants::

    <out>/<run_id>/cells.jsonl     one row per cell (records.cells; records.rows.CellRow)
    <out>/<run_id>/prompts.jsonl   the post-strategy prompt per cell (--budgetbench-audit)
                                   (records.prompts.PromptRecord)
    <out>/<run_id>/episodes.jsonl  an agent episode's trajectory and calls, per episode cell
                                   (records.episodes.EpisodeRecord)
    <out>/<run_id>/run.json        the run's settings and definition, written by the controller
                                   (records.run_json.RunInfo)
    <out>/<run_id>/run.lock        held (flock) by the controller while a session writes the run
    <out>/<run_id>/replicas.jsonl  replicas of the endpoint taken out and back
                                   (records.replicas.ReplicaEvent)
    <out>/<run_id>/safe_budgets.jsonl  a budget search's answer per task and strategy
                                   (records.safe_budgets.SafeBudgetRecord)
    <out>/<run_id>/server.log      the embedded server's log
    <out>/<run_id>/strategy-files/ the one place in a run where strategies may write
    <out>/<run_id>/exports/        records a task exports (one file each, JSON lines)
    <out>/<run_id>/.slots/         the request slots the xdist workers share (--concurrency)
    <out>/<run_id>/report/         the report written at session end (and by default by
                                   ``budgetbench report RUN``)

Named elsewhere: ``regraded/`` (``budgetbench regrade``'s default output, a run directory
of its own; commands.regrade) and, with ``--budgetbench-cache=off``, the run's private
caches (cache.responses, cache.counts, cache.vectors). docs/reports.md lists every entry.

The JSON lines themselves are written and parsed by :mod:`~pytest_budgetbench.records.
jsonl` (one locked append per row; a torn last line is skipped on read).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

from pytest_budgetbench.errors import ConfigError, RecordError
from pytest_budgetbench.messages import Message
from pytest_budgetbench.records import cells, prompts, run_json, safe_budgets
from pytest_budgetbench.records import episodes as episode_records
from pytest_budgetbench.records.cells import CELLS_FILE
from pytest_budgetbench.records.episodes import EPISODES_FILE, EpisodeRecord
from pytest_budgetbench.records.jsonl import append_jsonl
from pytest_budgetbench.records.prompts import PROMPTS_FILE, PromptRecord, SpanKept
from pytest_budgetbench.records.replicas import REPLICAS_FILE
from pytest_budgetbench.records.rows import CellRow
from pytest_budgetbench.records.run_json import RUN_FILE, RunInfo
from pytest_budgetbench.records.safe_budgets import SAFE_BUDGETS_FILE, SafeBudgetRecord

LOCK_FILE = "run.lock"
SERVER_LOG = "server.log"  # the embedded server's output
STRATEGY_FILES = "strategy-files"  # the one place in a run where strategies may write
EXPORTS_DIR = "exports"  # a task's exported records, <file name> each
SLOTS_DIR = ".slots"  # request slots shared by the xdist workers of one run
REPORT_DIR = "report"  # the session's report, and budgetbench report's default for one run


class RunStore:
    """The files of one run directory, each path named here."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._lock_fd: int | None = None

    @classmethod
    def of(cls, path: Path) -> RunStore:
        """The run of a run directory, or of a file in it (its cells.jsonl)."""
        return cls(path.parent if path.is_file() else path)

    def lock(self) -> None:
        """Hold the run for this session (the controller's; its xdist workers append under
        it), so that a second session on the same run, a ``--budgetbench-resume=latest``
        started meanwhile, is refused instead of recording a second row per cell. The lock
        (``flock``) goes with the process, so a killed session leaves none behind."""
        path = self.run_dir / LOCK_FILE
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise RecordError(f"cannot open {path} to hold the run: {exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise ConfigError(
                f"run {self.run_dir} is in use by another budgetbench session (pid {holder}); "
                "wait until it ends and resume then, or start a new run"
            ) from None
        with contextlib.suppress(OSError):  # the pid only names the holder (a full disk)
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._lock_fd, 0)
            os.close(self._lock_fd)
            self._lock_fd = None

    @property
    def cells_path(self) -> Path:
        return self.run_dir / CELLS_FILE

    @property
    def prompts_path(self) -> Path:
        return self.run_dir / PROMPTS_FILE

    @property
    def episodes_path(self) -> Path:
        return self.run_dir / EPISODES_FILE

    @property
    def run_info_path(self) -> Path:
        return self.run_dir / RUN_FILE

    @property
    def replicas_path(self) -> Path:
        return self.run_dir / REPLICAS_FILE

    @property
    def safe_budgets_path(self) -> Path:
        return self.run_dir / SAFE_BUDGETS_FILE

    @property
    def server_log_path(self) -> Path:
        return self.run_dir / SERVER_LOG

    @property
    def strategy_files_dir(self) -> Path:
        return self.run_dir / STRATEGY_FILES

    @property
    def exports_dir(self) -> Path:
        return self.run_dir / EXPORTS_DIR

    @property
    def slots_dir(self) -> Path:
        return self.run_dir / SLOTS_DIR

    @property
    def report_dir(self) -> Path:
        return self.run_dir / REPORT_DIR

    def write_row(self, row: CellRow) -> None:
        cells.append_row(self.cells_path, row.record())

    def write_prompt(self, cell_id: str, sha256: str, messages: list[Message] | None,
                     evidence: list[SpanKept] | None = None) -> None:
        prompts.append_prompt(self.prompts_path,
                              PromptRecord(cell_id, sha256, messages, evidence))

    def write_episode(self, episode: EpisodeRecord) -> None:
        """An agent episode's trajectory and calls, before its row (see engine.episode)."""
        episode_records.append_episode(self.episodes_path, episode)

    def episodes(self) -> dict[str, EpisodeRecord]:
        """The recorded episodes by cell id, the last record of each (a damaged record is
        skipped, as a torn line is)."""
        return episode_records.read_episodes(self.episodes_path)

    def prompts_of(self, cell_ids: Collection[str]) -> Iterator[PromptRecord]:
        """The prompts.jsonl records of these cells, in the file's order (a resumed cell
        has one per attempt); other cells' lines are skipped unparsed."""
        return prompts.read_prompts(self.prompts_path, cell_ids)

    def episodes_of(self, cell_ids: Collection[str]) -> Iterator[EpisodeRecord]:
        """The episodes.jsonl records of these cells, in the file's order (a rerun's comes
        last); a damaged record is skipped, other cells' lines unparsed."""
        return episode_records.episodes_of(self.episodes_path, cell_ids)

    def write_safe_budget(self, record: SafeBudgetRecord) -> None:
        """A budget search's answer for one task and strategy (see records.safe_budgets)."""
        safe_budgets.append_record(self.safe_budgets_path, record)

    def safe_budgets(self) -> list[SafeBudgetRecord]:
        """The budget search's answers, the last of each task and strategy."""
        return safe_budgets.read_records(self.safe_budgets_path)

    def write_export(self, file_name: str, record: Mapping[str, Any]) -> None:
        append_jsonl(self.exports_dir / file_name, record)

    def rows(self) -> list[dict[str, Any]]:
        """The rows of cells.jsonl as written, in its order (see :mod:`~pytest_budgetbench.
        records.cells`)."""
        return list(cells.read_rows(self.cells_path))

    def write_run_info(self, info: RunInfo) -> None:
        """Write run.json (redacted): the run's settings and definition."""
        run_json.write(self.run_info_path, info)

    def has_run_info(self) -> bool:
        return self.run_info_path.is_file()

    def run_info(self) -> RunInfo | None:
        """run.json as written, or None when the run has none (or it holds no JSON object).
        Raises ValueError when it is not JSON, OSError when it cannot be read."""
        return run_json.read(self.run_info_path)
