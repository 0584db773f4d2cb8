"""The SQLite file every cache keeps its entries in (responses, token counts, vectors):
shared by every process, checked entry by entry, and merged between machines.

Nothing stored is trusted blindly. Every entry (a reply here, a token count, a vector in
:mod:`~pytest_budgetbench.cache.vectors`) carries a checksum of its key's inputs and its
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
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_budgetbench.errors import CacheError

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
