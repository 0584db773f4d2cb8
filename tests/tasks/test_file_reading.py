"""Files are read as files: JSON lines end at ``\\n`` only, CSV records at CSV line ends
outside quotes, a cell may be as long as a chat, errors name the line a record starts on,
a byte that is not UTF-8 is named by line, column and value, and a command over
unreadable or empty records says so in one line; a gate over nothing fails."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.commands.cli import EXIT_GATE_FAILED, EXIT_OK, EXIT_USAGE, main
from pytest_budgetbench.errors import DataError
from pytest_budgetbench.tasks import TaskOptions, resolve_task
from pytest_budgetbench.tasks import _fixtures as fx
from pytest_budgetbench.tasks._data import json_lines, read_json
from pytest_budgetbench.tasks.import_chats import write_example
from pytest_budgetbench.tasks.jsonl import CsvTask, JsonlTask

CHAT = [{"role": "user", "content": "my dog is called Rex"},
        {"role": "assistant", "content": "Noted."}]
QUESTION = "What is my dog called?"
SEPARATORS = "\u2028\u2029\u0085"
"""Line breaks to str.splitlines, plain characters to JSON and CSV."""


def _load(path: Path) -> list[Any]:
    cls = CsvTask if path.suffix == ".csv" else JsonlTask
    defaults = {option.key: option.default for option in cls.declared_options}
    return cls(TaskOptions(data_path=path, extra=defaults)).load()


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("budgetbench: error: "), line
    return line


# -- JSON lines -----------------------------------------------------------------------------
def test_json_lines_end_at_newline_only() -> None:
    text = f'{{"a": "x{SEPARATORS}y"}}\r\n\n{{"b": 1}}\n'
    assert list(json_lines(text)) == [(1, {"a": f"x{SEPARATORS}y"}), (3, {"b": 1})]


def test_a_jsonl_record_may_hold_unicode_line_separators(tmp_path: Path) -> None:
    content = f"my dog{SEPARATORS[0]}is called{SEPARATORS[1]}Rex{SEPARATORS[2]}"
    record = {"history": [{"role": "user", "content": content}, CHAT[1]],
              "question": QUESTION, "answer": "Rex"}
    path = tmp_path / "chats.jsonl"
    path.write_text(json.dumps(record, ensure_ascii=False) + "\n", encoding="utf-8")
    (item,) = _load(path)
    assert item.messages[0]["content"] == content


def test_import_chats_reads_its_own_output_with_unicode_line_separators(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chats, questions = fx.openai_chat_export(2)
    chats[0]["messages"][1]["content"] += f" (see{SEPARATORS}above)"
    questions[1]["question"] = f"Which{SEPARATORS[0]}one?"
    export = fx.write_json(tmp_path / "export.json", chats)
    asked = tmp_path / "questions.jsonl"
    asked.write_text("".join(json.dumps(q, ensure_ascii=False) + "\n" for q in questions),
                     encoding="utf-8")
    out = tmp_path / "chats.jsonl"
    assert main(["import-chats", str(export), str(asked), "--out", str(out)]) == EXIT_OK, \
        capsys.readouterr().err
    items = _load(out)
    assert SEPARATORS in items[0].messages[1]["content"]
    assert items[1].messages[-1]["content"] == f"Which{SEPARATORS[0]}one?"


def test_a_jsonl_task_path_that_is_a_directory_is_one_clear_line(tmp_path: Path) -> None:
    cls = resolve_task("chats", {"chats": ("jsonl", {"path": str(tmp_path)})})
    defaults = {option.key: option.default for option in cls.declared_options}
    with pytest.raises(DataError) as info:
        cls(TaskOptions(data_path=tmp_path, extra=defaults)).load()
    assert str(info.value) == (
        f"task 'chats' needs a JSON-lines file, not the directory {tmp_path}: pass "
        "--budgetbench-data-chats=PATH (or BUDGETBENCH_DATA_CHATS) with the file's path")


# -- CSV ------------------------------------------------------------------------------------
def _write_csv(path: Path, *rows: list[str]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows([["id", "history", "question", "answer"], *rows])
    return path


def test_an_unquoted_csv_cell_holding_a_line_separator_is_one_record(tmp_path: Path) -> None:
    question = f"What{SEPARATORS[0]}is my dog{SEPARATORS[2]}called?"
    path = _write_csv(tmp_path / "chats.csv", ["t1", json.dumps(CHAT), question, "Rex"])
    assert '"' + question not in path.read_text(encoding="utf-8")  # written unquoted
    (item,) = _load(path)
    assert item.item_id == "t1" and item.messages[-1]["content"] == question


def test_a_csv_error_names_the_line_its_record_starts_on(tmp_path: Path) -> None:
    history = json.dumps(CHAT, indent=1)  # a quoted cell over several lines
    path = _write_csv(tmp_path / "chats.csv", ["t1", history, QUESTION, ""],
                      ["t2", json.dumps(CHAT), QUESTION, "Rex"])
    with pytest.raises(DataError, match=r"chats.csv line 2: field 'answer' is missing"):
        _load(path)


def test_an_unclosed_csv_quote_is_reported_at_its_record(tmp_path: Path) -> None:
    path = _write_csv(tmp_path / "chats.csv", ["t1", json.dumps(CHAT), QUESTION, "Rex"])
    with path.open("a", encoding="utf-8", newline="") as handle:
        handle.write('t2,"[{""role"": ""user""}],Q?,Rex\r\n')  # line 3: the quote stays open
        handle.write("t3,x,Q?,Rex\r\n")
    with pytest.raises(DataError) as info:
        _load(path)
    assert str(info.value) == (f"task 'csv': {path} line 3: a quoted cell is never closed: "
                               "add its closing '\"'")


def test_a_csv_cell_of_200k_characters_loads_and_the_limit_is_restored(
    tmp_path: Path,
) -> None:
    long = "word " * 40_000
    history = json.dumps([{"role": "user", "content": long}, CHAT[1]])
    path = _write_csv(tmp_path / "long.csv", ["t1", history, QUESTION, "Rex"])
    limit = csv.field_size_limit()
    (item,) = _load(path)
    assert item.messages[0]["content"] == long
    assert csv.field_size_limit() == limit


# -- import-chats: bad input is one line ----------------------------------------------------
@pytest.mark.parametrize(("calls", "expected"), [
    (5, "messages[1].tool_calls must be a list of calls (got 5)"),
    ([{"function": "lookup"}], "messages[1].tool_calls[0] must be an object whose "
                               "'function' is an object with 'name' and 'arguments'"),
], ids=["tool_calls-a-number", "function-a-string"])
def test_import_chats_with_malformed_tool_calls_is_one_line(
    tmp_path: Path, calls: Any, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    export = fx.write_json(tmp_path / "export.json", [{"id": "a", "messages": [
        CHAT[0], {"role": "assistant", "content": "", "tool_calls": calls}]}])
    questions = fx.write_jsonl(tmp_path / "q.jsonl", [
        {"chat_id": "a", "question": QUESTION, "answer": "Rex"}])
    assert main(["import-chats", str(export), str(questions), "--out",
                 str(tmp_path / "o.jsonl")]) == EXIT_USAGE
    assert f"export.json record 0: {expected}" in _one_error_line(capsys)


def test_import_chats_out_a_directory_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export, questions = write_example(tmp_path)
    assert main(["import-chats", str(export), str(questions), "--out",
                 str(tmp_path)]) == EXIT_USAGE
    assert f"cannot write {tmp_path} (Is a directory): pass --out a file" in \
        _one_error_line(capsys)


# -- not UTF-8: the line, the column and the byte, never a byte offset ----------------------
GOOD_LINE = json.dumps({"history": CHAT, "question": QUESTION, "answer": "Rex"}) + "\n"
BAD_PREFIX = '{"question": "Où est le café'
"""Before the bad byte on its line: two characters of two bytes each, so a column that
counts bytes (or the decoder's offset) would differ from one that counts characters."""
BAD_COLUMN = len(BAD_PREFIX) + 1


def _with_a_latin1_byte(path: Path, lines_before: str, bom: bool = False) -> Path:
    """``lines_before`` then a line whose ``é`` after BAD_PREFIX is Latin-1 (0xe9)."""
    bad = BAD_PREFIX.encode() + b'\xe9?", "answer": "x"}\n'
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + lines_before.encode() + bad)
    return path


