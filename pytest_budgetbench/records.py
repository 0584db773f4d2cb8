"""Run records: one JSON row per cell, appended in one write as soon as the cell ends.

Layout of a run directory::

    <out>/<run_id>/cells.jsonl     one row per cell (see ROW_FIELDS)
    <out>/<run_id>/prompts.jsonl   the post-strategy prompt per cell (--budgetbench-audit)
    <out>/<run_id>/run.json        the run's settings, written by the controller

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
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pytest_budgetbench.errors import RecordError

SCHEMA_VERSION = 1

ROW_FIELDS: tuple[str, ...] = (
    "schema",
    "run_id",
    "cell_id",
    "task",
    "item_id",
    "category",
    "strategy",
    "regime",
    "reference",
    "budget",
    "repeat",
    "status",  # ok | violation | error
    "counted_tokens",
    "server_prompt_tokens",
    "token_count_match",
    "utilisation",
    "quality",
    "prediction",
    "extracted",
    "strategy_s",
    "model_s",  # the original call's latency, also when served from cache
    "cached",  # the reply came from the response cache (this cell sent nothing)
    "output_tokens",
    "aux_calls",
    "aux_input_tokens",
    "aux_output_tokens",
    "aux_s",
    "strategy_info",
    "model",
    "endpoint",
    "server_flags",
    "tokenizer",
    "tokenizer_exact",
    "prompt_sha256",
    "grader",
    "error",
    "seed",
    "worker",  # the xdist worker that ran the cell, or null
    "time",
)

CELLS_FILE = "cells.jsonl"
PROMPTS_FILE = "prompts.jsonl"
RUN_FILE = "run.json"


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


def last_row_per_cell(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per cell id: the last one, as a resumed run supersedes its errors."""
    return list({row.get("cell_id"): row for row in rows}.values())


class RunStore:
    """The files of one run directory."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    @property
    def cells_path(self) -> Path:
        return self.run_dir / CELLS_FILE

    @property
    def prompts_path(self) -> Path:
        return self.run_dir / PROMPTS_FILE

    def write_row(self, row: Mapping[str, Any]) -> None:
        append_jsonl(self.cells_path, row)

    def write_prompt(self, cell_id: str, sha256: str, messages: object | None) -> None:
        record: dict[str, Any] = {"cell_id": cell_id, "prompt_sha256": sha256}
        if messages is not None:
            record["messages"] = messages
        append_jsonl(self.prompts_path, record)

    def write_export(self, file_name: str, record: Mapping[str, Any]) -> None:
        append_jsonl(self.run_dir / "exports" / file_name, record)

    def rows(self) -> list[dict[str, Any]]:
        return list(read_jsonl(self.cells_path))

    def write_run_info(self, info: Mapping[str, Any]) -> None:
        from pytest_budgetbench.redact import redact_obj

        text = json.dumps(redact_obj(info), indent=2, default=str) + "\n"
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / RUN_FILE).write_text(text)
        except OSError as exc:
            raise RecordError(f"cannot write {self.run_dir / RUN_FILE}: {exc}") from None
