"""The run object: one per pytest process, kept in ``config.stash``.

The controller (the only process without xdist, or xdist's master) resolves the endpoint
once, names the run, and hands both to xdist workers through ``workerinput``. Each process
builds its own runner lazily on its first cell, so heavy imports happen only when a sweep
really runs.

With no endpoint given, the embedded llama.cpp server is resolved from its GGUF and
started on the first reply the response cache does not hold (:mod:`~pytest_budgetbench.
embedded_server.launcher`): by the controller's launcher, in-process, or, under xdist, by the
controller at a worker's request, so it stays one server that dies with the run.

Two concerns live in their own modules: :mod:`~pytest_budgetbench.engine.resume` (the run
directory, and whether a resume may go on with the run there) and
:mod:`~pytest_budgetbench.reports.gates.items` (judging a gate over the run's rows).
"""

from __future__ import annotations

import functools
import random
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_budgetbench import embedded_server
from pytest_budgetbench.canonical import canonical_json
from pytest_budgetbench.engine import preflight, resume, wiring
from pytest_budgetbench.engine.catalog import Catalog
from pytest_budgetbench.engine.resume import resolve_run_dir
from pytest_budgetbench.engine.runner import CellResult, Runner, Timer
from pytest_budgetbench.engine.search import SearchSpec, check_limits, run_search, search_specs
from pytest_budgetbench.errors import (
    EndpointError,
    MissingDependency,
    RecordError,
    check_installed,
)
from pytest_budgetbench.messages import Message
from pytest_budgetbench.model.endpoint import Endpoint
from pytest_budgetbench.records import run_json
from pytest_budgetbench.records.rows import FINAL_STATUSES
from pytest_budgetbench.records.run_json import RunInfo
from pytest_budgetbench.records.store import RunStore
from pytest_budgetbench.reports.gates import items as gate_items
from pytest_budgetbench.reports.gates.verdicts import GateSpec, GateVerdict, gate_specs
from pytest_budgetbench.settings.config import Settings
from pytest_budgetbench.strategies import reference_flags, strategy_classes
from pytest_budgetbench.sweep.cells import Cell, adjacent_prompt_starts, build_cells
from pytest_budgetbench.sweep.shards import shard_cells

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_budgetbench.cache.responses import ResponseStore
    from pytest_budgetbench.embedded_server import Launcher, LaunchService, ServerLauncher
    from pytest_budgetbench.records.safe_budgets import SafeBudgetRecord
    from pytest_budgetbench.reports import Report
    from pytest_budgetbench.tokens.base import TokenCounter

SESSION_KEY = pytest.StashKey["BudgetBenchSession"]()
"""The run object of this pytest process, in ``config.stash`` (beside its class, as
pytest keeps its own stash keys)."""