def _not_utf8(line: int) -> str:
    return (f"line {line}: byte 0xe9 at column {BAD_COLUMN} (counting characters) is not "
            "UTF-8: save the file as UTF-8")


@pytest.mark.parametrize(("name", "before", "bom", "line"), [
    ("chats.jsonl", GOOD_LINE * 2, False, 3),
    ("chats.jsonl", "", True, 1),  # the byte-order mark is no column
    ("chats.csv", "id,question,answer\nt1,Q?,Rex\n", False, 3),
], ids=["jsonl", "jsonl-bom", "csv"])
def test_a_byte_that_is_not_utf8_names_line_column_and_byte(
    tmp_path: Path, name: str, before: str, bom: bool, line: int
) -> None:
    path = _with_a_latin1_byte(tmp_path / name, before, bom)
    with pytest.raises(DataError) as info:
        _load(path)
    task = path.suffix.lstrip(".")
    assert str(info.value) == f"task '{task}': {path} {_not_utf8(line)}"


def test_import_chats_over_a_file_that_is_not_utf8_is_one_line_naming_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export, _questions = write_example(tmp_path)
    questions = _with_a_latin1_byte(tmp_path / "q.jsonl", GOOD_LINE)
    assert main(["import-chats", str(export), str(questions), "--out",
                 str(tmp_path / "o.jsonl")]) == EXIT_USAGE
    assert _one_error_line(capsys) == (
        f"budgetbench: error: import-chats: {questions} {_not_utf8(2)}")


