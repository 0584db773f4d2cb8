"""pytest-budgetbench's pytest plugin: options, cell generation, summary and gates.

Without ``--budgets`` (or its ini twin ``budgetbench_budgets``) the plugin registers its
options and nothing else: no items, no output, no heavy imports. With it, a ``budgetbench``
collector joins the collection tree (:mod:`pytest_budgetbench.collect`) with one test per
task item x strategy x budget and one per gate, and the work goes to the run object.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

from pytest_budgetbench import distributed, nodeids
from pytest_budgetbench.config import (
    OPTIONS,
    Settings,
    ini_text,
    load_settings,
)
from pytest_budgetbench.errors import BudgetBenchError, EmbeddedServerError, StrategyAborted
from pytest_budgetbench.options import Option
from pytest_budgetbench.redact import redact, register_secret, register_url
from pytest_budgetbench.session import SESSION_KEY
from pytest_budgetbench.sweep_tests import assert_within_budget
from pytest_budgetbench.task_grammar import TaskDefinition, parse_task_definition, split_top_level

__all__ = ["SESSION_KEY", "assert_within_budget", "budget_cell", "budget_gate"]

DECLARED_KEY = pytest.StashKey[list[Option]]()
"""The flags tasks and strategies declare, as registered for this run."""

if TYPE_CHECKING:
    from pytest_budgetbench.cells import Cell, GateVerdict
    from pytest_budgetbench.progress import SweepProgress
    from pytest_budgetbench.runner import CellResult
    from pytest_budgetbench.session import BudgetBenchSession


_registered: list[Option] = []
"""The declared flags of the registered tasks and strategies, as the latest
pytest_addoption found them (each Config calls it first, so it is that Config's)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    from pytest_budgetbench.declared import flag_specs

    _registered[:] = flag_specs()
    _add_options(parser, (*OPTIONS, *_registered))


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser) -> None:
    """Flags of the ``module:attr`` tasks and strategies the sweep names, which the
    registries cannot list when options are first added (e.g. their data flag)."""
    specs = list(_registered)
    tasks, strategies = _named(early_config, "tasks"), _named(early_config, "strategies")
    instances = _instances(early_config, tasks)
    if instances or any(":" in name for name in (*tasks, *strategies)):
        from pytest_budgetbench.declared import flag_specs

        specs += flag_specs(tasks, strategies, registered=False, known=specs, named=instances)
        _add_options(parser, specs)
    early_config.stash[DECLARED_KEY] = specs


def _raw(config: pytest.Config, dest: str) -> str:
    """What --budgetbench-<dest> or its ini twin gives, as text, before settings exist."""
    raw = getattr(config.known_args_namespace, f"budgetbench_{dest}", None)
    if raw is None:
        raw = config.getini(f"budgetbench_{dest}") or ""
    return ini_text(raw)


def _named(config: pytest.Config, dest: str) -> list[str]:
    """The raw entries --budgetbench-<dest> or its ini twin gives, before settings exist."""
    return split_top_level(_raw(config, dest))


def _instances(config: pytest.Config, tasks: list[str]) -> dict[str, TaskDefinition]:
    """The named task instances, whose data flags the registries cannot list; a bad
    definition is left for the settings check to report."""
    found: dict[str, TaskDefinition] = {}
    definitions = [*split_top_level(_raw(config, "named_tasks")),
                   *(entry for entry in tasks if "=" in entry)]
    for text in definitions:
        try:
            name, definition = parse_task_definition(text, "--budgetbench-tasks")
        except BudgetBenchError:
            continue
        found[name] = definition
    return found


def _add_options(parser: pytest.Parser, specs: Sequence[Option]) -> None:
    group = parser.getgroup("budgetbench", "memory strategies under a token budget")
    added = {option.dest for option in group.options}
    for spec in specs:
        if f"budgetbench_{spec.dest}" in added:
            continue
        default = f" (default: {spec.default_text})" if spec.default not in (None, ()) else ""
        env = f" [env {spec.env}]" if spec.env else ""
        group.addoption(
            *spec.flags,
            dest=f"budgetbench_{spec.dest}",
            default=None,
            metavar=spec.metavar or spec.dest.upper(),
            help=f"{spec.help}{default}{env}",
        )
        parser.addini(spec.ini, help=spec.help, type=spec.ini_type, default=spec.ini_default)
    if "budgetbench_only" not in added:
        group.addoption(
            "--budgetbench-only", action="store_true", dest="budgetbench_only", default=False,
            help="run only the sweep: its cells, its gates and tests that use budget_cell",
        )


