"""``amem``: A-MEM's agentic memory (Xu et al., 2025, "A-MEM: Agentic Memory for LLM
Agents"), written here after the paper, with the prompts of the ``a-mem`` package.

**Why not the package.** ``a-mem`` 0.2.6 (module ``agentic_memory``, a packaged fork of
agiresearch/A-mem) cannot be driven offline with the run's auxiliary model and embedder
without copying it, so this module follows the paper and sends the package's two prompt
texts verbatim (``AgenticMemorySystem.analyze_content`` and
``AgenticMemorySystem._evolution_system_prompt``, de-indented; a test pins them to the
installed package's source, read with ``ast``, never imported). What stands in the way:

- importing ``agentic_memory.llm_controller`` or ``.memory_system`` imports ``litellm``,
  which at import fetches its model-cost map from GitHub unless an environment variable
  (``LITELLM_LOCAL_MODEL_COST_MAP``) is set for the whole process; ``memory_system`` also
  imports transformers, sentence-transformers, scikit-learn and nltk at its top;
- ``AgenticMemorySystem.__init__`` hard-codes ``ChromaRetriever``, i.e.
  ``chromadb.PersistentClient(storage_path)`` (``./chroma_db`` by default: on disk) with
  ``SentenceTransformerEmbeddingFunction('all-MiniLM-L6-v2')`` (a hub download), and an
  ``LLMController`` (for "openai" an OpenAI client that needs ``OPENAI_API_KEY``); the
  evolution prompt exists only as an attribute that ``__init__`` sets, so a subclass can
  neither run ``__init__`` offline nor skip it without copying it;
- its prompts cannot be held to a window: ``process_memory`` formats the whole evolution
  prompt (the note and k=5 neighbours with their full content, k hard-coded) with the
  format instructions after the material, so a controller given the finished string could
  only cut it blindly;
- failures cannot be counted: ``analyze_content`` catches every exception (prints, returns
  defaults) and ``process_memory`` catches everything (logs, returns no evolution), after a
  strict ``json.loads`` that the evolution template's own ``"should_evolve": True or
  False`` and trailing comma make a small model fail;
- ``search_agentic`` appends the linked neighbours and then returns ``memories[:k]``, so
  with k hits the neighbours never arrive; note ids (uuid4) and times (``datetime.now()``)
  in the prompts would make every run's auxiliary prompts differ (no cache hits).

**Construction** (per item, cached; purposes ``amem/note`` and ``amem/evolve``). The history
is cut into notes of consecutive turns, at most ``amem_note_tokens`` (default 768) tokens
of messages each (whole messages grouped; a longer message is cut at sentence ends), oldest
first; one note per turn (the paper) would cost ~800 auxiliary calls per LoCoMo
conversation. For each note, in order:

1. note construction, one call: the package's analysis prompt over the note's text
   (``role: text`` lines) gives its ``keywords``, ``context`` (one sentence) and ``tags``;
2. link generation and memory evolution, one call (none for the first note): the package's
   evolution prompt with the note and its ``EVOLVE_NEIGHBOURS`` (5, the package's k)
   nearest earlier notes. ``should_evolve`` with action ``strengthen`` links the note to
   the ``suggested_connections`` (ids of the neighbours shown; others are rejected) and
   sets its tags to ``tags_to_update``; ``update_neighbor`` sets each shown neighbour's
   context and tags from ``new_context_neighborhood`` / ``new_tags_neighborhood``, in
   order. An empty value leaves a field as it was.

Expected calls at the default: 2 per note less one, so a LoCoMo conversation (~14-19k
tokens of history) makes ~24-35 notes and ~47-69 calls per construction window, shared by
all of its questions (their histories are identical); a ``memory`` item (~2-3k tokens) makes
3-4 notes and 5-7 calls. No call at query time.

**Query time.** The question (``question_of`` the final user message) is embedded and the
``amem_top_k`` (3) nearest notes are retrieved from an in-memory chromadb collection of the
notes (rag's :data:`STORE`, the run's embedder), then the notes linked to them, at most as
many again (the paper's linked "box"; links count in both directions). They go, best first,
into one system message after the system messages, each as its context, keywords and tags
and then its text, at most ``MEMORY_SHARE`` (3/4) of the room; the room is shared out note by
note (a note's text is cut from its end to its share, and a short note leaves its share to
the next; a share too small for text leaves the note out). The newest history follows in
what remains, as in memgpt (chunks inside a note shown whole are not repeated), then the
query; the shared packer holds the prompt to the budget. A prompt that fits is sent
unchanged with no construction: there is nothing to remember.

**Window and reuse.** Every construction prompt is held to ``W = min(budget, amem_window)``
(default 2048) tokens: a note's text is cut from its end to fit the analysis prompt, and in
the evolution prompt the note and each neighbour get an equal share of the room (fewer
neighbours when even that does not fit; no call when the prompt alone does not fit,
``unfit_calls``: the evolution prompt is ~480 tokens, so below a window of ~550 notes are
analysed but neither linked nor evolved). The memory is cached in the process by the
content of the item's messages, W and ``amem_note_tokens`` (:class:`BuiltMemories`, never by
item id), so every budget at or above the window reuses one memory and each lower budget
builds its own; the calls are on the row of the cell that built it, and
``strategy_info.amem.construction`` on every row gives its cost, counts and ``reused``;
``strategy_info.amem.query`` gives the query-time cost and the notes shown.

**Isolation (persistent-stateful).** A memory belongs to the content it was built from: one
item's notes live in its own :class:`Memory`, the construction-time neighbour search scans
only that memory, and the query-time chromadb collection is keyed by the hash of its notes'
texts, so nothing built for one item can reach another's prompts.

**Degradation.** A reply is parsed leniently (code fences, prose around the JSON, Python's
``True``/``False``, trailing commas). An analysis reply without ``keywords``, ``context`` and
``tags`` of the right types, or an evolution reply without a boolean ``should_evolve`` (and,
when it evolves, known ``actions`` whose fields have the right types), is one
``aux_failure``: the fields it does have are used, the note keeps the package's defaults
(context "General", no keywords or tags) for the rest, and construction goes on.

Where this had to choose beyond the paper and the package:

- What is embedded is a note's context, keywords and tags first, then its text (the package
  puts the text first): the run's MiniLM reads 256 word pieces, which a grouped note
  exceeds, and the metadata the auxiliary model wrote is what A-MEM's retrieval is for.
- The construction-time neighbour search is an exact cosine scan over the notes so far (the
  run's embedder, vectors cached per note text): a chromadb collection per note would churn
  rag's shared collection cache for a few dozen vectors.
- The neighbour lines of the evolution prompt are the package's (``memory_id:``, content,
  context, keywords, tags) without its "talk start time": the history carries no times
  (LoCoMo writes each session's date at the head of its messages, so it is in the text).
  Note ids are the notes' positions ("0", "1", ...), so prompts are the same on every run.
- At query time no auxiliary call is made (A-MEM retrieves by embedding alone); the question
  itself is the query.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_budgetbench.errors import Requirement
from pytest_budgetbench.messages import Message, Schema, text_of
from pytest_budgetbench.options import Option, positive_int
from pytest_budgetbench.strategies._chunking import Piece, chunk_history, newest_first, piece_text
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
from pytest_budgetbench.strategies.base import Regime
from pytest_budgetbench.strategies.budgetmem.pipeline import question_of
from pytest_budgetbench.strategies.rag import STORE, unit_vector

EVOLVE_NEIGHBOURS = 5  # the package's find_related_memories(k=5)
NOTE_REPLY_TOKENS = 160
EVOLVE_REPLY_TOKENS = 320  # contexts and tags for up to five neighbours
MIN_CONTENT_TOKENS = 24  # a note cut below this in a construction prompt says nothing
MEMORY_SHARE = 0.75  # of the query-time room, for the retrieved notes
MIN_NOTE_TOKENS = 32  # of a note's text at query time, or the note is left out
DEFAULT_CONTEXT = "General"  # the package's context of a note never analysed
ACTIONS = ("strengthen", "update_neighbor")

AMEM_WINDOW = Option(
    "amem_window",
    "the largest prompt amem's construction sends; budgets at or above it share one memory",
    positive_int,
    2048,
)
AMEM_NOTE_TOKENS = Option(
    "amem_note_tokens",
    "tokens of consecutive history one amem note covers (one analysis and one evolution "
    "call per note; a LoCoMo conversation makes ~24-35 notes at the default)",
    positive_int,
    768,
)
AMEM_TOP_K = Option(
    "amem_top_k",
    "notes amem retrieves by embedding per question; as many linked notes may join them",
    positive_int,
    3,
)

# The package's controllers send this system message before every prompt.
JSON_SYSTEM = "You must respond with a JSON object."

# agentic_memory.memory_system: AgenticMemorySystem.analyze_content (the note's text follows).
NOTE_PROMPT = (
    "Generate a structured analysis of the following content by:\n"
    "1. Identifying the most salient keywords (focus on nouns, verbs, and key concepts)\n"
    "2. Extracting core themes and contextual elements\n"
    "3. Creating relevant categorical tags\n"
    "\n"
    "Format the response as a JSON object:\n"
    "{\n"
    '    "keywords": [\n'
    "        // several specific, distinct keywords that capture key concepts and "
    "terminology\n"
    "        // Order from most to least important\n"
    "        // Don't include keywords that are the name of the speaker or time\n"
    "        // At least three keywords, but don't be too redundant.\n"
    "    ],\n"
    '    "context": \n'
    "        // one sentence summarizing:\n"
    "        // - Main topic/domain\n"
    "        // - Key arguments/points\n"
    "        // - Intended audience/purpose\n"
    "    ,\n"
    '    "tags": [\n'
    "        // several broad categories/themes for classification\n"
    "        // Include domain, format, and type tags\n"
    "        // At least three tags, but don't be too redundant.\n"
    "    ]\n"
    "}\n"
    "\n"
    "Content for analysis:"
)
# agentic_memory.memory_system: AgenticMemorySystem.__init__, _evolution_system_prompt.
EVOLUTION_PROMPT = (
    "You are an AI memory evolution agent responsible for managing and evolving a "
    "knowledge base.\n"
    "Analyze the the new memory note according to keywords and context, also with "
    "their several nearest neighbors memory.\n"
    "Make decisions about its evolution.\n"
    "\n"
    "The new memory context:\n"
    "{context}\n"
    "content: {content}\n"
    "keywords: {keywords}\n"
    "\n"
    "The nearest neighbors memories (each line starts with memory_id):\n"
    "{nearest_neighbors_memories}\n"
    "\n"
    "Based on this information, determine:\n"
    "1. Should this memory be evolved? Consider its relationships with other memories.\n"
    "2. What specific actions should be taken (strengthen, update_neighbor)?\n"
    "   2.1 If choose to strengthen the connection, which memory should it be "
    "connected to? Use the memory_id from the neighbors above. Can you give the "
    "updated tags of this memory?\n"
    "   2.2 If choose to update_neighbor, you can update the context and tags of "
    "these memories based on the understanding of these memories. If the context and "
    "the tags are not updated, the new context and tags should be the same as the "
    "original ones. Generate the new context and tags in the sequential order of the "
    "input neighbors.\n"
    "Tags should be determined by the content of these characteristic of these "
    "memories, which can be used to retrieve them later and categorize them.\n"
    "Note that the length of new_tags_neighborhood must equal the number of input "
    "neighbors, and the length of new_context_neighborhood must equal the number of "
    "input neighbors.\n"
    "The number of neighbors is {neighbor_number}.\n"
    "Return your decision in JSON format with the following structure:\n"
    "{{\n"
    '    "should_evolve": True or False,\n'
    '    "actions": ["strengthen", "update_neighbor"],\n'
    '    "suggested_connections": ["memory_id_1", "memory_id_2", ...],\n'
    '    "tags_to_update": ["tag_1",..."tag_n"],\n'
    '    "new_context_neighborhood": ["new context",...,"new context"],\n'
    '    "new_tags_neighborhood": [["tag_1",...,"tag_n"],...["tag_1",...,"tag_n"]],\n'
    "}}"
)
MEMORY_HEADER = ("Memory (A-MEM): notes of the conversation retrieved for the question, and "
                 "the notes linked to them, each with its context, keywords and tags.\n")


# -- the memory ----------------------------------------------------------------------------
@dataclass
class Note:
    """One A-MEM note: a run of consecutive history, with what the auxiliary model wrote."""

    id: str
    pieces: list[Piece]  # the spans of history it covers
    content: str
    keywords: list[str] = field(default_factory=list)
    context: str = DEFAULT_CONTEXT
    tags: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)

    def metadata(self) -> str:
        return (f"context: {self.context}\nkeywords: {', '.join(self.keywords)}\n"
                f"tags: {', '.join(self.tags)}")

    def embedded(self) -> str:
        """What retrieval embeds: the metadata first (see the module docstring)."""
        return f"{self.metadata()}\n{self.content}"

    def neighbour_line(self, content: str) -> str:
        """The package's line for a neighbour in the evolution prompt (no time)."""
        return (f"memory_id:{self.id}\tmemory content: {content}\tmemory context: "
                f"{self.context}\tmemory keywords: {self.keywords!s}\tmemory tags: "
                f"{self.tags!s}")

    def covers(self, piece: Piece) -> bool:
        return any(p.msg == piece.msg and p.start <= piece.start and piece.end <= p.end
                   for p in self.pieces)


