"""``mem0``: the real Mem0 memory layer (the ``mem0ai`` 2.2.1 library) under the budget.

Construction. The item's history goes into a fresh ``mem0.Memory`` session by session, as
mem0 expects (``Memory.add(messages, user_id=...)``), and mem0 does the rest: it searches
its existing memories for the new messages, asks its LLM to extract memories (one call an
add: mem0 2.2.1's additive extraction, ``{"memory": [{"id", "text", "attributed_to"}]}``,
ADD only: it neither updates nor deletes, and drops a duplicate by hash), embeds and
stores them. mem0's LLM is a provider class that answers through the runner's auxiliary
model (purpose ``mem0/extract``), its embedder is the run's, its vector store a Qdrant
collection in an in-memory client, its history database an in-memory SQLite, its
telemetry off (see :mod:`._mem0_backend`).

- Sessions are read from the markers tasks put at a message's start: LoCoMo's
  ``DATE: <date> (session <n>)`` header (repeated on every part of a session) and the
  memory task's ``[<date>]`` prefix on a session's first turn; a message without a marker
  belongs to the session before it, and a history without markers is one session. A
  session's date becomes mem0's ``Observation Date`` (mem0's OSS ``add`` rejects its
  ``timestamp``; left alone, the prompt would say today).
- Each add holds at most ``ADD_SHARE`` of what the window leaves after mem0's instruction;
  a longer session is split into consecutive adds, a message longer than that into
  pieces. ``mem0_add=packed`` packs consecutive whole sessions into one add instead (fewer
  calls; the date is the last session's).
- Every call is held to the construction window W = ``min(budget, mem0_window)``.
  mem0's instruction alone is ~8,400 tokens, so the call keeps its ``# ROLE`` section,
  its first worked example and its ``# OUTPUT FORMAT`` (~780 tokens; the guidelines and
  the other eleven examples are left out); its prompt keeps mem0's sections, with the new
  messages whole, then as many of the existing memories (most similar first) and of the
  last messages (newest first) as fit. ``Current Date`` is left out (it is not an anchor,
  and would change every prompt every day, defeating the call cache).

Small models fail the JSON. A reply that is not an object with a ``memory`` list of
objects with a ``text``, or that has any entry without one or with a placeholder copied
from mem0's output format ("First extracted memory": Qwen2.5-0.5B does this), is one
``aux_failure`` on the row; the other memory objects found in it are still stored (a
reply cut at its token limit keeps its complete entries), and mem0 is given the validated
entries re-serialised, so what counts as a success is exactly what mem0 stores.
Construction goes on with the next add.

Query time. ``Memory.search(question)`` (mem0's ranking; no LLM call) returns memories,
best first; the prompt is the system messages, one system message with as many of them
as fit in ``MEMORY_SHARE`` of the room, the newest history packed into what is left (as
memgpt's FIFO tail: a budget larger than W buys more recent history), and the query. The
shared packer holds it to the budget. A prompt that fits is sent unchanged, with no
construction.

Persistent state, and how it is kept per item: a built memory is cached in the process by
the content of the item's messages and W (never by item id), so every budget at or above
``mem0_window`` reuses one memory built at the cap, and a budget below it builds its own.
Each built memory is its own ``mem0.Memory``: its own in-memory Qdrant client and
collection, its own SQLite, and a user id made from that content, so nothing one item
stored can be searched, nor shown as an existing memory, for another. The construction
calls are on the row of the cell that built the memory; ``strategy_info.mem0`` on every
row gives construction cost (``reused``, calls, tokens, seconds, failures, adds, events,
memories kept) apart from query cost.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import os
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from pytest_budgetbench.errors import MissingDependency, Requirement
from pytest_budgetbench.messages import Message, Schema, text_of
from pytest_budgetbench.options import Option, choice, positive_int
from pytest_budgetbench.strategies._chunking import chunk_history, newest_first
from pytest_budgetbench.strategies._memory_system import (
    BuiltMemories,
    Cost,
    ask,
    clip,
    construction_window,
    failed,
    json_values,
    memory_message,
)
from pytest_budgetbench.strategies._packing import HistoryStrategy, Packer, query_text
from pytest_budgetbench.strategies.base import Regime, StrategyContext
from pytest_budgetbench.strategies.budgetmem.pipeline import question_of

ADD_SHARE = 0.75  # of the window left after the instruction: the new messages of one add
MIN_ADD_TOKENS = 64  # a window leaving less than this for new messages builds nothing
EXTRACT_REPLY_TOKENS = 512
FIT_SLACK = 4  # tokens the fitted extraction prompt leaves free in the window
SEARCH_TOP_K = 20  # mem0's default
MEMORY_SHARE = 0.5  # of the query-time room, for the memory message
MIN_MEMORY_TOKENS = 8
KEPT_SECTIONS = ("ROLE", "OUTPUT FORMAT")  # of mem0's extraction instruction, in its order
ROLES = ("user", "assistant", "system")  # what mem0 renders; any other role is sent as user
PURPOSE = "mem0/extract"
NO_MEMORIES = json.dumps({"memory": []})

MEM0_WINDOW = Option(
    "mem0_window",
    "the largest window mem0's construction calls get; budgets at or above it share one "
    "memory",
    positive_int,
    2048,
)
MEM0_ADD = Option(
    "mem0_add",
    "what one Memory.add of mem0 holds: a session (split when long) or consecutive "
    "sessions packed to the add size",
    choice("session", "packed"),
    "session",
    metavar="session|packed",
)

SESSION_MARKERS = (
    re.compile(r"DATE: (?P<date>[^\n]+?) \(session \d+\)"),  # locomo
    re.compile(r"\[(?P<date>[^\]\n]{1,40}\d{4})\]"),  # memory: "[August 4, 2024] ..."
)
MEMORY_HEADER = "Memory (mem0): facts remembered from the conversation, most relevant first.\n"
# What mem0's prompt holds besides its content, to size an add before the first call.
SKELETON = ("## Summary\n\n\n## Last k Messages\n\n\n## Recently Extracted Memories\n[]\n\n"
            "## Existing Memories\n[]\n\n## New Messages\n\n\n## Observation Date\n"
            "10:00 am on 30 September, 2023\n\n# Output:")


BACKEND_MODULE = "pytest_budgetbench.strategies._mem0_backend"
RUN_MEM0_DIR = "BUDGETBENCH_MEM0_DIR"  # the run's directory for mem0, handed to the backend


def backend(work_dir: Path | None = None) -> ModuleType:
    """The mem0 wiring (:mod:`._mem0_backend`), imported on first use. mem0 writes a
    ``config.json`` into its directory when imported: in a run that is
    ``<work_dir>/mem0``, otherwise a private temporary directory removed at exit."""
    if importlib.util.find_spec("mem0") is None:
        raise MissingDependency("mem0ai", "mem0", "the mem0 strategy")
    if work_dir is not None and BACKEND_MODULE not in sys.modules:
        (work_dir / "mem0").mkdir(parents=True, exist_ok=True)
        os.environ[RUN_MEM0_DIR] = str(work_dir / "mem0")
    # By its name in sys.modules, not as the package's attribute: a module dropped from
    # sys.modules (pytester's in-process runs drop every module a run imported) is then
    # imported again with the qdrant-client that mem0's config checks its client against.
    return importlib.import_module(BACKEND_MODULE)


# -- sessions and adds ---------------------------------------------------------------------
@dataclass
class Add:
    """The messages of one ``Memory.add`` and their session's date ("" when unknown)."""

    date: str
    messages: list[Message] = field(default_factory=list)
    tokens: int = 0


