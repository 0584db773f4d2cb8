"""The run object: one per pytest process, kept in ``config.stash``.

The controller (the only process without xdist, or xdist's master) resolves the endpoint
once, names the run, and hands both to xdist workers through ``workerinput``. Each process
builds its own runner lazily on its first cell, so heavy imports happen only when a sweep
really runs.

With no endpoint given, the embedded llama.cpp server is resolved from its GGUF and
started on the first reply the response cache does not hold (:mod:`~pytest_budgetbench.
launcher`): by the controller's launcher, in-process, or, under xdist, by the controller
at a worker's request, so it stays one server that dies with the run.
"""

from __future__ import annotations

import functools
import json
import random
import secrets
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_budgetbench import embedded
from pytest_budgetbench.engine import preflight, wiring
from pytest_budgetbench.engine.catalog import Catalog
from pytest_budgetbench.engine.declared import strategy_values, task_values
from pytest_budgetbench.engine.runner import CellResult, Runner, Timer
from pytest_budgetbench.errors import (
    BudgetBenchError,
    ConfigError,
    EmbeddedServerError,
    EndpointError,
    MissingDependency,
    RecordError,
    check_installed,
)
from pytest_budgetbench.messages import Message
from pytest_budgetbench.model.endpoint import Endpoint
from pytest_budgetbench.records import definition
from pytest_budgetbench.records.store import (
    CELLS_FILE,
    FINAL_STATUSES,
    RUN_FILE,
    RunStore,
    read_jsonl,
)
from pytest_budgetbench.reports.verdicts import GateSpec, GateVerdict, gate_specs
from pytest_budgetbench.settings.cells import Cell, build_cells
from pytest_budgetbench.settings.config import Settings

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_budgetbench.embedded import Launcher, LaunchService, ServerLauncher
    from pytest_budgetbench.model.cache import ResponseStore
    from pytest_budgetbench.reports import Report
    from pytest_budgetbench.tokens.counters import TokenCounter

SESSION_KEY = pytest.StashKey["BudgetBenchSession"]()
"""The run object of this pytest process, in ``config.stash`` (beside its class, as
pytest keeps its own stash keys)."""
def new_run_id(shard: tuple[int, int] | None = None) -> str:
    run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)
    return f"{run_id}-shard{shard[0]}of{shard[1]}" if shard else run_id


def resolve_run_dir(settings: Settings) -> Path:
    """A new run directory under --budgetbench-out, or the one --budgetbench-resume names."""
    out = Path(settings.out)
    if settings.resume is None:
        return out / new_run_id(settings.shard)
    if settings.resume == "latest":
        # run.json is written after the checks and before the first cell, so a directory
        # that has it is a run, even one killed in its first cell with no row yet; one
        # without it is a start that failed (it may hold the embedded server's log).
        runs = [d for d in out.glob("*") if (d / RUN_FILE).is_file()]
        if not runs:
            raise ConfigError(
                f"--budgetbench-resume=latest found no run in {out}; "
                "pass the run directory, or --budgetbench-out=DIR where the runs are"
            )
        return max(runs, key=started_at)
    run_dir = Path(settings.resume)
    if not (run_dir / RUN_FILE).is_file() and not (run_dir / CELLS_FILE).is_file():
        raise ConfigError(
            f"--budgetbench-resume={settings.resume}: not a run directory (no {RUN_FILE} or "
            f"{CELLS_FILE}); pass a directory under --budgetbench-out, or 'latest'"
        )
    return run_dir


def started_at(run_dir: Path) -> float:
    """When a run first started (run.json keeps it across resumes); run ids made in the
    same second do not sort by time."""
    try:
        return float(json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))["started"])
    except (OSError, ValueError, KeyError, TypeError):
        return (run_dir / RUN_FILE).stat().st_mtime if (run_dir / RUN_FILE).exists() else 0.0


