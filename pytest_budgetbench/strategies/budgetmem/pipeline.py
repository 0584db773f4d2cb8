"""The BudgetMem pipeline: retrieve, then filter, relate (entity, temporal, topic), summarise.

Per query: the history is cut into 256-token chunks, embedded with the run's embedder
(cached by content, so every budget and strategy of an item shares the vectors), and the
``top_k`` chunks most similar to the question are retrieved, in chronological order. Then
five modules run in order, each at the tier a *chooser* picks for it (a fixed tier for the
controls, a seeded draw for the random control, the policy net for a router):

1. ``filter`` keeps the retrieved passages that bear on the question;
2. ``entity``, ``temporal`` and ``topic`` write relation notes over the kept passages;
3. ``summary`` writes the knowledge summary (facts and reasoning steps, not the answer)
   that the strategy sends between the system messages and the query.

Every module's cost is measured: wall-clock compute seconds (``time.perf_counter``, the
heuristic and embedding tiers included, with an auxiliary call's recorded latency in place
of its wall time, so a reply from the response cache costs what it cost when it was made),
auxiliary calls and their input and output tokens. Every auxiliary prompt is counted before
it is sent and its material cut until it fits the cell budget.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_budgetbench.messages import Message, text_of
from pytest_budgetbench.strategies._chunking import chunk_history
from pytest_budgetbench.strategies._memory_system import cut, fit_material, recorded_latency
from pytest_budgetbench.strategies._scoring import cosine
from pytest_budgetbench.strategies.base import AuxiliaryModel, StrategyContext
from pytest_budgetbench.strategies.budgetmem.tiers import (
    CAPACITY_MODELS,
    MODULES,
    Tier,
)
from pytest_budgetbench.tokens.base import TokenCounter

CHUNK_TOKENS = 256
FINAL_MARK = "FINAL:"

# Reasoning-axis prompt styles, by tier.
DIRECT, CHAIN_OF_THOUGHT, PLAN_ACT_REFLECT = "direct", "chain-of-thought", "plan-act-reflect"
STYLE_OF: dict[Tier, str] = {Tier.LOW: DIRECT, Tier.MID: CHAIN_OF_THOUGHT,
                             Tier.HIGH: PLAN_ACT_REFLECT}
COT_SUFFIX = " Think step by step, then write the result after 'FINAL:'."
PLAN_SUFFIX = (" First write a one-line PLAN, then carry it out, then write the result "
               "after 'FINAL:'.")
REFLECT_INSTRUCTION = (
    "Here is a draft result for the task below. Check it against the passages, fix "
    "anything wrong or missing, and write the corrected result after 'FINAL:'.\n"
    "Task: {instruction}\nDraft: {draft}"
)


@dataclass(frozen=True)
class Passage:
    """A retrieved chunk: its text (with its message's date line), vector and position."""

    text: str
    vector: tuple[float, ...]
    order: int


@dataclass
class State:
    """What the modules read and write for one query."""

    question: str
    query_vector: tuple[float, ...]
    passages: list[Passage]
    kept: list[Passage] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)
    summary: str = ""


@dataclass
class ModuleCost:
    seconds: float = 0.0
    aux_calls: int = 0
    aux_input_tokens: int = 0
    aux_output_tokens: int = 0


Chooser = Callable[[str, State], Tier]
"""Picks a module's tier from the module's name and the pipeline state before it runs."""


def question_of(query: str) -> str:
    """The question inside a task's answer prompt (text after its last ``Question:``)."""
    _head, mark, tail = query.rpartition("Question:")
    if not mark:
        return query.strip()
    return tail.split("Short answer:")[0].strip() or query.strip()


def mean_vector(vectors: Sequence[Sequence[float]], dim: int) -> tuple[float, ...]:
    if not vectors:
        return (0.0,) * dim
    return tuple(sum(v[i] for v in vectors) / len(vectors) for i in range(dim))


def extract_final(reply: str) -> str:
    """What follows the last ``FINAL:`` of a reasoning reply, else the whole reply."""
    index = reply.upper().rfind(FINAL_MARK)
    return (reply[index + len(FINAL_MARK):] if index >= 0 else reply).strip()


