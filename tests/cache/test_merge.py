"""Caches that travel: `budgetbench cache merge` and the keys that make merged caches answer.

A sweep whose caches were merged from another machine sends no request; a merge is a union
of checked entries, a bad entry is left out, a conflicting one is reported (never picked
silently), and merging twice changes nothing. The token-count and vector spaces are named
by the model files' content, so a merged cache answers in another directory too.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.cache.counts import COUNTS_FILE, CountDatabase
from pytest_budgetbench.cache.database import SharedDatabase
from pytest_budgetbench.cache.responses import CACHE_FILE, ResponseStore
from pytest_budgetbench.cache.vectors import STORE_FILE, VectorStore
from pytest_budgetbench.commands.cli import EXIT_GATE_FAILED, EXIT_OK, EXIT_USAGE, main
from pytest_budgetbench.model import digests
from pytest_budgetbench.model.chat import Completion
from tests.fake_openai import FakeOpenAI
from tests.fake_servers import CountsWith
from tests.faults import make_read_only, read_only_prefix

SPACE = "space/1"


@pytest.fixture(autouse=True)
def private_digest_memos(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Digest memos go to a fresh user cache, as on a new machine."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    monkeypatch.setattr(digests, "_MEMO", {})


def responses(location: Path, run_id: str = "run-a") -> ResponseStore:
    return ResponseStore(location / CACHE_FILE, run_id=run_id)


def reply(text: str, latency_s: float = 0.25) -> Completion:
    return Completion(text, 12, 3, latency_s)


def merge(capsys: pytest.CaptureFixture[str], *args: Path | str) -> tuple[int, str, str]:
    code = main(["cache", "merge", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def closed(*stores: SharedDatabase) -> None:
    for store in stores:
        store.close()


# -- the done-when: a sweep on merged caches sends nothing ----------------------------------
def sweep_args(fake: FakeOpenAI, out: Path) -> list[str]:
    return ["--budgets=1024,4096", "--budgetbench-items=2",
            "--budgetbench-strategies=full_context,truncation",
            f"--budgetbench-endpoint={fake.base_url}", "--budgetbench-tokenizer=approx",
            f"--budgetbench-out={out}", "--budgetbench-report=off", "--budgetbench-cache=on",
            "-p", "no:cacheprovider"]


def rows_in(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for cells in sorted(out.glob("*/cells.jsonl"))
            for line in cells.read_text().splitlines()]


def test_a_sweep_on_caches_merged_from_another_machine_sends_no_request(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    first = tmp_path / "machine-a" / "runs"
    pytester.runpytest(*sweep_args(fake_endpoint, first)).assert_outcomes(passed=6, xfailed=2)
    sent = len(fake_endpoint.requests)
    assert sent > 0

    # Machine A exports its caches (as CI saves them); machine B restores the export and
    # merges it into its own, empty, --budgetbench-out directory.
    exported = tmp_path / "exported"
    assert merge(capsys, first, "--into", exported)[0] == EXIT_OK
    assert not list(exported.glob("*-wal"))  # the files alone hold every entry
    second = tmp_path / "machine-b" / "elsewhere" / "runs"
    code, out, _ = merge(capsys, exported, "--into", second)
    assert code == EXIT_OK and f"-> {second / CACHE_FILE}: {sent} added" in out

    pytester.runpytest(*sweep_args(fake_endpoint, second)).assert_outcomes(passed=6, xfailed=2)
    assert len(fake_endpoint.requests) == sent  # not one request more
    rows = rows_in(second)
    assert len(rows) == 8 and all(row["cached"] for row in rows if row["status"] == "ok")
    assert {r["cell_id"]: r["prediction"] for r in rows} == {
        r["cell_id"]: r["prediction"] for r in rows_in(first)}


def test_counts_merged_from_another_copy_of_the_gguf_are_read_and_nothing_is_counted_again(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Machine B's GGUF lies elsewhere and was written later: the counts still travel."""
    from pytest_budgetbench.embedded_server.models import embedded_gguf_path
    from tests.strategy_helpers import load_gguf

    # The fake counts prompts as the GGUF does (else its chars/4 would say they were cut).
    fake_endpoint.server = CountsWith(load_gguf())  # skips where llama.cpp is missing
    original = embedded_gguf_path("smollm2")

    def sweep(gguf: Path, out: Path) -> None:
        args = [*sweep_args(fake_endpoint, out), f"--budgetbench-tokenizer=gguf:{gguf}"]
        pytester.runpytest_subprocess(*args).assert_outcomes(passed=6, xfailed=2)

    first = tmp_path / "a" / "runs"
    sweep(original, first)
    kept = CountDatabase(first / COUNTS_FILE).count()
    assert kept > 0
    copy = tmp_path / "b" / "models" / original.name
    copy.parent.mkdir(parents=True)
    shutil.copyfile(original, copy)
    os.utime(copy, ns=(1, 1))  # another modification time, as a fresh download has
    second = tmp_path / "b" / "runs"
    assert merge(capsys, first, "--into", second)[0] == EXIT_OK

    sweep(copy, second)
    assert CountDatabase(second / COUNTS_FILE).count() == kept  # counted nothing new


