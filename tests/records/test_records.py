"""Run records: the CellRow schema, reading schema-1 files, torn lines, concurrent appends,
the prompts audit, run.json and replicas.jsonl, and one owner per run file."""

from __future__ import annotations

import dataclasses
import errno
import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest

import pytest_budgetbench
from pytest_budgetbench.errors import RecordError
from pytest_budgetbench.records import store as records
from pytest_budgetbench.records.cells import CELLS_FILE
from pytest_budgetbench.records.jsonl import append_jsonl, read_jsonl
from pytest_budgetbench.records.prompts import PROMPTS_FILE, PromptRecord, SpanKept
from pytest_budgetbench.records.rows import ROW_FIELDS, SCHEMA_VERSION, CellRow, Status
from pytest_budgetbench.records.run_json import RUN_FILE
from pytest_budgetbench.records.store import RunStore


def _row(cell_id: str = "c1", **fields: Any) -> CellRow:
    return CellRow(run_id="run-1", cell_id=cell_id, task="memory", item_id="0000",
                   strategy="truncation", budget=512, **fields)


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
    store.write_row(_row("c1", status="ok"))
    store.write_row(_row("c2", status="violation"))
    assert store.cells_path == tmp_path / "run-1" / CELLS_FILE
    assert [(r["cell_id"], r["status"]) for r in store.rows()] == [("c1", "ok"),
                                                                   ("c2", "violation")]
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


def test_a_prompt_record_keeps_its_evidence_marks_and_an_old_record_has_none(
    tmp_path: Path,
) -> None:
    store = RunStore(tmp_path / "run")
    marks = [SpanKept("note 21", True), SpanKept("note 7", False)]
    store.write_prompt("c1", "a" * 64, [{"role": "user", "content": "note 21"}], marks)
    (line,) = read_jsonl(store.prompts_path)
    assert line["evidence"] == [{"span": "note 21", "kept": True},
                                {"span": "note 7", "kept": False}]
    assert next(store.prompts_of({"c1"})).evidence == marks
    old = PromptRecord.from_record({"cell_id": "c0", "prompt_sha256": "b" * 64, "messages": []})
    assert old.evidence is None and "evidence" not in old.record()
    damaged = PromptRecord.from_record({"cell_id": "c", "evidence": [{"span": 1}, "x"]})
    assert damaged.evidence == []


def test_write_run_info_creates_the_directory_and_overwrites(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "new" / "run")
    store.write_run_info({"run_id": "r1", "settings": {"budgets": [512]}, "out": tmp_path})
    path = tmp_path / "new" / "run" / RUN_FILE
    assert json.loads(path.read_text()) == {
        "run_id": "r1", "settings": {"budgets": [512]}, "out": str(tmp_path)
    }
    store.write_run_info({"run_id": "r2"})
    assert json.loads(path.read_text()) == {"run_id": "r2"}


# -- the schema ---------------------------------------------------------------------------------
def test_row_fields_are_the_cellrow_fields_in_order() -> None:
    assert tuple(f.name for f in dataclasses.fields(CellRow)) == ROW_FIELDS
    assert ROW_FIELDS[:3] == ("schema", "run_id", "cell_id")


def test_the_fields_change_only_with_the_schema_version() -> None:
    # When this fails, the on-disk shape changed: bump SCHEMA_VERSION, keep
    # CellRow.from_record reading schema 1, and add the new version's line here.
    schema_1_fields = set(json.loads(SCHEMA_1_LINE))
    # aux_failures joined schema 2 unbumped (issue 17): older rows read it as 0.
    schema_2_fields = schema_1_fields | {"gold", "aux_failures"}
    # Schema 3 (issue 25): an agent episode's fields, null on a single-call cell.
    schema_3_fields = schema_2_fields | {
        "calls", "ended", "call_tokens", "max_call_tokens", "p95_call_tokens",
        "sum_call_tokens", "violated_call", "total_tokens", "prefix_reuse"}
    # Schema 4 (issue 33): evidence retention, null where an item declares no evidence.
    schema_4_fields = schema_3_fields | {"evidence_total", "evidence_kept", "evidence_retention"}
    # Schema 5 (issue 33): how an episode ran, and a teacher-forced one's step scores.
    schema_5_fields = schema_4_fields | {"episode_mode", "steps", "steps_exact", "steps_name",
                                         "name_accuracy"}
    # Schema 6 (issue 40): a strategy's own count of its prompt, and the answer kept.
    schema_6_fields = schema_5_fields | {"estimated_tokens", "answer_kept", "answer_unique"}
    assert (SCHEMA_VERSION, set(ROW_FIELDS)) == (6, schema_6_fields)