def _settings(config: pytest.Config) -> Settings:
    try:
        declared = config.stash.get(DECLARED_KEY, None)
        if declared is None:
            from pytest_budgetbench.declared import flag_specs

            declared = flag_specs()
        settings = load_settings(
            lambda dest: config.getoption(f"budgetbench_{dest}", None),
            lambda ini: config.getini(ini),
            declared,
        )
        _register_secrets(settings)
        if settings.active:
            from pytest_budgetbench.preflight import check_settings

            check_settings(settings)
    except BudgetBenchError as exc:
        raise pytest.UsageError(redact(exc)) from None
    return settings


def _register_secrets(settings: Settings) -> None:
    """Tell the redaction layer every secret this run knows, before any text leaves."""
    register_secret(settings.api_key)
    for url in (settings.endpoint, settings.judge_endpoint, *(settings.aux_models or {}).values()):
        register_url(url)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    settings = _settings(config)
    config.addinivalue_line("markers", "budgetbench: a cell or gate of a budget sweep")
    from pytest_budgetbench.collect import take_sweep_args

    take_sweep_args(config)
    if not settings.active:
        return
    from pytest_budgetbench.session import BudgetBenchSession

    try:
        session = BudgetBenchSession(settings, worker_state=distributed.worker_state(config))
    except BudgetBenchError as exc:
        raise pytest.UsageError(redact(f"budgetbench: {exc}")) from None
    config.stash[SESSION_KEY] = session
    config.pluginmanager.register(SweepPlugin(config, session), "budgetbench-sweep")
    _narrow_benchmark_table(config)


def _narrow_benchmark_table(config: pytest.Config) -> None:
    """A cell's model call is timed once: spread columns (stddev, IQR, outliers) say
    nothing, so pytest-benchmark's table shows the time and the round count, unless the
    command line chose columns. (pytest-benchmark reads the option after this hook.)"""
    if not hasattr(config.option, "benchmark_columns"):
        return
    if any(str(a).startswith("--benchmark-columns") for a in config.invocation_params.args):
        return
    config.option.benchmark_columns = ["mean", "rounds"]


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """--budgetbench-only: deselect every test that is not part of the sweep."""
    from pytest_budgetbench.collect import unmatched_selectors

    unmatched = unmatched_selectors(config, items)
    if unmatched:
        hint = ("see the ids with: pytest --co -q" if SESSION_KEY in config.stash
                else "no sweep runs: pass --budgets=N,N")
        raise pytest.UsageError(f"not found: {', '.join(unmatched)} ({hint})")
    if not config.getoption("budgetbench_only", False):
        return
    keep = [i for i in items if _in_sweep(i)]
    if len(keep) < len(items):
        kept = set(map(id, keep))
        config.hook.pytest_deselected(items=[i for i in items if id(i) not in kept])
        items[:] = keep