# -- the merge itself ------------------------------------------------------------------------
def test_a_merge_is_the_union_of_every_kind_of_entry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b, into = tmp_path / "a", tmp_path / "b", tmp_path / "into"
    for location, name in ((a, "one"), (b, "two")):
        stores = (responses(location), CountDatabase(location / COUNTS_FILE),
                  VectorStore(location / STORE_FILE))
        stores[0].store(name, reply(name))
        stores[1].save(SPACE, {name: len(name)})
        stores[2].save(SPACE, {name: name.encode() * 4})
        closed(*stores)

    code, out, err = merge(capsys, a, b, "--into", into)
    assert (code, err) == (EXIT_OK, "")
    assert out.count("1 added, 0 already there") == 6
    store = responses(into)
    assert [store.lookup(k).text for k in ("one", "two")] == ["one", "two"]  # type: ignore[union-attr]
    assert [CountDatabase(into / COUNTS_FILE).lookup(SPACE, k) for k in ("one", "two")] == [3, 3]
    assert VectorStore(into / STORE_FILE).load(SPACE, ["one", "two"]) == {
        "one": b"one" * 4, "two": b"two" * 4}


def test_merging_twice_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source, into = tmp_path / "a", tmp_path / "into"
    store = responses(source)
    for index in range(3):
        store.store(f"key-{index}", reply(f"reply {index}"))
    closed(store)
    assert merge(capsys, source, "--into", into)[0] == EXIT_OK
    before = dump(into / CACHE_FILE)

    code, out, err = merge(capsys, source, "--into", into)
    assert (code, err) == (EXIT_OK, "") and "0 added, 3 already there" in out
    assert dump(into / CACHE_FILE) == before


