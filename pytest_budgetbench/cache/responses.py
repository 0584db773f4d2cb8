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

Modes (``--budgetbench-cache``):

- ``on``: the store at ``--budgetbench-cache-path`` (default ``<out>/responses.sqlite``)
  answers from any earlier run.
- ``refresh``: the same store, but only replies made in this run count; older ones are
  replaced as their requests are sent again.
- ``off``: a store private to the run directory, so identical prompts are still sent once
  and a resumed run reuses its own replies, but nothing is shared across runs.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pytest_budgetbench.cache.database import (
    AS_BYTES,
    REJECTED_SCHEMA,
    SAME_CHECKSUM,
    Entry,
    SharedDatabase,
    entry_checksum,
    rejection,
    text_of_bytes,
)
from pytest_budgetbench.canonical import json_sha256
from pytest_budgetbench.messages import Message, Tool
from pytest_budgetbench.model.backend import ChatBackend, Completion
from pytest_budgetbench.redact import redact_url

if TYPE_CHECKING:
    from pytest_budgetbench.model.tool_parser import ToolParser

CACHE_FILE = "responses.sqlite"


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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


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

    def forget(self, key: str) -> None:
        """Drop the reply at ``key`` (one that must not be served again: it answered a
        prompt the server cut)."""
        with self._transaction() as db:
            db.execute("DELETE FROM responses WHERE key = ?", (key,))

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
        key = self._key(messages, max_tokens, tools, response_format)
        return once(self._store, key, lambda: self._chat.complete(
            messages, max_tokens=max_tokens, tools=tools, response_format=response_format),
            self._poll_s)


    def forget(self, messages: Sequence[Message], *, max_tokens: int,
               tools: Sequence[Tool] | None = None,
               response_format: Mapping[str, Any] | None = None) -> None:
        """Drop the stored reply to this request, so it is never served again (the runner
        found that it answered a prompt the server cut)."""
        self._store.forget(self._key(messages, max_tokens, tools, response_format))

    def _key(self, messages: Sequence[Message], max_tokens: int,
             tools: Sequence[Tool] | None, response_format: Mapping[str, Any] | None) -> str:
        params = {**self.params, "max_tokens": max_tokens}
        if tools:  # the parser makes the reply's calls; a request without tools keeps its key
            params["tool_parser"] = self._chat.tool_parser
        return request_key(self.endpoint, self.model, params, messages, tools, response_format)


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