def session_marker(text: str) -> tuple[str, str] | None:
    """The session marker ``text`` starts with, and its date; None when none."""
    for pattern in SESSION_MARKERS:
        match = pattern.match(text)
        if match:
            return match.group(0), match.group("date").strip()
    return None


def sessions(history: Sequence[Message]) -> list[Add]:
    """The history as sessions (see the module docstring), each as one add's messages."""
    found: list[Add] = []
    current = None
    for message in history:
        text = text_of(message)
        if not text.strip():
            continue
        marker = session_marker(text.lstrip())
        if not found or (marker is not None and marker[0] != current):
            found.append(Add(marker[1] if marker else ""))
            current = marker[0] if marker else None
        role = str(message.get("role"))
        found[-1].messages.append({"role": role if role in ROLES else "user", "content": text})
    return found


def plan_adds(context: StrategyContext, history: Sequence[Message], size: int,
              packed: bool) -> tuple[list[Add], int]:
    """The adds of ``history``, each at most ``size`` tokens of rendered messages, and the
    number of sessions."""
    tokens = context.tokens
    adds: list[Add] = []
    found = sessions(history)
    for session in found:
        fresh = True  # a session starts a new add unless sessions are packed
        for message in session.messages:
            for piece in _pieces(context, message, size):
                cost = tokens.count_text(f"{piece['role']}: {piece['content']}") + 1
                if not adds or (fresh and not packed) or adds[-1].tokens + cost > size:
                    adds.append(Add(session.date))
                adds[-1].messages.append(piece)
                adds[-1].tokens += cost
                adds[-1].date = session.date
                fresh = False
    return adds, len(found)


