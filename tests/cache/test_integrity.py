"""Nothing stored is trusted blindly: the response cache, the token counts and the vectors.

Every entry carries a checksum; one that fails it (a flipped byte) or has none (written
before checksums) is a miss, deleted, counted and made again. A file that cannot be used
(garbage, truncated, another program's database) is one CacheError naming it and how to
reset it: before the first cell when the sweep starts, and in each cell's row otherwise.
"""

from __future__ import annotations

import gc
import json
import sqlite3
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.cache.counts import COUNTS_FILE, CountDatabase
from pytest_budgetbench.cache.database import SharedDatabase
from pytest_budgetbench.cache.responses import CACHE_FILE, CachingChatModel, ResponseStore
from pytest_budgetbench.cache.vectors import STORE_FILE, VectorStore
from pytest_budgetbench.errors import BudgetBenchError, CacheError
from pytest_budgetbench.model.chat import ChatModel, Completion
from tests.fake_openai import FakeOpenAI

SPACE = "space/1"
REPLY = Completion("Nugget", 12, 3, 0.25)
VECTOR = b"VECTOR-BYTES" + bytes(52)
COUNT = 0x7A7A7A  # stored as the three bytes b"zzz", which nothing else in the file holds


def _responses(path: Path) -> ResponseStore:
    return ResponseStore(path, run_id="run-a")


MAKERS: dict[str, Callable[[Path], SharedDatabase]] = {
    CACHE_FILE: _responses, COUNTS_FILE: CountDatabase, STORE_FILE: VectorStore}
TABLES = {CACHE_FILE: "responses", COUNTS_FILE: "counts", STORE_FILE: "vectors"}


def put(store: SharedDatabase, key: str) -> None:
    if isinstance(store, ResponseStore):
        store.store(key, REPLY)
    elif isinstance(store, CountDatabase):
        store.save(SPACE, {key: COUNT})
    else:
        assert isinstance(store, VectorStore)
        store.save(SPACE, {key: VECTOR})


def get(store: SharedDatabase, key: str) -> Any:
    """The entry of ``key``, or None (a miss)."""
    if isinstance(store, ResponseStore):
        return store.lookup(key)
    if isinstance(store, CountDatabase):
        return store.lookup(SPACE, key)
    assert isinstance(store, VectorStore)
    return store.load(SPACE, [key]).get(key)


def settle(path: Path) -> None:
    """Close every connection to ``path`` and fold its WAL in, so its bytes are all in it."""
    gc.collect()
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()


def entries(path: Path, name: str) -> int:
    with sqlite3.connect(path) as db:
        (count,) = db.execute(f"SELECT COUNT(*) FROM {TABLES[name]}").fetchone()
    db.close()
    return int(count)


def flip(path: Path, old: bytes, new: bytes) -> None:
    """Change the bytes ``old`` to ``new`` in the file, as a bad disk or a bad copy would."""
    settle(path)
    data = path.read_bytes()
    assert data.count(old) == 1
    path.write_bytes(data.replace(old, new))


# -- a bad entry is a miss -------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "old", "new"),
    [(CACHE_FILE, b"Nugget", b"Nuggeu"), (CACHE_FILE, b"Nugget", b"Nugg\xffe"),
     (COUNTS_FILE, b"zzz", b"zzy"), (STORE_FILE, b"VECTOR-BYTES", b"VECTOR-BYTET")],
    ids=["reply", "reply, no longer UTF-8", "count", "vector"],
)
def test_a_flipped_byte_in_an_entry_is_a_miss_deleted_and_counted(
    tmp_path: Path, name: str, old: bytes, new: bytes
) -> None:
    path = tmp_path / name
    put(MAKERS[name](path), "k")
    flip(path, old, new)

    store = MAKERS[name](path)  # another process, later
    assert get(store, "k") is None
    assert store.rejected_since(0) == {"checksum": 1} and entries(path, name) == 0  # deleted
    put(store, "k")  # made again, and trusted: its checksum holds
    assert get(store, "k") in (replace(REPLY, cached=True), COUNT, VECTOR)


@pytest.mark.parametrize("name", list(MAKERS))
def test_a_checksum_whose_bytes_are_no_longer_text_rejects_its_entry(
    tmp_path: Path, name: str
) -> None:
    path = tmp_path / name
    put(MAKERS[name](path), "k")
    settle(path)
    with sqlite3.connect(path) as db:
        (checksum,) = db.execute(f"SELECT checksum FROM {TABLES[name]}").fetchone()
    db.close()
    flip(path, checksum.encode(), b"\xff" + checksum[1:].encode())
    store = MAKERS[name](path)
    assert get(store, "k") is None and store.rejected_since(0) == {"checksum": 1}
    assert entries(path, name) == 0  # deleted