def dump(path: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as db:
        rows = sorted(db.execute("SELECT * FROM responses"))
    db.close()
    return rows


def test_the_same_reply_made_at_another_speed_is_no_conflict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two shards that both sent a request hold one reply with two latencies."""
    a, b = tmp_path / "a", tmp_path / "b"
    closed(*(_with(responses(a), "key", reply("Nugget", 0.25)),
             _with(responses(b, "run-b"), "key", reply("Nugget", 1.5))))
    code, out, err = merge(capsys, b, "--into", a)
    assert (code, err) == (EXIT_OK, "") and "0 added, 1 already there" in out
    assert responses(a).lookup("key").latency_s == 0.25  # type: ignore[union-attr]


def _with(store: ResponseStore, key: str, completion: Completion) -> ResponseStore:
    store.store(key, completion)
    return store


def test_a_conflicting_reply_is_reported_by_key_and_both_files_and_the_destinations_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    key = "3fa2c1d9e0b7a6f5" + "0" * 48
    closed(_with(responses(a, "run-a"), key, reply("Nugget")),
           _with(responses(b, "run-b"), key, reply("Biscuit")),
           _with(responses(b, "run-b"), "other", reply("new")))
    code, out, err = merge(capsys, b, "--into", a)
    assert code == EXIT_GATE_FAILED and "1 added, 0 already there, 1 in conflict" in out
    (line, verdict) = err.splitlines()
    assert line.startswith("budgetbench: conflict: response cache entry 3fa2c1d9e0b7a6f5...")
    assert f"{b / CACHE_FILE} (run run-b)" in line and f"{a / CACHE_FILE} (run run-a)" in line
    assert "--allow-conflicts" in verdict
    assert responses(a).lookup(key).text == "Nugget"  # type: ignore[union-attr]
    assert responses(a).lookup("other") is not None  # the rest is merged

    code, _, err = merge(capsys, b, "--into", a, "--allow-conflicts")
    assert code == EXIT_OK and "conflict: response cache entry 3fa2c1d9e0b7a6f5" in err


def test_conflicting_counts_are_reported_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    CountDatabase(a / COUNTS_FILE).save(SPACE, {"text:abc": 7})
    CountDatabase(b / COUNTS_FILE).save(SPACE, {"text:abc": 8})
    code, _, err = merge(capsys, b, "--into", a)
    assert code == EXIT_GATE_FAILED
    assert f"token-count cache entry {SPACE}/text:abc: {b / COUNTS_FILE} holds another count" in err
    assert CountDatabase(a / COUNTS_FILE).lookup(SPACE, "text:abc") == 7


def test_vectors_that_differ_in_their_last_bits_are_the_same_vector(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from array import array

    a, b = tmp_path / "a", tmp_path / "b"
    VectorStore(a / STORE_FILE).save(SPACE, {"k": array("f", [0.6, 0.8]).tobytes(),
                                             "far": array("f", [0.6, 0.8]).tobytes()})
    VectorStore(b / STORE_FILE).save(SPACE, {"k": array("f", [0.6000001, 0.8]).tobytes(),
                                             "far": array("f", [0.8, 0.6]).tobytes()})
    code, out, err = merge(capsys, b, "--into", a)
    assert code == EXIT_GATE_FAILED and "1 already there, 1 in conflict" in out
    assert f"{SPACE}/far" in err and f"{SPACE}/k:" not in err


@pytest.mark.parametrize(("damage", "shown"), [
    ("SET text = 'Biscuiu'", "bad"),
    ("SET key = CAST(X'626164ff' AS TEXT)", "bad\ufffd"),  # no longer UTF-8
], ids=["reply", "key"])
def test_a_corrupted_entry_is_reported_and_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str, shown: str
) -> None:
    source, into = tmp_path / "a", tmp_path / "into"
    store = responses(source)
    store.store("good", reply("Nugget"))
    store.store("bad", reply("Biscuit"))
    closed(store)
    with sqlite3.connect(source / CACHE_FILE) as db:  # a flipped byte, as a bad copy makes
        db.execute(f"UPDATE responses {damage} WHERE key = 'bad'")
    db.close()

    code, out, err = merge(capsys, source, "--into", into)
    assert code == EXIT_OK and "1 added, 0 already there, 1 failed their checksum" in out
    assert f"warning: response cache {source / CACHE_FILE}: entry {shown}: failed its " \
        "checksum; not merged" in err
    assert responses(into).lookup("bad") is None
    assert responses(into).lookup("good") is not None
    with sqlite3.connect(into / CACHE_FILE) as db:
        assert db.execute("SELECT COUNT(*) FROM responses").fetchone() == (1,)
    db.close()


def test_a_damaged_entry_of_the_destination_is_replaced_by_the_sources(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, into = tmp_path / "a", tmp_path / "into"
    closed(_with(responses(source), "key", reply("Nugget")),
           _with(responses(into), "key", reply("Nugget")))
    with sqlite3.connect(into / CACHE_FILE) as db:
        db.execute("UPDATE responses SET text = 'Nuggeu'")
    db.close()
    code, out, _ = merge(capsys, source, "--into", into)
    assert code == EXIT_OK and "1 damaged replaced" in out
    assert responses(into).lookup("key").text == "Nugget"  # type: ignore[union-attr]


def test_claims_in_flight_stay_behind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A claim copied to another machine would hold its request there for an hour."""
    source, into = tmp_path / "a", tmp_path / "into"
    store = responses(source)
    store.store("done", reply("Nugget"))
    assert store.claim("in-flight")
    closed(store)
    assert merge(capsys, source, "--into", into)[0] == EXIT_OK
    with sqlite3.connect(into / CACHE_FILE) as db:
        assert db.execute("SELECT COUNT(*) FROM claims").fetchone() == (0,)
    db.close()


def test_a_cache_path_file_takes_its_neighbours(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    named = tmp_path / "a" / "bb.sqlite"
    closed(_with(ResponseStore(named, run_id="r"), "key", reply("Nugget")))
    CountDatabase(named.with_name(COUNTS_FILE)).save(SPACE, {"k": 1})
    code, out, _ = merge(capsys, named, "--into", tmp_path / "into" / "other.sqlite")
    assert code == EXIT_OK and out.count("1 added") == 2
    assert CountDatabase(tmp_path / "into" / COUNTS_FILE).lookup(SPACE, "k") == 1


@pytest.mark.parametrize("problem", ["missing", "garbage", "itself"])
def test_bad_locations_are_one_line_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], problem: str
) -> None:
    source, into = tmp_path / "a", tmp_path / "into"
    if problem == "garbage":
        source.mkdir()
        (source / CACHE_FILE).write_bytes(b"not a database\n" * 200)
    elif problem == "itself":
        closed(_with(responses(source), "key", reply("Nugget")))
        into = source
    code, out, err = merge(capsys, source, "--into", into)
    assert code == EXIT_USAGE and out == "" and len(err.splitlines()) == 1
    expected = {"missing": f"{source} holds no cache (responses.sqlite, counts.sqlite",
                "garbage": "file is not a database",
                "itself": "is both a source and the destination"}[problem]
    assert expected in err and "delete it" not in err  # a source is only read: never deleted
    assert problem == "itself" or not into.exists()


