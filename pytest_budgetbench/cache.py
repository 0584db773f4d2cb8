"""The response cache: identical model requests are answered once.

A request is addressed by its content: the endpoint (redacted), the model id, the
generation parameters and the exact messages. Replies live in SQLite, so every xdist
worker, every thread and every later run shares them. A request that another process or
thread is already sending is *claimed*: the others wait for its reply instead of sending
it again, which is how identical prompts are sent once within a run. A claim whose owner
died (SIGKILL, say) is taken over.

A reply served from the store keeps the latency of the call that produced it, and says
``cached=True``, so tables report the model's real speed.

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
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from pytest_budgetbench.messages import Message
from pytest_budgetbench.model import ChatModel, Completion, redact_url

CACHE_FILE = "responses.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    key TEXT PRIMARY KEY,
    text TEXT NOT NULL,
    prompt_tokens INTEGER,
    completion_tokens INTEGER,
    latency_s REAL NOT NULL,
    run_id TEXT NOT NULL,
    created REAL NOT NULL
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
                messages: Sequence[Message]) -> str:
    """The content address of one chat request; ``endpoint`` names who answers it (a URL,
    redacted here, or the embedded model's identity, which outlives its port)."""
    canonical = json.dumps(
        {"endpoint": redact_url(endpoint), "model": model, "params": params,
         "messages": list(messages)},
        sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str,
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


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


class SharedDatabase:
    """One SQLite file shared by threads, xdist workers and runs: a connection per thread,
    WAL (readers never block), and ``BEGIN IMMEDIATE`` transactions."""

    def __init__(self, path: Path, schema: str) -> None:
        self.path = path
        self._local = threading.local()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db().executescript(schema)

    def _db(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)
            _switch_to_wal(db)
            db.execute("PRAGMA synchronous=NORMAL")
            self._local.db = db
        return db

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        db = self._db()
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")



_COUNTS_SCHEMA = """
CREATE TABLE IF NOT EXISTS counts (
    space TEXT NOT NULL,
    key TEXT NOT NULL,
    tokens INTEGER NOT NULL,
    PRIMARY KEY (space, key)
) WITHOUT ROWID;
"""

COUNTS_FILE = "counts.sqlite"


class CountDatabase(SharedDatabase):
    """Token counts by (counter space, content key), beside the response cache: a count
    is a function of its key, so nothing in it goes stale and xdist workers that write the
    same count at once each insert or ignore (:class:`~pytest_budgetbench.budget.CountStore`)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, _COUNTS_SCHEMA)

    def lookup(self, space: str, key: str) -> int | None:
        row = self._db().execute(
            "SELECT tokens FROM counts WHERE space = ? AND key = ?", (space, key)).fetchone()
        return None if row is None else int(row[0])

    def save(self, space: str, counts: Mapping[str, int]) -> None:
        with self._transaction() as db:
            db.executemany("INSERT OR IGNORE INTO counts VALUES (?, ?, ?)",
                           ((space, key, tokens) for key, tokens in counts.items()))

    def count(self) -> int:
        return int(self._db().execute("SELECT COUNT(*) FROM counts").fetchone()[0])


class ResponseStore(SharedDatabase):
    """Replies and in-flight claims in one SQLite file (WAL: readers never block)."""

    def __init__(self, path: Path, *, run_id: str, this_run_only: bool = False,
                 stale_after_s: float = 3600.0) -> None:
        self.run_id = run_id
        self.this_run_only = this_run_only
        self.stale_after_s = stale_after_s
        self._host = socket.gethostname()
        super().__init__(path, _SCHEMA)

    @property
    def _owner(self) -> str:
        return f"{self._host}:{os.getpid()}:{threading.get_ident()}"

    def lookup(self, key: str) -> Completion | None:
        query = "SELECT text, prompt_tokens, completion_tokens, latency_s FROM responses " \
                "WHERE key = ?"
        args: tuple[str, ...] = (key,)
        if self.this_run_only:
            query += " AND run_id = ?"
            args += (self.run_id,)
        found = self._db().execute(query, args).fetchone()
        if found is None:
            return None
        text, prompt_tokens, completion_tokens, latency_s = found
        return Completion(text, prompt_tokens, completion_tokens, latency_s, cached=True)

    def claim(self, key: str) -> bool:
        """Take the right to send ``key``'s request; False while a live owner holds it."""
        with self._transaction() as db:
            held = db.execute("SELECT owner, host, pid, since FROM claims WHERE key = ?",
                              (key,)).fetchone()
            if held is not None and not self._abandoned(*held[1:]):
                return False
            db.execute("INSERT OR REPLACE INTO claims VALUES (?, ?, ?, ?, ?)",
                       (key, self._owner, self._host, os.getpid(), time.time()))
        return True

    def _abandoned(self, host: str, pid: int, since: float) -> bool:
        if time.time() - since > self.stale_after_s:
            return True
        return host == self._host and not _pid_alive(pid)

    def store(self, key: str, completion: Completion) -> None:
        with self._transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?, ?)",
                (key, completion.text, completion.prompt_tokens, completion.completion_tokens,
                 completion.latency_s, self.run_id, time.time()),
            )
            db.execute("DELETE FROM claims WHERE key = ? AND owner = ?", (key, self._owner))

    def release(self, key: str) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM claims WHERE key = ? AND owner = ?", (key, self._owner))


class CachingChatModel:
    """A chat model whose identical requests are sent once; replies say where they came from.
    It is a :class:`~pytest_budgetbench.model.ChatBackend` itself.

    The key holds the wrapped model's generation parameters (temperature, seed) and
    ``max_tokens``, so a change to any of them is a new request; that is why it wraps the
    concrete client, which knows them, and not any backend. ``endpoint`` names who answers
    (``Endpoint.identity``); without it the client's URL does, port included. A client
    whose server starts on demand has no URL yet, so it needs ``endpoint``.
    """

    def __init__(self, chat: ChatModel, store: ResponseStore, *, endpoint: str | None = None,
                 poll_s: float = 0.05) -> None:
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

    def complete(self, messages: Sequence[Message], *, max_tokens: int) -> Completion:
        key = request_key(self.endpoint, self.model,
                          {**self.params, "max_tokens": max_tokens}, messages)
        delay = self._poll_s
        while True:
            found = self._store.lookup(key)
            if found is not None:
                return found
            if self._store.claim(key):
                return self._send(key, messages, max_tokens)
            time.sleep(delay)  # someone else is sending this very request
            delay = min(delay * 2, 1.0)

    def _send(self, key: str, messages: Sequence[Message], max_tokens: int) -> Completion:
        try:
            completion = self._chat.complete(messages, max_tokens=max_tokens)
        except BaseException:
            self._store.release(key)  # a waiter then sends it itself
            raise
        self._store.store(key, completion)
        return replace(completion, cached=False)
