"""One cell, start to finish: reset the strategy, apply it, count, enforce, call the model,
grade, record. The runner counts and enforces; strategies only propose prompts."""

from __future__ import annotations

import copy
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_budgetbench.budget import (
    BudgetCheck,
    TokenCounter,
    enforce,
    prompt_sha256,
    violation_message,
)
from pytest_budgetbench.cells import Cell
from pytest_budgetbench.config import Settings
from pytest_budgetbench.errors import BudgetExceeded, EndpointError, StrategyError
from pytest_budgetbench.messages import Message, check_messages
from pytest_budgetbench.model import ChatModel, Completion, redact_url
from pytest_budgetbench.records import SCHEMA_VERSION, RunStore
from pytest_budgetbench.strategies import Strategy, StrategyContext, load_strategy
from pytest_budgetbench.tasks import REGISTRY as TASKS
from pytest_budgetbench.tasks import Item, Task, TaskOptions

Timer = Callable[[Callable[[], Completion]], Completion]


@dataclass(frozen=True)
class Endpoint:
    """Where answers come from, as resolved once per session by the controller."""

    base_url: str
    model: str
    embedded: bool = False
    gguf_path: str | None = None
    server_flags: dict[str, Any] = field(default_factory=dict)

    @property
    def identity(self) -> str:
        """Who answers, for the response cache: the URL, or for the embedded server its
        model file and the flags that shape replies (not its port, new every session,
        nor its context size)."""
        if not self.embedded:
            return self.base_url
        flags = ",".join(f"{k}={v}" for k, v in sorted(self.server_flags.items())
                         if k != "n_ctx")
        return f"embedded:{Path(self.gguf_path or '').name}:{flags}"


@dataclass
class AuxCall:
    purpose: str
    input_tokens: int
    output_tokens: int | None
    latency_s: float
    model: str = "aux"
    cached: bool = False


class RecordedAuxModel:
    """The model as a strategy sees it: each call's prompt is held to the cell's budget,
    and each call is recorded on the cell's row.

    Several named models (``--budgetbench-aux-models``) of one cell share one ``calls``
    list, so the row lists every auxiliary call in order.
    """

    def __init__(
        self,
        chat: ChatModel,
        tokens: TokenCounter,
        budget: int,
        cell_id: str,
        *,
        label: str = "aux",
        calls: list[AuxCall] | None = None,
    ) -> None:
        self._chat = chat
        self._tokens = tokens
        self._budget = budget
        self._cell_id = cell_id
        self.label = label
        self.calls: list[AuxCall] = [] if calls is None else calls

    def complete(self, messages: Sequence[Message], *, max_tokens: int, purpose: str) -> str:
        counted = self._tokens.count_messages(messages)
        check = BudgetCheck(counted, self._budget)
        enforce(f"{self._cell_id} (auxiliary call '{purpose}')", purpose, check, self._tokens)
        completion = self._chat.complete(messages, max_tokens=max_tokens)
        self.calls.append(AuxCall(purpose, counted, completion.completion_tokens,
                                  completion.latency_s, self.label, completion.cached))
        return completion.text

    def sibling(self, chat: ChatModel, label: str) -> RecordedAuxModel:
        """Another model for the same cell, recorded in the same list."""
        return RecordedAuxModel(chat, self._tokens, self._budget, self._cell_id,
                                label=label, calls=self.calls)


@dataclass
class CellResult:
    """What a cell produced; the ``budget_cell`` fixture returns one."""

    cell: Cell
    item: Item
    row: dict[str, Any]
    prompt: list[Message]
    reference: bool
    violation: str = ""

    def __repr__(self) -> str:
        # Short on purpose: a failed assertion in a budget_cell test prints this, and the
        # full row and prompt would bury the line that matters.
        quality = "-" if self.quality is None else f"{self.quality:.3f}"
        return (f"<CellResult {self.cell.cell_id} {self.status} quality={quality} "
                f"prediction={self.prediction!r}>")

    @property
    def status(self) -> str:
        return str(self.row["status"])

    @property
    def quality(self) -> float | None:
        value = self.row.get("quality")
        return None if value is None else float(value)

    @property
    def prediction(self) -> str | None:
        return self.row.get("prediction")

    @classmethod
    def from_row(
        cls, cell: Cell, item: Item, row: dict[str, Any], prompt: list[Message]
    ) -> CellResult:
        """The result a resumed run already recorded for this cell."""
        violation = str(row.get("error") or "") if row.get("status") == "violation" else ""
        return cls(cell, item, row, prompt, bool(row.get("reference")), violation)