@dataclass
class Memory:
    """One item's notes at window W; read-only once built (it may be shared)."""

    window: int
    notes: list[Note] = field(default_factory=list)
    evolutions: int = 0
    links: int = 0
    neighbour_updates: int = 0
    rejected_links: int = 0
    unfit_calls: int = 0
    cost: Cost = field(default_factory=Cost)
    vectors: dict[str, list[float]] = field(default_factory=dict, repr=False)
    """Unit vectors by embedded text (the run's embedder); every final note's is here."""

    def note(self, note_id: str) -> Note | None:
        return next((n for n in self.notes if n.id == note_id), None)

    def linked(self, note: Note) -> list[Note]:
        """The notes ``note`` links to, then those that link to it (a box has no direction)."""
        outgoing = [n for n in map(self.note, note.links) if n is not None]
        incoming = [n for n in self.notes if note.id in n.links and n not in outgoing]
        return outgoing + incoming

    def info(self) -> dict[str, Any]:
        return {**self.cost.info(), "notes": len(self.notes), "links": self.links,
                "evolutions": self.evolutions, "neighbour_updates": self.neighbour_updates,
                "rejected_links": self.rejected_links, "unfit_calls": self.unfit_calls}


MEMORIES: BuiltMemories[Memory] = BuiltMemories()