class BudgetBenchSession:
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
            from pytest_budgetbench.embedded import RemoteLauncher

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
        preflight.check_sweep(settings, self.catalog, self.cells)
        wiring.check_caches(settings, self.store.run_dir)
        if settings.endpoint:
            self.endpoint = wiring.resolve_endpoint(settings)
        else:
            self.endpoint = self._embedded()
        self.aux_endpoints = {
            name: wiring.resolve_aux(name, target, settings.api_key)
            for name, target in (settings.aux_models or {}).items()
        }
        self._counter = preflight.check_tokenizer(settings, self.endpoint)
        self.store.lock()
        self._write_run_info()
        self.started = True

    def embedded_description(self) -> str:
        """What starting the embedded model means, for the line printed before it starts."""
        from pytest_budgetbench.embedded import embedded_model

        model = embedded_model(self.settings.model)
        return f"{model.description}, n_ctx {self._embedded_n_ctx()}"

    def _embedded_n_ctx(self) -> int:
        return embedded.embedded_context(max(self.settings.budgets), self.settings.max_tokens)

    def _write_run_info(self) -> None:
        assert self.endpoint is not None
        block = self._definition()
        info = {"run_id": self.run_id, "settings": self.settings.public(),
                "endpoint": self.endpoint.label, "model": self.endpoint.model,
                "server_flags": self.endpoint.server_flags, "started": time.time(),
                definition.KEY: block}
        earlier = self._earlier_run_info()
        if earlier is not None:
            self._check_resume(earlier, block)
            info = {**earlier, "resumed": [*earlier.get("resumed", []), time.time()]}
        self.store.write_run_info(info)

    def _definition(self) -> dict[str, Any]:
        """What defines this run's cells (see :mod:`~pytest_budgetbench.records.definition`)."""
        assert self.endpoint is not None
        settings, catalog = self.settings, self.catalog
        block = run_definition(settings, self.endpoint.model, self._counter.name
                               if self._counter else settings.tokenizer,
                               {name: e.model for name, e in self.aux_endpoints.items()})
        for name, entry in block["tasks"].items():
            task = catalog.task(name)
            path = task.options.data_path
            entry["grader"] = task.grader_id
            entry["data"] = None if path is None else {
                "path": str(path), "sha256": definition.content_sha256(path)}
            entry["items"] = {item.item_id: definition.item_digest(
                item.item_id, item.messages, item.answer, item.category)
                for item in catalog.items(name)}
        return block

    def _check_resume(self, earlier: dict[str, Any], current: dict[str, Any]) -> None:
        """Refuse to resume a run whose cells this session would define otherwise: one
        line naming the first difference (or the first recorded gold that differs)."""
        recorded = earlier.get(definition.KEY)
        if not isinstance(recorded, dict):
            recorded = self._legacy_definition(earlier)
            self.notes.append(
                f"run {self.run_id} was made before run.json recorded a definition: its "
                "settings were checked, the content of its data files and items could not be")
            current = {**current, "settings": {**current["settings"],
                                               "tokenizer": self.settings.tokenizer}}
        found = definition.differences(recorded, current)
        if found:
            raise ConfigError(
                f"--budgetbench-resume: run {self.run_id} was made with "
                f"{definition.describe(found, '{what} {old}, this session asks {new}')}; "
                "resume with the run's settings, or start a new run (drop --budgetbench-resume)")
        self._check_recorded_golds()

    def _legacy_definition(self, earlier: dict[str, Any]) -> dict[str, Any]:
        """What a run.json of an older version tells of its definition: its settings
        (option values as this version reads them), no data or item digests."""
        recorded = earlier.get("settings") or {}
        try:
            block = run_definition(settings_from_record(recorded), earlier.get("model"),
                                   str(recorded.get("tokenizer", "auto")), {})
            del block["settings"]["aux_models"]  # not recorded: targets, not their models
        except (TypeError, ValueError, ImportError, BudgetBenchError):  # another version's
            block = {"settings": {"model": earlier.get("model")}}
        if block["settings"]["model"] is None:  # a run.json that names no model
            del block["settings"]["model"]
        return block

    def _check_recorded_golds(self) -> None:
        """The golds the run's rows recorded must be those of this session's items: a
        changed seed or data file would otherwise keep old rows under new items' ids."""
        golds: dict[tuple[Any, Any], Any] = {}
        for name in self.catalog.names:
            for item in self.catalog.items(name):
                golds[(name, item.item_id)] = item.answer
        changed = [(row, golds[key]) for row in self.recorded.values() if "gold" in row
                   and (key := (row.get("task"), row.get("item_id"))) in golds
                   and not definition.same_gold(row["gold"], golds[key])]
        if changed:
            row, gold = changed[0]
            items = {(r["task"], r["item_id"]) for r, _ in changed}
            more = f" (and {len(items) - 1} more items)" if len(items) > 1 else ""
            raise ConfigError(
                f"--budgetbench-resume: run {self.run_id} recorded task '{row['task']}' item "
                f"{row['item_id']} with gold {definition.show(row['gold'])}, this session's "
                f"item {row['item_id']} has {definition.show(gold)}{more}: the items changed "
                "since the run (seed, data or task); resume with the run's settings and data, "
                "or start a new run (drop --budgetbench-resume)")

    def _earlier_run_info(self) -> dict[str, Any] | None:
        path = self.store.run_dir / RUN_FILE
        if self.settings.resume is None or not path.is_file():
            return None
        try:
            info = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            return None
        return info if isinstance(info, dict) else None

    def _embedded(self) -> Endpoint:
        """The embedded server's endpoint, from its GGUF; the server itself starts on the
        first cache miss (or now, for a counter that asks the server)."""
        settings = self.settings
        self.server, endpoint = embedded.embedded_launcher(
            self._embedded_n_ctx(), settings.threads, self.store.run_dir / "server.log",
            settings.model, on_start=self._server_starting,
        )
        self.launcher = self.server
        return embedded.counting_endpoint(settings.tokenizer, endpoint, self.server)

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
                from pytest_budgetbench.embedded import LaunchService

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
        report = self.computed_report()
        try:
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
                [self.store.run_dir], self.store.run_dir / "report",
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
        """The gate items this sweep asked for, one per kind and strategy@budget."""
        settings = self.settings
        references = {cls.name: bool(cls.reference)
                      for cls in preflight.strategy_classes(settings.strategies).values()}
        return gate_specs(
            references, settings.budgets,
            violation=settings.max_violation_rate is not None,
            regression=settings.baseline is not None and settings.max_regression is not None,
        )

    def judge(self, gate: GateSpec, running_elsewhere: set[str]) -> GateVerdict:
        """A gate's verdict over the computed report (see :meth:`computed_report`).

        Its cells are every cell of its strategy@budget: those this process has not run
        yet run now (a gate selected alone, e.g. by ``--lf``, judges complete data), and
        those ``running_elsewhere`` (other xdist workers) are waited for in the records.
        """
        cells = [c for c in self.cells if (c.strategy_name or c.strategy) == gate.strategy
                 and c.budget == gate.budget and not self.skip_reason(c)]
        for cell in cells:
            if cell.cell_id not in running_elsewhere and cell.cell_id not in self.errored:
                try:
                    self.run_cell(cell)
                except EmbeddedServerError:
                    raise  # no cell can get a reply: the run stops (see the plugin)
                except Exception:  # its error row is what the gate counts
                    continue
        waiting = self._await_rows({c.cell_id for c in cells} & running_elsewhere)
        from pytest_budgetbench import reports

        verdict = reports.gate_verdict(
            self.computed_report(), gate,
            max_rate=self.settings.max_violation_rate, max_regression=self.settings.max_regression,
            regression_test=self.settings.regression_test,
            baseline=Path(self.settings.baseline) if self.settings.baseline else None,
        )
        if waiting:
            stalled = f"{len(waiting)} of its cells never recorded a row (a worker stopped?)"
            verdict = replace(verdict, reasons=(*verdict.reasons, stalled) if verdict.reasons
                              else (f"{gate.gate_id}: {stalled}",))
        return verdict

    def _await_rows(self, cell_ids: set[str]) -> set[str]:
        """Wait until other processes recorded a row for each cell; give up once the
        records stop growing for longer than one cell may take. Returns the missing ids."""
        stall_s = self.settings.timeout * self.settings.retries + 60.0
        last_size, last_change = -1, time.monotonic()
        while True:
            missing = cell_ids - {row.get("cell_id") for row in self.store.rows()}
            if not missing:
                return set()
            size = self.store.cells_path.stat().st_size if self.store.cells_path.exists() else 0
            if size != last_size:
                last_size, last_change = size, time.monotonic()
            elif time.monotonic() - last_change > stall_s:
                return missing
            time.sleep(0.2)

    def cache_rejections(self) -> list[str]:
        """A line per cache file whose entries failed their checksum during this run."""
        return wiring.cache_rejections(self.settings, self.store.run_dir, self.created)

    def stop(self) -> None:
        """End the session: cells queued in threads are dropped and those running end
        before their next model call, recording nothing (after Ctrl-C: the resume runs
        them), and the embedded server stops, which ends a call in flight at once."""
        self.store.unlock()
        if self._runner is not None:
            self._runner.stop()
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
        """The sweep's cells; built once, as collection and parametrization both need them."""
        items = {task: [i.item_id for i in self.catalog.items(task)]
                 for task in self.catalog.names}
        names = {spec: cls.name
                 for spec, cls in preflight.strategy_classes(self.settings.strategies).items()}
        cells = build_cells(
            items, self.settings.strategies, self.settings.budgets, self.settings.repeats, names
        )
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
        endpoint = {
            "model": self.endpoint.model if self.endpoint else None,
            "vision": self.settings.vision == "on",
        }
        return self.catalog.task(cell.task).skip_reason(endpoint)

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
        return {entry["cell_id"]: entry["messages"] for entry in read_jsonl(
            self.store.prompts_path) if "messages" in entry and "cell_id" in entry}

    def prefetch(self, cells: list[Cell]) -> None:
        """Start ``--budgetbench-concurrency`` cells at a time in threads (as many per
        replica of the endpoint); the tests then collect their results in order."""
        runner = self.runner  # built once, here, not raced for by the threads
        self._pool = ThreadPoolExecutor(self.settings.parallel_cells,
                                        thread_name_prefix="budgetbench")
        for cell in cells:
            if cell.cell_id not in self.recorded and cell.cell_id not in self._pending:
                self._pending[cell.cell_id] = self._pool.submit(runner.run, cell)