def test_an_official_file_that_is_not_utf8_names_line_column_and_byte(tmp_path: Path) -> None:
    path = _with_a_latin1_byte(tmp_path / "data.json", "[\n")
    with pytest.raises(DataError) as info:
        read_json("longbench_v2", path, "data.json")
    assert str(info.value) == (
        f"task 'longbench_v2' cannot read {path}: {_not_utf8(2)}; point "
        "--budgetbench-data-longbench_v2=PATH (or BUDGETBENCH_DATA_LONGBENCH_V2) at the "
        "official data.json")


# -- report and diff: no rows is not a report -----------------------------------------------
def _row(item: int, strategy: str = "trunc", status: str = "ok", budget: int = 500,
         quality: float = 1.0) -> dict[str, Any]:
    from pytest_budgetbench.reports.synthetic import make_row

    return make_row(item_id=f"i{item}", strategy=strategy, budget=budget, status=status,
                    quality=quality, reference=strategy == "full_context")


def _run(path: Path, rows: list[dict[str, Any]]) -> Path:
    from pytest_budgetbench.reports.synthetic import write_run

    return write_run(path, rows)


def _report(*args: str) -> int:
    return main(["report", "--no-plots", "--resamples", "200", *args])


@pytest.mark.parametrize(("content", "expected"), [
    (None, "{run} has no cells.jsonl: pass a run directory"),
    ("", "{cells} is empty: the run recorded no cell"),
    ("garbage\n{not json\n", "{cells} holds no JSON object on any line"),
    ('{"name": "a"}\n{"task": "t", "strategy": "s"}\n',
     "{cells} holds 2 JSON objects but no cell row (one with task, item_id, strategy and "
     "budget)"),
], ids=["bare", "empty", "garbage", "foreign-schema"])
def test_report_and_diff_refuse_a_run_with_no_rows(
    tmp_path: Path, content: str | None, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    if content is not None:
        (run / "cells.jsonl").write_text(content)
    message = expected.format(run=run, cells=run / "cells.jsonl")
    assert _report(str(run), "--max-violation-rate", "0.05") == EXIT_USAGE
    assert message in _one_error_line(capsys)
    assert not (run / "report").exists()  # no "0 cells" report is written
    good = _run(tmp_path / "good", [_row(i) for i in range(3)])
    assert main(["diff", str(good), str(run), "--fail-on-regression", "0.05"]) == EXIT_USAGE
    assert message in _one_error_line(capsys)


@pytest.mark.parametrize("kind", ["directory", "symlink-loop"])
def test_report_and_diff_over_an_unreadable_cells_file_are_one_line(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    cells = run / "cells.jsonl"
    if kind == "directory":
        cells.mkdir()
    else:
        os.symlink("cells.jsonl", cells)
    assert _report(str(run)) == EXIT_USAGE
    assert f"cannot read {cells} (" in _one_error_line(capsys)
    good = _run(tmp_path / "good", [_row(i) for i in range(3)])
    assert main(["diff", str(good), str(run)]) == EXIT_USAGE
    assert f"cannot read {cells} (" in _one_error_line(capsys)


def test_the_cli_gates_fail_when_no_row_was_judged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [row for i in range(5) for row in (_row(i, "full_context", budget=2000),
                                              _row(i, status="error"))]
    run = _run(tmp_path / "run", rows)
    assert _report(str(run), "--max-violation-rate", "0.05") == EXIT_GATE_FAILED
    err = capsys.readouterr().err
    assert ("gate failed: trunc@500: no cell was admitted or over budget (5 errored, see "
            "cells.jsonl), so there is no violation rate to judge") in err
    only_reference = _run(tmp_path / "ref", [_row(i, "full_context", budget=2000)
                                             for i in range(5)])
    assert _report(str(only_reference), "--max-violation-rate", "0.05") == EXIT_GATE_FAILED
    assert "no strategy@budget other than a reference has a row" in capsys.readouterr().err
    # So does a retention floor that no strategy@budget of the run falls under.
    assert _report(str(only_reference), "--min-retention", "0.5") == EXIT_GATE_FAILED
    assert ("gate failed: retention-floor gate: no strategy@budget other than a reference "
            "has a row") in capsys.readouterr().err


def test_the_cli_regression_gate_fails_when_nothing_was_compared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = _run(tmp_path / "base", [_row(i) for i in range(5)])
    assert _report(str(base)) == EXIT_OK
    errored = _run(tmp_path / "errored", [_row(i, status="error") for i in range(5)])
    assert _report(str(errored), "--baseline", str(base / "report" / "report.json"),
                   "--max-regression", "0.05") == EXIT_GATE_FAILED
    assert "was admitted or over budget (every one errored" in capsys.readouterr().err


def test_the_diff_gate_fails_when_no_item_is_scored_in_both_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _run(tmp_path / "a", [_row(i) for i in range(5)])
    b = _run(tmp_path / "b", [_row(i, status="error") for i in range(5)])
    assert main(["diff", str(a), str(b), "--resamples", "200"]) == EXIT_OK  # no gate asked
    capsys.readouterr()
    assert main(["diff", str(a), str(b), "--resamples", "200",
                 "--fail-on-regression", "0.1"]) == EXIT_GATE_FAILED
    assert (f"regression: no item is scored in both {a} and {b}"
            in capsys.readouterr().err)


# -- regrade --------------------------------------------------------------------------------
@pytest.mark.parametrize(("content", "expected"), [
    ("", "holds no row (it is empty, or no line is a JSON object): nothing to re-grade"),
    ("garbage\n", "holds no row (it is empty, or no line is a JSON object)"),
    ('{"name": "a"}\n', "row '(no cell_id)' lacks task, item_id, strategy, budget"),
], ids=["empty", "garbage", "foreign-schema"])
def test_regrade_of_a_run_it_cannot_read_is_one_line(
    tmp_path: Path, content: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "cells.jsonl").write_text(content)
    assert main(["regrade", str(run)]) == EXIT_USAGE
    assert f"regrade: {run / 'cells.jsonl'} {expected}" in _one_error_line(capsys)
    assert not (run / "regraded").exists()


@pytest.mark.parametrize("budget", ["big", None, 2048.5])
def test_regrade_of_a_row_whose_budget_is_not_an_integer_is_one_line(
    tmp_path: Path, budget: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.commands.test_regrade import YES_ID, _row

    data = fx.write_json(tmp_path / "hotpot_dev_distractor_v1.json", fx.hotpotqa_records())
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"settings": {
        "tasks": ["hotpotqa"], "data_paths": {"hotpotqa": str(data)}}}))
    rows = [_row("c1", YES_ID, "yes", 1.0), {**_row("c2", YES_ID, "no", 0.0), "budget": budget}]
    (run / "cells.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert main(["regrade", str(run)]) == EXIT_USAGE
    assert (f"regrade: {run / 'cells.jsonl'} row 'c2' has budget {budget!r}, not an integer"
            in _one_error_line(capsys))
    assert not (run / "regraded").exists()