# -- parsing replies -----------------------------------------------------------------------
NOTE_FIELDS = ("keywords", "context", "tags")


def _strings_schema(items: int, chars: int) -> dict[str, Any]:
    return {"type": "array", "maxItems": items,
            "items": {"type": "string", "maxLength": chars}}


# The bounds make a reply that follows the schema end within its token limit
# (NOTE_REPLY_TOKENS, EVOLVE_REPLY_TOKENS): with none, the 0.5B default model filled
# contexts and tag lists until the limit cut the reply (2 of 16 notes and 6 of 8
# evolutions of the `memory` sweep, each a malformed reply). At ~4 characters a token:
# note ~5x7 + 50 + 5x7 tokens; evolution ~5x5 + 5x7 + 5x22 + 5x2x7 tokens, plus JSON.
_TERMS = _strings_schema(5, 32)
NOTE_SCHEMA = Schema("amem_note", {
    "type": "object",
    "properties": {"keywords": _TERMS, "context": {"type": "string", "maxLength": 200},
                   "tags": _TERMS},
    "required": list(NOTE_FIELDS), "additionalProperties": False})
"""An analysis reply as :func:`parse_note` reads it (the package's own schema for it)."""


def parse_note(reply: str) -> tuple[dict[str, Any], bool]:
    """The usable fields of an analysis reply (``keywords``, ``context``, ``tags``), and
    whether the reply was well formed (all three, of the right types)."""
    for value in json_values(reply, lenient=True):
        if not isinstance(value, dict) or not any(k in value for k in NOTE_FIELDS):
            continue
        fields: dict[str, Any] = {}
        for key in ("keywords", "tags"):
            strings = _strings(value.get(key))
            if strings is not None:
                fields[key] = strings
        context = value.get("context")
        if isinstance(context, str):
            fields["context"] = context.strip()
        return fields, len(fields) == len(NOTE_FIELDS)
    return {}, False


