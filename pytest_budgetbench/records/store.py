"""The run directory: every file and folder name in it, and the JSON-lines writer.

Layout of a run directory (the names are this module's constants, and :class:`RunStore`'s
paths; nothing else spells them)::

    <out>/<run_id>/cells.jsonl     one row per cell (records.rows.CellRow)
    <out>/<run_id>/prompts.jsonl   the post-strategy prompt per cell (--budgetbench-audit)
    <out>/<run_id>/episodes.jsonl  an agent episode's trajectory and calls, per episode cell
                                   (records.episodes.EpisodeRecord)
    <out>/<run_id>/run.json        the run's settings and definition, written by the controller
    <out>/<run_id>/run.lock        held (flock) by the controller while a session writes the run
    <out>/<run_id>/replicas.jsonl  replicas of the endpoint taken out and back
    <out>/<run_id>/server.log      the embedded server's log
    <out>/<run_id>/strategy-files/ the one place in a run where strategies may write
    <out>/<run_id>/exports/        records a task exports (one file each, JSON lines)
    <out>/<run_id>/.slots/         the request slots the xdist workers share (--concurrency)
    <out>/<run_id>/report/         the report written at session end (and by default by
                                   ``budgetbench report RUN``)

Rows are appended with ``O_APPEND`` under an exclusive ``flock``, one ``write`` each, so
xdist workers can share a file and a crash loses at most the row being written. A torn
last line is skipped on read.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

from pytest_budgetbench.errors import ConfigError, RecordError
from pytest_budgetbench.messages import Message
from pytest_budgetbench.records.episodes import EpisodeRecord, decode_episodes
from pytest_budgetbench.records.prompts import PromptRecord, SpanKept
from pytest_budgetbench.records.rows import CellRow

CELLS_FILE = "cells.jsonl"
PROMPTS_FILE = "prompts.jsonl"
EPISODES_FILE = "episodes.jsonl"  # an episode cell's trajectory and its calls, one record a cell
RUN_FILE = "run.json"
LOCK_FILE = "run.lock"
REPLICAS_FILE = "replicas.jsonl"  # replicas of the endpoint taken out and back (model/replicas.py)
SERVER_LOG = "server.log"  # the embedded server's output
STRATEGY_FILES = "strategy-files"  # the one place in a run where strategies may write
EXPORTS_DIR = "exports"  # a task's exported records, <file name> each
SLOTS_DIR = ".slots"  # request slots shared by the xdist workers of one run
REPORT_DIR = "report"  # the session's report, and budgetbench report's default for one run


def append_jsonl(path: Path, row: Mapping[str, Any]) -> None:
    """Append one JSON line, whole or not at all, under an exclusive lock.

    The line is redacted (see :func:`_redacted_line`). A write that the disk cuts short
    (ENOSPC, a short ``os.write``) is undone, the file truncated back to its last line
    boundary, and raised as RecordError: the cell errors, it never passes unrecorded.
    """
    line = _redacted_line(row)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        raise RecordError(f"cannot open {path} to record a row: {exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            _terminate_torn_line(fd, path)
            _write_whole(fd, path, line)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _redacted_line(row: Mapping[str, Any]) -> bytes:
    """The row as one JSON line, with no secret in it: the ``error`` text (ours, and what
    servers echoed into it) fully redacted; everything else, which is data (prompts,
    predictions, whose URLs are content), only cleared of the secret values themselves."""
    from pytest_budgetbench.redact import redact, redact_known

    if isinstance(row.get("error"), str):
        row = {**row, "error": redact(row["error"])}
    text = redact_known(json.dumps(row, ensure_ascii=False, default=str))
    return (text + "\n").encode("utf-8")


def _write_whole(fd: int, path: Path, data: bytes) -> None:
    """Write all of ``data`` at the end of the file, or cut the file back and raise."""
    start = os.fstat(fd).st_size
    written = 0
    try:
        while written < len(data):
            count = os.write(fd, data[written:])
            if count <= 0:
                raise OSError(errno.ENOSPC, "the write made no progress")
            written += count
    except OSError as exc:
        _truncate(fd, start)
        raise RecordError(
            f"could not record a row in {path}: wrote {written} of {len(data)} bytes "
            f"({exc.strerror or exc}); the file was cut back to its last whole line. "
            "Free space (or pass --budgetbench-out=DIR on another disk) and resume with "
            "--budgetbench-resume=latest"
        ) from None


def _truncate(fd: int, size: int) -> None:
    with contextlib.suppress(OSError):  # nothing more to do: the reader skips a torn line
        os.ftruncate(fd, size)


def _terminate_torn_line(fd: int, path: Path) -> None:
    """If a crash left a partial last line, end it so the next row starts clean."""
    size = os.fstat(fd).st_size
    if size == 0:
        return
    with path.open("rb") as existing:
        existing.seek(size - 1)
        if existing.read(1) != b"\n":
            _write_whole(fd, path, b"\n")


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Rows of a JSONL file; lines that are not whole JSON objects (a torn write) are skipped."""
    if not path.exists():
        return
    with path.open("rb") as handle:
        for raw in handle:
            try:
                row = json.loads(raw)
            except ValueError:
                continue
            if isinstance(row, dict):
                yield row


