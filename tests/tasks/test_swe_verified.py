"""SWE-bench Verified: diff parsing, the patch proxy grader, predictions export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_budgetbench.errors import DataError
from pytest_budgetbench.sweep.cells import Cell
from pytest_budgetbench.tasks import Item, TaskOptions
from pytest_budgetbench.tasks._fixtures import GOLD_PATCH, swe_verified_records, write_jsonl
from pytest_budgetbench.tasks.swe_verified import (
    SWEVerifiedTask,
    extract_diff,
    parse_diff,
    proxy_score,
    strip_prefix,
)

REAL = Path(__file__).resolve().parents[3] / "shared" / "data" / "swebench_verified" / (
    "swebench_verified_dev50.jsonl"
)
UTIL_ONLY = "\n".join([
    "--- a/src/pkg/util.py",
    "+++ b/src/pkg/util.py",
    "@@ -1,2 +1,2 @@",
    " def add(a, b):",
    "-    return a - b",
    "+    return a + b",
]) + "\n"


def _task(path: Path | None, chunk_tokens: int = 512) -> SWEVerifiedTask:
    return SWEVerifiedTask(TaskOptions(data_path=path, chunk_tokens=chunk_tokens))


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "swebench_verified.jsonl", swe_verified_records())


@pytest.fixture
def item(data_file: Path) -> Item:
    return _task(data_file).load()[0]


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        ("b/build/helpers.py", "build/helpers.py"),  # lstrip("b/") would eat "b" of build
        ("a/a/b.py", "a/b.py"),
        ("b/bar.py", "bar.py"),
        ("src/x.py", "src/x.py"),
        ("b/x.py\t2024-01-01 10:00:00", "x.py"),
        ("/dev/null", "/dev/null"),
    ],
)
def test_strip_prefix_removes_a_prefix_not_characters(raw: str, path: str) -> None:
    assert strip_prefix(raw) == path


def test_parse_diff() -> None:
    files = parse_diff(GOLD_PATCH)
    assert set(files) == {"src/pkg/util.py", "build/helpers.py"}
    assert sorted(files["build/helpers.py"].lines.elements()) == [
        "+y = 3", "+z = 4", "-y = 2"]
    deleted = parse_diff("--- a/old.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-gone\n")
    assert set(deleted) == {"old.py"}
    # A removed line whose text starts with "-- " is a hunk line, not a header.
    tricky = parse_diff("--- a/x.sql\n+++ b/x.sql\n@@ -1,2 +1,1 @@\n--- a comment\n keep\n")
    assert list(tricky["x.sql"].lines.elements()) == ["--- a comment"]  # sign + text


def test_proxy_score() -> None:
    assert proxy_score(GOLD_PATCH, GOLD_PATCH)[0] == pytest.approx(1.0)
    # One of two files, its lines exactly: 0.4 x 1/2 + 0.6 x 1.
    score, detail = proxy_score(UTIL_ONLY, GOLD_PATCH)
    assert score == pytest.approx(0.8)
    assert detail["file_recall"] == 0.5 and detail["line_overlap_f1"] == 1.0
    wrong_lines = UTIL_ONLY.replace("return a + b", "return b + a")
    assert proxy_score(wrong_lines, GOLD_PATCH)[0] == pytest.approx(0.2 + 0.6 * 0.5)
    elsewhere = UTIL_ONLY.replace("src/pkg/util.py", "src/pkg/other.py")
    assert proxy_score(elsewhere, GOLD_PATCH)[0] == 0.0


def test_extract_diff_from_replies() -> None:
    fenced = f"Here is the fix:\n```diff\n{UTIL_ONLY}```\nThis swaps the operator."
    assert parse_diff(extract_diff(fenced)).keys() == {"src/pkg/util.py"}
    # SWE-bench's extract_diff: without a fenced or tagged block, the whole reply.
    inline = f"Sure.\n{UTIL_ONLY}"
    assert extract_diff(inline) == inline
    assert parse_diff(extract_diff(inline)).keys() == {"src/pkg/util.py"}
    prose = "The bug is in add(); change - to +.</s>ignored"
    assert extract_diff(prose) == "The bug is in add(); change - to +."
    two = f"```python\nx = 1\n```\n<patch>{UTIL_ONLY}</patch>"
    assert extract_diff(two) == UTIL_ONLY  # a diff or patch block wins over others
    assert extract_diff("") == extract_diff(None) == ""


def test_grade(data_file: Path, item: Item) -> None:
    task = _task(data_file)
    assert item.category == "pkg/pkg"
    assert item.meta["gold_files"] == ["build/helpers.py", "src/pkg/util.py"]
    assert task.grade(item, f"```diff\n{GOLD_PATCH}```").quality == pytest.approx(1.0)
    assert task.grade(item, UTIL_ONLY).quality == pytest.approx(0.8)
    for bad in ("", "I don't know", "Connection refused", "**Fix add()**"):
        grade = task.grade(item, bad)
        assert grade.quality == 0.0 and grade.extracted == ""
    assert task.grade(item, "").grader == "swe-verified-patch-proxy/2"


def test_loader_messages(data_file: Path) -> None:
    item = _task(data_file, chunk_tokens=64).load()[0]
    system, *history, request = item.messages
    assert system["role"] == "system" and len(history) > 2
    assert all(str(m["content"]).startswith("Repository: pkg/pkg at commit 0123") for m in history)
    assert "unified diff" in request["content"]


def test_export_is_swebench_predictions(data_file: Path, item: Item) -> None:
    task = _task(data_file)
    name, record = task.export(item, f"Fix:\n```diff\n{UTIL_ONLY}```",
                               Cell("swe_verified", 0, item.item_id, "truncation", 8192).cell_id)
    assert name == "swe_verified_predictions.truncation-8192.jsonl"
    assert record == {"instance_id": "pkg__pkg-1234",
                      "model_name_or_path": "budgetbench__truncation-8192",
                      "model_patch": UTIL_ONLY}
    json.dumps(record)


def test_data_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError) as exc:
        _task(tmp_path).load()
    assert "task 'swe_verified' needs" in str(exc.value) and "\n" not in str(exc.value)
    rows = swe_verified_records()
    del rows[0]["patch"]
    bad = write_jsonl(tmp_path / "x.jsonl", rows)
    with pytest.raises(DataError) as exc:
        _task(bad).load()
    assert "pkg__pkg-1234" in str(exc.value) and "patch" in str(exc.value)
    bad.write_text('{"instance_id": 1}\nnot json\n', encoding="utf-8")
    with pytest.raises(DataError, match="line 2 is not valid JSON"):
        _task(bad).load()


@pytest.mark.skipif(not REAL.is_file(), reason="shared SWE-bench Verified data not present")
def test_real_file() -> None:
    task = _task(REAL)
    items = task.load()
    assert len(items) == 50
    assert "django/django" in {i.category for i in items}
    for item in items:
        assert item.meta["gold_files"], item.item_id
        assert task.grade(item, str(item.answer)).quality == pytest.approx(1.0), item.item_id