class SweepPlugin:
    """Hooks that exist only while a sweep runs."""

    def __init__(self, config: pytest.Config, session: BudgetBenchSession) -> None:
        self.config = config
        self.session = session
        self.finish_error = ""
        self.progress: SweepProgress | None = None
        self._restore_sigterm: Callable[[], None] = lambda: None

    @property
    def distributed(self) -> bool:
        return distributed.is_distributed(self.config)

    @property
    def controller(self) -> bool:
        """The process that prints: the only one without xdist, or xdist's controller."""
        return not self.session.is_worker and not self.config.option.collectonly

    # -- endpoint up before the first cell ---------------------------------------------
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        # xdist's workers need the endpoint when they start; without xdist it waits for
        # collection, so `pytest tests/test_x.py` with ini budgets starts no model.
        if self.controller and self.distributed:
            self._restore_sigterm = distributed.stop_workers_on_sigterm()
            self._start()

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if not self.controller or self.distributed:
            return
        if any(map(_in_sweep, session.items)) and not self.session.started:
            self._start()
        self._expect([i for i in session.items if _is_cell_item(i)])

    def _start(self) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None and not self.session.settings.endpoint:
            self.session.on_server_start = self._starting_line(reporter)
        from pytest_budgetbench.preflight import NothingToRun
        from pytest_budgetbench.wiring import credential_line

        credential = credential_line(self.session.settings)
        if reporter is not None and credential:
            reporter.write_line(redact(credential))

        try:
            self.session.start()
        except NothingToRun as exc:
            pytest.exit(str(exc), returncode=pytest.ExitCode.OK)
        except BudgetBenchError as exc:
            raise pytest.UsageError(redact(f"budgetbench: {exc}")) from None
        for note in self.session.notes:
            if reporter is not None:
                reporter.write_line(redact(f"budgetbench: warning: {note}"), yellow=True)

    def _starting_line(self, reporter: Any) -> Callable[[], None]:
        """The line printed when the embedded server really starts: on the first cache
        miss, inside a cell's test (under xdist: in the controller, at a worker's request),
        so past the output capture, as pytest's live logging writes."""
        description = self.session.embedded_description()
        capture = self.config.pluginmanager.get_plugin("capturemanager")

        def write() -> None:
            with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
                reporter.write_line(f"Starting the embedded model ({description})…")

        return write

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        distributed.hand_to_worker(node, self.session.worker_state())

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        if config.option.dist not in ("load", "loadgroup"):
            return None  # the user chose another distribution; respect it
        groups = {c.cell_id: c.group for c in self.session.cells}
        return distributed.make_scheduler(config, log, groups)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        if self.progress is None and self.controller:
            self._expect_ids([i for i in ids if nodeids.is_cell_nodeid(i)])

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self._restore_sigterm()
        self.session.stop()

    # -- --budgetbench-concurrency without xdist: cells run ahead in threads ------------
    def pytest_runtestloop(self, session: pytest.Session) -> None:
        concurrency = self.session.settings.concurrency or 1
        if concurrency < 2 or self.session.is_worker or self.config.option.collectonly:
            return
        if self.distributed:
            return  # xdist's controller runs no test; its workers run one cell at a time
        cells = [c for c in map(item_cell_of, session.items) if c is not None]
        unique = list({c.cell_id: c for c in cells}.values())
        self.session.prefetch([cell for cell in unique if not self.session.skip_reason(cell)])

    # -- collection: the budgetbench node, its cells and gates --------------------------
    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(self, collector: pytest.Collector) -> Any:
        report = yield
        if isinstance(collector, pytest.Session) and report.passed:
            from pytest_budgetbench.collect import SweepModule, sweep_is_collected

            if sweep_is_collected(self.config, only=self.config.getoption("budgetbench_only")):
                from pytest_budgetbench.preflight import NothingToRun, check_not_empty

                try:  # bad data is a usage error, not a collection error of one node
                    check_not_empty(self.session.settings, self.session.cells)
                    self.session.gates  # noqa: B018 - built once, here
                except NothingToRun as exc:
                    pytest.exit(str(exc), returncode=pytest.ExitCode.OK)
                except BudgetBenchError as exc:
                    raise pytest.UsageError(redact(f"budgetbench: {exc}")) from None
                # First: the cells run (and are timed) before the tests that read them.
                report.result.insert(0, SweepModule.for_session(collector))
        return report

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """Cells and gates, and a user's test that asks for ``budget_cell``, are
        parametrized like any test: once per cell, once per gate."""
        try:
            if "budget_cell" in metafunc.fixturenames:
                cells = self.session.cells
                metafunc.parametrize(
                    "budget_cell", cells, ids=[c.cell_id for c in cells], indirect=True
                )
            if "budget_gate" in metafunc.fixturenames:
                gates = self.session.gates
                metafunc.parametrize(
                    "budget_gate", gates, ids=[g.gate_id for g in gates], indirect=True
                )
        except BudgetBenchError as exc:
            raise pytest.UsageError(redact(f"budgetbench: {exc}")) from None

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """Gates run after the cells they judge."""
        from pytest_budgetbench.collect import is_gate_item

        items.sort(key=is_gate_item)

    # -- reports: progress, teststatus, gates ------------------------------------------
    def _expect(self, cells: list[pytest.Item]) -> None:
        self._expect_ids([i.nodeid for i in cells], [item_cell_of(i) for i in cells])

    def _expect_ids(self, ids: list[str], cells: list[Cell | None] | None = None) -> None:
        from collections import Counter

        from pytest_budgetbench.progress import SweepProgress

        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        interval = self.session.settings.progress
        if reporter is None or interval == 0 or self.config.get_verbosity() < 0 or not ids:
            return
        by_id = {c.cell_id: c.task for c in self.session.cells}
        tasks = Counter(
            cell.task if cell is not None else by_id.get(nodeids.params_of(nodeid), "?")
            for nodeid, cell in zip(ids, cells or [None] * len(ids), strict=True)
        )
        tty = reporter.isatty  # a bool on pytest 8, a method on 9
        in_place = bool(tty() if callable(tty) else tty) and self.config.get_verbosity() == 0
        self.progress = SweepProgress(reporter, interval=interval, in_place=in_place)
        self.progress.expect(dict(tasks))

    @pytest.hookimpl(wrapper=True)
    def pytest_report_teststatus(self, report: pytest.TestReport) -> Any:
        status = yield
        if (self.progress is not None and self.progress.in_place and status
                and nodeids.is_cell_nodeid(report.nodeid)):
            # On a tty the progress row stands for the cells' dots.
            return (status[0], "", status[2])
        return status

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not self.controller:
            return
        if self.progress is not None and report.when == "call":
            self.progress.add(report.user_properties)
        if nodeids.is_gate_nodeid(report.nodeid) and report.when == "call":
            # The verdict itself, from this process's gate or an xdist worker's report.
            from pytest_budgetbench.cells import GateVerdict

            self.session.verdicts.extend(GateVerdict.from_public(json.loads(str(value)))
                                         for name, value in report.user_properties
                                         if name == VERDICT_PROPERTY)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Any:
        report = yield
        from pytest_budgetbench.collect import is_sweep_item

        if is_sweep_item(item) or _uses_budget_cell(item):
            # Failures are shown without secrets, in the terminal and in --junitxml.
            from pytest_budgetbench.failures import scrub_report

            scrub_report(report, call.excinfo)
        if is_sweep_item(item):
            # The heading of a failure names the node id, which can be pasted back.
            path, lineno, _domain = report.location
            report.location = (path, lineno, item.nodeid)
        return report

    # -- end of session ----------------------------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self.controller or not self.session.store.cells_path.exists():
            return
        try:
            self.session.finish()
        except BudgetBenchError as exc:  # e.g. a full disk: one line, not a traceback
            self.finish_error = redact(f"budgetbench: {exc}")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl(trylast=True)  # after pytest-benchmark's tables: the answer comes last
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.controller or not self.session.started:
            return  # no sweep item ran (e.g. `pytest tests/test_x.py` with ini budgets)
        if self.progress is not None:
            self.progress.close()
        from pytest_budgetbench.reports.terminal import write_summary

        run = self.session
        write_summary(terminalreporter, run.store.run_dir, run.settings,
                      report=run.report if run.report_dir is not None else None,
                      verdicts=run.verdicts, report_dir=run.report_dir,
                      report_missing=run.report_missing)
        for line in self.session.cache_rejections():
            terminalreporter.write_line(f"budgetbench: {line}", yellow=True)
        endpoint = self.session.endpoint
        if endpoint is not None and endpoint.embedded and not self.session.server_needed:
            terminalreporter.write_line("budgetbench: the embedded model was not started: the "
                                        "response cache held every reply this run needed")
        if self.finish_error:
            terminalreporter.write_line(self.finish_error, red=True, bold=True)