def test_a_misspelled_field_is_an_error_where_the_row_is_built() -> None:
    with pytest.raises(TypeError, match="counted_token"):
        _row(counted_token=3)
    row = _row()
    with pytest.raises(AttributeError):
        row.counted_token = 3  # type: ignore[attr-defined]


def test_row_is_a_read_only_mapping_of_its_fields() -> None:
    row = _row(quality=0.5, counted_tokens=300)
    assert row["counted_tokens"] == 300 and row.get("quality") == 0.5
    assert row.get("no_such_field") is None and "no_such_field" not in row
    with pytest.raises(KeyError):
        row["no_such_field"]
    assert list(row) == list(ROW_FIELDS) and dict(row) == row.record()


def test_written_row_has_every_field_in_schema_order(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run")
    store.write_row(_row(strategy_info={"note": "東京"}, aux_calls=[{"purpose": "summary"}]))
    (line,) = store.cells_path.read_text(encoding="utf-8").splitlines()
    written = json.loads(line)
    assert list(written) == list(ROW_FIELDS)
    assert written["schema"] == SCHEMA_VERSION
    assert written["strategy_info"] == {"note": "東京"}
    assert CellRow.from_record(written) == _row(strategy_info={"note": "東京"},
                                                aux_calls=[{"purpose": "summary"}])


# A row exactly as the schema-1 runner wrote it: its base row's keys in their order, then the
# auxiliary fields, which it added after the strategy ran. Written by hand so that a change
# to CellRow cannot change what this test reads.
SCHEMA_1_LINE = (
    '{"schema": 1, "run_id": "20250101-000000-abcd", "cell_id": "memory-0003-rag-2048", '
    '"task": "memory", "item_id": "0003", "category": "multi-hop", "strategy": "rag", '
    '"regime": "retrieval", "reference": false, "budget": 2048, "repeat": 0, "status": "ok", '
    '"counted_tokens": 1911, "server_prompt_tokens": 1911, "token_count_match": true, '
    '"utilisation": 0.9331, "quality": 1.0, "prediction": "Paris", "extracted": "paris", '
    '"strategy_s": 0.012345, "model_s": 0.4821, "cached": false, "output_tokens": 4, '
    '"strategy_info": {"chunks": 7}, "model": "smollm2", "endpoint": "http://127.0.0.1:8080/v1", '
    '"server_flags": {"n_ctx": 8192}, "tokenizer": "smollm2-gguf", "tokenizer_exact": true, '
    '"prompt_sha256": "' + "e" * 64 + '", "grader": "memory-exact-v1", "error": null, '
    '"seed": 0, "worker": null, "time": 1735689600.125, '
    '"aux_calls": [{"purpose": "embed", "input_tokens": 12, "output_tokens": null, '
    '"latency_s": 0.01, "model": "aux", "cached": false}], '
    '"aux_input_tokens": 12, "aux_output_tokens": 0, "aux_s": 0.01}\n'
)


def test_a_schema_1_row_file_reads_back_as_cell_rows(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run")
    store.cells_path.parent.mkdir(parents=True)
    store.cells_path.write_text(SCHEMA_1_LINE + '{"schema": 1, "cell_id": "torn', "utf-8")
    (record,) = store.rows()  # the torn second line is skipped
    row = CellRow.from_record(record)
    assert (row.schema, row.cell_id, row.status, row.budget) == (1, "memory-0003-rag-2048",
                                                                 "ok", 2048)
    assert (row.counted_tokens, row.quality, row.token_count_match) == (1911, 1.0, True)
    assert row.aux_calls[0]["purpose"] == "embed" and row.aux_input_tokens == 12
    assert row.strategy_info == {"chunks": 7} and row.time == 1735689600.125
    # Nothing of a schema-1 row is lost or renamed; schema 2's gold reads as unknown, and
    # schema 3's episode fields as null (a single-call cell).
    episode = dict.fromkeys(set(ROW_FIELDS) - set(record) - {"gold", "aux_failures"})
    assert set(episode) >= {"calls", "call_tokens", "prefix_reuse"}
    assert row.record() == {**record, "gold": None, "aux_failures": 0, **episode}


def test_an_older_row_without_optional_fields_takes_the_defaults() -> None:
    row = CellRow.from_record({"cell_id": "c", "run_id": "r", "task": "t", "item_id": "i",
                               "strategy": "s", "budget": 8, "status": "violation",
                               "future_field": 1})
    assert (row.schema, row.aux_calls, row.aux_s, row.quality) == (SCHEMA_VERSION, [], 0.0, None)
    assert "future_field" not in row.record()


def test_a_row_status_is_a_status_that_is_written_as_its_text(tmp_path: Path) -> None:
    row = CellRow.from_record({"cell_id": "c", "run_id": "r", "task": "t", "item_id": "i",
                               "strategy": "s", "budget": 8, "status": "violation"})
    assert row.status is Status.VIOLATION and row.status == "violation"
    assert CellRow(run_id="r", cell_id="c", task="t", item_id="i", strategy="s",
                   budget=8).status is Status.ERROR  # a cell that never finishes errored
    store = RunStore(tmp_path / "run")
    store.cells_path.parent.mkdir(parents=True)
    store.write_row(dataclasses.replace(row, status=Status.OK))
    assert '"status": "ok"' in store.cells_path.read_text("utf-8")


def test_a_row_with_an_unknown_status_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match=r"'c9' has the status 'skipped'; a status is one of "
                                         r"ok, violation, error"):
        CellRow.from_record({"cell_id": "c9", "run_id": "r", "task": "t", "item_id": "i",
                             "strategy": "s", "budget": 8, "status": "skipped"})


def test_a_row_without_a_required_field_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match=r"'c9' lacks the field 'budget'"):
        CellRow.from_record({"cell_id": "c9", "run_id": "r", "task": "t", "item_id": "i",
                             "strategy": "s"})
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


