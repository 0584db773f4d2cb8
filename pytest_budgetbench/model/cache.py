"""The response cache: identical model requests are answered once.

A request is addressed by its content: the endpoint (redacted), the model id, the
generation parameters and the exact messages; a request with tools also by its tools and
the client's tool-call parser (:mod:`~pytest_budgetbench.model.tool_parser`), which makes the
reply's calls; a request with a ``response_format`` also by it (the form an endpoint takes
is kept here too, under a key of its own: :mod:`~pytest_budgetbench.model.structured`). A reply
keeps its text, its usage and its tool calls. Replies live in SQLite, so every xdist
worker, every thread and every later run shares them. A request that another process or
thread is already sending is *claimed*: the others wait for its reply instead of sending
it again, which is how identical prompts are sent once within a run. A claim whose owner
died (SIGKILL, say) is taken over.

A reply served from the store keeps the latency of the call that produced it, and says
``cached=True``, so tables report the model's real speed.

Nothing stored is trusted blindly. Every entry (a reply here, a token count, a vector in
:mod:`~pytest_budgetbench.embeddings.store`) carries a checksum of its key's inputs and its
value; an entry that fails it is a miss: it is deleted, noted in the file's ``rejected``
table (the run's summary counts them) and made again. Entries written before checksums
existed have none and are treated the same way, once: they are replaced by checked ones.
A file that cannot be used (not a database, damaged, made by something else) is a
:class:`~pytest_budgetbench.errors.CacheError` naming it and how to reset it; the session
checks the files it will use before its first cell (:meth:`SharedDatabase.check`), at a
cost that does not grow with the file.

Entries travel (``budgetbench cache merge``, :meth:`SharedDatabase.merge_from`): merging
one file into another adds the entries it lacks, checked one by one (a bad one is reported
and left out); a key both hold with different values is a conflict, reported, and the
destination's entry kept. Claims in flight and the ``rejected`` log stay behind. A
source is only read (:attr:`SharedDatabase.read_only`): it may lie on a read-only volume or
belong to someone else, and nothing is written in it or beside it.

Modes (``--budgetbench-cache``):

- ``on``: the store at ``--budgetbench-cache-path`` (default ``<out>/responses.sqlite``)
  answers from any earlier run.
- ``refresh``: the same store, but only replies made in this run count; older ones are
  replaced as their requests are sent again.
- ``off``: a store private to the run directory, so identical prompts are still sent once
  and a resumed run reuses its own replies, but nothing is shared across runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pytest_budgetbench.canonical import json_sha256
from pytest_budgetbench.errors import CacheError
from pytest_budgetbench.messages import Message, Tool
from pytest_budgetbench.model.backend import ChatBackend, Completion
from pytest_budgetbench.redact import redact_url

if TYPE_CHECKING:
    from pytest_budgetbench.model.tool_parser import ToolParser

CACHE_FILE = "responses.sqlite"

CHECKSUM_COLUMN = "checksum"
"""The column every entry's checksum is kept in (added to tables made before it existed)."""
ADDED_COLUMNS = (CHECKSUM_COLUMN, "tool_calls", "parsed_tool_calls")
"""Columns a table made before them lacks: each comes last in its table's schema, and
opening such a file adds them (empty), in this order, so its entries keep working."""
REJECTED = {"checksum": "failed its checksum", "unchecked": "had no checksum (older format)"}
"""Why an entry was rejected, as the ``rejected`` table and the run's summary say it."""

REJECTED_SCHEMA = """
CREATE TABLE IF NOT EXISTS rejected (
    key TEXT PRIMARY KEY,
    reason TEXT NOT NULL,
    seen REAL NOT NULL
);
"""

_SCHEMA = REJECTED_SCHEMA + """
CREATE TABLE IF NOT EXISTS responses (
    key TEXT PRIMARY KEY,
    text TEXT NOT NULL,
    prompt_tokens INTEGER,
    completion_tokens INTEGER,
    latency_s REAL NOT NULL,
    run_id TEXT NOT NULL,
    created REAL NOT NULL,
    checksum TEXT,
    tool_calls TEXT,
    parsed_tool_calls INTEGER
);
CREATE TABLE IF NOT EXISTS claims (
    key TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    since REAL NOT NULL
);
"""