def _is_cell_item(item: pytest.Item) -> bool:
    from pytest_budgetbench.collect import is_sweep_item

    return is_sweep_item(item) and nodeids.is_cell_name(item.name)


def _uses_budget_cell(item: pytest.Item) -> bool:
    return "budget_cell" in getattr(item, "fixturenames", ())


def _in_sweep(item: pytest.Item) -> bool:
    """A cell, a gate, or a user's test over the cells."""
    from pytest_budgetbench.collect import is_sweep_item

    return is_sweep_item(item) or _uses_budget_cell(item)


def item_cell_of(item: pytest.Item) -> Cell | None:
    from pytest_budgetbench.collect import item_cell

    return item_cell(item)


VERDICT_PROPERTY = "budgetbench_gate"
"""The user property under which a gate item's report carries its verdict (JSON)."""
NO_SWEEP = ("no sweep runs: pass --budgets=N,N (or set budgetbench_budgets in the ini) to "
            "run this test over the sweep's cells")


@pytest.fixture
def budget_cell(request: pytest.FixtureRequest) -> CellResult:
    """The result of one sweep cell: its row (``.row``), prompt, prediction and quality.

    Ask for it in your own test to write assertions over every cell; each such test is
    parametrized over the sweep's cells. Without a sweep the test is skipped.
    """
    session = request.config.stash.get(SESSION_KEY, None)
    if session is None:
        pytest.skip(NO_SWEEP)
    cell = request.param
    reason = session.skip_reason(cell)
    if reason:
        pytest.skip(reason)
    timer = _benchmark_timer(request)
    try:
        result = session.run_cell(cell, timer)
    except StrategyAborted as exc:
        # Its row is written; the run stops as a Ctrl-C would, summary and report included.
        pytest.exit(redact(str(exc)), returncode=pytest.ExitCode.INTERRUPTED)
    except EmbeddedServerError as exc:
        _stop_without_a_server(request, exc)
    if timer is not None and timer.timed:
        request.getfixturevalue("benchmark").extra_info.update(
            quality=result.quality, counted_tokens=result.row.counted_tokens
        )
    return result