# -- one owner per format: readers take the fields from the records package ----------------

READERS = ("reports/viewer.py", "reports/load.py", "commands/regrade.py")
MOST_NAMED_FIELDS = 8
"""A literal collection naming more row fields than this outside records/ is a second list
of the schema (the viewer's 27 page keys and the loader's 13 numeric fields were)."""


def test_the_viewer_and_the_loader_take_their_field_lists_from_the_schema() -> None:
    from pytest_budgetbench.records import episodes, rows
    from pytest_budgetbench.reports import load, viewer

    assert viewer.PAGE_KEYS is rows.PAGE_KEYS and viewer.CALL_PAGE_KEYS is episodes.CALL_PAGE_KEYS
    assert load.CELL_KEY is rows.CELL_KEY and load.MEASURES is rows.MEASURES
    assert load.CATEGORICAL is rows.CATEGORICAL
    assert set(rows.PAGE_KEYS) | set(load.REPORT_FIELDS) | set(viewer._CLIPPED) <= set(ROW_FIELDS)
    assert set(episodes.CALL_PAGE_KEYS) <= set(episodes.CALL_FIELDS)
    for keys in (rows.PAGE_KEYS, episodes.CALL_PAGE_KEYS):  # one page key per field
        assert len(set(keys.values())) == len(keys)
    assert rows.CELL_KEY == ("task", "item_id", "strategy", "budget", "repeat")


def test_the_viewer_shows_every_page_field_of_a_row_under_its_key() -> None:
    from pytest_budgetbench.records.rows import PAGE_KEYS
    from pytest_budgetbench.reports.viewer import _entry

    row = {name: f"v-{name}" for name in ROW_FIELDS}
    entry = _entry(row, cell=0, repeat=0)
    assert {key: entry[key] for key in PAGE_KEYS.values()} == {
        key: f"v-{name}" for name, key in PAGE_KEYS.items()}
    assert set(entry) == {"c", "r", *PAGE_KEYS.values()}  # no other field of a row