@dataclass(frozen=True)
class Evolution:
    """What an evolution reply asks for; None fields were missing or of the wrong type."""

    should_evolve: bool
    strengthen: bool = False
    connections: tuple[str, ...] = ()
    tags: tuple[str, ...] | None = None
    update_neighbours: bool = False
    contexts: tuple[str | None, ...] = ()
    neighbour_tags: tuple[tuple[str, ...] | None, ...] = ()


EVOLUTION_SCHEMA = Schema("amem_evolution", {
    "type": "object",
    "properties": {
        "should_evolve": {"type": "boolean"},
        "actions": {"type": "array", "maxItems": len(ACTIONS),
                    "items": {"type": "string", "enum": list(ACTIONS)}},
        "suggested_connections": _strings_schema(EVOLVE_NEIGHBOURS, 16),
        "tags_to_update": _strings_schema(5, 24),
        "new_context_neighborhood": _strings_schema(EVOLVE_NEIGHBOURS, 80),
        "new_tags_neighborhood": {"type": "array", "maxItems": EVOLVE_NEIGHBOURS,
                                  "items": _strings_schema(2, 24)},
    },
    "required": ["should_evolve", "actions", "suggested_connections", "tags_to_update",
                 "new_context_neighborhood", "new_tags_neighborhood"],
    "additionalProperties": False})