def _pieces(context: StrategyContext, message: Message, size: int) -> list[Message]:
    """``message``, or its consecutive pieces when it alone exceeds ``size`` tokens."""
    tokens = context.tokens
    text = text_of(message)
    framing = tokens.count_text(f"{message['role']}: ") + 1
    if tokens.count_text(text) + framing <= size:
        return [message]
    return [{"role": message["role"], "content": text[p.start:p.end]}
            for p in chunk_history(tokens, [message], max(1, size - framing))]


def add_size(context: StrategyContext, window: int, instruction: str) -> int:
    """Tokens of new messages one add may hold at ``window`` (0: the window is too small)."""
    fixed = context.tokens.count_messages([{"role": "system", "content": instruction},
                                           {"role": "user", "content": SKELETON}])
    size = int((window - fixed) * ADD_SHARE)
    return size if size >= MIN_ADD_TOKENS else 0


# -- the extraction call -------------------------------------------------------------------
@functools.lru_cache(maxsize=8)  # mem0 sends the same instruction on every call
def condensed(instruction: str) -> str:
    """mem0's instruction cut to its ``KEPT_SECTIONS`` and its first worked example, before
    the output format (all of it when it has none of those sections). Without an example,
    Qwen2.5-0.5B copied the output format's placeholders back instead of extracting."""
    sections = re.split(r"\n(?=# )", instruction)
    kept = [s.strip() for s in sections
            if s.startswith("# ") and s[2:].split("\n", 1)[0].strip() in KEPT_SECTIONS]
    if not kept:
        return instruction.strip()
    examples = next((s for s in sections if s.startswith("# EXAMPLES")), "")
    first = re.split(r"\n(?=## )", examples)[1:2]
    if first:
        kept.insert(len(kept) - 1, "# EXAMPLE\n\n" + first[0].strip())
    return "\n\n".join(kept)


_EXAMPLE_TEXT = re.compile(r'"text":\s*"([^"]+)"')


@functools.lru_cache(maxsize=8)
def example_texts(instruction: str) -> frozenset[str]:
    """The placeholder ``text`` values of the output format shown in ``instruction``
    (mem0's "First extracted memory", ...): a reply that repeats one extracted nothing."""
    return frozenset(m.group(1).strip() for m in _EXAMPLE_TEXT.finditer(instruction))


EXTRACTION_SCHEMA = Schema("mem0_extraction", {
    "type": "object",
    "properties": {"memory": {"type": "array", "minItems": 1, "maxItems": 6, "items": {
        "type": "object",
        "properties": {"id": {"type": "string", "maxLength": 8},
                       "text": {"type": "string", "minLength": 1, "maxLength": 140},
                       "attributed_to": {"type": "string", "enum": ["user", "assistant"]},
                       "linked_memory_ids": {"type": "array", "maxItems": 2,
                                             "items": {"type": "string", "maxLength": 8}}},
        "required": ["id", "text", "attributed_to"], "additionalProperties": False}}},
    "required": ["memory"], "additionalProperties": False})
"""The output format of mem0's extraction instruction, as :func:`parse_extraction` reads it
(mem0 2.2.1: ``id``, ``text`` and ``attributed_to`` required, ``linked_memory_ids``
optional), with two changes that constrained decoding needs:

- at least one entry: allowed an empty list, the 0.5B default model answered every
  extraction of the `memory` and LoCoMo sweeps with ``{"memory": []}`` (well formed, and
  no memory at all). What is added is whole chat sessions, so there is always something
  to keep;
- bounded entries (6, of up to 140 characters), so that the longest reply the schema
  allows ends within ``EXTRACT_REPLY_TOKENS`` instead of being cut into a malformed one.
  The model fills the list, at about 3.45 characters a token: allowed 8 entries, 11 of
  its 26 extractions on LoCoMo ran into the 512-token limit and 10 were malformed.
"""