@pytest.mark.parametrize("reader", READERS)
def test_no_reader_parses_records_by_pattern_or_keeps_a_list_of_row_fields(reader: str) -> None:
    import ast

    import pytest_budgetbench

    path = Path(pytest_budgetbench.__file__).parent / reader
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    assert "re" not in imported, f"{reader} reads records with regular expressions"
    fields = set(ROW_FIELDS)
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple | ast.List | ast.Set | ast.Dict):
            items = node.keys if isinstance(node, ast.Dict) else node.elts
            named = [item.value for item in items
                     if isinstance(item, ast.Constant) and item.value in fields]
            assert len(named) <= MOST_NAMED_FIELDS, (
                f"{reader}:{node.lineno} lists {len(named)} row fields ({', '.join(named)}); "
                "take them from pytest_budgetbench.records.rows")


def test_a_per_cell_file_gives_the_records_of_the_cells_asked_for(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.write_prompt("a", "1" * 64, [{"role": "user", "content": "x" * 10_000}])
    store.write_prompt('b "quoted" \u00e9', "2" * 64, None)
    with store.prompts_path.open("a") as handle:
        handle.write('{"prompt_sha256": "3", "cell_id": "c"}\n')  # cell_id not first: parsed
        handle.write('{"cell_id": "a", "prompt_sha\n')  # torn
    store.write_prompt("a", "4" * 64, None)  # a resumed cell's second record
    assert [(p.cell_id, p.prompt_sha256) for p in store.prompts_of({"a"})] == [
        ("a", "1" * 64), ("a", "4" * 64)]
    (quoted,) = store.prompts_of({'b "quoted" \u00e9', "z"})
    assert quoted.messages is None and quoted.prompt_sha256 == "2" * 64
    assert [p.cell_id for p in store.prompts_of({"c"})] == ["c"]
    assert list(store.prompts_of(set())) == []


def test_an_episode_record_reads_back_as_written_and_a_damaged_one_is_skipped(
    tmp_path: Path,
) -> None:
    from pytest_budgetbench.records.episodes import CallRecord, EpisodeRecord

    call = CallRecord(call=1, seen=1, prompt=[{"t": 0}, {"m": {"role": "user", "content": "s"}}],
                      tools=0, counted_tokens=7, prompt_sha256="f" * 64, cached=False)
    episode = EpisodeRecord(cell_id="e1", run_id="r", ended="done",
                            trajectory=[{"role": "user", "content": "q"}], calls=[call])
    store = RunStore(tmp_path)
    store.write_episode(episode)
    with store.episodes_path.open("a") as handle:
        handle.write(json.dumps({"cell_id": "e2", "trajectory": "not a list", "calls": []}) + "\n")
    assert store.episodes() == {"e1": episode}
    assert list(call.prompt_parts()) == [0, {"role": "user", "content": "s"}]
    assert list(store.episodes_of({"e2"})) == []


def test_run_info_is_read_back_and_a_run_without_one_has_none(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run")
    assert store.run_info() is None and not store.has_run_info()
    store.write_run_info({"started": 1.5})
    assert store.run_info() == {"started": 1.5}
    assert RunStore.of(store.cells_path.parent).run_info() == {"started": 1.5}
    store.run_info_path.write_text("{not json")
    with pytest.raises(ValueError):
        store.run_info()


# -- one owner per file ---------------------------------------------------------------------
PACKAGE_DIR = Path(pytest_budgetbench.__file__).parent
OWNERS = {
    "cells.jsonl": ("records/cells.py", "CELLS_FILE"),
    "prompts.jsonl": ("records/prompts.py", "PROMPTS_FILE"),
    "replicas.jsonl": ("records/replicas.py", "REPLICAS_FILE"),
    "run.json": ("records/run_json.py", "RUN_FILE"),
    "episodes.jsonl": ("records/episodes.py", "EPISODES_FILE"),
    "safe_budgets.jsonl": ("records/safe_budgets.py", "SAFE_BUDGETS_FILE"),
}
"""Each file of a run that issue 39 gave one owner: the module that names, writes and
reads it, and the constant it names it by."""
LAYOUT = "records/store.py"
"""RunStore's paths join the owners' names to a run directory: the layout, not a reader."""
JSON_LINES_TOOLS = frozenset({"append_jsonl", "read_jsonl", "lines_of", "cell_records",
                              "blocks", "parse_line", "write_lines"})


def _package_sources() -> dict[str, Any]:
    import ast

    return {path.relative_to(PACKAGE_DIR).as_posix(): ast.parse(path.read_text("utf-8"))
            for path in sorted(PACKAGE_DIR.rglob("*.py"))}


def _value_strings(tree: Any) -> list[tuple[int, str]]:
    """The string literals of a module used as values: a string statement (a docstring,
    an attribute's docstring) is prose and left out."""
    import ast

    prose = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in prose]


def test_each_run_file_name_is_spelled_by_its_owner_alone() -> None:
    """A literal that is a file's name, or a path or glob ending in it, outside the owner
    is a second writer or reader of the file in the making."""
    import re

    found = []
    for module, tree in _package_sources().items():
        for lineno, text in _value_strings(tree):
            for name, (owner, _constant) in OWNERS.items():
                if module != owner and re.search(rf"(?:^|[/*\\]){re.escape(name)}$", text):
                    found.append(f"{module}:{lineno} spells {text!r} ({name} is {owner}'s)")
    assert not found, "\n".join(found)


def test_no_module_outside_records_reads_or_writes_json_lines_of_a_run_itself() -> None:
    """The JSON-lines tools (one locked writer, one line parser) are the owners': a module
    outside records/ that imports them parses or writes a run's lines itself."""
    import ast

    found = []
    for module, tree in _package_sources().items():
        if module.startswith("records/"):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(
                    "pytest_budgetbench.records"):
                continue
            names = {alias.name for alias in node.names}
            if node.module == "pytest_budgetbench.records.jsonl" or "jsonl" in names \
                    or names & JSON_LINES_TOOLS:
                found.append(f"{module}:{node.lineno} imports {sorted(names)} "
                             f"from {node.module}")
    assert not found, "\n".join(found)


def test_no_module_but_the_owner_builds_a_path_from_a_run_file_name() -> None:
    """``run_dir / CELLS_FILE`` outside the owner (and RunStore's paths) opens the file
    without it; a message may still name the file by its constant."""
    import ast

    constants = {constant: owner for owner, constant in OWNERS.values()}
    found = []
    for module, tree in _package_sources().items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.BinOp) or not isinstance(node.op, ast.Div):
                continue
            right = node.right
            name = right.id if isinstance(right, ast.Name) else \
                right.attr if isinstance(right, ast.Attribute) else None
            if name in constants and module not in (constants[name], LAYOUT):
                found.append(f"{module}:{node.lineno} joins {name} to a path "
                             f"(go through {constants[name]})")
    assert not found, "\n".join(found)