def run_definition(settings: Settings, model: str | None, tokenizer: str,
                   aux_models: dict[str, str | None]) -> dict[str, Any]:
    """The definition of a sweep with ``settings``, as far as settings tell it: the
    session adds each task's grader, data digest and item digests.

    Every name in :data:`definition.CELL_SETTINGS` is recorded, so every one is compared on
    a resume: those the session resolves (the model, the counter, each auxiliary
    endpoint's model) from the arguments, the rest from the Settings field of that name."""
    resolved: dict[str, Any] = {
        "model": model, "tokenizer": tokenizer, "aux_models": dict(sorted(aux_models.items())),
        "grader": dict(sorted((settings.grader or {}).items()))}
    block: dict[str, Any] = {"version": definition.VERSION, "settings": {
        key: definition.plain(resolved[key] if key in resolved else getattr(settings, key))
        for key in definition.CELL_SETTINGS}}
    from pytest_budgetbench.tasks import sweep_tasks

    block["tasks"] = {name: {"options": definition.plain(task_values(cls, settings))}
                      for name, cls in sweep_tasks(settings.tasks, settings.named_tasks).items()}
    block["strategies"] = {
        cls.name: {"options": definition.plain(strategy_values(cls, settings))}
        for cls in preflight.strategy_classes(settings.strategies).values()}
    return block


def settings_from_record(recorded: dict[str, Any]) -> Settings:
    """The Settings a run.json recorded (JSON lists back as tuples). Raises TypeError for
    settings of another version."""
    from dataclasses import fields

    known = {f.name for f in fields(Settings)}
    values: dict[str, Any] = {key: tuple(value) if isinstance(value, list) else value
                              for key, value in recorded.items() if key in known}
    return Settings(**values)


def shard_cells(
    cells: list[Cell], items: dict[str, list[str]], index: int, count: int
) -> list[Cell]:
    """Shard ``index`` of ``count`` (1-based): every count-th item across all tasks, so
    shards are even and an item's cells, which pair with each other, stay together."""
    positions: dict[tuple[str, int], int] = {}
    for task, item_ids in items.items():
        for item_index in range(len(item_ids)):
            positions[(task, item_index)] = len(positions)
    return [c for c in cells if positions[(c.task, c.item_index)] % count == index - 1]
