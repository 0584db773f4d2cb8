"""The JSON lines of a run's files: one locked writer and one line parser, for the owners.

No file name is spelled here: each file of a run has its owner in ``records/`` (cells,
prompts, replicas; run.json is not JSON lines), which names the file and gives its typed
record, and reads and writes it through this module. Nothing outside ``records/`` imports
it (``tests/test_records.py`` holds to that).

Rows are appended with ``O_APPEND`` under an exclusive ``flock``, one ``write`` each, so
xdist workers can share a file and a crash loses at most the row being written. A line
that is not a whole JSON object (a torn last line) is skipped on read, by every reader.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

from pytest_budgetbench.errors import RecordError

BLOCK_BYTES = 8 << 20
"""A file is read in blocks of about this many bytes of whole lines."""


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
    """The JSON objects of a file, one a line; lines that are not whole JSON objects (a torn
    write) are skipped, and a file that does not exist gives none."""
    for block in blocks(path):
        yield from block


def blocks(path: Path, block_bytes: int = 0) -> Iterator[list[dict[str, Any]]]:
    """The JSON objects of a file, one block of whole lines at a time (none when it does
    not exist): a reader of a million rows holds one block's dicts, not the file's.
    Raises OSError where the path cannot be read (a directory, no permission)."""
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return
    with handle:
        rest = b""
        while chunk := handle.read(block_bytes or BLOCK_BYTES):
            data = rest + chunk
            cut = data.rfind(b"\n") + 1
            rest = data[cut:]
            if cut:
                yield _parse(data[:cut])
        if rest:  # a last line without its newline: whole, or a torn write
            yield _parse(rest)


def _parse(data: bytes) -> list[dict[str, Any]]:
    """The JSON objects of some whole lines; a line that is not one (a torn write) is
    skipped.

    With orjson (the ``reports`` extra), each line is parsed by it, and any line it refuses
    by ``json`` (which also reads NaN, huge integers and lone surrogates): the rows are
    those ``json`` gives, three times as fast. Without it, one parse of the joined lines
    is about twice as fast as a parse per line, which it falls back to at a bad line.
    """
    lines = [line for line in data.split(b"\n") if line.strip()]
    fast = fast_loads()
    if fast is not None:
        return [row for row in (_load_line(fast, line) for line in lines)
                if isinstance(row, dict)]
    try:
        parsed = json.loads(b"[" + b",".join(lines) + b"]")
    except ValueError:
        return _parse_lines(lines)
    if len(parsed) != len(lines):  # a line held several values: not one row per line
        return _parse_lines(lines)
    return [row for row in parsed if isinstance(row, dict)]


def _parse_lines(lines: Iterable[bytes]) -> list[dict[str, Any]]:
    return [row for row in (_load_line(None, line) for line in lines) if isinstance(row, dict)]


def _load_line(fast: Callable[[bytes], Any] | None, line: bytes) -> Any:
    if fast is not None:
        try:
            return fast(line)
        except ValueError:  # orjson.JSONDecodeError is one
            pass
    try:
        return json.loads(line)
    except ValueError:
        return None


def parse_line(line: bytes) -> dict[str, Any] | None:
    """One line as a JSON object, parsed as :func:`blocks` parses it; None for a line that
    is not one (a torn write)."""
    row = _load_line(fast_loads(), line)
    return row if isinstance(row, dict) else None


@cache
def fast_loads() -> Callable[[bytes], Any] | None:
    """orjson's parser where it is installed (looked up once, on first use), else None."""
    try:
        import orjson
    except ImportError:
        return None
    loads: Callable[[bytes], Any] = orjson.loads
    return loads


def write_lines(path: Path, records: Iterable[Mapping[str, Any]], tail: str = "") -> None:
    """Write a whole file of records, one JSON line each, as :func:`append_jsonl` would
    write them one by one but unlocked and unredacted: for a run made up at once (the
    synthetic runs of tests and benchmarks), not one being recorded. ``tail`` ends the
    file (a torn line, for a test of the readers)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        handle.write(tail)


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
        record = parse_line(line)  # None for a torn write
        if record is not None and record.get("cell_id") in cell_ids:
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