def test_the_owners_name_their_files_and_the_store_lays_them_out(tmp_path: Path) -> None:
    import importlib

    store = RunStore(tmp_path)
    paths = {"CELLS_FILE": store.cells_path, "PROMPTS_FILE": store.prompts_path,
             "REPLICAS_FILE": store.replicas_path, "RUN_FILE": store.run_info_path,
             "EPISODES_FILE": store.episodes_path,
             "SAFE_BUDGETS_FILE": store.safe_budgets_path}
    for name, (owner, constant) in OWNERS.items():
        module = importlib.import_module(
            "pytest_budgetbench." + owner.removesuffix(".py").replace("/", "."))
        assert getattr(module, constant) == name
        assert paths[constant] == tmp_path / name


def test_a_resumed_and_a_regraded_run_json_keep_what_the_run_wrote(tmp_path: Path) -> None:
    from pytest_budgetbench.records import run_json

    store = RunStore(tmp_path / "run")
    store.write_run_info({"run_id": "r", "settings": {"seed": 3}, "started": 5.0,
                          "definition": {"version": 1}, "from_another_version": [1]})
    earlier = store.run_info()
    assert earlier is not None
    once = run_json.resumed(earlier, 7.0)
    twice = run_json.resumed(once, 9.0)
    assert list(twice) == ["run_id", "settings", "started", "definition",
                           "from_another_version", "resumed"]
    assert twice["resumed"] == [7.0, 9.0] and run_json.started(twice) == 5.0
    regraded = run_json.regraded(twice, tmp_path / "run", 11.0, {"memory": "exact"})
    assert regraded["regraded"] == {"from": str(tmp_path / "run"), "time": 11.0,
                                    "grader_variants": {"memory": "exact"}}
    assert {**regraded, "regraded": None} == {**twice, "regraded": None}
    assert run_json.definition_of(regraded) == {"version": 1}
    assert run_json.settings_of(regraded) == {"seed": 3}