"""An evolution reply as :func:`parse_evolution` reads it (the package's own schema for
it: every field required)."""


def parse_evolution(reply: str) -> tuple[Evolution | None, bool]:
    """The evolution an evolution reply asks for (None without a boolean ``should_evolve``),
    and whether the reply was well formed: known actions, each with its fields typed."""
    for value in json_values(reply, lenient=True):
        if not isinstance(value, dict) or "should_evolve" not in value:
            continue
        if not isinstance(value["should_evolve"], bool):
            return None, False
        if not value["should_evolve"]:
            return Evolution(False), True
        actions = value.get("actions")
        if not isinstance(actions, list):
            return Evolution(True), False
        well_formed = all(a in ACTIONS for a in actions)
        strengthen = "strengthen" in actions
        update = "update_neighbor" in actions
        connections = _ids(value.get("suggested_connections")) if strengthen else ()
        tags = _strings(value.get("tags_to_update")) if strengthen else None
        contexts = value.get("new_context_neighborhood") if update else []
        neighbour_tags = value.get("new_tags_neighborhood") if update else []
        if strengthen and (connections is None or tags is None):
            well_formed = False
        if update and not (isinstance(contexts, list) and isinstance(neighbour_tags, list)):
            well_formed = False
        contexts = contexts if isinstance(contexts, list) else []
        neighbour_tags = neighbour_tags if isinstance(neighbour_tags, list) else []
        context_values = tuple(c.strip() if isinstance(c, str) else None for c in contexts)
        tag_values = tuple(_tuple(_strings(t)) for t in neighbour_tags)
        if None in context_values or None in tag_values:
            well_formed = False
        return Evolution(True, strengthen, connections or (), _tuple(tags), update,
                         context_values, tag_values), well_formed
    return None, False