def parse_extraction(reply: str, placeholders: frozenset[str] = frozenset()
                     ) -> tuple[list[dict[str, str]], bool]:
    """The memory entries of an extraction ``reply``, and whether it was well formed (an
    object whose ``memory`` is a list of objects, each with a non-empty ``text`` that is
    not one of the prompt's ``placeholders``).

    A malformed reply still yields the entry objects found in it, e.g. the complete
    entries of a reply cut short at its token limit; a placeholder copied from the output
    format (small models do) is dropped, so it never becomes a memory."""
    for value in json_values(reply):
        if isinstance(value, dict) and isinstance(value.get("memory"), list):
            raw = value["memory"]
            entries = [e for e in map(_entry, raw) if e is not None]
            kept = [e for e in entries if e["text"] not in placeholders]
            return _numbered(kept), len(kept) == len(raw)
    entries = [e for e in map(_entry, json_values(reply))
               if e is not None and e["text"] not in placeholders]
    unique = list({e["text"]: e for e in entries}.values())
    return _numbered(unique), False


def _entry(raw: Any) -> dict[str, str] | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("text"), str):
        return None
    text = raw["text"].strip()
    if not text:
        return None
    entry = {"text": text}
    if raw.get("attributed_to") in ("user", "assistant"):
        entry["attributed_to"] = raw["attributed_to"]
    return entry


def _numbered(entries: list[dict[str, str]]) -> list[dict[str, str]]:
    return [{"id": str(i), **e} for i, e in enumerate(entries)]


@dataclass
class PromptParts:
    """mem0's extraction prompt as sections, to be fitted to the window."""

    summary: str  # the "## Summary" block, as mem0 wrote it
    last_lines: list[str]  # "## Last k Messages", line by line, oldest first
    recent: str  # "## Recently Extracted Memories" (JSON)
    existing: list[Any]  # "## Existing Memories", most similar first
    new: str  # "## New Messages", as mem0 rendered them
    tail: list[str]  # the blocks after the new messages, dates rewritten

    def text(self, existing: int, last: int, new: str | None = None) -> tuple[str, str]:
        """The prompt as ``ask`` takes it: the context (what may be cut), then the request
        (the new messages and what follows them)."""
        lines = self.last_lines[len(self.last_lines) - last:] if last else []
        context = [self.summary, "## Last k Messages\n" + "\n".join(lines),
                   "## Recently Extracted Memories\n" + self.recent,
                   "## Existing Memories\n" + json.dumps(self.existing[:existing],
                                                         ensure_ascii=False)]
        request = ["## New Messages\n" + (self.new if new is None else new), *self.tail]
        return "\n\n".join(context), "\n\n".join(request)


def prompt_parts(prompt: str, new: str, date: str) -> PromptParts | None:
    """``prompt`` (mem0's user message, whose new messages are ``new``) as sections, with
    ``date`` as its Observation Date ("" leaves it out) and no Current Date; None when it
    is not laid out as mem0 2.2.1 lays it out."""
    marker = f"\n\n## New Messages\n{new}\n\n"
    where = prompt.find(marker)
    if where < 0:
        return None
    before, after = prompt[:where], prompt[where + len(marker):]
    rest, found, existing_json = before.rpartition("\n\n## Existing Memories\n")
    rest, found_recent, recent = rest.rpartition("\n\n## Recently Extracted Memories\n")
    summary, found_last, last = rest.partition("\n\n## Last k Messages\n")
    try:
        existing = json.loads(existing_json)
    except ValueError:
        return None
    if not (found and found_recent and found_last) or not isinstance(existing, list):
        return None
    tail = [b for b in re.split(r"\n\n(?=#{1,2} )", after)
            if not b.startswith(("## Observation Date", "## Current Date"))]
    if date:
        tail.insert(0, f"## Observation Date\n{date}")
    lines = last.rstrip("\n").split("\n") if last.strip() else []
    return PromptParts(summary, lines, recent, existing, new, tail)