class Services:
    """What modules use: the counter, the embedder, the auxiliary models (chosen by axis
    and tier), the cell budget, and the per-module cost ledger."""

    def __init__(self, context: StrategyContext, budget: int, axis: str) -> None:
        self.context = context
        self.tokens: TokenCounter = context.tokens
        self.budget = budget
        self.axis = axis
        self.question = ""
        self.costs: dict[str, ModuleCost] = {m: ModuleCost() for m in MODULES}
        self._aux_s = 0.0  # wall seconds spent waiting for auxiliary replies (this module)
        self._aux_latency = 0.0  # the recorded latency of those replies

    # -- embeddings ---------------------------------------------------------------------
    def embed(self, texts: Sequence[str]) -> list[tuple[float, ...]]:
        if not texts:
            return []
        return [tuple(v) for v in self.context.embedder.embed(list(texts))]

    # -- the auxiliary model --------------------------------------------------------------
    def uses_llm(self, tier: Tier) -> bool:
        """Whether a module at ``tier`` asks the auxiliary model on this axis."""
        return self.axis != "implementation" or tier == Tier.HIGH

    def model_for(self, tier: Tier) -> tuple[AuxiliaryModel, str]:
        """The auxiliary model a call at ``tier`` goes to, and its label."""
        if self.axis == "capacity":
            name = CAPACITY_MODELS[tier]
            named = self.context.aux_models.get(name)
            if named is not None:
                return named, name
        if self.context.aux is None:
            raise RuntimeError("BudgetMem's LLM tiers need the runner's auxiliary model")
        return self.context.aux, "aux"

    def ask(self, module: str, tier: Tier, instruction: str, material: str,
            max_tokens: int) -> str:
        """The auxiliary model's result for ``instruction`` over ``material``, in the
        prompt style of ``tier`` on the reasoning axis (direct elsewhere); "" when the
        budget leaves no room for the material."""
        style = STYLE_OF[tier] if self.axis == "reasoning" else DIRECT
        model, _label = self.model_for(tier)
        purpose = f"budgetmem/{module}/{tier.name}"
        if style == DIRECT:
            return self._call(model, module, purpose, instruction, material, max_tokens)
        if style == CHAIN_OF_THOUGHT:
            reply = self._call(model, module, purpose, instruction + COT_SUFFIX, material,
                               2 * max_tokens)
            return self.clip(extract_final(reply), max_tokens)
        draft = extract_final(self._call(model, module, purpose + "/plan-act",
                                         instruction + PLAN_SUFFIX, material, 2 * max_tokens))
        draft = self.clip(draft, max_tokens)
        reflect = REFLECT_INSTRUCTION.format(instruction=instruction, draft=draft)
        revised = self._call(model, module, purpose + "/reflect", reflect, material,
                             2 * max_tokens)
        return self.clip(extract_final(revised), max_tokens) or draft

    def prompt(self, instruction: str, material: str) -> list[Message]:
        # Material first: calls over the same passages share a prefix (llama.cpp reuses it).
        content = f"Passages:\n{material}\n\nQuestion: {self.question}\n\n{instruction}"
        return [{"role": "user", "content": content}]

    def _call(self, model: AuxiliaryModel, module: str, purpose: str, instruction: str,
              material: str, max_tokens: int) -> str:
        tokens = self.tokens
        if not material.strip():
            return ""
        fitted = fit_material(tokens, lambda text: self.prompt(instruction, text), material,
                              self.budget)
        if fitted is None or not fitted[0].strip():
            return ""
        material, counted = fitted
        prompt = self.prompt(instruction, material)
        started = time.perf_counter()
        reply = model.complete(prompt, max_tokens=max_tokens, purpose=purpose)
        self._aux_s += time.perf_counter() - started
        self._aux_latency += recorded_latency(model, time.perf_counter() - started)
        cost = self.costs[module]
        cost.aux_calls += 1
        cost.aux_input_tokens += counted
        reply = self.clip(reply.strip(), max_tokens)
        cost.aux_output_tokens += tokens.count_text(reply) if reply else 0
        return reply

    def clip(self, text: str, limit: int) -> str:
        """``text`` cut after a word to ``limit`` tokens."""
        return cut(self.tokens, text, limit)

    # -- timing ---------------------------------------------------------------------------
    def timed(self, module: str, run: Callable[[], None]) -> None:
        """Run a module and add its compute seconds to its cost; an auxiliary reply counts
        its recorded latency, not the wall time spent waiting for it."""
        self._aux_s = self._aux_latency = 0.0
        started = time.perf_counter()
        run()
        wall = time.perf_counter() - started
        self.costs[module].seconds += max(0.0, wall - self._aux_s) + self._aux_latency


def retrieve(services: Services, history: Sequence[Message], question: str,
             top_k: int) -> State:
    """The ``top_k`` 256-token chunks most similar to ``question``, chronological."""
    tokens = services.tokens
    chunks = chunk_history(tokens, history, CHUNK_TOKENS)
    texts = [text_of(m) for m in history]
    labelled = [_with_date_line(texts[c.msg], c.start, c.end) for c in chunks]
    vectors = services.embed([*labelled, question]) if labelled else services.embed([question])
    query_vector = vectors[-1]
    scored = sorted(range(len(labelled)),
                    key=lambda i: (-cosine(vectors[i], query_vector), -i))[:top_k]
    passages = [Passage(labelled[i], vectors[i], i) for i in sorted(scored)]
    return State(question=question, query_vector=query_vector, passages=passages)


def _with_date_line(text: str, start: int, end: int) -> str:
    """A chunk, prefixed with its message's first line when that names a date (LoCoMo and
    memory sessions start with one) and the chunk does not already include it."""
    first = text.split("\n", 1)[0].strip()
    chunk = text[start:end]
    if start > 0 and first and len(first) < 120 and any(ch.isdigit() for ch in first):
        return f"[{first}] {chunk}"
    return chunk


@dataclass
class Outcome:
    """A pipeline run: its final state, the tier of each module, and their costs."""

    state: State
    tiers: dict[str, Tier]
    costs: dict[str, ModuleCost]
    retrieve_s: float

    def info(self, axis: str) -> dict[str, Any]:
        """What goes on the row as ``strategy_info``."""
        costs = self.costs
        return {
            "budgetmem": {
                "axis": axis,
                "tiers": {m: t.name for m, t in self.tiers.items()},
                "module_s": {m: round(c.seconds, 6) for m, c in costs.items()},
                "module_aux_calls": {m: c.aux_calls for m, c in costs.items()},
                "module_aux_input_tokens": {m: c.aux_input_tokens for m, c in costs.items()},
                "module_aux_output_tokens": {m: c.aux_output_tokens for m, c in costs.items()},
                "retrieve_s": round(self.retrieve_s, 6),
                "retrieved": len(self.state.passages),
                "kept": len(self.state.kept),
                "cost_tokens": self.cost_tokens(),
                "cost_s": round(self.cost_seconds(), 6),
            }
        }

    def cost_tokens(self) -> int:
        return sum(c.aux_input_tokens + c.aux_output_tokens for c in self.costs.values())

    def cost_seconds(self) -> float:
        return self.retrieve_s + sum(c.seconds for c in self.costs.values())