def cell_records(path: Path, cell_ids: Collection[str]
                 ) -> Iterator[tuple[str, dict[str, Any]]]:
    """(cell id, record) for these cells from a per-cell JSON-lines file (prompts.jsonl,
    episodes.jsonl), in the file's order; a torn line, or a file that cannot be read, gives
    nothing. A line of another cell is skipped on its leading ``cell_id`` (which the
    writers here put first), without parsing the rest of it: a prompt or an episode can be
    long."""
    if not cell_ids:
        return
    for line in lines_of(path):
        leading = _leading_cell_id(line)
        if leading is not None and leading not in cell_ids:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a torn write
        if isinstance(record, dict) and record.get("cell_id") in cell_ids:
            yield str(record["cell_id"]), record


def lines_of(path: Path) -> Iterator[bytes]:
    """The raw lines of a JSON-lines file; none where it cannot be opened (a run that
    never wrote it, a file being replaced): readers of records skip what they cannot use."""
    try:
        handle = path.open("rb")
    except OSError:
        return
    with handle:
        yield from handle


_LEADING_CELL_ID = '{"cell_id": '
"""How a per-cell record's line starts, as :func:`append_jsonl` writes it."""
_HEAD_BYTES = 4096
_DECODER = json.JSONDecoder()


def _leading_cell_id(line: bytes) -> str | None:
    """The cell id a line starts with, decoded as JSON decodes it; None where the line
    does not start with one (it is then parsed whole)."""
    if not line.startswith(_LEADING_CELL_ID.encode()):
        return None
    head = line[:_HEAD_BYTES].decode("utf-8", "replace")
    try:
        value, _end = _DECODER.raw_decode(head, len(_LEADING_CELL_ID))
    except ValueError:  # longer than the head, or not JSON
        return None
    return value if isinstance(value, str) else None


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
        append_jsonl(self.cells_path, row.record())

    def write_prompt(self, cell_id: str, sha256: str, messages: list[Message] | None,
                     evidence: list[SpanKept] | None = None) -> None:
        append_jsonl(self.prompts_path,
                     PromptRecord(cell_id, sha256, messages, evidence).record())

    def write_episode(self, episode: EpisodeRecord) -> None:
        """An agent episode's trajectory and calls, before its row (see engine.episode)."""
        append_jsonl(self.episodes_path, episode.record())

    def episodes(self) -> dict[str, EpisodeRecord]:
        """The recorded episodes by cell id, the last record of each (a damaged record is
        skipped, as a torn line is)."""
        return {episode.cell_id: episode
                for episode in decode_episodes(read_jsonl(self.episodes_path))}

    def prompts_of(self, cell_ids: Collection[str]) -> Iterator[PromptRecord]:
        """The prompts.jsonl records of these cells, in the file's order (a resumed cell
        has one per attempt); other cells' lines are skipped unparsed."""
        for _cell_id, record in cell_records(self.prompts_path, cell_ids):
            yield PromptRecord.from_record(record)

    def episodes_of(self, cell_ids: Collection[str]) -> Iterator[EpisodeRecord]:
        """The episodes.jsonl records of these cells, in the file's order (a rerun's comes
        last); a damaged record is skipped, other cells' lines unparsed."""
        return decode_episodes(record for _cell_id, record
                               in cell_records(self.episodes_path, cell_ids))

    def write_export(self, file_name: str, record: Mapping[str, Any]) -> None:
        append_jsonl(self.exports_dir / file_name, record)

    def rows(self) -> list[dict[str, Any]]:
        return list(read_jsonl(self.cells_path))

    def write_run_info(self, info: Mapping[str, Any]) -> None:
        """Write run.json (redacted): the run's settings and definition."""
        from pytest_budgetbench.redact import redact_obj

        text = json.dumps(redact_obj(info), indent=2, default=str) + "\n"
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.run_info_path.write_text(text)
        except OSError as exc:
            raise RecordError(f"cannot write {self.run_info_path}: {exc}") from None

    def has_run_info(self) -> bool:
        return self.run_info_path.is_file()

    def run_info(self) -> dict[str, Any] | None:
        """run.json as written, or None when the run has none (or it holds no JSON object).
        Raises ValueError when it is not JSON, OSError when it cannot be read."""
        if not self.run_info_path.is_file():
            return None
        info = json.loads(self.run_info_path.read_text(encoding="utf-8"))
        return info if isinstance(info, dict) else None