class Catalog:
    """Tasks and their items, loaded once per process (collection needs them too)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._tasks: dict[str, Task] = {}
        self._items: dict[str, list[Item]] = {}

    def task(self, name: str) -> Task:
        if name not in self._tasks:
            self._tasks[name] = make_task(name, self.settings)
        return self._tasks[name]

    def items(self, task_name: str) -> list[Item]:
        if task_name not in self._items:
            self._items[task_name] = self.task(task_name).load()[: self.settings.items]
        return self._items[task_name]


class Runner:
    """Runs cells in one process; strategies, tasks and the counter are built once."""

    def __init__(
        self,
        settings: Settings,
        catalog: Catalog,
        endpoint: Endpoint,
        store: RunStore,
        run_id: str,
        tokens: TokenCounter,
        chat: ChatModel,
        embedder_factory: Callable[[], Any] | None = None,
        aux_chats: dict[str, ChatModel] | None = None,
    ) -> None:
        self.settings = settings
        self.catalog = catalog
        self.endpoint = endpoint
        self.store = store
        self.run_id = run_id
        self.tokens = tokens
        self.chat = chat
        self.embedder_factory = embedder_factory
        self.aux_chats = aux_chats or {}
        # Strategies keep per-item state, so each thread (--budgetbench-concurrency) has its own.
        self._local = threading.local()

    def strategy(self, name: str) -> Strategy:
        strategies: dict[str, Strategy] = self._local.__dict__.setdefault("strategies", {})
        if name not in strategies:
            strategies[name] = load_strategy(name)
        return strategies[name]

    # -- the cell ----------------------------------------------------------------------
    def run(self, cell: Cell, timer: Timer | None = None) -> CellResult:
        task = self.catalog.task(cell.task)
        item = self.catalog.items(cell.task)[cell.item_index]
        strategy = self.strategy(cell.strategy)
        context = self._context(cell, item)
        row = self._base_row(cell, item, strategy)
        try:
            return self._run(cell, task, item, strategy, context, row, timer)
        except (StrategyError, EndpointError) as exc:
            # The test errors, but the cell still gets its one row.
            self._record_strategy(row, context)
            row.update(status="error", error=str(exc))
            self.store.write_row(row)
            raise

    def _run(
        self,
        cell: Cell,
        task: Task,
        item: Item,
        strategy: Strategy,
        context: StrategyContext,
        row: dict[str, Any],
        timer: Timer | None,
    ) -> CellResult:
        prompt, row["strategy_s"] = self._apply(strategy, item, cell, context)
        self._record_strategy(row, context)
        counted = self.tokens.count_messages(prompt)
        sha = prompt_sha256(prompt)
        row.update(counted_tokens=counted, prompt_sha256=sha,
                   utilisation=round(counted / cell.budget, 4))
        self._audit(cell, sha, prompt)
        check = BudgetCheck(counted, cell.budget)
        if not check.fits:
            message = violation_message(cell.cell_id, strategy.name, check, self.tokens)
            row.update(status="violation", error=message)
            self.store.write_row(row)
            return CellResult(cell, item, row, prompt, strategy.reference, violation=message)

        completion = self._call(prompt, timer)
        grade = task.grade(item, completion.text)
        row.update(
            status="ok",
            prediction=completion.text,
            extracted=grade.extracted,
            quality=grade.quality,
            grader=grade.grader,
            model_s=round(completion.latency_s, 4),
            cached=completion.cached,
            output_tokens=completion.completion_tokens,
            server_prompt_tokens=completion.prompt_tokens,
            token_count_match=(
                None if completion.prompt_tokens is None else completion.prompt_tokens == counted
            ),
        )
        self.store.write_row(row)
        exported = task.export(item, completion.text, cell.cell_id)
        if exported is not None:
            self.store.write_export(*exported)
        return CellResult(cell, item, row, prompt, strategy.reference)

    def _context(self, cell: Cell, item: Item) -> StrategyContext:
        aux = RecordedAuxModel(self.chat, self.tokens, cell.budget, cell.cell_id)
        settings = self.settings
        return StrategyContext(
            tokens=self.tokens,
            item_id=f"{cell.task}/{item.item_id}",
            seed=settings.seed,
            aux=aux,
            aux_models={name: aux.sibling(chat, name) for name, chat in self.aux_chats.items()},
            embedder_factory=self.embedder_factory,
            options={"rag_chunk": settings.rag_chunk,
                     "embedding_model": settings.embedding_model,
                     **(settings.strategy_options or {})},
        )

    def _apply(
        self, strategy: Strategy, item: Item, cell: Cell, context: StrategyContext
    ) -> tuple[list[Message], float]:
        started = time.perf_counter()
        try:
            strategy.reset(context)
            # A private copy: a strategy that mutates its input must not corrupt later cells.
            output = strategy.apply(copy.deepcopy(list(item.messages)), cell.budget)
            prompt = check_messages(output, f"strategy '{strategy.name}'")
        except (EndpointError, StrategyError):
            raise
        except BudgetExceeded as exc:
            raise StrategyError(f"strategy '{strategy.name}' made an auxiliary call over budget: "
                                f"{exc}") from exc
        except Exception as exc:
            raise StrategyError(
                f"strategy '{strategy.name}' failed on cell {cell.cell_id}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        return prompt, round(time.perf_counter() - started, 6)

    def _call(self, prompt: list[Message], timer: Timer | None) -> Completion:
        def call() -> Completion:
            return self.chat.complete(prompt, max_tokens=self.settings.max_tokens)

        return timer(call) if timer is not None else call()

    def _audit(self, cell: Cell, sha: str, prompt: list[Message]) -> None:
        mode = self.settings.audit
        if mode != "off":
            self.store.write_prompt(cell.cell_id, sha, prompt if mode == "full" else None)

    @staticmethod
    def _record_strategy(row: dict[str, Any], context: StrategyContext) -> None:
        """The strategy's auxiliary calls (every named model's) and its own notes."""
        assert isinstance(context.aux, RecordedAuxModel)
        calls = context.aux.calls
        row["aux_calls"] = [vars(call) for call in calls]
        row["aux_input_tokens"] = sum(c.input_tokens for c in calls)
        row["aux_output_tokens"] = sum(c.output_tokens or 0 for c in calls)
        row["aux_s"] = round(sum(c.latency_s for c in calls), 4)
        row["strategy_info"] = context.info or None

    def _base_row(self, cell: Cell, item: Item, strategy: Strategy) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "run_id": self.run_id,
            "cell_id": cell.cell_id,
            "task": cell.task,
            "item_id": item.item_id,
            "category": item.category,
            "strategy": strategy.name,
            "regime": strategy.regime_label(),
            "reference": strategy.reference,
            "budget": cell.budget,
            "repeat": cell.repeat,
            "status": "error",
            "counted_tokens": None,
            "server_prompt_tokens": None,
            "token_count_match": None,
            "utilisation": None,
            "quality": None,
            "prediction": None,
            "extracted": None,
            "strategy_s": None,
            "model_s": None,
            "cached": None,
            "output_tokens": None,
            "strategy_info": None,
            "model": self.endpoint.model,
            "endpoint": redact_url(self.endpoint.base_url),
            "server_flags": self.endpoint.server_flags,
            "tokenizer": self.tokens.name,
            "tokenizer_exact": self.tokens.exact,
            "prompt_sha256": None,
            "grader": self.catalog.task(cell.task).grader_version,
            "error": None,
            "seed": self.settings.seed,
            "worker": os.environ.get("PYTEST_XDIST_WORKER"),
            "time": round(time.time(), 3),
        }


def make_task(name: str, settings: Settings) -> Task:
    cls = TASKS.resolve(name)
    data = settings.data_paths.get(cls.name or name)
    judge = None
    if settings.judge_endpoint:
        judge = ChatModel(settings.judge_endpoint, settings.judge_model or "",
                          api_key=settings.api_key, timeout=settings.timeout,
                          attempts=settings.retries, temperature=0.0)
    options = TaskOptions(
        seed=settings.seed,
        judge=judge,
        items=settings.items,
        data_path=Path(data) if data else None,
        chunk_tokens=settings.chunk_tokens,
        extra={"history_tokens": settings.memory_history,
               "locomo_samples": settings.locomo_samples},
    )
    return cls(options)