@pytest.fixture
def budget_gate(request: pytest.FixtureRequest) -> GateVerdict:
    """The verdict of one gate item over the cells of its strategy@budget."""
    session: BudgetBenchSession = request.config.stash[SESSION_KEY]
    spec = request.param
    elsewhere: set[str] = set()
    if distributed.is_worker(request.config):
        # Under xdist the selected cells run on every worker; wait for their rows.
        elsewhere = {c.cell_id for c in map(item_cell_of, request.session.items)
                     if c is not None}
    try:
        verdict = session.judge(spec, elsewhere)
    except EmbeddedServerError as exc:
        _stop_without_a_server(request, exc)
    # The controller's summary reads it, and --junitxml shows it as a property.
    request.node.user_properties.append((VERDICT_PROPERTY, json.dumps(verdict.public())))
    return verdict


def _stop_without_a_server(request: pytest.FixtureRequest, exc: EmbeddedServerError) -> NoReturn:
    """The embedded server, started on the first cache miss, did not start: no later cell
    could get a reply either, so the run stops with the reason, as a failed start before
    the first cell does (the cell keeps its error row, which is never graded). An xdist
    worker's exit is not shown, but its ``shouldstop`` is: the controller stops every
    worker with it, and prints it."""
    reason = redact(f"budgetbench: {exc}")
    if distributed.is_worker(request.config):
        request.session.shouldstop = reason
    pytest.exit(reason, returncode=pytest.ExitCode.USAGE_ERROR)


def _benchmark_timer(request: pytest.FixtureRequest) -> _ModelCallTimer | None:
    """Time the model call exactly once through pytest-benchmark, when it is active."""
    config = request.config
    # pytest-benchmark switches itself off under xdist (it reads PYTEST_XDIST_WORKER).
    if not config.pluginmanager.hasplugin("benchmark") or distributed.worker_id():
        return None
    if (config.stash[SESSION_KEY].settings.concurrency or 1) > 1:
        return None  # cells run ahead in threads; there is no call left to time
    if getattr(config.option, "benchmark_disable", False) or distributed.is_distributed(config):
        return None

    return _ModelCallTimer(request)


class _ModelCallTimer:
    """Times the one model call of a cell; a cell that makes none (a violation, a resumed
    cell) never asks for the benchmark fixture, which pytest-benchmark would warn about."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self.request = request
        self.timed = False

    def __call__(self, call: Callable[[], Any]) -> Any:
        benchmark = self.request.getfixturevalue("benchmark")
        cell = self.request.param
        # One table per task and strategy@budget, not one ~200-column table of all cells.
        benchmark.group = f"{cell.task} {cell.strategy_name or cell.strategy}@{cell.budget}"
        completion = benchmark.pedantic(call, rounds=1, iterations=1)
        benchmark.extra_info["output_tokens"] = completion.completion_tokens
        self.timed = True
        return completion
