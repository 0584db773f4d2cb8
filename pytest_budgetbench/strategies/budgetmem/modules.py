"""The five BudgetMem modules, each at three tiers, and :func:`run_pipeline`, which runs
them in order over the retrieved passages (the services and state live in
:mod:`~pytest_budgetbench.strategies.budgetmem.pipeline`, which imports no module).

On the implementation axis LOW is a heuristic, MID uses embeddings, HIGH asks the
auxiliary model; on the reasoning and capacity axes every tier asks the model (the
services pick the prompt style or the model by tier). Every module writes into the
:class:`~pytest_budgetbench.strategies.budgetmem.pipeline.State`:

- ``filter`` sets ``kept``: LOW keeps passages sharing at least half as many question
  keywords as the best one; MID keeps those within ``MID_MARGIN`` cosine of the most
  similar; HIGH asks which passage numbers matter. None kept means all kept: a filter
  that removes everything leaves the summary nothing to work with.
- ``entity``, ``temporal``, ``topic`` write one note each: capitalised names and the
  sentences naming them; date expressions and their sentences; recurring keywords, or
  clusters of similar passages (MID); or the model's lines.
- ``summary`` sets ``summary`` within the room the budget leaves: LOW concatenates notes
  and kept passages, MID writes a template of the sentences most similar to the question
  plus the notes, HIGH asks for facts and reasoning steps, not the answer.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Sequence

from pytest_budgetbench import lexicon
from pytest_budgetbench.messages import Message
from pytest_budgetbench.strategies._scoring import cosine
from pytest_budgetbench.strategies.budgetmem.pipeline import (
    Chooser,
    Outcome,
    Passage,
    Services,
    State,
    question_of,
    retrieve,
)
from pytest_budgetbench.strategies.budgetmem.tiers import MODULES, Tier

ModuleRunner = Callable[[State, Tier, Services, int], None]
NoteMaker = Callable[[State, Services, Tier], str]
"""A relation note written without the LLM: LOW (heuristic) or MID (embeddings)."""

MID_MARGIN = 0.15  # MID filter: keep passages this close (cosine) to the best one
CLUSTER_SIMILARITY = 0.5  # MID topic: passages this similar share a topic
NOTE_LINES = 6  # lines per relation note
NOTE_TOKENS = 96  # the most a relation note (any tier) may take
FILTER_REPLY_TOKENS = 24
SUMMARY_REPLY_TOKENS = 192

# Task prompt words (LoCoMo's "Answer with exact words ...") are stop words here too.
_PROMPT_WORDS = (
    "said say says like get got one two based above context write answer form short phrase "
    "following question exact words whenever possible use date conversation approximate"
)
STOPWORDS = lexicon.STOPWORDS | frozenset(_PROMPT_WORDS.split())
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'-]*")
_NAME = re.compile(r"\b[A-Z][a-z]+(?:\s+[A-Z][a-z]+)*\b")
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_MONTHS = ("january|february|march|april|may|june|july|august|september|october|november|"
           "december|jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec")
_TIME = re.compile(
    rf"\b(?:\d{{1,2}}\s+(?:{_MONTHS})\b(?:,?\s+\d{{4}})?|(?:{_MONTHS})\s+\d{{1,2}}(?:,?\s+\d{{4}})?"
    r"|\d{4}-\d{2}-\d{2}|(?:19|20)\d{2}|yesterday|today|tomorrow|tonight|ago"
    r"|(?:last|next|this)\s+(?:week|month|year|weekend|monday|tuesday|wednesday|thursday|"
    r"friday|saturday|sunday)|\d{1,2}:\d{2}\s*(?:am|pm)?)\b",
    re.IGNORECASE,
)
_NOT_NAMES = frozenset({"I", "The", "A", "An", "And", "But", "So", "It", "This", "That",
                        "DATE", "Date", "Question", "Passages", "Session", "Oh", "Yes", "No",
                        "Hey", "Hi", "Thanks", "Wow", "What", "When", "Where", "Why", "How",
                        "Who", "My", "We", "You", "He", "She", "They", "Our", "Your"})


def keywords(text: str) -> list[str]:
    return [w for w in (m.group().lower() for m in _WORD.finditer(text)) if w not in STOPWORDS]


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(text) if s.strip()]


def numbered(passages: Sequence[Passage]) -> str:
    return "\n".join(f"[{i}] {p.text}" for i, p in enumerate(passages, start=1))


# -- filter ----------------------------------------------------------------------------------
FILTER_INSTRUCTION = ("Which passages help answer the question? Reply with their numbers only, "
                      "e.g. 1, 3.")


def run_filter(state: State, tier: Tier, services: Services, _room: int) -> None:
    passages = state.passages
    if not passages:
        state.kept = []
        return
    if not services.uses_llm(tier):
        kept = _filter_keywords(state) if tier == Tier.LOW else _filter_embeddings(state)
    else:
        reply = services.ask("filter", tier, FILTER_INSTRUCTION, numbered(passages),
                             FILTER_REPLY_TOKENS)
        chosen = {int(n) for n in re.findall(r"\d+", reply)}
        kept = [p for i, p in enumerate(passages, start=1) if i in chosen]
    state.kept = kept or list(passages)


def _filter_keywords(state: State) -> list[Passage]:
    wanted = set(keywords(state.question))
    scores = [len(wanted & set(keywords(p.text))) for p in state.passages]
    best = max(scores, default=0)
    if best == 0:
        return []
    return [p for p, s in zip(state.passages, scores, strict=True) if 2 * s >= best]


def _filter_embeddings(state: State) -> list[Passage]:
    sims = [cosine(p.vector, state.query_vector) for p in state.passages]
    best = max(sims)
    return [p for p, s in zip(state.passages, sims, strict=True) if s >= best - MID_MARGIN]


# -- relations --------------------------------------------------------------------------------
ENTITY_INSTRUCTION = ("List the people, places and things in the passages that matter for the "
                      "question and how they relate, one 'A - relation - B' per line.")
TEMPORAL_INSTRUCTION = ("List the events in the passages that bear on the question with their "
                        "dates, oldest first, one 'date: event' per line.")
TOPIC_INSTRUCTION = ("Name the topics of the passages that bear on the question, one per line, "
                     "with what is said about each.")


def _relation(kind: str, instruction: str, note_without_llm: NoteMaker) -> ModuleRunner:
    """A relation module: the LLM writes the note at its tier, else ``note_without_llm``."""

    def run(state: State, tier: Tier, services: Services, _room: int) -> None:
        if services.uses_llm(tier):
            note = services.ask(kind, tier, instruction, numbered(state.kept), NOTE_TOKENS)
        else:
            note = note_without_llm(state, services, tier)
        state.notes[kind] = services.clip(note, NOTE_TOKENS)

    return run


def _entity_note(state: State, services: Services, tier: Tier) -> str:
    by_embedding = tier == Tier.MID
    counts: Counter[str] = Counter()
    for passage in state.kept:
        counts.update(names_in(passage.text))
    asked = set(names_in(state.question)) | set(_NAME.findall(state.question))
    names = sorted(counts, key=lambda n: (n not in asked, -counts[n], n))[:NOTE_LINES]
    if not names:
        return ""
    lines = [f"Entities: {', '.join(names)}"]
    all_sentences = [s for p in state.kept for s in sentences(p.text)]
    for name in names:
        mentions = [s for s in all_sentences if name in s]
        if mentions:
            lines.append(f"{name}: {_best(mentions, state, services, by_embedding)}")
    return "\n".join(lines)


def names_in(text: str) -> list[str]:
    """Capitalised word runs that are names, not words capitalised for starting a sentence:
    a run counts when it appears mid-sentence somewhere in ``text`` or speaks ("X said")."""
    found: list[str] = []
    proper: set[str] = set()
    for match in _NAME.finditer(text):
        name = match.group()
        if name in _NOT_NAMES:
            continue
        found.append(name)
        before = text[: match.start()].rstrip()
        if (before and before[-1] not in ".!?:\n\"'[(") or text.startswith(
                " said", match.end()):
            proper.add(name)
    return [name for name in found if name in proper]


def _best(candidates: list[str], state: State, services: Services, by_embedding: bool) -> str:
    """The candidate most related to the question: by cosine (MID) or keyword overlap."""
    if by_embedding:
        vectors = services.embed(candidates)
        scores = [cosine(v, state.query_vector) for v in vectors]
    else:
        wanted = set(keywords(state.question))
        scores = [float(len(wanted & set(keywords(c)))) for c in candidates]
    return candidates[max(range(len(candidates)), key=lambda i: (scores[i], -i))]


def _temporal_note(state: State, services: Services, tier: Tier) -> str:
    by_embedding = tier == Tier.MID
    dated: list[tuple[str, str]] = []  # (the passage's date line, a sentence with a time)
    for passage in state.kept:
        when = _date_line(passage.text)
        for sentence in sentences(passage.text):
            if _TIME.search(sentence) and sentence != when:
                dated.append((when, sentence))
    if not dated:
        return ""
    if by_embedding:
        vectors = services.embed([s for _w, s in dated])
        order = sorted(range(len(dated)),
                       key=lambda i: (-cosine(vectors[i], state.query_vector), i))
        dated = [dated[i] for i in sorted(order[:NOTE_LINES])]
    else:
        dated = dated[:NOTE_LINES]
    return "\n".join(f"{when or 'undated'}: {sentence}" for when, sentence in dated)


def _date_line(text: str) -> str:
    first = text.lstrip("[").split("\n", 1)[0].split("]", 1)[0].strip()
    return first if _TIME.search(first) else ""


def _topic_note(state: State, _services: Services, tier: Tier) -> str:
    if tier == Tier.MID:
        return _topic_clusters(state)
    counts = Counter(w for p in state.kept for w in keywords(p.text) if not w.isdigit())
    top = [w for w, _n in counts.most_common(8)]
    return f"Topics: {', '.join(top)}" if top else ""


def _topic_clusters(state: State) -> str:
    """Passages grouped greedily by cosine similarity, each group named by its keywords."""
    clusters: list[list[int]] = []
    for index, passage in enumerate(state.kept):
        for cluster in clusters:
            if cosine(state.kept[cluster[0]].vector, passage.vector) >= CLUSTER_SIMILARITY:
                cluster.append(index)
                break
        else:
            clusters.append([index])
    lines = []
    for cluster in clusters[:NOTE_LINES]:
        counts = Counter(w for i in cluster for w in keywords(state.kept[i].text)
                         if not w.isdigit())
        names = ", ".join(w for w, _n in counts.most_common(4))
        members = ", ".join(str(i + 1) for i in cluster)
        lines.append(f"Topic ({names}): passages {members}")
    return "\n".join(lines)


# -- summary ----------------------------------------------------------------------------------
SUMMARY_INSTRUCTION = (
    "Write a knowledge summary for the question: the relevant facts from the passages, with "
    "their dates, and the reasoning steps that connect them. Do not answer the question."
)


def notes_text(state: State) -> str:
    return "\n".join(note for note in (state.notes.get(m, "") for m in
                                       ("entity", "temporal", "topic")) if note)


def run_summary(state: State, tier: Tier, services: Services, room: int) -> None:
    if room <= 0:
        state.summary = ""
        return
    notes = notes_text(state)
    passages = "\n\n".join(p.text for p in state.kept)
    if services.uses_llm(tier):
        material = "\n\n".join(part for part in (notes, passages) if part)
        summary = services.ask("summary", tier, SUMMARY_INSTRUCTION, material,
                               min(room, SUMMARY_REPLY_TOKENS))
    elif tier == Tier.LOW:
        summary = "\n\n".join(part for part in (notes, passages) if part)
    else:
        summary = _template_summary(state, services, notes, room)
    state.summary = services.clip(summary, room)


def _template_summary(state: State, services: Services, notes: str, room: int) -> str:
    """The kept sentences most similar to the question, best first, then the notes."""
    candidates = list(dict.fromkeys(s for p in state.kept for s in sentences(p.text)))
    vectors = services.embed(candidates)
    order = sorted(range(len(candidates)),
                   key=lambda i: (-cosine(vectors[i], state.query_vector), i))
    notes_tokens = services.tokens.count_text(notes) if notes else 0
    left = room - notes_tokens - 8
    facts: list[str] = []
    for index in order:
        cost = services.tokens.count_text(candidates[index]) + 2
        if cost > left:
            continue
        facts.append(f"- {candidates[index]}")
        left -= cost
    parts = ["Relevant facts:\n" + "\n".join(facts)] if facts else []
    if notes:
        parts.append("Relations:\n" + notes)
    return "\n\n".join(parts)


MODULE_RUNNERS: dict[str, ModuleRunner] = {
    "filter": run_filter,
    "entity": _relation("entity", ENTITY_INSTRUCTION, _entity_note),
    "temporal": _relation("temporal", TEMPORAL_INSTRUCTION, _temporal_note),
    "topic": _relation("topic", TOPIC_INSTRUCTION, _topic_note),
    "summary": run_summary,
}


def run_pipeline(services: Services, history: Sequence[Message], query: str, top_k: int,
                 summary_room: int, choose: Chooser) -> Outcome:
    """Retrieve, then run every module at the tier ``choose`` picks for it."""
    services.question = question_of(query)
    started = time.perf_counter()
    state = retrieve(services, history, services.question, top_k)
    retrieve_s = time.perf_counter() - started
    tiers: dict[str, Tier] = {}
    for name in MODULES:
        tier = choose(name, state)
        tiers[name] = tier
        module = MODULE_RUNNERS[name]

        def run(module: ModuleRunner = module, tier: Tier = tier) -> None:
            module(state, tier, services, summary_room)

        services.timed(name, run)
    return Outcome(state, tiers, services.costs, retrieve_s)