def test_a_flipped_byte_in_a_stored_reply_is_sent_again_never_served(
    fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    question = [{"role": "user", "content": "Please remember: my dog is called Nugget."},
                {"role": "user", "content": "What is my dog called?"}]
    path = tmp_path / CACHE_FILE

    def chat(run_id: str) -> CachingChatModel:
        model = ChatModel(fake_endpoint.base_url, fake_endpoint.model, attempts=1)
        return CachingChatModel(model, ResponseStore(path, run_id=run_id))

    assert chat("run-a").complete(question, max_tokens=8).text == "Nugget"
    flip(path, b"Nugget", b"Nuggeu")  # the request is stored only as its key's digest
    again = chat("run-b").complete(question, max_tokens=8)
    assert (again.text, again.cached, len(fake_endpoint.requests)) == ("Nugget", False, 2)


OLD_SCHEMAS = {
    CACHE_FILE: ("CREATE TABLE responses (key TEXT PRIMARY KEY, text TEXT NOT NULL, "
                 "prompt_tokens INTEGER, completion_tokens INTEGER, latency_s REAL NOT NULL, "
                 "run_id TEXT NOT NULL, created REAL NOT NULL);"
                 "CREATE TABLE claims (key TEXT PRIMARY KEY, owner TEXT NOT NULL, "
                 "host TEXT NOT NULL, pid INTEGER NOT NULL, since REAL NOT NULL);"
                 "INSERT INTO responses VALUES ('k', 'Nugget', 12, 3, 0.25, 'old', 0);"),
    COUNTS_FILE: ("CREATE TABLE counts (space TEXT NOT NULL, key TEXT NOT NULL, tokens "
                  "INTEGER NOT NULL, PRIMARY KEY (space, key)) WITHOUT ROWID;"
                  f"INSERT INTO counts VALUES ('{SPACE}', 'k', {COUNT});"),
    STORE_FILE: ("CREATE TABLE vectors (space TEXT NOT NULL, key TEXT NOT NULL, vector BLOB "
                 "NOT NULL, PRIMARY KEY (space, key)) WITHOUT ROWID;"
                 f"INSERT INTO vectors VALUES ('{SPACE}', 'k', X'{VECTOR.hex()}');"),
}


@pytest.mark.parametrize("name", list(MAKERS))
def test_a_file_from_before_checksums_is_migrated_and_its_entries_made_again(
    tmp_path: Path, name: str
) -> None:
    path = tmp_path / name
    with sqlite3.connect(path) as db:
        db.executescript(OLD_SCHEMAS[name])
    db.close()
    store = MAKERS[name](path)
    store.check()  # readable: the checksum column is added, nothing else changes
    assert get(store, "k") is None  # unchecked: never trusted
    assert store.rejected_since(0) == {"unchecked": 1} and entries(path, name) == 0
    put(store, "k")
    assert get(store, "k") is not None


# -- a file that cannot be used --------------------------------------------------------
def _garbage(path: Path, name: str) -> None:
    path.write_bytes(b"these are not the bytes of a SQLite database\n" * 200)


def _truncated(path: Path, name: str) -> None:
    store = MAKERS[name](path)
    for index in range(300):
        put(store, f"key-{index:04d}")
    del store
    settle(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _another_programs(path: Path, name: str) -> None:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT)")
    db.close()


def _other_columns(path: Path, name: str) -> None:
    table = TABLES[name]
    with sqlite3.connect(path) as db:
        db.execute(f"CREATE TABLE {table} (key TEXT PRIMARY KEY, value TEXT)")
    db.close()


DAMAGES = {"garbage": _garbage, "truncated": _truncated,
           "another program's database": _another_programs, "other columns": _other_columns}


@pytest.mark.parametrize("damage", list(DAMAGES))
@pytest.mark.parametrize("name", list(MAKERS))
def test_an_unusable_file_is_one_cache_error_naming_it_and_how_to_reset_it(
    tmp_path: Path, name: str, damage: str
) -> None:
    path = tmp_path / name
    DAMAGES[damage](path, name)
    with pytest.raises(CacheError) as checked:
        MAKERS[name](path).check()
    message = str(checked.value)
    assert str(path) in message and "delete it" in message and "\n" not in message
    # Used without the check (a cell's lookup), it is the same error: a row, not a crash.
    with pytest.raises(CacheError, match="delete it"):
        get(MAKERS[name](path), "key-0001")
    assert issubclass(CacheError, BudgetBenchError)  # the runner records it in the row


def test_the_start_up_check_reads_a_few_pages_not_the_whole_file(tmp_path: Path) -> None:
    """A multi-GB response cache is checked at once at every start: the check reads the
    header, the schema and each table's first and last entry. A damaged page inside the
    file is found by the read that reaches it, not by reading every page up front."""
    path = tmp_path / CACHE_FILE
    store = _responses(path)
    for index in range(300):  # a reply of 1000 characters: about three to a page
        store.store(f"key-{index:04d}", replace(REPLY, text=f"{index:04d}" * 250))
    store.close()
    settle(path)
    with sqlite3.connect(path) as db:
        try:
            leaves = [page for (page,) in db.execute(
                "SELECT pageno FROM dbstat WHERE name = 'responses' AND pagetype = 'leaf' "
                "ORDER BY path")]
        except sqlite3.OperationalError as exc:
            pytest.skip(f"this SQLite cannot list a table's pages ({exc})")
        (page_size,) = db.execute("PRAGMA page_size").fetchone()
    db.close()
    assert len(leaves) > 50
    with path.open("r+b") as file:  # zeroes: no longer a page of the table
        file.seek((leaves[len(leaves) // 2] - 1) * page_size)
        file.write(bytes(page_size))

    store = _responses(path)
    store.check()  # never reads the middle of the file
    with pytest.raises(CacheError, match="delete it"):
        for index in range(300):
            store.lookup(f"key-{index:04d}")


# -- whole sweeps ----------------------------------------------------------------------
def sweep_args(fake: FakeOpenAI, tmp: Path, *extra: str) -> list[str]:
    return ["--budgets=4096", "--budgetbench-items=2",
            "--budgetbench-strategies=full_context,truncation",
            f"--budgetbench-endpoint={fake.base_url}", "--budgetbench-tokenizer=approx",
            f"--budgetbench-out={tmp / 'out'}", "--budgetbench-report=off",
            "--budgetbench-cache=on", "-p", "no:cacheprovider", *extra]


def runs_of(tmp: Path) -> set[Path]:
    return set((tmp / "out").glob("*/cells.jsonl"))


def rows_of(tmp: Path, runs: set[Path] | None = None) -> list[dict[str, Any]]:
    """The rows of ``runs`` (every run's when None)."""
    return [json.loads(line) for cells in sorted(runs_of(tmp) if runs is None else runs)
            for line in cells.read_text().splitlines()]


@pytest.mark.parametrize("name", list(MAKERS))
def test_an_unusable_cache_file_stops_the_sweep_before_any_cell_with_one_line(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path, name: str
) -> None:
    path = tmp_path / "out" / name
    path.parent.mkdir()
    _garbage(path, name)
    result = pytester.runpytest(*sweep_args(fake_endpoint, tmp_path))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    (line,) = [line for line in result.stderr.lines if str(path) in line]
    assert "file is not a database" in line and "delete it" in line
    assert rows_of(tmp_path) == [] and fake_endpoint.requests == []


def test_a_cache_file_that_breaks_after_the_start_gives_every_cell_an_error_row(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    path = tmp_path / "out" / CACHE_FILE
    pytester.makeconftest(f"""
        import pytest

        @pytest.hookimpl(tryfirst=True)
        def pytest_runtestloop(session):
            open({str(path)!r}, "wb").write(b"not a database any more" * 100)
    """)
    result = pytester.runpytest(*sweep_args(fake_endpoint, tmp_path))
    rows = rows_of(tmp_path)
    assert len(rows) == 4 and len({row["cell_id"] for row in rows}) == 4  # one row a cell
    for row in rows:
        if row["status"] != "violation":
            assert row["status"] == "error" and str(path) in row["error"], row
            assert "delete it" in row["error"]
    assert result.ret == pytest.ExitCode.TESTS_FAILED and fake_endpoint.requests == []


def test_a_sweep_never_grades_a_corrupted_stored_reply_and_its_summary_counts_it(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    pytester.runpytest(*sweep_args(fake_endpoint, tmp_path))
    first_run = runs_of(tmp_path)
    first = {row["cell_id"]: row["prediction"] for row in rows_of(tmp_path)}
    path = tmp_path / "out" / CACHE_FILE
    settle(path)
    with sqlite3.connect(path) as db:
        replies = [text for (text,) in db.execute("SELECT text FROM responses")]
    db.close()
    target = max(replies, key=len)  # the bytes of one reply, as stored
    data = path.read_bytes()
    assert data.count(target.encode()) == replies.count(target)
    path.write_bytes(data.replace(target.encode(), target[:-1].encode() + b"#"))

    sent = len(fake_endpoint.requests)
    result = pytester.runpytest(*sweep_args(fake_endpoint, tmp_path))
    second = rows_of(tmp_path, runs_of(tmp_path) - first_run)
    assert {row["cell_id"]: row["prediction"] for row in second} == first  # never the bad bytes
    resent = [row for row in second if row["status"] == "ok" and not row["cached"]]
    assert len(resent) == replies.count(target) == len(fake_endpoint.requests) - sent > 0
    result.stdout.fnmatch_lines([f"*response cache {path}: {len(resent)} entr* failed its "
                                 "checksum; each was treated as a miss and made again*"])
