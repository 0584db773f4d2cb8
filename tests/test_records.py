"""Run records: torn lines, concurrent appends, the prompts audit and run.json."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench import records
from pytest_budgetbench.errors import RecordError
from pytest_budgetbench.records import (
    CELLS_FILE,
    PROMPTS_FILE,
    RUN_FILE,
    RunStore,
    append_jsonl,
    read_jsonl,
)


def _raw_lines(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")


def test_round_trip_keeps_order_and_non_ascii(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "dir" / "rows.jsonl"  # parents are created
    rows = [{"i": i, "text": f"東京 🙂 naïve {i}"} for i in range(5)]
    for row in rows:
        append_jsonl(path, row)
    assert list(read_jsonl(path)) == rows
    assert "東京".encode() in path.read_bytes()  # written as UTF-8, not \u escapes
    assert path.read_bytes().endswith(b"\n")


def test_values_json_cannot_encode_are_stringified(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    append_jsonl(path, {"path": tmp_path / "x"})
    assert list(read_jsonl(path)) == [{"path": str(tmp_path / "x")}]


def test_missing_file_reads_as_empty(tmp_path: Path) -> None:
    assert list(read_jsonl(tmp_path / "nope.jsonl")) == []
    assert RunStore(tmp_path / "run").rows() == []


def test_torn_last_line_is_skipped_and_the_next_append_starts_fresh(tmp_path: Path) -> None:
    path = tmp_path / CELLS_FILE
    append_jsonl(path, {"cell_id": "a", "status": "ok"})
    with path.open("ab") as handle:  # a crash in the middle of a write
        handle.write(b'{"cell_id": "torn", "sta')
    assert list(read_jsonl(path)) == [{"cell_id": "a", "status": "ok"}]

    append_jsonl(path, {"cell_id": "b", "status": "ok"})
    assert [row["cell_id"] for row in read_jsonl(path)] == ["a", "b"]
    lines = _raw_lines(path)
    assert lines[1] == b'{"cell_id": "torn", "sta'  # ended, not glued to the new row
    assert json.loads(lines[2]) == {"cell_id": "b", "status": "ok"}


def test_torn_line_as_the_only_content(tmp_path: Path) -> None:
    path = tmp_path / CELLS_FILE
    path.write_bytes(b'{"cell_id": "to')
    assert list(read_jsonl(path)) == []
    append_jsonl(path, {"cell_id": "b"})
    assert list(read_jsonl(path)) == [{"cell_id": "b"}]


def test_line_torn_inside_a_multibyte_character_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / CELLS_FILE
    append_jsonl(path, {"cell_id": "a"})
    whole = json.dumps({"cell_id": "東京"}, ensure_ascii=False).encode()
    with path.open("ab") as handle:
        handle.write(whole[: whole.index("東".encode()) + 1])  # half a character
    append_jsonl(path, {"cell_id": "c"})
    assert [row["cell_id"] for row in read_jsonl(path)] == ["a", "c"]


def test_lines_that_are_not_objects_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / CELLS_FILE
    path.write_bytes(b'[1, 2]\n"text"\n\n{"ok": 1}\n42\n')
    assert list(read_jsonl(path)) == [{"ok": 1}]


def _append_many(path: str, worker: int, count: int, start: Any) -> None:
    start.wait()
    for seq in range(count):
        # Rows of different sizes, some large, so unlocked writes would interleave.
        pad = "x" * (1 + (seq * 37 + worker * 11) % 6000)
        append_jsonl(Path(path), {"worker": worker, "seq": seq, "pad": pad})


def test_concurrent_appends_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    workers, count = 4, 200
    path = tmp_path / CELLS_FILE
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    start = ctx.Event()
    procs = [
        ctx.Process(target=_append_many, args=(str(path), w, count, start))
        for w in range(workers)
    ]
    for proc in procs:
        proc.start()
    start.set()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0

    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""  # the file ends with a newline
    parsed = [json.loads(line) for line in lines[:-1]]  # every line is whole JSON
    keys = [(row["worker"], row["seq"]) for row in parsed]
    assert len(keys) == workers * count
    assert set(keys) == {(w, s) for w in range(workers) for s in range(count)}
    for row in parsed:
        assert row["pad"] == "x" * (1 + (row["seq"] * 37 + row["worker"] * 11) % 6000)
    # Each worker's rows keep their own order.
    for w in range(workers):
        assert [s for (wk, s) in keys if wk == w] == list(range(count))


def test_store_rows_and_exports(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run-1")
    store.write_row({"cell_id": "c1", "status": "ok"})
    store.write_row({"cell_id": "c2", "status": "violation"})
    assert store.cells_path == tmp_path / "run-1" / CELLS_FILE
    assert [r["cell_id"] for r in store.rows()] == ["c1", "c2"]
    store.write_export("preds.jsonl", {"id": 1})
    assert list(read_jsonl(tmp_path / "run-1" / "exports" / "preds.jsonl")) == [{"id": 1}]


def test_prompts_audit_with_and_without_messages(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run")
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "東京?"}]
    store.write_prompt("c1", "a" * 64, messages)
    store.write_prompt("c2", "b" * 64, None)
    assert store.prompts_path == tmp_path / "run" / PROMPTS_FILE
    full, hashed = list(read_jsonl(store.prompts_path))
    assert full == {"cell_id": "c1", "prompt_sha256": "a" * 64, "messages": messages}
    assert hashed == {"cell_id": "c2", "prompt_sha256": "b" * 64}
    assert "messages" not in hashed
    assert store.rows() == []  # the audit does not go into cells.jsonl


def test_write_run_info_creates_the_directory_and_overwrites(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "new" / "run")
    store.write_run_info({"run_id": "r1", "settings": {"budgets": [512]}, "out": tmp_path})
    path = tmp_path / "new" / "run" / RUN_FILE
    assert json.loads(path.read_text()) == {
        "run_id": "r1", "settings": {"budgets": [512]}, "out": str(tmp_path)
    }
    store.write_run_info({"run_id": "r2"})
    assert json.loads(path.read_text()) == {"run_id": "r2"}


# -- short writes and full disks ----------------------------------------------------------
def _flaky_write(monkeypatch: pytest.MonkeyPatch, outcomes: list[int | None]) -> None:
    """os.write for records: each call writes ``n`` bytes of what it is given (None: fails
    with ENOSPC) until ``outcomes`` runs out, then writes normally."""
    real_write = os.write

    def write(fd: int, data: bytes) -> int:
        if not outcomes:
            return real_write(fd, data)
        n = outcomes.pop(0)
        if n is None:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data[:n])

    monkeypatch.setattr(records.os, "write", write)


def test_a_short_write_is_completed_not_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "cells.jsonl"
    _flaky_write(monkeypatch, [3, 5])
    append_jsonl(path, {"cell_id": "a", "text": "x" * 50})
    assert list(read_jsonl(path)) == [{"cell_id": "a", "text": "x" * 50}]


def test_a_full_disk_raises_and_leaves_the_file_at_its_last_whole_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "cells.jsonl"
    append_jsonl(path, {"cell_id": "a"})
    before = path.read_bytes()
    _flaky_write(monkeypatch, [7, None])  # part of the line, then ENOSPC
    with pytest.raises(RecordError, match=r"wrote 7 of \d+ bytes .*No space left"):
        append_jsonl(path, {"cell_id": "b"})
    assert path.read_bytes() == before
    append_jsonl(path, {"cell_id": "c"})  # space again: the record goes on, line-aligned
    assert [r["cell_id"] for r in read_jsonl(path)] == ["a", "c"]


def test_a_write_that_makes_no_progress_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "cells.jsonl"
    _flaky_write(monkeypatch, [0])
    with pytest.raises(RecordError):
        append_jsonl(path, {"cell_id": "a"})
    assert path.read_bytes() == b""


def test_rows_are_written_without_known_secrets(tmp_path: Path) -> None:
    from pytest_budgetbench.redact import forget_secrets, register_secret

    register_secret("sk-plantedKEY0000111")
    try:
        path = tmp_path / "cells.jsonl"
        error = "401 for http://u:pw@h/v1?key=abc: Bearer sk-plantedKEY0000111"
        append_jsonl(path, {"error": error, "prediction": "see https://example.com/q?page=2"})
        text = path.read_text()
    finally:
        forget_secrets()
    assert "sk-plantedKEY0000111" not in text and "u:pw" not in text and "key=abc" not in text
    assert "https://example.com/q?page=2" in text  # data, not a credential: kept
