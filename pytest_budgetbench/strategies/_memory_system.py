"""What every memory-system strategy (memgpt, mem0, amem) shares.

- :func:`ask`: one auxiliary call whose prompt is cut to a token limit (the material is
  clipped from its end), with its counted tokens added to a phase's :class:`Cost`, and
  the JSON schema its reply should follow, where it has one (each schema lives beside
  the parser that reads the reply: ``mem0.EXTRACTION_SCHEMA``, ``amem.NOTE_SCHEMA`` and
  ``amem.EVOLUTION_SCHEMA``, ``memgpt.EDIT_SCHEMA`` and ``memgpt.SEARCH_SCHEMA``);
- :func:`json_values`: the JSON objects and arrays in a small model's reply, fenced or not
  (and, on request, repaired where it copied a template's Python literals or commas);
- :func:`failed`: a reply the strategy could not use, counted on the row
  (``aux_failures``) and in the phase's cost, so degradation is per call, never per run;
- :class:`BuiltMemories`: memories built for an item, kept in the process by the content
  of the item's messages and the window they were built at (never by item id, so a memory
  cannot reach another item) and reused by the item's other budgets;
- :func:`construction_window`: the window a memory is built at, ``min(budget, cap)``, so
  no construction call is larger than the budget of any cell that reuses the memory;
- :func:`memory_message`: the system message that carries the memories, after a header
  naming the strategy.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pytest_budgetbench.canonical import json_sha256
from pytest_budgetbench.messages import Message, Schema, text_of
from pytest_budgetbench.strategies._chunking import fit_prefix
from pytest_budgetbench.strategies.base import AuxiliaryModel, StrategyContext

if TYPE_CHECKING:
    from pytest_budgetbench.tokens.base import TokenCounter

MEMORIES_KEPT = 32  # built memories cached in the process, per strategy
MIN_MATERIAL_TOKENS = 16  # a call with less room than this to read is not worth making

T = TypeVar("T")


@dataclass
class Cost:
    """Auxiliary calls, their counted tokens, wall seconds and failures of one phase."""

    aux_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    seconds: float = 0.0
    model_s: float = 0.0
    """Seconds the model took to answer the phase's calls, as recorded: a reply from the
    response cache keeps the latency it was first answered in, so a rebuilt memory still
    shows what building it costs."""
    aux_failures: int = 0

    def info(self) -> dict[str, Any]:
        return {**asdict(self), "seconds": round(self.seconds, 6),
                "model_s": round(self.model_s, 6)}


class BuiltMemories(Generic[T]):
    """Built memories by the content of their messages and window, least recently used
    dropped first; thread-safe (a strategy instance may serve several cells at once)."""

    def __init__(self, capacity: int = MEMORIES_KEPT) -> None:
        self.capacity = capacity
        self._memories: OrderedDict[str, T] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(head: Sequence[Message], history: Sequence[Message], window: int,
            *settings: Any) -> str:
        """The memory's address: the item's messages, the window and any setting that
        changes what is built."""
        return json_sha256([list(head), list(history), window, list(settings)],
                           ensure_ascii=True, default=str)

    def get(self, key: str) -> T | None:
        with self._lock:
            memory = self._memories.get(key)
            if memory is not None:
                self._memories.move_to_end(key)
            return memory

    def get_or_build(self, key: str, build: Callable[[], T]) -> tuple[T, bool]:
        """The memory at ``key``, built now when there is none, and whether it was reused.
        Two cells that miss at once both build (the lock is not held while building: a
        build makes model calls); the memories are equal and the later one is kept."""
        found = self.get(key)
        if found is not None:
            return found, True
        memory = build()
        self.put(key, memory)
        return memory, False

    def put(self, key: str, memory: T) -> None:
        with self._lock:
            self._memories[key] = memory
            while len(self._memories) > self.capacity:
                self._memories.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._memories.clear()


def construction_window(budget: int, cap: int) -> int:
    """The window a memory is built at: below ``cap`` it depends on the budget (and is
    built per budget); every budget at or above ``cap`` shares one memory built at it."""
    return min(budget, cap)


_FENCE = re.compile(r"```[a-zA-Z]*\s*(.*?)```", re.DOTALL)
_PYTHON_LITERAL = re.compile(r"\b(True|False|None)\b")
_JSON_LITERAL = {"True": "true", "False": "false", "None": "null"}
_TRAILING_COMMA = re.compile(r",(\s*[}\]])")


def memory_message(header: str, text: str) -> Message:
    """The system message that shows the model a strategy's memories: ``header`` (which
    names the strategy and what the memories are), then ``text``."""
    return {"role": "system", "content": header + text}


def json_values(reply: str, *, lenient: bool = False) -> Iterator[Any]:
    """Every JSON object or array in ``reply``: inside code fences first, then anywhere.

    ``lenient``: then also in the reply repaired as a small model breaks JSON when it
    copies a prompt's template (Python's ``True``/``False``/``None``, trailing commas)."""
    decoder = json.JSONDecoder()
    texts = [*(m.group(1) for m in _FENCE.finditer(reply)), reply]
    if lenient:
        texts += [_repaired(text) for text in texts]
    for text in texts:
        index = 0
        while index < len(text):
            if text[index] in "{[":
                try:
                    value, end = decoder.raw_decode(text, index)
                except ValueError:
                    index += 1
                    continue
                yield value
                index = end
            else:
                index += 1


def _repaired(text: str) -> str:
    text = _PYTHON_LITERAL.sub(lambda m: _JSON_LITERAL[m.group(1)], text)
    return _TRAILING_COMMA.sub(r"\1", text)


def render(messages: Sequence[Message]) -> str:
    """Messages as ``role: text`` lines, the form memory systems read a conversation in."""
    return "\n".join(f"{m.get('role')}: {text_of(m)}" for m in messages if text_of(m).strip())


def clip(context: StrategyContext, text: str, limit: int) -> str:
    """``text`` cut after a word to ``limit`` tokens of the run's counter."""
    return cut(context.tokens, text, limit)