def request_key(endpoint: str, model: str, params: dict[str, Any],
                messages: Sequence[Message], tools: Sequence[Tool] | None = None,
                response_format: Mapping[str, Any] | None = None) -> str:
    """The content address of one chat request; ``endpoint`` names who answers it (a URL,
    redacted here, or the embedded model's identity, which outlives its port). A request
    with tools or a ``response_format`` keys on them too; one without keeps the key it
    always had."""
    request: dict[str, Any] = {"endpoint": redact_url(endpoint), "model": model,
                               "params": params, "messages": list(messages)}
    if tools:
        request["tools"] = list(tools)
    if response_format:
        request["response_format"] = dict(response_format)
    return json_sha256(request, separators=(",", ":"), default=str)


def entry_checksum(*parts: object) -> str:
    """The checksum of a stored entry: sha256 over its key's inputs and its value, each
    part typed and length-prefixed so that no two entries share one by accident."""
    digest = hashlib.sha256()
    for part in parts:
        data = part if isinstance(part, bytes) else repr(part).encode("utf-8")
        digest.update(type(part).__name__.encode() + b":" + len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()[:32]


def _read_edges(db: sqlite3.Connection, table: str) -> None:
    """Read the first and last entry of ``table`` in key order: a few pages, the two edges
    of its b-trees, whatever its size."""
    info = list(db.execute(f"PRAGMA table_info({table})"))
    if not info:  # a read-only file made before the table existed
        return
    keys = [row[1] for row in sorted(info, key=lambda row: row[5]) if row[5]] or ["rowid"]
    # typeof() reads every column of the row without decoding its text (which may not be
    # UTF-8: a checksum miss, not a broken file).
    columns = ", ".join(f"typeof({row[1]})" for row in info)
    for order in ("ASC", "DESC"):
        ordered = ", ".join(f"{key} {order}" for key in keys)
        db.execute(f"SELECT {columns} FROM {table} ORDER BY {ordered} LIMIT 1").fetchall()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def _switch_to_wal(db: sqlite3.Connection, attempts: int = 50) -> None:
    """``journal_mode=WAL`` needs a moment alone with a new file, and SQLite answers
    "database is locked" at once, without its busy timeout, when xdist workers open the
    cache together; so wait and try again."""
    for attempt in range(attempts):
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or attempt == attempts - 1:
                raise
            time.sleep(0.05 * (attempt + 1))


Entry = dict[str, Any]
"""One stored entry, by column (text read as its bytes, then decoded: see AS_BYTES)."""

MERGE_BATCH = 500
"""Entries read from a merged file per transaction on the file merged into."""


@dataclass
class MergeResult:
    """What merging one cache file into another did (:meth:`SharedDatabase.merge_from`)."""

    label: str
    source: Path
    into: Path
    added: int = 0
    same: int = 0
    repaired: int = 0
    """Entries of the destination that failed their checksum, replaced by the source's."""
    rejected: list[str] = field(default_factory=list)
    """The source's entries that failed their checksum (or had none): never imported."""
    conflicts: list[str] = field(default_factory=list)
    """Keys both files hold with different values: the destination's entry is kept."""


class SharedDatabase:
    """One SQLite file shared by threads, xdist workers and runs: a connection per thread,
    WAL (readers never block), and ``BEGIN IMMEDIATE`` transactions.

    The file is opened on first use, not when this object is made: a file that cannot be
    used raises :class:`CacheError` there (inside a cell, whose row then says so), and
    :meth:`check` raises it up front. Any SQLite failure later is a CacheError too."""

    label = "cache"
    """What the file is, in messages ("response cache")."""
    reset_hint = ""
    """Another way out than deleting the file, in messages (an option to point elsewhere)."""
    table = ""
    """The table of entries that travel (``budgetbench cache merge``); the others (claims,
    the rejected log) belong to this file alone."""
    key_columns: tuple[str, ...] = ()
    value_noun = "value"
    """What an entry holds, in messages ("reply")."""

    def __init__(self, path: Path, schema: str) -> None:
        self.path = path
        self.read_only = False
        """Set before first use on a file that is only read (a merge's source): it is opened
        read-only, nothing is written in it or beside it, and its messages never say to
        delete it."""
        self.merge_target = False
        """Set on a merge's destination: its messages say what to pass to ``budgetbench
        cache merge``, not a sweep's option (it runs no sweep)."""
        self._schema = schema
        self._lacking: dict[str, list[str]] = {}
        """The columns each table of the file lacks (a read-only file is never migrated)."""
        self._local = threading.local()
        self._ready = False
        self._ready_lock = threading.Lock()

    def _db(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            db = self._connect()
            self._local.db = db
        return db

    def _connect(self) -> sqlite3.Connection:
        with self._failing("cannot be opened"):
            if self.read_only:
                db = self._connect_read_only()
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                db = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)
            try:
                if not self.read_only:
                    _switch_to_wal(db)
                    db.execute("PRAGMA synchronous=NORMAL")
                with self._ready_lock:
                    if not self._ready:
                        self._prepare(db)
                        self._ready = True
            except BaseException:
                db.close()
                raise
        return db

    def _connect_read_only(self) -> sqlite3.Connection:
        """Open the file without writing in it or beside it (see :attr:`read_only`).

        Without a ``-wal`` beside it the file alone holds every entry, and ``immutable=1``
        reads it as it lies: ``mode=ro`` would make ``-wal`` and ``-shm`` files, and fails
        where the directory is not writable. With one, ``mode=ro`` reads the entries it
        holds too, under SQLite's locks (a run may still be writing it)."""
        uri = self.path.absolute().as_uri()
        wal = self.path.with_name(f"{self.path.name}-wal")
        if wal.exists():
            db = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=60.0,
                                 isolation_level=None)
            try:
                db.execute("SELECT 1 FROM sqlite_master LIMIT 1")  # opens -wal and -shm
                return db
            except sqlite3.OperationalError as exc:
                db.close()
                if wal.stat().st_size > 0:
                    raise CacheError(
                        f"the {self.label} {self.path} cannot be merged: {wal.name} beside it "
                        f"holds entries not yet in it, and SQLite cannot read them without "
                        f"writing {self.path.name}-shm there ({type(exc).__name__}: {exc}); "
                        f"copy {self.path.name} and {wal.name} to a writable directory and "
                        "merge from there"
                    ) from None
        return sqlite3.connect(f"{uri}?immutable=1", uri=True, timeout=60.0,
                               isolation_level=None)

    def _prepare(self, db: sqlite3.Connection) -> None:
        """Make the tables, add the columns of ADDED_COLUMNS to tables made before them,
        and refuse a file whose tables are not this cache's (another program's database).
        A read-only file is only checked: what it lacks is read as empty (:meth:`entries`)."""
        if self.read_only:
            self._lacking = self._columns_lacking(db)
            return
        db.execute("BEGIN IMMEDIATE")
        try:
            for statement in self._schema.split(";"):
                if statement.strip():
                    db.execute(statement)
            for table, missing in self._columns_lacking(db).items():
                for column in missing:
                    kind = _column_types(self._schema)[table][column]
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        self._lacking = {table: [] for table in _columns_of(self._schema)}

    def _columns_lacking(self, db: sqlite3.Connection) -> dict[str, list[str]]:
        """The columns each table of the schema lacks in the file (of ADDED_COLUMNS, or all of
        a table it lacks); a CacheError for a file whose tables are not this cache's."""
        expected = _columns_of(self._schema)
        found = {name for (name,) in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")
            if not name.startswith("sqlite_")}
        strangers = sorted(found - set(expected))
        if strangers:
            raise CacheError(self.describe(
                f"it holds tables this cache never makes ({', '.join(strangers)})"))
        lacking: dict[str, list[str]] = {}
        for table, columns in expected.items():
            have = [row[1] for row in db.execute(f"PRAGMA table_info({table})")]
            missing = columns[len(have):]
            if have and (have != columns[:len(have)] or not set(missing) <= set(ADDED_COLUMNS)):
                raise CacheError(self.describe(
                    f"its table '{table}' has columns {have}, not {columns}"))
            lacking[table] = missing
        return lacking

    def describe(self, problem: str) -> str:
        """One line: which file, what is wrong, and how to reset it (a file only read is
        never to be deleted: another copy of it is the way out)."""
        if self.read_only:
            return (f"the {self.label} {self.path} cannot be merged: {problem}; it was only "
                    "read and is left as it was: merge from a sound copy of it, or from "
                    "another location")
        if self.merge_target:
            return (f"the {self.label} {self.path} cannot be merged into: {problem}; pass "
                    "budgetbench cache merge --into a folder you can write (a new one is "
                    "made), or make this one writable")
        hint = f", or {self.reset_hint}" if self.reset_hint else ""
        return (f"the {self.label} {self.path} cannot be used: {problem}; delete it (and "
                f"any {self.path.name}-wal and {self.path.name}-shm beside it) to start an "
                f"empty one{hint}")

    @contextmanager
    def _failing(self, what: str) -> Iterator[None]:
        """SQLite's failures (and the file system's) as one CacheError naming the file."""
        try:
            yield
        except (sqlite3.Error, OSError) as exc:
            raise CacheError(self.describe(f"it {what} ({type(exc).__name__}: {exc})")) from None

    def check(self) -> None:
        """A CacheError, now, for a file that is not a database, is truncated or belongs to
        something else, at a cost that does not grow with the file: opening it reads its
        header (SQLite refuses a file shorter than the pages the header counts) and its
        schema (:meth:`_prepare`), then the first and last entry of each table are read.
        ``PRAGMA quick_check`` would read every page, seconds for a multi-GB response cache
        at every start; damage inside the file is found by the read that reaches it instead
        (a CacheError in that cell's row), and a bad entry by its checksum."""
        with self._failing("cannot be read"):
            db = self._db()
            for table in _columns_of(self._schema):
                _read_edges(db, table)

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        db = self._db()
        with self._failing("cannot be written"):
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def _read(self, query: str, args: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        with self._failing("cannot be read"):
            return list(self._db().execute(query, args))

    def _reject(self, db: sqlite3.Connection, key: str, reason: str) -> None:
        """Note (inside a transaction) that the entry ``key`` was rejected for ``reason``."""
        db.execute("INSERT OR REPLACE INTO rejected VALUES (?, ?, ?)", (key, reason, time.time()))

    def rejected_since(self, since: float) -> dict[str, int]:
        """Entries rejected at or after ``since`` (a time.time()), by reason (see REJECTED)."""
        rows = self._read("SELECT reason, COUNT(*) FROM rejected WHERE seen >= ? GROUP BY reason",
                          (since,))
        return {str(reason): int(count) for reason, count in rows}

    def close(self) -> None:
        """Close this thread's connection: the last one to close folds the WAL into the
        file, so the file alone holds every entry (to be copied, or saved by CI)."""
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is not None:
            self._local.db = None
            db.close()

    # -- travelling: entries merged from another machine's file --------------------------
    def checksum_of(self, entry: Entry) -> str:
        """The checksum ``entry`` must carry (what lookups check)."""
        raise NotImplementedError(f"{type(self).__name__} has no entries to merge")

    def same_value(self, ours: Entry, theirs: Entry) -> bool:
        """Whether two checked entries of one key hold the same value."""
        return ours == theirs

    def origin(self, entry: Entry) -> str:
        """Where an entry came from, for a conflict's message ("run X"), or ""."""
        return ""

    def entries(self) -> Iterator[list[Entry]]:
        """Every entry of :attr:`table`, in batches, unchecked; a column a read-only file
        lacks (made before it existed) reads as NULL, as it would once added."""
        columns = list(_column_types(self._schema)[self.table])
        with self._failing("cannot be read"):
            db = self._db()
            lacking = self._lacking[self.table]
            if len(lacking) == len(columns):  # a read-only file without the table
                return
            read = ["NULL" if column in lacking else expression
                    for column, expression in zip(columns, self._as_read(), strict=True)]
            cursor = db.execute(f"SELECT {', '.join(read)} FROM {self.table}")
            while batch := cursor.fetchmany(MERGE_BATCH):
                yield [self._decoded(dict(zip(columns, row, strict=True))) for row in batch]

    def merge_from(self, source: SharedDatabase) -> MergeResult:
        """Add every checked entry of ``source`` (a file of the same kind) that this file
        lacks. An entry of ``source`` that fails its checksum is reported, never imported;
        one whose key this file holds with another value is a conflict, reported, and this
        file's entry is kept: nothing is picked silently. Claims are never copied."""
        if type(source) is not type(self):
            raise TypeError(f"cannot merge a {source.label} into a {self.label}")
        result = MergeResult(self.label, source.path, self.path)
        for batch in source.entries():
            with self._transaction() as db:
                for entry in batch:
                    self._merge_entry(db, entry, source, result)
        return result

    def _merge_entry(self, db: sqlite3.Connection, entry: Entry, source: SharedDatabase,
                     result: MergeResult) -> None:
        key = tuple(entry[column] for column in self.key_columns)
        reason = self._rejection(entry)
        if reason is not None:
            result.rejected.append(f"{self._short(key)}: {REJECTED[reason]}")
            return
        entry = {column: _readable(value) for column, value in entry.items()}
        where = " AND ".join(f"{column} = ?" for column in self.key_columns)
        found = db.execute(f"SELECT {', '.join(self._as_read())} FROM {self.table} "
                           f"WHERE {where}", key).fetchone()
        ours = None if found is None else self._decoded(
            dict(zip(_column_types(self._schema)[self.table], found, strict=True)))
        if ours == entry:  # the common case of a merge done before: nothing to check
            result.same += 1
            return
        if ours is not None and self._rejection(ours) is None:
            if self.same_value(ours, entry):
                result.same += 1
            else:
                result.conflicts.append(self._conflict(key, ours, entry, source))
            return
        if ours is not None:
            self._reject(db, "/".join(key), self._rejection(ours) or "checksum")
            result.repaired += 1
        else:
            result.added += 1
        marks = ", ".join("?" * len(entry))
        db.execute(f"INSERT OR REPLACE INTO {self.table} ({', '.join(entry)}) "
                   f"VALUES ({marks})", tuple(entry.values()))

    def _rejection(self, entry: Entry) -> str | None:
        return rejection(entry[CHECKSUM_COLUMN], self.checksum_of(entry))

    def _conflict(self, key: tuple[str, ...], ours: Entry, theirs: Entry,
                  source: SharedDatabase) -> str:
        def named(path: Path, entry: Entry) -> str:
            origin = self.origin(entry)
            return f"{path} ({origin})" if origin else str(path)

        return (f"{self.label} entry {self._short(key)}: {named(source.path, theirs)} holds "
                f"another {self.value_noun} than {named(self.path, ours)}; kept {self.path}'s")

    @staticmethod
    def _short(key: tuple[str, ...]) -> str:
        """A key as messages show it: its last part cut to 16 characters."""
        *space, last = (str(_readable(part)) for part in key)  # a damaged key prints too
        return "/".join([*space, last[:16] + ("..." if len(last) > 16 else "")])

    def _as_read(self) -> list[str]:
        """The table's columns as a query reads them (text as its bytes: AS_BYTES)."""
        return [AS_BYTES.format(column) if kind in ("TEXT", "BLOB") else column
                for column, kind in _column_types(self._schema)[self.table].items()]

    def _decoded(self, row: Entry) -> Entry:
        types = _column_types(self._schema)[self.table]
        return {column: text_of_bytes(value) if types[column] == "TEXT" and value is not None
                else bytes(value) if isinstance(value, bytes | memoryview) else value
                for column, value in row.items()}


AS_BYTES = "CAST({} AS BLOB)"
"""Read a TEXT column as its bytes: a flipped byte can make it invalid UTF-8, which
SQLite's driver refuses to decode (an error, where a checksum miss is the answer)."""


SAME_CHECKSUM = "CAST(checksum AS BLOB) IS ?"
"""Deletes the rejected entry (its checksum's bytes, as read), not a good one another
process stored since."""


def text_of_bytes(raw: bytes | None) -> str | None:
    """A TEXT column read with AS_BYTES, decoded; bytes that are not UTF-8 survive as
    surrogates, so the entry fails its checksum instead of failing the read."""
    return None if raw is None else bytes(raw).decode("utf-8", "surrogateescape")


def _readable(value: object) -> object:
    """A checked entry's value as it can be written: a text column its checksum does not
    cover (a reply's run id) may hold bytes that are not UTF-8; they become U+FFFD."""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return value


def rejection(stored: str | None, expected: str) -> str | None:
    """Why an entry with checksum ``stored`` is rejected (a key of REJECTED), or None."""
    if stored is None:
        return "unchecked"
    return None if stored == expected else "checksum"


_COLUMNS: dict[str, dict[str, dict[str, str]]] = {}


def _column_types(schema: str) -> dict[str, dict[str, str]]:
    """The tables ``schema`` makes and their columns' types, in order (read from SQLite
    itself)."""
    if schema not in _COLUMNS:
        with closing(sqlite3.connect(":memory:")) as db:
            db.executescript(schema)
            tables = [name for (name,) in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")]
            _COLUMNS[schema] = {table: {row[1]: row[2] for row in db.execute(
                f"PRAGMA table_info({table})")} for table in tables}
    return _COLUMNS[schema]


def _columns_of(schema: str) -> dict[str, list[str]]:
    """The tables ``schema`` makes and their columns, in order."""
    return {table: list(types) for table, types in _column_types(schema).items()}


_COUNTS_SCHEMA = REJECTED_SCHEMA + """
CREATE TABLE IF NOT EXISTS counts (
    space TEXT NOT NULL,
    key TEXT NOT NULL,
    tokens INTEGER NOT NULL,
    checksum TEXT,
    PRIMARY KEY (space, key)
) WITHOUT ROWID;
"""

COUNTS_FILE = "counts.sqlite"


class CountDatabase(SharedDatabase):
    """Token counts by (counter space, content key), beside the response cache: a count
    is a function of its key, so nothing in it goes stale and xdist workers that write the
    same count at once each insert or ignore
    (:class:`~pytest_budgetbench.tokens.counters.CountStore`)."""

    label = "token-count cache"
    table = "counts"
    key_columns = ("space", "key")
    value_noun = "count"

    def __init__(self, path: Path) -> None:
        super().__init__(path, _COUNTS_SCHEMA)

    def checksum_of(self, entry: Entry) -> str:
        return entry_checksum(entry["space"], entry["key"], entry["tokens"])

    def lookup(self, space: str, key: str) -> int | None:
        """The stored count, or None (absent, or rejected by its checksum: counted again)."""
        rows = self._read(f"SELECT tokens, {AS_BYTES.format('checksum')} FROM counts "
                          "WHERE space = ? AND key = ?", (space, key))
        if not rows:
            return None
        tokens, raw_checksum = rows[0]
        reason = rejection(text_of_bytes(raw_checksum), entry_checksum(space, key, tokens))
        if reason is None:
            return int(tokens)
        with self._transaction() as db:
            db.execute(f"DELETE FROM counts WHERE space = ? AND key = ? AND {SAME_CHECKSUM}",
                       (space, key, raw_checksum))
            self._reject(db, f"{space}/{key}", reason)
        return None

    def save(self, space: str, counts: Mapping[str, int]) -> None:
        with self._transaction() as db:
            db.executemany(
                "INSERT OR IGNORE INTO counts VALUES (?, ?, ?, ?)",
                ((space, key, int(tokens), entry_checksum(space, key, int(tokens)))
                 for key, tokens in counts.items()))

    def count(self) -> int:
        return int(self._read("SELECT COUNT(*) FROM counts")[0][0])


_SENDING: set[tuple[str, str]] = set()
"""(cache file, key) of the requests this process's threads are sending now."""
_SENDING_LOCK = threading.Lock()


class ResponseStore(SharedDatabase):
    """Replies and in-flight claims in one SQLite file (WAL: readers never block)."""

    label = "response cache"
    reset_hint = "pass --budgetbench-cache-path=NEW.sqlite"
    table = "responses"
    key_columns = ("key",)
    value_noun = "reply"
    _REPLY_COLUMNS = ("text", "prompt_tokens", "completion_tokens", "tool_calls",
                      "parsed_tool_calls")
    """What a reply is; its latency, run and time are when and how fast it was made."""

    def __init__(self, path: Path, *, run_id: str, this_run_only: bool = False,
                 stale_after_s: float = 3600.0) -> None:
        self.run_id = run_id
        self.this_run_only = this_run_only
        self.stale_after_s = stale_after_s
        self._host = socket.gethostname()
        super().__init__(path, _SCHEMA)

    def checksum_of(self, entry: Entry) -> str:
        return _reply_checksum(entry["key"], entry["text"], entry["prompt_tokens"],
                               entry["completion_tokens"], entry["latency_s"],
                               entry["tool_calls"], entry["parsed_tool_calls"])

    def same_value(self, ours: Entry, theirs: Entry) -> bool:
        """The same reply, however fast and in whichever run each was made (two shards
        that both sent a request have two latencies for one reply)."""
        return all(ours[column] == theirs[column] for column in self._REPLY_COLUMNS)

    def origin(self, entry: Entry) -> str:
        return f"run {entry['run_id']}"

    @property
    def _owner(self) -> str:
        return f"{self._host}:{os.getpid()}:{threading.get_ident()}"

    def lookup(self, key: str) -> Completion | None:
        """The stored reply, or None: absent, or rejected by its checksum (a flipped byte
        in a reply is never served; the request is sent again)."""
        query = (f"SELECT {AS_BYTES.format('text')}, prompt_tokens, completion_tokens, "
                 f"latency_s, {AS_BYTES.format('checksum')}, {AS_BYTES.format('tool_calls')}, "
                 "parsed_tool_calls FROM responses WHERE key = ?")
        args: tuple[str, ...] = (key,)
        if self.this_run_only:
            query += " AND run_id = ?"
            args += (self.run_id,)
        rows = self._read(query, args)
        if not rows:
            return None
        (raw_text, prompt_tokens, completion_tokens, latency_s, raw_checksum, raw_calls,
         parsed) = rows[0]
        text, checksum = text_of_bytes(raw_text), text_of_bytes(raw_checksum)
        calls = text_of_bytes(raw_calls)
        reason = rejection(checksum, _reply_checksum(key, text, prompt_tokens,
                                                    completion_tokens, latency_s,
                                                    calls, parsed))
        if reason is None:
            assert text is not None
            return Completion(text, prompt_tokens, completion_tokens, latency_s, cached=True,
                              tool_calls=tuple(json.loads(calls)) if calls else (),
                              parsed_tool_calls=int(parsed or 0))
        with self._transaction() as db:
            db.execute(f"DELETE FROM responses WHERE key = ? AND {SAME_CHECKSUM}",
                       (key, raw_checksum))
            self._reject(db, key, reason)
        return None

    def claim(self, key: str) -> bool:
        """Take the right to send ``key``'s request; False while a live owner holds it."""
        with self._transaction() as db:
            held = db.execute("SELECT owner, host, pid, since FROM claims WHERE key = ?",
                              (key,)).fetchone()
            if held is not None and not self._abandoned(key, *held[1:]):
                return False
            # Marked as sending before the claim commits: a thread of this process that
            # sees the claim must find it sending, or it would take it over as abandoned.
            with _SENDING_LOCK:
                _SENDING.add((str(self.path), key))
            try:
                db.execute("INSERT OR REPLACE INTO claims VALUES (?, ?, ?, ?, ?)",
                           (key, self._owner, self._host, os.getpid(), time.time()))
            except BaseException:
                self._sent(key)
                raise
        return True

    def _sent(self, key: str) -> None:
        with _SENDING_LOCK:
            _SENDING.discard((str(self.path), key))

    def _abandoned(self, key: str, host: str, pid: int, since: float) -> bool:
        if host == self._host and pid == os.getpid():
            # Ours: abandoned unless a thread of this process is sending it now (its reply
            # could not be stored or its claim released, on a full disk say).
            with _SENDING_LOCK:
                return (str(self.path), key) not in _SENDING
        if time.time() - since > self.stale_after_s:
            return True
        return host == self._host and not _pid_alive(pid)

    def store(self, key: str, completion: Completion) -> None:
        try:
            self._store(key, completion)
        finally:
            # Only once the reply is stored (or could not be): until then a thread of this
            # process that sees the claim waits instead of sending the request again.
            self._sent(key)

    def _store(self, key: str, completion: Completion) -> None:
        # A reply without calls leaves both columns empty, as an entry made before them.
        calls = (json.dumps(list(completion.tool_calls), ensure_ascii=False)
                 if completion.tool_calls else None)
        parsed = completion.parsed_tool_calls if calls is not None else None
        with self._transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (key, completion.text, completion.prompt_tokens, completion.completion_tokens,
                 completion.latency_s, self.run_id, time.time(),
                 _reply_checksum(key, completion.text, completion.prompt_tokens,
                                 completion.completion_tokens, float(completion.latency_s),
                                 calls, parsed),
                 calls, parsed),
            )
            db.execute("DELETE FROM claims WHERE key = ? AND owner = ?", (key, self._owner))

    def release(self, key: str) -> None:
        try:
            with self._transaction() as db:
                db.execute("DELETE FROM claims WHERE key = ? AND owner = ?", (key, self._owner))
        finally:
            self._sent(key)


def _reply_checksum(key: str, text: str | None, prompt_tokens: object,
                    completion_tokens: object, latency_s: object, tool_calls: str | None,
                    parsed_tool_calls: object) -> str:
    """A reply's checksum: its key (the digest of the request) and every stored field, as
    stored (a REAL column gives back a float, so the store side passes one). A reply
    without tool calls sums what it summed before they were stored, so entries made then
    still hold."""
    calls = () if tool_calls is None else (tool_calls, parsed_tool_calls)
    return entry_checksum(key, text, prompt_tokens, completion_tokens, latency_s, *calls)


class KeyedClient(ChatBackend, Protocol):
    """What the response cache reads of the client it wraps, besides its answers: what the
    key holds. :class:`~pytest_budgetbench.model.chat.ChatModel` is one, and so is a pool
    of replicas (:class:`~pytest_budgetbench.model.replicas.ReplicaPool`)."""

    @property
    def base_url(self) -> str:
        """Who answers; empty when no one URL does (a server started on demand, a pool)."""
        ...

    @property
    def model(self) -> str: ...

    @property
    def params(self) -> dict[str, Any]:
        """The generation parameters (temperature, seed) every request is sent with."""
        ...

    @property
    def tool_parser(self) -> ToolParser:
        """What makes a reply's tool calls from its text (a request with tools keys on it)."""
        ...


class CachingChatModel:
    """A chat model whose identical requests are sent once; replies say where they came from.
    It is a :class:`~pytest_budgetbench.model.backend.ChatBackend` itself.

    The key holds the wrapped model's generation parameters (temperature, seed) and
    ``max_tokens``, so a change to any of them is a new request; that is why it wraps a
    :class:`KeyedClient`, which knows them, and not any backend. ``endpoint`` names who
    answers (``Endpoint.identity``); without it the client's URL does, port included. A
    client whose server starts on demand has no URL yet, and a pool of replicas has no one
    URL (:class:`~pytest_budgetbench.model.replicas.ReplicaPool`), so they need ``endpoint``.
    """

    def __init__(self, chat: KeyedClient, store: ResponseStore, *,
                 endpoint: str | None = None, poll_s: float = 0.05) -> None:
        if not endpoint and not chat.base_url:
            raise ValueError("CachingChatModel needs endpoint= for a client that has no URL "
                             "before its first request (a server started on demand)")
        self._chat = chat
        self._store = store
        self._poll_s = poll_s
        self.model = chat.model
        self.endpoint = endpoint or chat.base_url

    @property
    def params(self) -> dict[str, Any]:
        return self._chat.params

    def complete(self, messages: Sequence[Message], *, max_tokens: int,
                 tools: Sequence[Tool] | None = None,
                 response_format: Mapping[str, Any] | None = None) -> Completion:
        params = {**self.params, "max_tokens": max_tokens}
        if tools:  # the parser makes the reply's calls; a request without tools keeps its key
            params["tool_parser"] = self._chat.tool_parser
        key = request_key(self.endpoint, self.model, params, messages, tools, response_format)
        return once(self._store, key, lambda: self._chat.complete(
            messages, max_tokens=max_tokens, tools=tools, response_format=response_format),
            self._poll_s)


def once(store: ResponseStore, key: str, make: Callable[[], Completion],
         poll_s: float = 0.05) -> Completion:
    """The stored answer at ``key``, else ``make()``'s, stored: made once across threads,
    workers and runs. While another holds the claim on ``key`` this waits for its answer;
    when ``make`` raises, the claim is released (a waiter then makes it itself)."""
    delay = poll_s
    while True:
        found = store.lookup(key)
        if found is not None:
            return found
        if store.claim(key):
            # Another may have stored it and let go of its claim between our lookup and our
            # claim (a process descheduled there on a busy machine sent it twice): a store
            # commits the reply with the claim's release, so looking once more settles it.
            found = store.lookup(key)
            if found is None:
                break
            store.release(key)
            return found
        time.sleep(delay)  # someone else is making this very answer
        delay = min(delay * 2, 1.0)
    try:
        completion = make()
    except BaseException:
        store.release(key)
        raise
    store.store(key, completion)
    return replace(completion, cached=False)