class Construction:
    """The auxiliary calls of one memory's construction: mem0's LLM answers through
    :meth:`respond`, each call held to the window W."""

    def __init__(self, context: StrategyContext, window: int, cost: Cost) -> None:
        self.context = context
        self.window = window
        self.cost = cost
        self.add = Add("")
        self.new = ""  # the current add's messages as mem0 renders them
        self.extracted = 0
        self.skipped_calls = 0
        self.error: BaseException | None = None

    def begin(self, add: Add, rendered: str) -> None:
        self.add, self.new = add, rendered

    def respond(self, messages: list[dict[str, Any]]) -> str:
        try:
            return self._respond(messages)
        except BaseException as exc:  # mem0 wraps it in its LLMError: kept to re-raise
            self.error = exc
            raise

    def _respond(self, messages: list[dict[str, Any]]) -> str:
        system = next((text_of(m) for m in messages if m.get("role") == "system"), "")
        user = text_of(messages[-1]) if messages else ""
        instruction = condensed(system)
        material, request = self.fit(instruction, user)
        reply = ask(self.context, "mem0", instruction, material, request, limit=self.window,
                    max_tokens=EXTRACT_REPLY_TOKENS, purpose=PURPOSE, cost=self.cost,
                    schema=EXTRACTION_SCHEMA)
        if reply is None:
            self.skipped_calls += 1
            return NO_MEMORIES
        entries, well_formed = parse_extraction(reply, example_texts(instruction))
        if not well_formed:
            failed(self.context, self.cost)
        self.extracted += len(entries)
        return json.dumps({"memory": entries}, ensure_ascii=False)

    def fit(self, instruction: str, prompt: str) -> tuple[str, str]:
        """mem0's prompt as (context, request) for ``ask``: the new messages whole (cut
        only if they alone overflow), then as many existing memories and last messages as
        fit in W, less ``FIT_SLACK`` (``ask`` cuts the context by a count of its own)."""
        parts = prompt_parts(prompt, self.new, self.add.date)
        if parts is None:
            return prompt, ""  # not mem0 2.2.1's layout: ask() cuts it from its end
        tokens = self.context.tokens
        limit = self.window - FIT_SLACK

        def excess(existing: int, last: int, new: str) -> int:
            content = "\n\n".join(parts.text(existing, last, new))
            return tokens.count_messages([{"role": "system", "content": instruction},
                                          {"role": "user", "content": content}]) - limit

        new = parts.new
        while new and (over := excess(0, 0, new)) > 0:
            new = clip(self.context, new, tokens.count_text(new) - over)
        existing = 0
        while existing < len(parts.existing) and excess(existing + 1, 0, new) <= 0:
            existing += 1
        last = 0
        while last < len(parts.last_lines) and excess(existing, last + 1, new) <= 0:
            last += 1
        return parts.text(existing, last, new)


# -- the memory ----------------------------------------------------------------------------
@dataclass
class Built:
    """One item's mem0 memory at window W; only searched once built (it may be shared)."""

    memory: Any  # mem0.Memory
    user_id: str
    window: int
    cost: Cost = field(default_factory=Cost)
    sessions: int = 0
    adds: int = 0
    add_tokens: int = 0
    extracted: int = 0
    skipped_calls: int = 0
    memories: int = 0
    events: Counter[str] = field(
        default_factory=lambda: Counter(dict.fromkeys(("ADD", "UPDATE", "DELETE", "NONE"), 0)))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def info(self) -> dict[str, Any]:
        return {**self.cost.info(), "sessions": self.sessions, "adds": self.adds,
                "add_tokens": self.add_tokens, "extracted": self.extracted,
                "skipped_calls": self.skipped_calls, "events": dict(self.events),
                "memories": self.memories}


MEMORIES: BuiltMemories[Built] = BuiltMemories()