def failed(context: StrategyContext, cost: Cost) -> None:
    """A reply this cell could not use: on the row and in the phase's cost."""
    cost.aux_failures += 1
    context.aux_failures += 1


def auxiliary(context: StrategyContext, strategy: str) -> AuxiliaryModel:
    """The runner's auxiliary model, or a clear error naming the strategy that needs it."""
    if context.aux is None:
        raise RuntimeError(f"{strategy} needs the runner's auxiliary model (context.aux)")
    return context.aux


def fit_material(tokens: TokenCounter, prompt: Callable[[str], list[Message]], material: str,
                 limit: int) -> tuple[str, int] | None:
    """The material cut from its end until ``prompt(material)`` counts at most ``limit``
    tokens, and that count; None when less than ``MIN_MATERIAL_TOKENS`` of material would
    fit (the call is not worth making). The material may come back empty."""
    room = limit - tokens.count_messages(prompt(""))
    if room < MIN_MATERIAL_TOKENS:
        return None
    material = cut(tokens, material, room)
    counted = tokens.count_messages(prompt(material))
    while counted > limit and material:
        # Joined text can cost a token or two more than its parts: cut the excess.
        material = cut(tokens, material, tokens.count_text(material) - (counted - limit))
        counted = tokens.count_messages(prompt(material))
    if counted > limit:
        return None
    return material, counted


def cut(tokens: TokenCounter, text: str, limit: int) -> str:
    if limit <= 0:
        return ""
    return text[: fit_prefix(tokens, text, 0, len(text), limit)].strip()


def recorded_latency(model: AuxiliaryModel, wall: float) -> float:
    """The recorded latency of ``model``'s last call (the runner's recorder keeps it; a
    cached reply keeps its original latency), else the measured wall time."""
    calls: Any = getattr(model, "calls", None)
    if isinstance(calls, list) and calls:
        latency = getattr(calls[-1], "latency_s", None)
        if isinstance(latency, int | float):
            return float(latency)
    return wall


def ask(context: StrategyContext, strategy: str, instruction: str, material: str,
        request: str, *, limit: int, max_tokens: int, purpose: str, cost: Cost,
        schema: Schema | None = None) -> str | None:
    """The reply to ``instruction`` over ``material`` and ``request``, the material cut
    from its end until the prompt fits ``limit`` tokens; None (no call) when nothing fits.

    The call goes through the runner's auxiliary model, so it is also held to the cell's
    budget, cached and recorded on the row with ``purpose``; ``schema``, the JSON schema
    the reply's parser reads, goes with it (an endpoint that can constrains the reply)."""
    tokens = context.tokens

    def prompt(text: str) -> list[Message]:
        content = "\n\n".join(t for t in (text, request) if t)
        return [{"role": "system", "content": instruction},
                {"role": "user", "content": content}]

    fitted = fit_material(tokens, prompt, material, limit)
    if fitted is None or not (fitted[0] or request):
        return None
    material, counted = fitted
    model = auxiliary(context, strategy)
    started = time.perf_counter()
    reply = model.complete(prompt(material), max_tokens=max_tokens, purpose=purpose,
                           schema=schema)
    cost.model_s += recorded_latency(model, time.perf_counter() - started)
    reply = clip(context, reply.strip(), max_tokens)
    cost.aux_calls += 1
    cost.input_tokens += counted
    cost.output_tokens += tokens.count_text(reply) if reply else 0
    return reply