# -- a source is only read -------------------------------------------------------------------
def three_caches(location: Path) -> None:
    stores = (responses(location), CountDatabase(location / COUNTS_FILE),
              VectorStore(location / STORE_FILE))
    stores[0].store("key", reply("Nugget"))
    stores[1].save(SPACE, {"key": 3})
    stores[2].save(SPACE, {"key": b"vector" * 4})
    closed(*stores)


def digests_of(location: Path) -> dict[str, str]:
    """Every file of ``location`` by name, as its sha256: a file made beside the caches
    (a -wal, a -shm) shows too."""
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(location.iterdir())}


UNWRITABLE = "import sys\ntry:\n    open(sys.argv[1], 'r+b')\nexcept PermissionError:\n" \
    "    sys.exit(0)\nsys.exit(1)"
"""Exits 0 when the file it is given cannot be opened for writing."""


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[tuple[Path, list[str]]]:
    """A cache location made read-only as `chmod -R a-w` does, and the prefix of a command
    for which it is: root ignores permission bits, so as root the command runs without the
    capabilities that override them (util-linux's setpriv drops them)."""
    location = tmp_path / "read-only"
    three_caches(location)
    if not hasattr(os, "geteuid"):
        pytest.skip("permission bits make no file read-only on this platform")
    prefix = read_only_prefix()
    if prefix and shutil.which(prefix[0]) is None:
        pytest.skip("running as root without setpriv: no file can be made unwritable")
    make_read_only(location)
    try:
        probe = subprocess.run([*prefix, sys.executable, "-c", UNWRITABLE,
                                str(location / CACHE_FILE)], capture_output=True, text=True)
        if probe.returncode != 0:
            pytest.skip(f"cannot make a file unwritable here ({' '.join(prefix) or 'chmod'}: "
                        f"{probe.stderr.strip() or 'still writable'})")
        yield location, prefix
    finally:
        location.chmod(0o755)  # so that pytest can remove tmp_path


def test_a_read_only_source_is_merged_and_left_byte_for_byte_as_it_was(
    tmp_path: Path, read_only: tuple[Path, list[str]]
) -> None:
    """A cache on a read-only volume or owned by another user (`chmod -R a-w`) is merged."""
    source, prefix = read_only
    into = tmp_path / "into"
    before = digests_of(source)
    merged = subprocess.run(
        [*prefix, sys.executable, "-m", "pytest_budgetbench.commands.cli", "cache", "merge",
         str(source), "--into", str(into)], capture_output=True, text=True)
    assert (merged.returncode, merged.stderr) == (EXIT_OK, "")
    assert merged.stdout.count("1 added, 0 already there") == 3
    assert digests_of(source) == before
    assert responses(into).lookup("key").text == "Nugget"  # type: ignore[union-attr]
    assert CountDatabase(into / COUNTS_FILE).lookup(SPACE, "key") == 3
    assert VectorStore(into / STORE_FILE).load(SPACE, ["key"]) == {"key": b"vector" * 4}


