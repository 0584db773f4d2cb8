"""One cell, start to finish: reset the strategy, apply it, count, enforce, call the model,
grade, record. The runner counts and enforces; strategies only propose prompts."""

from __future__ import annotations

import copy
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from pytest_budgetbench.engine.answers import fill_answer
from pytest_budgetbench.engine.aux_calls import RecordedAuxModel
from pytest_budgetbench.engine.calls import CallSite, budgeted_call, cut_by_server, fill_outcome
from pytest_budgetbench.engine.catalog import Catalog
from pytest_budgetbench.engine.episode import (
    TEACHER_FORCED,
    EpisodeLoop,
    TeacherForcedLoop,
    fill_row,
    fill_teacher_forced,
)
from pytest_budgetbench.engine.evidence import fill_retention, spans_kept, tally
from pytest_budgetbench.errors import (
    BudgetBenchError,
    BudgetExceeded,
    EndpointError,
    PromptCut,
    RecordError,
    RunStopping,
    StrategyAborted,
    StrategyError,
    TokenizerError,
)
from pytest_budgetbench.messages import (
    Message,
    Tool,
    check_messages,
    check_tool_pairs,
    private_copy,
)
from pytest_budgetbench.model.chat import ChatBackend, Completion
from pytest_budgetbench.model.endpoint import Endpoint
from pytest_budgetbench.model.servers import likely_cut
from pytest_budgetbench.model.structured import StructuredOutput
from pytest_budgetbench.model.tool_parser import parse_tool_calls, parser_for
from pytest_budgetbench.records.prompts import SpanKept
from pytest_budgetbench.records.rows import CellRow, Status
from pytest_budgetbench.records.store import RunStore
from pytest_budgetbench.settings.config import Settings, strategy_values
from pytest_budgetbench.strategies import Embedder, Strategy, StrategyContext, load_strategy
from pytest_budgetbench.sweep.cells import Cell
from pytest_budgetbench.sweep.workers import worker_id
from pytest_budgetbench.tasks import Environment, EpisodicTask, Item, StepScore, Task
from pytest_budgetbench.tokens.base import TokenCounter, prompt_sha256

T = TypeVar("T")


class Timer(Protocol):
    """Times a cell's model work, once: its one call, or an agent episode as a whole
    (pytest-benchmark's ``pedantic`` in a sweep: ``sweep_tests.ModelCallTimer``)."""

    def __call__(self, work: Callable[[], T]) -> T: ...


@dataclass
class CellResult:
    """What a cell produced; the ``budget_cell`` fixture returns one."""

    cell: Cell
    item: Item
    row: CellRow
    """The cell's record; also a read-only mapping (``result.row["counted_tokens"]``)."""
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
    def status(self) -> Status:
        return self.row.status

    @property
    def quality(self) -> float | None:
        value = self.row.quality
        return None if value is None else float(value)

    @property
    def prediction(self) -> str | None:
        return self.row.prediction

    @classmethod
    def from_row(
        cls, cell: Cell, item: Item, record: Mapping[str, Any], prompt: list[Message]
    ) -> CellResult:
        """The result a resumed run already recorded for this cell (any schema version)."""
        row = CellRow.from_record(record)
        violation = str(row.error or "") if row.status == Status.VIOLATION else ""
        return cls(cell, item, row, prompt, bool(row.reference), violation)