class Mem0(HistoryStrategy):
    """mem0ai's memory built session by session through the auxiliary model; see above."""

    name = "mem0"
    requires = (Requirement("mem0", "mem0", "mem0ai"),)
    uses_embedder = True
    regimes = frozenset({Regime.AUXILIARY_MODEL, Regime.PERSISTENT_STATEFUL})
    declared_options = (MEM0_WINDOW, MEM0_ADD)

    def fit(self, head: list[Message], history: list[Message], query: list[Message],
            room: int, budget: int) -> list[Message]:
        tokens = self.context.tokens
        window = construction_window(
            budget, int(self.context.options.get("mem0_window", MEM0_WINDOW.default)))
        built, reused = self.memory(head, history, window)
        cost = Cost()
        started = time.perf_counter()
        hits = self.search(built, question_of(query_text(query)))
        packed = self.memory_lines(hits, int(room * MEMORY_SHARE))
        fixed = [memory_message(MEMORY_HEADER, "\n".join(packed))] if packed else []
        recent = newest_first(tokens, history)
        prompt = Packer(tokens, history).pack(head, query, recent, budget, fixed)
        cost.seconds = time.perf_counter() - started
        self.context.info["mem0"] = {
            "window": window,
            "library": f"mem0ai {backend().VERSION}",
            "construction": {**built.info(), "reused": reused},
            "query": {**cost.info(), "hits": len(hits), "packed": len(packed)},
        }
        return prompt

    # -- construction --------------------------------------------------------------------
    def memory(self, head: list[Message], history: list[Message], window: int
               ) -> tuple[Built, bool]:
        """The item's memory at ``window``, and whether it was built by an earlier cell."""
        mode = str(self.context.options.get("mem0_add", MEM0_ADD.default))
        key = MEMORIES.key(head, history, window, mode)
        return MEMORIES.get_or_build(
            key, lambda: self.build(history, window, key, packed=mode == "packed"))

    def build(self, history: list[Message], window: int, key: str, *, packed: bool) -> Built:
        """A fresh mem0 memory (its own store, database and user id), fed add by add."""
        library = backend(self.context.work_dir)
        started = time.perf_counter()
        embedder = self.context.embedder
        dimensions = len(embedder.embed(["mem0 embedding dimensions"])[0])
        built = Built(library.new_memory(f"budgetbench-{key[:24]}", dimensions),
                      user_id=f"item-{key[:24]}", window=window)
        construction = Construction(self.context, window, built.cost)
        built.add_tokens = add_size(self.context, window, condensed(library.EXTRACTION_PROMPT))
        adds, built.sessions = (plan_adds(self.context, history, built.add_tokens, packed)
                                if built.add_tokens else ([], 0))
        library.bind(built.memory, construction.respond, embedder.embed)
        try:
            for add in adds:
                construction.begin(add, library.rendered(add.messages))
                try:
                    result = built.memory.add(add.messages, user_id=built.user_id)
                except Exception:
                    if construction.error is not None:  # the run's own error, not mem0's
                        raise construction.error from None
                    raise
                built.adds += 1
                built.events.update(str(r.get("event")) for r in result.get("results", []))
            built.memories = len(built.memory.get_all(
                filters={"user_id": built.user_id}, top_k=1_000_000)["results"])
        finally:
            library.bind(built.memory, None, None)
        built.extracted = construction.extracted
        built.skipped_calls = construction.skipped_calls
        built.cost.seconds = time.perf_counter() - started
        return built

    # -- query time ----------------------------------------------------------------------
    def search(self, built: Built, question: str) -> list[str]:
        """mem0's memories for ``question``, best first (none for an empty memory)."""
        if not built.memories or not question.strip():
            return []
        library = backend()
        with built.lock:  # the memory may be shared by cells running at once
            library.bind(built.memory, None, self.context.embedder.embed)
            try:
                found = built.memory.search(question, filters={"user_id": built.user_id},
                                            top_k=SEARCH_TOP_K)
            finally:
                library.bind(built.memory, None, None)
        return [str(r["memory"]) for r in found.get("results", []) if r.get("memory")]

    def memory_lines(self, hits: list[str], limit: int) -> list[str]:
        """The hits, best first, as lines of a memory message of at most ``limit`` tokens
        (a hit too long for what is left is skipped); none when too little fits."""
        tokens = self.context.tokens
        if limit - tokens.count_message(memory_message(MEMORY_HEADER, "")) < MIN_MEMORY_TOKENS:
            return []
        lines: list[str] = []
        for hit in hits:
            trial = [*lines, f"- {hit}"]
            if tokens.count_message(memory_message(MEMORY_HEADER, "\n".join(trial))) <= limit:
                lines = trial
        return lines