def _strings(value: Any) -> list[str] | None:
    """A list of strings, stripped and without empty ones; None for anything else."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None
    return [v.strip() for v in value if v.strip()]


def _tuple(values: list[str] | None) -> tuple[str, ...] | None:
    return None if values is None else tuple(values)


def _ids(value: Any) -> tuple[str, ...] | None:
    """Note ids as the model wrote them (strings or numbers, with or without the line's
    ``memory_id:`` label); None when not a list of them."""
    if not isinstance(value, list) or not all(
        isinstance(v, str | int) and not isinstance(v, bool) for v in value
    ):
        return None
    return tuple(str(v).strip().removeprefix("memory_id:").strip() for v in value)


# -- the strategy --------------------------------------------------------------------------
class AMem(HistoryStrategy):
    """A-MEM notes (keywords, context, tags, links, evolution), retrieved with their
    linked notes; see the module docstring."""

    name = "amem"
    requires = (Requirement("chromadb", "amem"),)
    uses_embedder = True
    regimes = frozenset({Regime.AUXILIARY_MODEL, Regime.PERSISTENT_STATEFUL})
    declared_options = (AMEM_WINDOW, AMEM_NOTE_TOKENS, AMEM_TOP_K)

    def fit(self, head: list[Message], history: list[Message], query: list[Message],
            room: int, budget: int) -> list[Message]:
        tokens = self.context.tokens
        window = construction_window(budget, self._option(AMEM_WINDOW))
        note_tokens = self._option(AMEM_NOTE_TOKENS)
        top_k = self._option(AMEM_TOP_K)
        memory, reused = self.memory(head, history, window, note_tokens)
        cost = Cost()
        started = time.perf_counter()
        hits, neighbours = self.retrieve(memory, question_of(query_text(query)), top_k)
        text, shown, whole = self.memory_text([*hits, *neighbours], int(room * MEMORY_SHARE))
        fixed = [memory_message(MEMORY_HEADER, text)] if text else []
        recent = [
            p for p in newest_first(tokens, history)
            if not any(note.covers(p) for note in whole)
        ]
        prompt = Packer(tokens, history).pack(head, query, recent, budget, fixed)
        cost.seconds = time.perf_counter() - started
        self.context.info["amem"] = {
            "window": window,
            "note_tokens": note_tokens,
            "construction": {**memory.info(), "reused": reused},
            "query": {**cost.info(), "hits": len(hits), "neighbours": len(neighbours),
                      "shown": [n.id for n in shown], "shown_whole": len(whole)},
        }
        return prompt

    def _option(self, option: Option) -> int:
        return int(self.context.options.get(option.key, option.default))

    # -- construction --------------------------------------------------------------------
    def memory(self, head: list[Message], history: list[Message], window: int,
               note_tokens: int) -> tuple[Memory, bool]:
        """The item's memory at ``window``, and whether it was built by an earlier cell."""
        key = MEMORIES.key(head, history, window, note_tokens)
        return MEMORIES.get_or_build(key, lambda: self.build(history, window, note_tokens))

    def build(self, history: list[Message], window: int, note_tokens: int) -> Memory:
        """Each note analysed, then evolved against its nearest earlier notes, in order."""
        memory = Memory(window)
        started = time.perf_counter()
        texts = [text_of(m) for m in history]
        for index, pieces in enumerate(self.note_pieces(history, note_tokens)):
            lines = [{"role": history[p.msg].get("role"), "content": piece_text(texts, p)}
                     for p in pieces]
            note = Note(str(index), pieces, render(lines))
            self._analyse(memory, note)
            self._evolve(memory, note)
            memory.notes.append(note)
        self._vectors(memory, memory.notes)  # the final texts, for query time to read
        memory.cost.seconds = time.perf_counter() - started
        return memory

    def note_pieces(self, history: list[Message], note_tokens: int) -> list[list[Piece]]:
        """The history in runs of consecutive pieces of at most ``note_tokens`` tokens."""
        groups: list[list[Piece]] = []
        size = 0
        for piece in chunk_history(self.context.tokens, history, note_tokens):
            if not groups or size + piece.tokens > note_tokens:
                groups.append([])
                size = 0
            groups[-1].append(piece)
            size += piece.tokens
        return groups

    def _analyse(self, memory: Memory, note: Note) -> None:
        prompt = self._fitted(lambda share: f"{NOTE_PROMPT}\n{self._clip(note.content, share)}",
                              1, memory.window)
        reply = self._ask(prompt, memory, NOTE_REPLY_TOKENS, "amem/note", NOTE_SCHEMA)
        if reply is None:
            return
        fields, well_formed = parse_note(reply)
        if not well_formed:
            self._failed(memory.cost)
        note.keywords = fields.get("keywords") or note.keywords
        note.context = fields.get("context") or note.context
        note.tags = fields.get("tags") or note.tags

    def _evolve(self, memory: Memory, note: Note) -> None:
        if not memory.notes:
            return  # the package evolves nothing into an empty memory
        neighbours = self.nearest(memory, note, EVOLVE_NEIGHBOURS)
        prompt: str | None = None
        while neighbours and prompt is None:
            prompt = self._evolution_prompt(note, neighbours, memory.window)
            if prompt is None:
                neighbours = neighbours[:-1]  # the farthest goes first
        reply = self._ask(prompt, memory, EVOLVE_REPLY_TOKENS, "amem/evolve",
                          EVOLUTION_SCHEMA)
        if reply is None:
            return
        evolution, well_formed = parse_evolution(reply)
        if not well_formed:
            self._failed(memory.cost)
        if evolution is None or not evolution.should_evolve:
            return
        memory.evolutions += 1
        if evolution.strengthen:
            shown = {n.id for n in neighbours}
            for target in evolution.connections:
                if target in shown and target not in note.links:
                    note.links.append(target)
                    memory.links += 1
                else:
                    memory.rejected_links += 1
            note.tags = list(evolution.tags or note.tags)
        if evolution.update_neighbours:
            for neighbour, context, tags in zip(
                neighbours, _padded(evolution.contexts, len(neighbours)),
                _padded(evolution.neighbour_tags, len(neighbours)), strict=True
            ):
                updated = (context or neighbour.context, list(tags or neighbour.tags))
                if updated != (neighbour.context, neighbour.tags):
                    neighbour.context, neighbour.tags = updated
                    memory.neighbour_updates += 1

    def _evolution_prompt(self, note: Note, neighbours: list[Note], window: int) -> str | None:
        def render_with(share: int) -> str:
            lines = "\n".join(n.neighbour_line(self._clip(n.content, share)) for n in neighbours)
            return EVOLUTION_PROMPT.format(
                context=note.context, content=self._clip(note.content, share),
                keywords=note.keywords, nearest_neighbors_memories=lines,
                neighbor_number=len(neighbours))

        return self._fitted(render_with, len(neighbours) + 1, window)

    def nearest(self, memory: Memory, note: Note, count: int) -> list[Note]:
        """The ``count`` earlier notes nearest to ``note`` by cosine (ties: older first)."""
        vectors = self._vectors(memory, [*memory.notes, note])
        query = vectors[-1]
        scores = [sum(a * b for a, b in zip(v, query, strict=True)) for v in vectors[:-1]]
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
        return [memory.notes[i] for i in order[:count]]

    def _vectors(self, memory: Memory, notes: Sequence[Note]) -> list[list[float]]:
        """Unit vectors of the notes' embedded texts, each text embedded once per memory."""
        texts = [n.embedded() for n in notes]
        missing = list(dict.fromkeys(t for t in texts if t not in memory.vectors))
        if missing:
            for text, vector in zip(missing, self.context.embedder.embed(missing), strict=True):
                memory.vectors[text] = unit_vector(vector)
        return [memory.vectors[t] for t in texts]

    # -- query time ----------------------------------------------------------------------
    def retrieve(self, memory: Memory, question: str, top_k: int
                 ) -> tuple[list[Note], list[Note]]:
        """The ``top_k`` notes nearest to ``question``, and at most as many notes linked to
        them (in the order of the hits) that are not hits themselves."""
        notes = memory.notes
        if not notes or not question.strip():
            return [], []
        texts = [n.embedded() for n in notes]
        embedder = self.context.embedder
        collection = STORE.collection(embedder.name, texts, [memory.vectors[t] for t in texts])
        (vector,) = embedder.embed([question])
        hits = [notes[i] for i in STORE.nearest(collection, vector, len(texts))[:top_k]]
        taken = {n.id for n in hits}
        neighbours: list[Note] = []
        for hit in hits:
            for linked in memory.linked(hit):
                if len(neighbours) < top_k and linked.id not in taken:
                    neighbours.append(linked)
                    taken.add(linked.id)
        return hits, neighbours

    def memory_text(self, notes: list[Note], limit: int
                    ) -> tuple[str, list[Note], list[Note]]:
        """The notes, best first, in at most ``limit`` tokens of memory message; with the
        notes shown and those shown whole. The room is shared note by note: a note's text
        is cut to its share, and what a short note leaves goes to the next."""
        tokens = self.context.tokens
        room = limit - tokens.count_message(memory_message(MEMORY_HEADER, ""))
        parts: list[str] = []
        shown: list[Note] = []
        for index, note in enumerate(notes):
            share = room // (len(notes) - index)
            label = f"[note {note.id}] {note.metadata()}\n"
            content = self._clip(note.content, share - tokens.count_text(label) - 1)
            if tokens.count_text(content) < min(MIN_NOTE_TOKENS,
                                                tokens.count_text(note.content)):
                continue  # too little of it fits to be worth its label
            part = label + content
            parts.append(part)
            shown.append(note)
            room -= tokens.count_text(part) + 1
        text = "\n\n".join(parts)
        counted = tokens.count_message(memory_message(MEMORY_HEADER, text))
        while text and counted > limit:
            # Joined text can cost a token or two more than its parts: cut the excess.
            text = self._clip(text, tokens.count_text(text) - (counted - limit))
            counted = tokens.count_message(memory_message(MEMORY_HEADER, text))
        if not text:
            return "", [], []
        whole = [n for n in shown if f"{n.metadata()}\n{n.content}" in text]
        return text, shown, whole

    # -- the auxiliary model -------------------------------------------------------------
    def _fitted(self, render_with: Callable[[int], str], parts: int, limit: int
                ) -> str | None:
        """``render_with(share)`` for the largest share of the room that the ``parts`` cut
        texts may each take within ``limit`` tokens; None when a share would be too small."""
        tokens = self.context.tokens

        def counted(text: str) -> int:
            return tokens.count_messages([{"role": "system", "content": JSON_SYSTEM},
                                          {"role": "user", "content": text}])

        share = (limit - counted(render_with(0))) // parts
        while share >= MIN_CONTENT_TOKENS:
            text = render_with(share)
            over = counted(text) - limit
            if over <= 0:
                return text
            share -= max(1, math.ceil(over / parts))
        return None

    def _ask(self, prompt: str | None, memory: Memory, max_tokens: int, purpose: str,
             schema: Schema) -> str | None:
        """The reply to ``prompt`` (None, and an unfit call, when there is no prompt)."""
        reply = None if prompt is None else ask(
            self.context, self.name, JSON_SYSTEM, prompt, "", limit=memory.window,
            max_tokens=max_tokens, purpose=purpose, cost=memory.cost, schema=schema)
        if reply is None:
            memory.unfit_calls += 1
        return reply

    def _failed(self, cost: Cost) -> None:
        failed(self.context, cost)

    def _clip(self, text: str, limit: int) -> str:
        return clip(self.context, text, limit)


def _padded(values: tuple[Any, ...], length: int) -> list[Any]:
    """``values`` cut or padded with None to ``length`` (a model may give fewer)."""
    return [*values[:length], *([None] * (length - len(values)))]