@dataclass
class CellWork:
    """A cell whose strategy is built and whose row is begun: what the single-call path
    and the episode path both run on."""

    cell: Cell
    item: Item
    strategy: Strategy
    context: StrategyContext
    row: CellRow
    timer: Timer | None

    def parts(self) -> tuple[Cell, Item, Strategy, StrategyContext, CellRow, Timer | None]:
        return self.cell, self.item, self.strategy, self.context, self.row, self.timer


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
        chat: ChatBackend,
        embedder_factory: Callable[[], Embedder] | None = None,
        aux_chats: dict[str, ChatBackend] | None = None,
        structured: Mapping[str, StructuredOutput] | None = None,
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
        self.structured = dict(structured or {})
        """How each auxiliary model's endpoint takes a JSON schema, by label (``aux`` for
        the sweep's own endpoint); a model without an entry is sent none."""
        # Strategies keep per-item state, so each thread (--budgetbench-concurrency) has its own.
        self._local = threading.local()
        self._unread_calls_seen = False
        """Whether a reply held tool calls as text that no parser reads: told once a run."""
        self._seen_lock = threading.Lock()
        self._stopping = threading.Event()
        """Set by :meth:`stop`: cells running in threads end before their next call."""

    def stop(self) -> None:
        """End the cells running in other threads at their next model call, recording
        nothing (Ctrl-C): the session exits in seconds, and a resume runs them."""
        self._stopping.set()

    def strategy(self, name: str) -> Strategy:
        strategies: dict[str, Strategy] = self._local.__dict__.setdefault("strategies", {})
        if name not in strategies:
            strategies[name] = load_strategy(name)
        return strategies[name]

    def _forget_strategy(self, name: str) -> None:
        """Drop a strategy instance whose apply() is still running in a timed-out thread:
        the next cell builds a fresh one."""
        self._local.__dict__.setdefault("strategies", {}).pop(name, None)

    def _load(self, cell: Cell) -> Strategy:
        """The cell's strategy; a constructor that raises is that cell's StrategyError."""
        try:
            return self.strategy(cell.strategy)
        except BudgetBenchError:
            raise
        except Exception as exc:
            raise StrategyError(
                f"strategy '{cell.strategy_label}' could not be built for "
                f"cell {cell.cell_id}: {type(exc).__name__}: {exc}"
            ) from exc

    # -- the cell ----------------------------------------------------------------------
    def run(
        self, cell: Cell, timer: Timer | None = None, *, strategy: Strategy | None = None
    ) -> CellResult:
        """Run ``cell``; ``strategy``, when given, is the instance that runs it instead of
        the one its name loads (training runs its own tier sampler through here)."""
        task = self.catalog.task(cell.task)
        item = self.catalog.items(cell.task)[cell.item_index]
        row = self._base_row(cell, item)
        context: StrategyContext | None = None
        try:
            strategy = strategy or self._load(cell)
            self._describe(row, strategy, cell)
            context = self._context(cell, item, strategy)
            work = CellWork(cell, item, strategy, context, row, timer)
            if isinstance(task, EpisodicTask):
                return self._run_episode(work, task)
            return self._run(work, task)
        except (RecordError, RunStopping):
            raise  # the row could not be written, or must not be: nothing more to record
        except (BudgetBenchError, StrategyAborted) as exc:
            if self._stopping.is_set():  # e.g. the stopped server broke the call in flight
                raise RunStopping(f"cell {cell.cell_id} stopped with the session") from exc
            # The test errors (or the run stops), but the cell still gets its one row.
            if context is not None:
                self._record_strategy(row, context)
            if isinstance(exc, PromptCut):  # the server's count, beside the sweep's
                row.server_prompt_tokens, row.token_count_match = exc.server_tokens, False
            row.status, row.error = Status.ERROR, str(exc)
            self.store.write_row(row)
            raise
        finally:
            self.tokens.save_counts()  # one transaction per cell for the counts it made
            self._tell_unread_calls()

    def _run(self, work: CellWork, task: Task) -> CellResult:
        cell, item, strategy, context, row, timer = work.parts()
        prompt, row.strategy_s, counted = self._apply(strategy, item, cell, context)
        self._record_strategy(row, context)
        sha = prompt_sha256(prompt, item.tools)
        row.counted_tokens, row.prompt_sha256 = counted, sha
        row.estimated_tokens = context.estimated_tokens
        row.utilisation = round(counted / cell.budget, 4)
        # On the prompt as sent (or, over budget, as it would have been): the strategy's.
        spans = spans_kept(item.evidence, prompt)
        fill_retention(row, tally(spans))
        fill_answer(row, self.catalog.answers(cell.task, cell.item_index), prompt)
        self._audit(cell, sha, prompt, spans or None)
        outcome = budgeted_call(
            CallSite(cell.cell_id, strategy.name), prompt, budget=cell.budget,
            tokens=self.tokens, counted=counted,
            send=self._sender(lambda: self._call(prompt, timer, item.tools,
                                                 self.settings.max_tokens, counted)))
        completion = outcome.completion
        if completion is None:
            # Nothing sent (over budget, or model-free): the model's fields stay empty, and
            # an admitted model-free row is "ok" with no quality.
            fill_outcome(row, [], outcome.violation)
            self.store.write_row(row)
            return CellResult(cell, item, row, prompt, strategy.reference,
                              violation=outcome.violation)

        fill_outcome(row, [outcome])
        grade = task.grade(item, completion.text)
        row.prediction = completion.text
        row.extracted = grade.extracted
        row.quality = grade.quality
        row.grader = grade.grader
        # The call's own count, None where the server gave none (an episode's row sums).
        row.output_tokens = completion.completion_tokens
        self.store.write_row(row)
        exported = task.export(item, completion.text, cell.cell_id)
        if exported is not None:
            self.store.write_export(*exported)
        return CellResult(cell, item, row, prompt, strategy.reference)

    def _run_episode(self, work: CellWork, task: EpisodicTask) -> CellResult:
        """An agent episode: the strategy builds, and the runner counts and enforces, the
        prompt of every call (see :mod:`~pytest_budgetbench.engine.episode`)."""
        cell, item, strategy, context, row, timer = work.parts()
        environment = task.environment(item)
        try:
            self._as_strategy_error(strategy, cell, lambda: self._within_timeout(
                lambda: strategy.reset(context), strategy, cell))
            loop = self._episode_loop(task, item, environment,
                                      EpisodeTurns(self, strategy, cell, context), cell.budget)
            episode = timer(loop.play) if timer is not None else loop.play()
        finally:
            environment.close()
        self._record_strategy(row, context)
        fill_row(row, episode)
        if isinstance(loop, TeacherForcedLoop):
            fill_teacher_forced(row, episode, loop.checker)
        elif not episode.violation:
            grade = task.grade_trajectory(item, episode.trajectory)
            row.quality, row.extracted, row.grader = grade.quality, grade.extracted, grade.grader
        self.store.write_episode(episode.record(cell.cell_id, self.run_id))
        self.store.write_row(row)
        return CellResult(cell, item, row, episode.last_prompt, strategy.reference,
                          violation=episode.violation)

    def _episode_loop(self, task: EpisodicTask, item: Item, environment: Environment,
                      turns: EpisodeTurns, budget: int) -> EpisodeLoop:
        """The loop of ``--budgetbench-episodes``: free-running, or teacher-forced on the
        task's reference steps (scored by the task; in a model-free sweep, only counted)."""
        if self.settings.episodes != TEACHER_FORCED:
            return EpisodeLoop(environment, self.tokens, budget, self.settings.max_calls,
                               turns, evidence=item.evidence)
        steps = task.reference_steps(item)
        if steps is None:  # the preflight refuses the mode for such a task
            raise StrategyError(f"task '{task.name}' has no reference trajectory")

        def score(index: int, prediction: Message) -> StepScore:
            return task.score_step(item, steps, index, prediction)

        return TeacherForcedLoop(environment, self.tokens, budget, self.settings.max_calls,
                                 turns, evidence=item.evidence, steps=steps,
                                 score=score if self.endpoint.sends else None)

    def _describe(self, row: CellRow, strategy: Strategy, cell: Cell) -> None:
        """The strategy's own fields of the row; a strategy whose declarations cannot be
        read fails its cell like one whose apply() raises."""
        try:
            row.strategy = strategy.name
            row.regime = strategy.regime_label()
            row.reference = bool(strategy.reference)
        except Exception as exc:
            raise StrategyError(
                f"strategy '{row.strategy}' has unreadable declarations on cell "
                f"{cell.cell_id}: {type(exc).__name__}: {exc}"
            ) from exc

    def _context(self, cell: Cell, item: Item, strategy: Strategy) -> StrategyContext:
        aux = RecordedAuxModel(self.chat, self.tokens, cell.budget, cell.cell_id,
                               strategy=strategy.name, structured=self.structured.get("aux"))
        settings = self.settings
        return StrategyContext(
            tokens=self.tokens.with_tools(item.tools),
            tools=list(item.tools),
            item_id=f"{cell.task}/{item.item_id}",
            seed=settings.seed,
            aux=aux,
            aux_models={name: aux.sibling(chat, name, self.structured.get(name))
                        for name, chat in self.aux_chats.items()},
            embedder_factory=self.embedder_factory,
            work_dir=self.store.strategy_files_dir,
            options={"embedding_model": settings.embedding_model,
                     **strategy_values(type(strategy), settings)},
        )

    def _apply(
        self, strategy: Strategy, item: Item, cell: Cell, context: StrategyContext
    ) -> tuple[list[Message], float, int]:
        """The strategy's prompt, the seconds it took, and the prompt's token count."""
        return self._prompt_of(
            strategy, cell, lambda: self._reset_and_apply(strategy, item, cell, context),
            item.tools)

    def _prompt_of(
        self, strategy: Strategy, cell: Cell, work: Callable[[], object],
        tools: Sequence[Tool],
    ) -> tuple[list[Message], float, int]:
        """The prompt ``work`` returns (run within the strategy's timeout), checked (chat
        messages, tool-call pairs), the seconds it took, and its count with ``tools``."""
        started = time.perf_counter()
        produced_by = f"strategy '{strategy.name}'"

        def checked() -> list[Message]:
            prompt = check_messages(self._within_timeout(work, strategy, cell), produced_by)
            if not prompt:  # no template renders it, no endpoint takes it
                raise StrategyError(
                    f"{produced_by} returned no message on cell {cell.cell_id}: an empty "
                    "prompt cannot be counted or sent")
            try:
                check_tool_pairs(prompt, produced_by)
            except ValueError as exc:  # the message names the strategy and the pair
                raise StrategyError(f"{exc} (cell {cell.cell_id})") from None
            return prompt

        prompt = self._as_strategy_error(strategy, cell, checked)
        seconds = round(time.perf_counter() - started, 6)
        # Counting is the runner's, but what it counts is the strategy's: a prompt the
        # counter cannot read fails here, as the strategy's error.
        counted = self._as_strategy_error(
            strategy, cell, lambda: self.tokens.count_messages(prompt, tools))
        return prompt, seconds, counted

    @staticmethod
    def _as_strategy_error(strategy: Strategy, cell: Cell, work: Callable[[], T]) -> T:
        """``work()``; whatever it raises is the strategy's error, but for the endpoint's
        or the counter's own failures."""
        try:
            return work()
        except (EndpointError, StrategyError, TokenizerError):
            raise
        except BudgetExceeded as exc:
            raise StrategyError(f"strategy '{strategy.name}' made an auxiliary call over budget: "
                                f"{exc}") from exc
        except Exception as exc:
            raise StrategyError(
                f"strategy '{strategy.name}' failed on cell {cell.cell_id}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    @staticmethod
    def _reset_and_apply(
        strategy: Strategy, item: Item, cell: Cell, context: StrategyContext
    ) -> object:
        strategy.reset(context)
        context.estimated_tokens = None  # the strategy's own count of this prompt, if any
        # A private copy: a strategy that mutates its input must not corrupt later cells.
        return strategy.apply(private_copy(item.messages), cell.budget)

    def _within_timeout(
        self, work: Callable[[], object], strategy: Strategy, cell: Cell
    ) -> object:
        """Run a strategy's work in a daemon thread and wait at most
        --budgetbench-strategy-timeout. A hung strategy cannot be stopped from outside, so
        its thread is left behind and its instance forgotten; the sweep goes on."""
        limit = self.settings.strategy_timeout
        outcome: list[object] = []
        failure: list[BaseException] = []

        def target() -> None:
            try:
                outcome.append(work())
            except BaseException as exc:  # re-raised in the cell's own thread below
                failure.append(exc)

        worker = threading.Thread(target=target, name=f"budgetbench-{cell.cell_id}",
                                  daemon=True)
        worker.start()
        worker.join(limit)
        if worker.is_alive():
            self._forget_strategy(cell.strategy)
            raise StrategyError(
                f"strategy '{strategy.name}' timed out on cell {cell.cell_id} after {limit:g} s "
                "(--budgetbench-strategy-timeout); its cell is an error, the sweep goes on"
            )
        if failure and isinstance(failure[0], (SystemExit, KeyboardInterrupt)):
            exc = failure[0]
            raise StrategyAborted(
                f"strategy '{strategy.name}' raised {type(exc).__name__}"
                f"({', '.join(map(repr, exc.args))}) on cell {cell.cell_id}; the run stops here"
            ) from exc
        if failure:
            raise failure[0]
        return outcome[0]

    def _sender(self, send: Callable[[], Completion]) -> Callable[[], Completion] | None:
        """``send``, or None in a model-free sweep (its endpoint sends nothing)."""
        return send if self.endpoint.sends else None

    def _call(self, prompt: list[Message], timer: Timer | None, tools: Sequence[Tool],
              max_tokens: int, counted: int) -> Completion:
        """The reply to ``prompt`` (``counted`` tokens); a PromptCut where the server's own
        count says it evaluated less (:func:`~pytest_budgetbench.engine.calls.cut_by_server`):
        that reply leaves the response cache, as it answers no prompt a strategy built."""
        if self._stopping.is_set():
            raise RunStopping("the session is stopping: no more model calls")

        def call() -> Completion:
            return self.chat.complete(prompt, max_tokens=max_tokens, tools=tools or None)

        completion = timer(call) if timer is not None else call()
        cut = cut_by_server(prompt, counted, completion, self.tokens,
                            likely_cut(self.endpoint.server))
        if cut is not None:
            from pytest_budgetbench.cache.responses import CachingChatModel

            if isinstance(self.chat, CachingChatModel):
                self.chat.forget(prompt, max_tokens=max_tokens, tools=tools or None)
            raise PromptCut(cut, completion.prompt_tokens)
        self._look_for_unread_calls(completion, tools)
        return completion

    def _look_for_unread_calls(self, completion: Completion, tools: Sequence[Tool]) -> None:
        """Keep a note, the first time in the run, of a reply whose text holds calls to the
        request's tools while its ``tool_calls`` is empty and no parser reads text: the
        call is taken for the final answer (an episode ends after it, graded 0), and
        nothing else says why. The note is told as the cell ends (:meth:`run`)."""
        if self._unread_calls_seen or not tools or completion.tool_calls:
            return
        if parser_for(self.settings.tool_parser, self.endpoint.embedded) != "none":
            return  # a parser read the text already and found no call
        if not parse_tool_calls(completion.text, tools).tool_calls:
            return
        with self._seen_lock:
            first, self._unread_calls_seen = not self._unread_calls_seen, True
        if first:
            self._local.unread_calls = True

    def _tell_unread_calls(self) -> None:
        """The note :meth:`_look_for_unread_calls` kept in this thread, as a warning (in
        pytest's warnings summary; its text is the same in every xdist worker, so pytest
        shows it once). Told after the cell's row, which an error-raising filter
        (``-W error``) must not cost."""
        if not self._local.__dict__.pop("unread_calls", False):
            return
        warnings.warn(unread_calls_note(self.endpoint), stacklevel=2)

    def _audit(self, cell: Cell, sha: str, prompt: list[Message],
               evidence: list[SpanKept] | None = None) -> None:
        """prompts.jsonl's record: with audit=full the prompt and its evidence marks, with
        hash its sha256 only."""
        mode = self.settings.audit
        if mode == "full":
            self.store.write_prompt(cell.cell_id, sha, prompt, evidence)
        elif mode != "off":
            self.store.write_prompt(cell.cell_id, sha, None)

    @staticmethod
    def _record_strategy(row: CellRow, context: StrategyContext) -> None:
        """The strategy's auxiliary calls (every named model's) and its own notes."""
        assert isinstance(context.aux, RecordedAuxModel)
        calls = context.aux.calls
        row.aux_calls = [call.row() for call in calls]
        row.aux_input_tokens = sum(c.input_tokens for c in calls)
        row.aux_output_tokens = sum(c.output_tokens or 0 for c in calls)
        row.aux_s = round(sum(c.latency_s for c in calls), 4)
        row.aux_failures = context.aux_failures
        row.strategy_info = context.info or None

    def _base_row(self, cell: Cell, item: Item) -> CellRow:
        """The row before the cell runs: who, what and where; the outcome fields start
        empty and status "error", so a cell that dies half-way still records as errored."""
        return CellRow(
            run_id=self.run_id,
            cell_id=cell.cell_id,
            task=cell.task,
            item_id=item.item_id,
            category=item.category,
            gold=item.answer,  # the viewer and diff show it beside the reply
            strategy=cell.strategy_label,  # the strategy's own, once built
            budget=cell.budget,
            repeat=cell.repeat,
            model=self.endpoint.model,
            endpoint=self.endpoint.label,
            server_flags=self.endpoint.server_flags,
            tokenizer=self.tokens.name,
            tokenizer_exact=self.tokens.exact,
            grader=self.catalog.task(cell.task).grader_id,
            seed=self.settings.seed,
            worker=worker_id(),
            time=round(time.time(), 3),
        )


@dataclass
class EpisodeTurns:
    """One episode cell as its loop sees it (an ``episode.EpisodeCell``): the strategy's
    prompt at each call, and the model's reply."""

    runner: Runner
    strategy: Strategy
    cell: Cell
    context: StrategyContext

    @property
    def site(self) -> CallSite:
        return CallSite(self.cell.cell_id, self.strategy.name)

    def prompt(self, trajectory: list[Message],
               tools: list[Tool]) -> tuple[list[Message], float, int]:
        """One call's prompt: the strategy sees the trajectory so far (a private copy) and
        a counter that counts the tools with every prompt."""
        strategy, cell, runner = self.strategy, self.cell, self.runner
        self.context.tools, self.context.tokens = tools, runner.tokens.with_tools(tools)
        self.context.estimated_tokens = None
        return runner._prompt_of(
            strategy, cell, lambda: strategy.apply(copy.deepcopy(trajectory), cell.budget), tools)

    @property
    def estimated_tokens(self) -> int | None:
        return self.context.estimated_tokens

    def send(self, prompt: list[Message], tools: list[Tool], counted: int) -> Completion:
        # No timer per call: an episode is timed as a whole (Runner.run's timer).
        return self.runner._call(prompt, None, tools, self.runner.settings.agent_max_tokens,
                                 counted)


def unread_calls_note(endpoint: Endpoint) -> str:
    """The warning for replies that hold tool calls as text no parser reads."""
    return (
        f"replies of model {endpoint.model!r} at {endpoint.label} hold tool calls as text "
        "(e.g. <tool_call> blocks) with tool_calls empty, and no tool-call parser reads "
        "text for this endpoint (the default, auto, reads it for the embedded model only): "
        "each such call is read as the final answer, so an agent episode ends at its "
        "first call; to read them, pass --budgetbench-tool-parser=hermes, or have the "
        "server return its calls in tool_calls"
    )
