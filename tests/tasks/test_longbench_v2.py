"""LongBench v2: loader on the official schema, official extraction, DataErrors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_budgetbench.errors import DataError
from pytest_budgetbench.tasks import TaskOptions
from pytest_budgetbench.tasks._fixtures import longbench_v2_records, write_json
from pytest_budgetbench.tasks.longbench_v2 import (
    LongBenchV2Task,
    extract_answer,
    extract_answer_guarded,
)

REAL = Path(__file__).resolve().parents[3] / "shared" / "data" / "longbench_v2" / (
    "longbench_v2_dev12.json"
)


def _task(path: Path | None, chunk_tokens: int = 64) -> LongBenchV2Task:
    return LongBenchV2Task(TaskOptions(data_path=path, chunk_tokens=chunk_tokens))


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    return write_json(tmp_path / "data.json", longbench_v2_records())


def test_loads_official_schema_into_chunked_messages(data_file: Path) -> None:
    items = _task(data_file).load()
    assert [i.item_id for i in items] == ["fixture-lb2-0", "fixture-lb2-1", "fixture-lb2-2"]
    assert [i.category for i in items] == ["easy", "hard", "hard"]
    item = items[0]
    assert item.meta["length"] == "short" and item.meta["domain"] == "Single-Document QA"
    system, *history, question = item.messages
    assert system["role"] == "system" and "read the following text" in system["content"]
    assert len(history) > 3, "the document must become several messages"
    assert str(history[0]["content"]).startswith("<text>\n")
    assert str(history[-1]["content"]).endswith("\n</text>")
    record = longbench_v2_records()[0]
    assert "".join(str(m["content"]) for m in history) == f"<text>\n{record['context']}\n</text>"
    assert question["role"] == "user"
    assert "(B) 4100" in question["content"]
    assert 'The correct answer is (insert answer here)' in question["content"]


def test_a_directory_holding_data_json_is_accepted(data_file: Path) -> None:
    assert len(_task(data_file.parent).load()) == 3


@pytest.mark.parametrize(
    ("reply", "letter"),
    [
        ("", None),
        (None, None),
        ("I don't know", None),
        ("B", None),  # no official phrase: no answer
        ("Because the text says so, B.", None),
        ("The correct answer is Because of the vault", "B"),  # upstream reads a word's letter
        ("The correct answer is (B)", "B"),
        ("**The correct answer is (B)**", "B"),
        ("The correct answer is **B**.", "B"),
        ("The correct answer is D", "D"),
        ("Because A is wrong and B is weak... The correct answer is (C)", "C"),
        ("The correct answer is (E)", None),
        ("the correct answer is (b)", None),  # the official regex is case-sensitive
        ("The correct answer is A. Wait, The correct answer is (C)", "C"),  # (X) form first
    ],
)
def test_official_extraction(reply: str | None, letter: str | None) -> None:
    assert extract_answer(reply) == letter


@pytest.mark.parametrize(
    ("reply", "letter"),
    [
        ("The correct answer is (B)", "B"),
        ("The correct answer is D", "D"),
        ("The correct answer is Because of the vault", None),
        ("The correct answer is Because ... so The correct answer is D", None),
        ("The correct answer is (A) or The correct answer is (C)", None),  # a hedge
        ("The correct answer is (C). Indeed, The correct answer is C", "C"),
        ("no phrase at all", None),
    ],
)
def test_word_guard_variant_is_never_more_lenient(reply: str, letter: str | None) -> None:
    assert extract_answer_guarded(reply) == letter
    assert letter is None or extract_answer(reply) == letter


def test_grades(data_file: Path) -> None:
    task = _task(data_file)
    item = task.load()[0]
    assert task.grade(item, "The correct answer is (B)").quality == 1.0
    assert task.grade(item, "The correct answer is (A)").quality == 0.0
    empty = task.grade(item, "")
    assert empty.quality == 0.0 and empty.extracted == ""
    assert task.grade(item, "Connection refused").quality == 0.0
    assert task.grade(item, "Because B is right").quality == 0.0
    assert task.grade(item, "The correct answer is Because").quality == 1.0  # as upstream
    assert empty.grader == "longbench-v2-official-extract/2" == task.grader_version
    guarded = LongBenchV2Task(TaskOptions(data_path=data_file, extra={
        "grader_variants": {"longbench_v2": "word-guard"}}))
    grade = guarded.grade(item, "The correct answer is Because")
    assert grade.quality == 0.0
    assert grade.grader == "longbench-v2-official-extract/2+word-guard"


def _one_line(exc: pytest.ExceptionInfo[DataError]) -> str:
    message = str(exc.value)
    assert "\n" not in message
    assert "longbench_v2" in message
    return message


def test_missing_file_is_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(DataError) as exc:
        _task(tmp_path / "nope.json").load()
    message = _one_line(exc)
    assert "data.json" in message and "--budgetbench-data-longbench_v2=PATH" in message
    assert "nope.json" in message
    with pytest.raises(DataError) as exc:
        _task(None).load()
    assert "--budgetbench-data-longbench_v2" in _one_line(exc)


def test_malformed_files_name_the_file_and_record(tmp_path: Path) -> None:
    bad = tmp_path / "data.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(DataError) as exc:
        _task(bad).load()
    assert "invalid JSON" in _one_line(exc) and str(bad) in str(exc.value)

    records = longbench_v2_records()
    del records[1]["choice_C"]
    write_json(bad, records)
    with pytest.raises(DataError) as exc:
        _task(bad).load()
    message = _one_line(exc)
    assert "record 1" in message and "choice_C" in message and "fixture-lb2-1" in message

    records = longbench_v2_records()
    records[0]["answer"] = "E"
    bad.write_text(json.dumps(records), encoding="utf-8")
    with pytest.raises(DataError) as exc:
        _task(bad).load()
    assert "not one of A-D" in _one_line(exc)

    write_json(bad, {"not": "a list"})
    with pytest.raises(DataError):
        _task(bad).load()


@pytest.mark.skipif(not REAL.is_file(), reason="shared LongBench v2 data not present")
def test_real_file() -> None:
    task = _task(REAL, chunk_tokens=512)
    items = task.load()
    assert len(items) == 12
    assert {i.category for i in items} <= {"easy", "hard"}
    for item in items:
        assert len(item.messages) > 10
        assert item.meta["domain"] and item.meta["length"] == "short"
        assert task.grade(item, f"The correct answer is ({item.answer})").quality == 1.0