def test_run_json_accessors_read_an_old_or_hand_edited_run_as_saying_nothing() -> None:
    from pytest_budgetbench.records import run_json

    odd: Any = {"started": "soon", "definition": [1], "settings": "seed=3", "resumed": 4}
    assert run_json.started(odd) is None and run_json.started({}) is None
    assert run_json.definition_of(odd) is None and run_json.settings_of(odd) == {}
    assert run_json.resumed(odd, 2.0)["resumed"] == [2.0]


def test_replica_events_are_stamped_read_back_and_damaged_ones_skipped(tmp_path: Path) -> None:
    from pytest_budgetbench.records import replicas

    path = RunStore(tmp_path).replicas_path
    replicas.append_event(path, {"event": "out", "replica": "http://a/v1", "cooldown_s": 30.0,
                                 "error": "refused"}, worker="gw1", when=2.0)
    with path.open("a") as handle:
        handle.write('{"event": "gone", "replica": "x"}\n{"event": "out", "time": "late"}\n')
    replicas.append_event(path, {"event": "back", "replica": "http://a/v1"}, worker=None,
                          when=3.0)
    with path.open("a") as handle:
        handle.write('{"event": "out", "repl')  # torn
    assert list(replicas.read_events(path)) == [
        {"event": "out", "replica": "http://a/v1", "cooldown_s": 30.0, "error": "refused",
         "worker": "gw1", "time": 2.0},
        {"event": "back", "replica": "http://a/v1", "worker": None, "time": 3.0}]


def test_a_synthetic_prompts_file_reads_back_through_its_owner(tmp_path: Path) -> None:
    from pytest_budgetbench.records.prompts import read_prompts
    from pytest_budgetbench.reports.synthetic import make_row, write_prompts, write_run

    rows = [make_row(item_id="i1", reference=True), make_row(item_id="i2", budget=512)]
    write_run(tmp_path, rows, torn_tail='{"cell_id": "torn')
    path = write_prompts(tmp_path, rows)
    prompts = list(read_prompts(path, {row["cell_id"] for row in rows}))
    assert [p.cell_id for p in prompts] == [row["cell_id"] for row in rows]
    assert len(prompts[0].messages or []) == 10 and len(prompts[1].messages or []) == 3
    assert [row["cell_id"] for row in RunStore(tmp_path).rows()] == [
        row["cell_id"] for row in rows]


def test_safe_budgets_jsonl_keeps_the_last_search_of_each_task_and_strategy(tmp_path: Path
                                                                          ) -> None:
    """A resumed budget search appends again: its last record is the answer."""
    from pytest_budgetbench.records.safe_budgets import SafeBudgetRecord
    from pytest_budgetbench.records.store import RunStore

    store = RunStore(tmp_path)
    record: SafeBudgetRecord = {
        "task": "memory", "strategy": "rag", "lo": 512, "hi": 1024, "step": 64,
        "min_retention": 0.9, "max_violation_rate": None, "safe_budget": 1024, "below": 960,
        "scanned": None, "max_safe_budget": None, "gate": None, "probes": []}
    store.write_safe_budget(record)
    store.write_safe_budget({**record, "safe_budget": 512, "below": None})
    store.write_safe_budget({**record, "strategy": "truncation"})
    with store.safe_budgets_path.open("a") as file:  # not a search's record; a torn line
        file.write('{"task": "memory"}\n{"torn": ')
    assert [(r["strategy"], r["safe_budget"]) for r in store.safe_budgets()] == [
        ("rag", 512), ("truncation", 1024)]