class BudgetBenchSession:
    """The run of one pytest process: its settings, run directory, cells and results.

    Every process (the controller, or an xdist worker built from ``worker_state``):

    - builds the sweep's :attr:`cells` (sharded and shuffled as asked) from the catalog;
    - runs a cell once (:meth:`run_cell`), or takes its row from a resumed run
      (:attr:`recorded`), or from the threads of :meth:`prefetch`;
    - judges gate items (:meth:`judge`, :mod:`~pytest_budgetbench.reports.gates.items`).

    The controller alone, before any cell runs (:meth:`start`): checks the sweep,
    resolves the endpoint (or the embedded server, started on first need), checks a resume
    (:mod:`~pytest_budgetbench.engine.resume`) and writes run.json; it hands the workers
    what they need (:meth:`worker_state`), writes the report at the end (:meth:`finish`)
    and stops the server (:meth:`stop`).
    """

    def __init__(self, settings: Settings, *, worker_state: dict[str, Any] | None = None) -> None:
        self.settings = settings
        self.is_worker = worker_state is not None
        run_dir = Path(worker_state["run_dir"]) if worker_state else resolve_run_dir(settings)
        self.run_id = run_dir.name
        self.endpoint: Endpoint | None = (
            Endpoint(**worker_state["endpoint"]) if worker_state else None
        )
        self.aux_endpoints: dict[str, Endpoint] = {
            name: Endpoint(**fields)
            for name, fields in (worker_state or {}).get("aux_endpoints", {}).items()
        }
        self.store = RunStore(run_dir)
        self.catalog = Catalog(settings)
        self.server: ServerLauncher | None = None
        """The controller's launcher of the embedded server (None for a given endpoint)."""
        self.launcher: Launcher | None = self.server
        """Where this process gets the embedded server's URL: the launcher, or a worker's
        line to the controller's."""
        if worker_state and worker_state.get("launcher"):
            from pytest_budgetbench.embedded_server import RemoteLauncher

            self.launcher = RemoteLauncher(worker_state["launcher"])
        self._launch_service: LaunchService | None = None
        self.on_server_start: Callable[[], None] | None = None
        """Called just before the embedded server starts (the plugin prints a line)."""
        self.results: dict[str, CellResult] = {}
        self.errored: set[str] = set()
        self._pending: dict[str, Future[CellResult]] = {}
        self._pool: ThreadPoolExecutor | None = None
        self.verdicts: list[GateVerdict] = []
        """The gates' verdicts, as the controller saw their reports (a worker's come in its
        gate reports' user_properties)."""
        self.report: Report | None = None
        """The report computed from this run's rows (by the first gate, or at the end)."""
        self._report_rows: tuple[int, int] | None = None
        """cells.jsonl's size and mtime when ``report`` was computed: rows since, recompute."""
        self.started = False
        self.report_dir: Path | None = None
        self.report_missing: str | None = None
        """Why the report was not written (its extra is not installed) and how to write it."""
        self._runner: Runner | None = None
        self._counter: TokenCounter | None = None
        """The controller's counter, loaded and tried by the preflight; workers load theirs."""
        self.notes: list[str] = []
        """Lines for the terminal once the session started (e.g. a resume not fully checked)."""
        self.created = time.time()
        """When this process's session began: cache entries rejected since are this run's."""

    # -- controller --------------------------------------------------------------------
    def start(self) -> None:
        """Check the sweep, resolve the endpoint and write run.json, before any cell runs.

        Nothing is written until the checks that need no endpoint have passed: a ConfigError
        (or a DataError, an EndpointError) names the first problem."""
        settings = self.settings
        preflight.check_sweep(settings, self.catalog, self.planned_cells)
        if settings.search is not None:
            check_limits(settings, list(dict.fromkeys(s.name for s in self.searches)))
        wiring.check_caches(settings, self.store.run_dir)
        if settings.endpoint:
            self.endpoint = wiring.resolve_endpoint(settings)
        elif settings.model_free:
            self.endpoint = wiring.model_free_endpoint(settings)
        else:
            self.endpoint = self._embedded()
        self.aux_endpoints = {
            name: wiring.resolve_aux(name, target, settings.api_key)
            for name, target in (settings.aux_models or {}).items()
        }
        preflight.check_context(settings, self.endpoint)
        self._counter = preflight.check_tokenizer(settings, functools.partial(
            wiring.make_counter, settings.tokenizer, self.endpoint, settings.api_key,
            settings.chat_template_kwargs), tools=preflight.sends_tools(self.catalog))
        self.endpoint = wiring.counted_server(self.endpoint, self._counter)
        self.store.lock()
        self._write_run_info()
        self.started = True

    @property
    def counter_name(self) -> str:
        """The token counter the sweep counts with, as rows name it (once started)."""
        return self._counter.name if self._counter else self.settings.tokenizer

    def embedded_description(self) -> str:
        """What starting the embedded model means, for the line printed before it starts."""
        from pytest_budgetbench.embedded_server import embedded_model

        model = embedded_model(self.settings.model)
        return f"{model.description}, n_ctx {self._embedded_n_ctx()}"

    def _embedded_n_ctx(self) -> int:
        return embedded_server.embedded_context(max(self.settings.budgets),
                                                self.settings.max_tokens)

    def _write_run_info(self) -> None:
        """Write run.json; on a resume, after the checks that the run may go on
        (:func:`~pytest_budgetbench.engine.resume.check_resume`)."""
        assert self.endpoint is not None
        block = resume.sweep_definition(
            self.settings, self.catalog, self.endpoint.model,
            self.counter_name,
            {name: e.model for name, e in self.aux_endpoints.items()})
        info: RunInfo = {
            "run_id": self.run_id, "settings": self.settings.public(),
            "endpoint": self.endpoint.label, "model": self.endpoint.model,
            "server_flags": self.endpoint.server_flags, "started": time.time(),
            "definition": block}
        if self.endpoint.server:
            info["server"] = self.endpoint.server
        earlier = resume.earlier_run_info(self.settings, self.store)
        if earlier is not None:
            self.notes += resume.check_resume(self.run_id, earlier, block,
                                              settings=self.settings, catalog=self.catalog,
                                              recorded=self.recorded.values())
            info = run_json.resumed(earlier, time.time())
        self.store.write_run_info(info)

    def _embedded(self) -> Endpoint:
        """The embedded server's endpoint, from its GGUF; the server itself starts on the
        first cache miss (or now, for a counter that asks the server)."""
        settings = self.settings
        self.server, endpoint = embedded_server.embedded_launcher(
            self._embedded_n_ctx(), settings.threads, self.store.server_log_path,
            settings.model, on_start=self._server_starting,
        )
        self.launcher = self.server
        return embedded_server.counting_endpoint(settings.tokenizer, endpoint, self.server)

    def _server_starting(self) -> None:
        if self.on_server_start is not None:
            self.on_server_start()

    @property
    def server_needed(self) -> bool:
        """Whether this run asked for the embedded server, started or failed (the
        controller knows: under xdist it starts the server for the workers)."""
        return self.server is not None and self.server.attempted

    def worker_state(self) -> dict[str, Any]:
        """What an xdist worker needs: the run, the endpoints, and the address at which it
        asks the controller for the embedded server (the service starts with the first)."""
        assert self.endpoint is not None
        state: dict[str, Any] = {
            "run_dir": str(self.store.run_dir), "endpoint": vars(self.endpoint),
            "aux_endpoints": {name: vars(e) for name, e in self.aux_endpoints.items()}}
        if self.settings.shard is not None:  # resolved here once: a worker reads no engine
            state["shard"] = [*self.settings.shard, self.settings.shard_source]
        if self.server is not None:
            if self._launch_service is None:
                from pytest_budgetbench.embedded_server import LaunchService

                self._launch_service = LaunchService(self.server)
            state["launcher"] = self._launch_service.address
        return state

    def finish(self) -> None:
        """Write the report of this run (the gates are test items; see :meth:`judge`)."""
        if self.settings.report == "off":
            return
        from pytest_budgetbench import reports

        try:
            check_installed(reports.REQUIREMENTS, "the HTML report",
                            f"then `budgetbench report {self.store.run_dir}`")
        except MissingDependency as exc:  # a core install: the records and summary stand
            self.report_missing = str(exc)
            return
        try:
            if self.settings.search is not None:  # its figure, before the report: its own
                from pytest_budgetbench.reports.builder import PLOTS_DIR
                from pytest_budgetbench.reports.plots import safe_budget_plots

                safe_budget_plots(self.store.safe_budgets(), self.store.report_dir / PLOTS_DIR)
            report = self.computed_report()
            reports.write_report(report, plots=self.settings.report == "on")
        except OSError as exc:
            raise self._unwritable(exc) from None
        self.report_dir = report.out_dir

    def computed_report(self) -> Report:
        """The report of this run's rows, computed once and again only when rows were
        recorded since (a gate selected alone runs its cells first)."""
        settings = self.settings
        from pytest_budgetbench import reports

        cells = self.store.cells_path
        stat = cells.stat() if cells.exists() else None
        rows = (stat.st_size, stat.st_mtime_ns) if stat else (0, 0)
        if self.report is not None and rows == self._report_rows:
            return self.report
        prices = None
        if settings.price_in is not None or settings.price_out is not None:
            prices = reports.Prices(settings.price_in or 0.0, settings.price_out or 0.0)
        try:
            self.report = reports.compute_report(
                [self.store.run_dir], self.store.report_dir,
                reference=settings.reference, resamples=settings.resamples, seed=settings.seed,
                prices=prices,
            )
        except OSError as exc:
            raise self._unwritable(exc) from None
        self._report_rows = rows
        return self.report

    def _unwritable(self, exc: OSError) -> RecordError:
        return RecordError(  # a full disk: the cells are safe, only the report is not
                f"the report could not be written to {self.store.run_dir / 'report'} "
                f"({exc.strerror or exc}); the cells are intact in {self.store.cells_path}: "
                f"free space and rebuild it with `budgetbench report {self.store.run_dir}`"
            )

    # -- gates -------------------------------------------------------------------------
    @functools.cached_property
    def gates(self) -> list[GateSpec]:
        """The gate items this sweep asked for, one per kind and strategy@budget (none in a
        budget search: its floors are what it searches for, its gate is each search item)."""
        if self.settings.search is not None:
            return []
        return gate_specs(reference_flags(strategy_classes(self.settings.strategies)),
                          self.settings)

    def judge(self, gate: GateSpec, running_elsewhere: set[str]) -> GateVerdict:
        """A gate's verdict over the computed report (see :func:`~pytest_budgetbench.reports.gates.
        items.judge`): runs the gate's cells this process has not run, waits for those
        ``running_elsewhere``."""
        return gate_items.judge(self, gate, running_elsewhere)

    def cache_rejections(self) -> list[str]:
        """A line per cache file whose entries failed their checksum during this run."""
        return wiring.cache_rejections(self.settings, self.store.run_dir, self.created)

    def interrupt(self) -> None:
        """Ctrl-C: cells running in threads end before their next model call, recording
        nothing (:meth:`stop` then ends the rest)."""
        if self._runner is not None:
            self._runner.stop()

    def stop(self) -> None:
        """End the session: cells queued in threads are dropped and those running end
        before their next model call, recording nothing (after Ctrl-C: the resume runs
        them), and the embedded server stops, which ends a call in flight at once."""
        self.store.unlock()
        self.interrupt()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        if self._launch_service is not None:
            self._launch_service.close()
            self._launch_service = None
        if self.server is not None:
            self.server.stop()  # keeps .attempted: the summary (printed before) reads it
        if pool is not None:
            pool.shutdown(wait=True)  # each thread is at most one call (now failing) from done

    # -- every process -----------------------------------------------------------------
    @functools.cached_property
    def cells(self) -> list[Cell]:
        """The sweep's cells; built once, as collection and parametrization both need them.
        None in a budget search: its probes choose their cells as it goes."""
        if self.settings.search is not None:
            return []
        return self._build_cells(self.settings.budgets)

    @functools.cached_property
    def planned_cells(self) -> list[Cell]:
        """The cells the checks before the first cell read: the sweep's, or in a budget
        search those of its largest budget, which it probes first."""
        if self.settings.search is None:
            return self.cells
        return self._build_cells((self.settings.search.hi,))

    @functools.cached_property
    def searches(self) -> list[SearchSpec]:
        """A budget search's items, one per task and strategy (none without a search)."""
        if self.settings.search is None:
            return []
        classes = strategy_classes(self.settings.strategies)
        return search_specs(self.catalog.names, {
            spec: (cls.name, bool(cls.reference)) for spec, cls in classes.items()})

    def run_search(self, spec: SearchSpec) -> SafeBudgetRecord:
        """Search one task and strategy's smallest safe budget (see engine.search)."""
        return run_search(self, spec)

    def _build_cells(self, budgets: tuple[int, ...]) -> list[Cell]:
        items = {task: [i.item_id for i in self.catalog.items(task)]
                 for task in self.catalog.names}
        names = {spec: cls.name
                 for spec, cls in strategy_classes(self.settings.strategies).items()}
        cells = build_cells(
            items, self.settings.strategies, budgets, self.settings.repeats, names
        )
        cells = adjacent_prompt_starts(cells, {
            task: {item.item_id: canonical_json(item.tools) for item in self.catalog.items(task)}
            for task in self.catalog.names})
        if self.settings.shard is not None:
            cells = shard_cells(cells, items, *self.settings.shard)
        if self.settings.shuffle == "on":
            # Seeded, so every xdist worker collects the same order.
            random.Random(self.settings.seed).shuffle(cells)
        return cells

    @property
    def runner(self) -> Runner:
        if self._runner is None:
            self._runner = self._make_runner()
        return self._runner

    def _make_runner(self) -> Runner:
        if self.endpoint is None:
            raise EndpointError("the sweep's endpoint was not resolved at session start")
        return wiring.make_runner(
            self.settings, self.catalog, self.endpoint, self.store, self.run_id,
            response_store=self.response_store, aux_endpoints=self.aux_endpoints,
            tokens=self._counter, launcher=self.launcher,
        )

    @functools.cached_property
    def response_store(self) -> ResponseStore | None:
        """The response cache of --budgetbench-cache, or None when replies are sampled."""
        return wiring.session_response_store(self.settings, self.store.run_dir, self.run_id)

    def skip_reason(self, cell: Cell) -> str | None:
        """Why a cell's task cannot run on this endpoint (e.g. it needs vision), or None."""
        return self.task_skip_reason(cell.task)

    def task_skip_reason(self, task: str) -> str | None:
        """Why ``task`` cannot run on this endpoint (e.g. it needs vision), or None."""
        endpoint = {
            "model": self.endpoint.model if self.endpoint else None,
            "vision": self.settings.vision == "on",
        }
        return self.catalog.task(task).skip_reason(endpoint)

    def run_cell(self, cell: Cell, timer: Timer | None = None) -> CellResult:
        """Run a cell once per process; later requests for it get the same result."""
        if cell.cell_id not in self.results:
            try:
                self.results[cell.cell_id] = self._result(cell, timer)
            except Exception:
                self.errored.add(cell.cell_id)  # recorded as an error row; a gate skips it
                raise
        return self.results[cell.cell_id]

    def _result(self, cell: Cell, timer: Timer | None) -> CellResult:
        recorded = self.recorded.get(cell.cell_id)
        if recorded is not None:
            item = self.catalog.items(cell.task)[cell.item_index]
            prompt = self._recorded_prompts.get(cell.cell_id, [])
            return CellResult.from_row(cell, item, recorded, prompt)
        pending = self._pending.pop(cell.cell_id, None)
        if pending is not None:
            return pending.result()
        return self.runner.run(cell, timer)

    @functools.cached_property
    def recorded(self) -> dict[str, dict[str, Any]]:
        """Cells a resumed run already has, by cell id (empty for a new run)."""
        if self.settings.resume is None:
            return {}
        return {row["cell_id"]: row for row in self.store.rows()
                if row.get("status") in FINAL_STATUSES and "cell_id" in row}

    @functools.cached_property
    def _recorded_prompts(self) -> dict[str, list[Message]]:
        """The prompt each recorded cell's last prompts.jsonl record kept (none where only
        its sha256 was kept)."""
        return {prompt.cell_id: prompt.messages
                for prompt in self.store.prompts_of(self.recorded.keys())
                if prompt.messages is not None}

    def prefetch(self, cells: list[Cell]) -> None:
        """Start ``--budgetbench-concurrency`` cells at a time in threads (as many per
        replica of the endpoint); the tests then collect their results in order."""
        runner = self.runner  # built once, here, not raced for by the threads
        self._pool = ThreadPoolExecutor(self.settings.parallel_cells,
                                        thread_name_prefix="budgetbench")
        for cell in cells:
            if cell.cell_id not in self.recorded and cell.cell_id not in self._pending:
                self._pending[cell.cell_id] = self._pool.submit(runner.run, cell)