def test_a_read_only_destination_is_one_line_that_says_what_to_pass_the_command(
    tmp_path: Path, read_only: tuple[Path, list[str]]
) -> None:
    """The merge runs no sweep: its way out is another --into, not a pytest flag, and never
    deleting a cache that may be another user's."""
    into, prefix = read_only
    source = tmp_path / "source"
    responses(source).store("other", reply("Biscuit"))
    merged = subprocess.run(
        [*prefix, sys.executable, "-m", "pytest_budgetbench.commands.cli", "cache", "merge",
         str(source), "--into", str(into)], capture_output=True, text=True)
    assert merged.returncode == EXIT_USAGE, merged.stderr
    (line,) = merged.stderr.splitlines()
    assert line.startswith(f"budgetbench: error: the response cache {into / CACHE_FILE} cannot "
                           "be merged into: ")
    assert line.endswith("pass budgetbench cache merge --into a folder you can write (a new "
                         "one is made), or make this one writable")
    assert "--budgetbench-" not in line and "delete" not in line


def test_a_writable_source_is_only_read_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing is made beside it (SQLite's mode=ro leaves a -wal and a -shm behind)."""
    source = tmp_path / "a"
    three_caches(source)
    before = digests_of(source)
    assert merge(capsys, source, "--into", tmp_path / "into")[0] == EXIT_OK
    assert digests_of(source) == before


def test_a_source_still_being_written_is_read_with_its_wal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run still holding the file keeps its newest entries in the -wal beside it."""
    source = tmp_path / "a"
    live = responses(source)
    live.store("key", reply("Nugget"))
    assert (source / f"{CACHE_FILE}-wal").stat().st_size > 0
    code, out, _ = merge(capsys, source, "--into", tmp_path / "into")
    assert code == EXIT_OK and "1 added" in out
    assert responses(tmp_path / "into").lookup("key").text == "Nugget"  # type: ignore[union-attr]
    closed(live)


# -- keys that travel ------------------------------------------------------------------------
def test_a_files_digest_is_its_content_wherever_it_lies_and_is_remembered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here, there = tmp_path / "here.gguf", tmp_path / "elsewhere" / "there.gguf"
    there.parent.mkdir()
    here.write_bytes(b"weights" * 1000)
    there.write_bytes(b"weights" * 1000)
    os.utime(there, ns=(1, 1))
    assert digests.file_digest(here) == digests.file_digest(there)

    monkeypatch.setattr(digests, "_MEMO", {})  # a new process on this machine
    monkeypatch.setattr(digests, "file_sha256", _never_read)
    assert digests.file_digest(here) == digests.file_digest(there)  # from the memo

    monkeypatch.undo()
    there.write_bytes(b"weightz" * 1000)  # changed in place: read again
    assert digests.file_digest(here) != digests.file_digest(there)


def _never_read(path: Path) -> str:
    raise AssertionError(f"{path} was read again")


def test_the_vector_space_is_the_models_content_not_its_directory(tmp_path: Path) -> None:
    from pytest_budgetbench.embeddings import SentenceTransformerEmbedder

    def model_at(parent: str, weights: bytes) -> str:
        root = tmp_path / parent / "my-model"
        (root / "1_Pooling").mkdir(parents=True)
        (root / "model.safetensors").write_bytes(weights)
        (root / "1_Pooling" / "config.json").write_text("{}")
        return str(root)

    here = SentenceTransformerEmbedder(model_at("a", b"w" * 64)).space
    there = SentenceTransformerEmbedder(model_at("b", b"w" * 64)).space
    other = SentenceTransformerEmbedder(model_at("c", b"v" * 64)).space
    assert here == there != other
