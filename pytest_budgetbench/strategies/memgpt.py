"""``memgpt``: a MemGPT-style memory hierarchy (Packer et al., 2023), written here (no Letta).

The history is streamed, message by message, into a simulated MemGPT whose context window
is ``W = min(budget, memgpt_window)`` tokens. Its main context is a fixed system block (the
task's system messages), core memory (blocks ``persona`` and ``human``, each limited to
``CORE_BLOCK_SHARE`` of W), the recursive summary, and the FIFO message queue:

- memory pressure: when the main context passes ``WARN_SHARE`` (70%) of W, the auxiliary
  model gets the paper's warning with core memory and the queue, and may call
  ``core_memory_append``, ``core_memory_replace`` and ``archival_memory_insert`` (purpose
  ``memgpt/core_edit``);
- eviction: past ``FLUSH_SHARE`` (100%) of W the oldest messages are evicted until the main
  context is at ``EVICT_SHARE`` (50%) of W; they go to recall storage, and the auxiliary
  model writes a new recursive summary from the previous one and the evicted messages
  (purpose ``memgpt/summarise``).

At query time the auxiliary model sees core memory, the summary and the question and calls
``archival_memory_search`` and ``conversation_search`` (purpose ``memgpt/search``; pages of
``PAGE_SIZE`` hits, ``page`` from 0). The prompt is the system messages; one system message
with core memory, the summary and the hits (at most ``MEMORY_SHARE`` of the room, in that
order of priority); the newest history packed into what is left (the FIFO tail); the query.
The shared packer holds it to the budget. A prompt that fits is sent unchanged with no
call: there is no memory pressure, so there is nothing to manage.

Function calls are JSON in the reply text, not OpenAI tool calls (small local servers
rarely support them): ``{"calls": [{"name": ..., "arguments": {...}}]}``, a bare list of
calls, or one call; code fences and prose around the JSON are tolerated. A reply with no
such JSON, or with a call that names no known function or lacks its arguments, counts as
one ``aux_failure`` on the row (degradation is per call, never per run): its valid calls
still run, the memory keeps what it had, and at query time the question itself is searched
instead. A summary reply is text (or JSON with a ``summary`` key); an empty one is a
failure and the previous summary stays.

Where this had to choose beyond the paper:

- W is the cell budget, capped by ``memgpt_window`` (default 2048): a budget is the
  context window MemGPT manages, so below the cap the memory depends on the budget and is
  built per budget; every budget at or above the cap reuses one memory built at the cap
  (cached in the process by the content of the item's messages and W, never by item id, so
  it cannot reach another item). Construction calls are held to W, so a reused memory never
  made a call larger than the reusing cell's budget; the calls are on the row of the cell
  that built it, and ``strategy_info.memgpt.construction`` on every row gives its cost and
  ``reused``.
- No heartbeats (no chained steps): each warning and each query is one call; searches the
  model asks for are run for the prompt but not shown back to the model, and searches asked
  for during construction are ignored.
- An edit that would overflow a core block, or replace text the block does not hold, is
  rejected (``rejected_edits``), as MemGPT returns an error to the model; not a failure.
- ``conversation_search`` ranks evicted messages by BM25 (MemGPT matches the query string,
  which a small model's queries rarely do verbatim); ``archival_memory_search`` ranks by the
  run's embedder in an in-memory chromadb collection (rag's :class:`ChunkStore`).
- The FIFO tail at query time is the newest history that fits beside the memory message,
  evicted or not: a budget larger than W buys more recent history.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_budgetbench.errors import Requirement
from pytest_budgetbench.messages import Message, Schema
from pytest_budgetbench.options import Option, positive_int
from pytest_budgetbench.strategies._chunking import newest_first
from pytest_budgetbench.strategies._memory_system import (
    BuiltMemories,
    Cost,
    ask,
    clip,
    construction_window,
    failed,
    json_values,
    memory_message,
    render,
)
from pytest_budgetbench.strategies._packing import HistoryStrategy, Packer, query_text
from pytest_budgetbench.strategies._scoring import bm25
from pytest_budgetbench.strategies.base import Regime
from pytest_budgetbench.strategies.budgetmem.pipeline import question_of
from pytest_budgetbench.strategies.rag import STORE

WARN_SHARE = 0.7  # the paper's memory-pressure warning
FLUSH_SHARE = 1.0  # the paper's flush
EVICT_SHARE = 0.5  # a flush evicts until the main context is at this share of W
CORE_BLOCK_SHARE = 0.1
CORE_BLOCK_MAX = 256  # tokens per core block at most
SUMMARY_SHARE = 0.15
SUMMARY_MAX = 256  # tokens of recursive summary at most
MEMORY_SHARE = 0.5  # of the query-time room, for the memory message
PAGE_SIZE = 5
MAX_SEARCHES = 3
EDIT_REPLY_TOKENS = 192
SEARCH_REPLY_TOKENS = 96
MIN_MEMORY_TOKENS = 8  # below this the memory message is noise
BLOCKS = ("persona", "human")

MEMGPT_WINDOW = Option(
    "memgpt_window",
    "the largest context window memgpt manages; budgets at or above it share one memory",
    positive_int,
    2048,
)

FUNCTIONS_BLOCK = (
    "You are MemGPT, the memory manager of a conversation with a user. Your main context "
    'holds core memory (blocks "persona" and "human", each of limited size), a recursive '
    "summary of evicted messages, and the newest messages. Functions:\n"
    "- core_memory_append(label, content): add a line to block persona or human.\n"
    "- core_memory_replace(label, old_content, new_content): replace text in a block.\n"
    "- archival_memory_insert(content): store a passage in archival memory.\n"
    f"- archival_memory_search(query, page): search archival memory, {PAGE_SIZE} results "
    "a page, page from 0.\n"
    "- conversation_search(query, page): search the evicted messages, pages alike.\n"
    'Reply with JSON only: {"calls": [{"name": "<function>", "arguments": {...}}]}. '
    'Reply {"calls": []} when nothing needs doing.'
)
PRESSURE_WARNING = (
    "System alert: memory pressure. The oldest messages above will soon be evicted from "
    "context. Save what matters about the user (names, places, dates, preferences, "
    "changes) with core_memory_append, core_memory_replace or archival_memory_insert."
)
SEARCH_REQUEST = (
    "Question to answer next: {question}\nCall archival_memory_search and/or "
    f"conversation_search to find what the answer needs (at most {MAX_SEARCHES} calls)."
)
SUMMARY_INSTRUCTION = (
    "Write the new recursive summary of a conversation: merge the previous summary with the "
    "evicted messages, oldest first. Keep every fact the user states about themselves, with "
    "its date if one is given. Be brief. No preamble."
)
MEMORY_HEADER = ("Memory (MemGPT): core memory, a summary of the evicted conversation, and "
                 "memories retrieved for the question.\n")

EDIT_ARGUMENTS = {
    "core_memory_append": ("label", "content"),
    "core_memory_replace": ("label", "old_content", "new_content"),
    "archival_memory_insert": ("content",),
}
SEARCH_ARGUMENTS = {"archival_memory_search": ("query",), "conversation_search": ("query",)}
FUNCTIONS = {**EDIT_ARGUMENTS, **SEARCH_ARGUMENTS}

Call = tuple[str, dict[str, Any]]


def _call_schema(name: str, arguments: tuple[str, ...]) -> dict[str, Any]:
    """One function call as :func:`_call` reads it: the name, and its string arguments
    (``label`` one of the blocks; a search's ``page`` a whole number, optional)."""
    properties: dict[str, Any] = {key: {"type": "string", "enum": list(BLOCKS)}
                                  if key == "label" else {"type": "string"}
                                  for key in arguments}
    if name in SEARCH_ARGUMENTS:
        properties["page"] = {"type": "integer", "minimum": 0}
    return {"type": "object",
            "properties": {"name": {"const": name},
                           "arguments": {"type": "object", "properties": properties,
                                         "required": list(arguments),
                                         "additionalProperties": False}},
            "required": ["name", "arguments"], "additionalProperties": False}


def _calls_schema(name: str, functions: Mapping[str, tuple[str, ...]],
                  most: int | None = None) -> Schema:
    """A reply of calls to ``functions`` (at most ``most``), as :func:`parse_calls` reads it."""
    calls: dict[str, Any] = {"type": "array", "items": {
        "anyOf": [_call_schema(n, args) for n, args in functions.items()]}}
    if most is not None:
        calls["maxItems"] = most
    return Schema(name, {"type": "object", "properties": {"calls": calls},
                         "required": ["calls"], "additionalProperties": False})


EDIT_SCHEMA = _calls_schema("memgpt_edits", EDIT_ARGUMENTS)
"""A reply to the memory-pressure warning: edits of core or archival memory (a search
then is ignored, so the schema offers none)."""
SEARCH_SCHEMA = _calls_schema("memgpt_searches", SEARCH_ARGUMENTS, MAX_SEARCHES)
"""A reply to the question: at most ``MAX_SEARCHES`` searches."""


# -- parsing replies ---------------------------------------------------------------------
def parse_calls(reply: str) -> tuple[list[Call], bool]:
    """The well-formed function calls of ``reply``, and whether the reply was well formed
    (JSON calls, each naming a known function with its string arguments)."""
    for value in json_values(reply):
        raw = _raw_calls(value)
        if raw is None:
            continue
        calls = [call for call in map(_call, raw) if call is not None]
        return calls, len(calls) == len(raw)
    return [], False


def _raw_calls(value: Any) -> list[Any] | None:
    if isinstance(value, dict) and isinstance(value.get("calls"), list):
        return list(value["calls"])
    if isinstance(value, dict) and "name" in value:
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return list(value)
    return None


def _call(raw: Any) -> Call | None:
    if not isinstance(raw, dict) or raw.get("name") not in FUNCTIONS:
        return None
    arguments = raw.get("arguments", raw.get("args", raw.get("parameters", {})))
    if isinstance(arguments, str):  # OpenAI's own convention: arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    name = str(raw["name"])
    if not all(isinstance(arguments.get(key), str) for key in FUNCTIONS[name]):
        return None
    if "label" in arguments and arguments["label"] not in BLOCKS:
        return None
    return name, arguments


def parse_summary(reply: str) -> str:
    """The summary in ``reply``: its text, or a JSON ``summary`` field; "" when none."""
    text = reply.strip()
    if text.startswith(("{", "```")):
        for value in json_values(text):
            if isinstance(value, dict) and isinstance(value.get("summary"), str):
                return str(value["summary"]).strip()
        return ""
    return text


# -- the memory ----------------------------------------------------------------------------
@dataclass
class Memory:
    """One item's MemGPT memory at window W; read-only once built (it may be shared)."""

    window: int
    core: dict[str, str] = field(default_factory=lambda: dict.fromkeys(BLOCKS, ""))
    summary: str = ""
    archival: list[str] = field(default_factory=list)
    recall: list[int] = field(default_factory=list)  # evicted history indices, oldest first
    queue: list[int] = field(default_factory=list)  # history indices still in context
    warnings: int = 0
    flushes: int = 0
    rejected_edits: int = 0
    cost: Cost = field(default_factory=Cost)

    def core_text(self) -> str:
        return "\n".join(f"[core memory: {b}]\n{self.core[b]}" for b in BLOCKS if self.core[b])

    def summary_text(self) -> str:
        return f"[summary of evicted messages]\n{self.summary}" if self.summary else ""


MEMORIES: BuiltMemories[Memory] = BuiltMemories()


class MemGPT(HistoryStrategy):
    """Core memory, recursive summary, archival and recall storage, FIFO tail; see above."""

    name = "memgpt"
    requires = (Requirement("chromadb", "memgpt"),)
    uses_embedder = True
    regimes = frozenset({Regime.AUXILIARY_MODEL, Regime.PERSISTENT_STATEFUL})
    declared_options = (MEMGPT_WINDOW,)

    def fit(self, head: list[Message], history: list[Message], query: list[Message],
            room: int, budget: int) -> list[Message]:
        tokens = self.context.tokens
        window = construction_window(
            budget, int(self.context.options.get("memgpt_window", MEMGPT_WINDOW.default)))
        memory, reused = self.memory(head, history, window)
        cost = Cost()
        started = time.perf_counter()
        hits = self.search(memory, history, question_of(query_text(query)), budget, cost)
        text = self.memory_text(memory, hits, int(room * MEMORY_SHARE))
        fixed = [memory_message(MEMORY_HEADER, text)] if text else []
        recent = newest_first(tokens, history)
        prompt = Packer(tokens, history).pack(head, query, recent, budget, fixed)
        cost.seconds = time.perf_counter() - started
        self.context.info["memgpt"] = {
            "window": window,
            "construction": {**memory.cost.info(), "reused": reused,
                             "warnings": memory.warnings, "flushes": memory.flushes,
                             "evicted": len(memory.recall), "archival": len(memory.archival),
                             "rejected_edits": memory.rejected_edits},
            "query": {**cost.info(), "hits": len(hits)},
        }
        return prompt

    # -- construction --------------------------------------------------------------------
    def memory(self, head: list[Message], history: list[Message], window: int
               ) -> tuple[Memory, bool]:
        """The item's memory at ``window``, and whether it was built by an earlier cell."""
        key = MEMORIES.key(head, history, window)
        return MEMORIES.get_or_build(key, lambda: self.build(head, history, window))

    def build(self, head: list[Message], history: list[Message], window: int) -> Memory:
        """Stream ``history`` through the FIFO queue, warning at 70% and flushing at 100%."""
        memory = Memory(window)
        started = time.perf_counter()
        warned = False
        for index in range(len(history)):
            memory.queue.append(index)
            if not warned and self._pressure(head, history, memory) > WARN_SHARE * window:
                self._warn(history, memory)
                warned = True
            if self._pressure(head, history, memory) > FLUSH_SHARE * window:
                self._flush(head, history, memory)
                warned = False
        memory.cost.seconds = time.perf_counter() - started
        return memory

    def _pressure(self, head: list[Message], history: list[Message], memory: Memory) -> int:
        context = "\n".join(t for t in (memory.core_text(), memory.summary_text()) if t)
        main = [*head, memory_message(MEMORY_HEADER, context), *(history[i] for i in memory.queue)]
        return self.context.tokens.count_messages(main)

    def _warn(self, history: list[Message], memory: Memory) -> None:
        memory.warnings += 1
        # Core memory first: a prompt cut to fit loses the newest messages, not the blocks.
        material = "\n\n".join(t for t in (memory.core_text(), memory.summary_text(),
                                           render([history[i] for i in memory.queue])) if t)
        reply = self.ask(FUNCTIONS_BLOCK, material, PRESSURE_WARNING, memory.window,
                         EDIT_REPLY_TOKENS, "memgpt/core_edit", memory.cost, EDIT_SCHEMA)
        if reply is None:
            return
        calls, well_formed = parse_calls(reply)
        if not well_formed:
            self._failed(memory.cost)
        for name, arguments in calls:
            self._edit(memory, name, arguments)

    def _edit(self, memory: Memory, name: str, arguments: dict[str, Any]) -> None:
        if name == "archival_memory_insert":
            if arguments["content"].strip():
                memory.archival.append(arguments["content"].strip())
            return
        if name not in EDIT_ARGUMENTS:
            return  # a search during construction: no heartbeat shows it back, so ignored
        label = arguments["label"]
        block = memory.core[label]
        if name == "core_memory_append":
            edited = f"{block}\n{arguments['content']}".strip()
        elif arguments["old_content"] and arguments["old_content"] in block:
            edited = block.replace(arguments["old_content"], arguments["new_content"], 1).strip()
        else:
            memory.rejected_edits += 1
            return
        if self.context.tokens.count_text(edited) > self._block_limit(memory.window):
            memory.rejected_edits += 1
            return
        memory.core[label] = edited

    def _flush(self, head: list[Message], history: list[Message], memory: Memory) -> None:
        memory.flushes += 1
        evicted: list[int] = []
        while memory.queue and self._pressure(head, history, memory) > EVICT_SHARE * memory.window:
            evicted.append(memory.queue.pop(0))
        memory.recall.extend(evicted)
        previous = memory.summary or "(none)"
        material = (f"Previous summary:\n{previous}\n\nEvicted messages:\n"
                    f"{render([history[i] for i in evicted])}")
        limit = min(SUMMARY_MAX, int(memory.window * SUMMARY_SHARE))
        reply = self.ask(SUMMARY_INSTRUCTION, material, "", memory.window, limit,
                         "memgpt/summarise", memory.cost)
        if reply is None:
            return
        summary = parse_summary(reply)
        if not summary:
            self._failed(memory.cost)
            return
        memory.summary = self._clip(summary, limit)

    @staticmethod
    def _block_limit(window: int) -> int:
        return min(CORE_BLOCK_MAX, int(window * CORE_BLOCK_SHARE))

    # -- query time ----------------------------------------------------------------------
    def search(self, memory: Memory, history: list[Message], question: str, budget: int,
               cost: Cost) -> list[str]:
        """The hits of the searches the model asks for (of the question itself when its
        reply is malformed or no call fits the budget), deduplicated, best first."""
        if not memory.recall and not memory.archival:
            return []
        material = "\n\n".join(t for t in (memory.core_text(), memory.summary_text()) if t)
        reply = self.ask(FUNCTIONS_BLOCK, material, SEARCH_REQUEST.format(question=question),
                         budget, SEARCH_REPLY_TOKENS, "memgpt/search", cost, SEARCH_SCHEMA)
        calls: list[Call] = []
        well_formed = False
        if reply is not None:
            calls, well_formed = parse_calls(reply)
            if not well_formed:
                self._failed(cost)
        searches = [c for c in calls if c[0] in SEARCH_ARGUMENTS][:MAX_SEARCHES]
        if not well_formed and not searches:
            searches = [("conversation_search", {"query": question}),
                        ("archival_memory_search", {"query": question})]
        hits: list[str] = []
        for name, arguments in searches:
            page = _page(arguments.get("page"))
            if name == "conversation_search":
                found = self.conversation_search(memory, history, arguments["query"], page)
            else:
                found = self.archival_memory_search(memory, arguments["query"], page)
            hits.extend(h for h in found if h not in hits)
        return hits

    def conversation_search(self, memory: Memory, history: list[Message], query: str,
                            page: int) -> list[str]:
        """One page of evicted messages by BM25 to ``query`` (ties: newest first)."""
        texts = [render([history[i]]) for i in memory.recall]
        scores = bm25(query, texts)
        order = sorted((i for i, s in enumerate(scores) if s > 0), key=lambda i: (-scores[i], -i))
        return [texts[i] for i in order[page * PAGE_SIZE : (page + 1) * PAGE_SIZE]]

    def archival_memory_search(self, memory: Memory, query: str, page: int) -> list[str]:
        """One page of archival passages nearest to ``query`` by the run's embedder."""
        texts = memory.archival
        if not texts or not query.strip():
            return []
        embedder = self.context.embedder
        vectors = embedder.embed([*texts, query])
        collection = STORE.collection(embedder.name, texts, vectors[:-1])
        order = STORE.nearest(collection, vectors[-1], len(texts))
        return [texts[i] for i in order[page * PAGE_SIZE : (page + 1) * PAGE_SIZE]]

    def memory_text(self, memory: Memory, hits: list[str], limit: int) -> str:
        """Core memory, summary and hits, in that priority, cut so that the memory message
        takes at most ``limit`` tokens; "" when too little fits to be worth sending."""
        retrieved = "[retrieved memories]\n" + "\n".join(f"- {h}" for h in hits) if hits else ""
        text = "\n".join(t for t in (memory.core_text(), memory.summary_text(), retrieved) if t)
        tokens = self.context.tokens
        room = limit - tokens.count_message(memory_message(MEMORY_HEADER, ""))
        if not text or room < MIN_MEMORY_TOKENS:
            return ""
        text = self._clip(text, room)
        while text and tokens.count_message(memory_message(MEMORY_HEADER, text)) > limit:
            text = self._clip(text, tokens.count_text(text) - 1)
        return text

    # -- the auxiliary model -------------------------------------------------------------
    def ask(self, instruction: str, material: str, request: str, limit: int, max_tokens: int,
            purpose: str, cost: Cost, schema: Schema | None = None) -> str | None:
        return ask(self.context, self.name, instruction, material, request, limit=limit,
                   max_tokens=max_tokens, purpose=purpose, cost=cost, schema=schema)

    def _failed(self, cost: Cost) -> None:
        failed(self.context, cost)

    def _clip(self, text: str, limit: int) -> str:
        return clip(self.context, text, limit)


def _page(raw: Any) -> int:
    """A search's ``page`` argument (0 when absent or not a whole number >= 0)."""
    try:
        return max(0, int(raw))
    except (TypeError, ValueError):
        return 0
