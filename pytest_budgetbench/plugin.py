"""pytest-budgetbench's pytest plugin: options, cell generation, summary and gates.

Without ``--budgets`` (or its ini twin ``budgetbench_budgets``) the plugin registers its
options and nothing else: no items, no output, no heavy imports. With it, a ``budgetbench``
collector joins the collection tree (:mod:`pytest_budgetbench.pytest_face.collect`) with one
test per task item x strategy x budget and one per gate, and the work goes to the run object.

This module holds the hooks, the fixtures and the option registration; what they do is in
the modules that own it: :mod:`~pytest_budgetbench.pytest_face.arguments` (options and settings),
:mod:`~pytest_budgetbench.pytest_face.collect` (items),
:mod:`~pytest_budgetbench.pytest_face.sweep_tests` (the cells' and gates' tests),
:mod:`~pytest_budgetbench.pytest_face.progress` and :mod:`~pytest_budgetbench.pytest_face.summary`
(the terminal).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from pytest_budgetbench.engine.session import SESSION_KEY
from pytest_budgetbench.errors import BudgetBenchError
from pytest_budgetbench.options import Option
from pytest_budgetbench.pytest_face import nodeids
from pytest_budgetbench.pytest_face import xdist as distributed
from pytest_budgetbench.pytest_face.arguments import (
    add_options,
    declared_flags,
    narrow_benchmark_table,
    settings_of,
)
from pytest_budgetbench.pytest_face.collect import (
    cells_of,
    in_sweep,
    is_cell_item,
    item_cell,
    present_report,
    select_sweep_items,
)
from pytest_budgetbench.pytest_face.sweep_tests import (
    assert_within_budget,
    gate_verdicts,
    judge_gate,
    parametrize_sweep,
    run_budget_cell,
    run_budget_search,
)
from pytest_budgetbench.redact import redact
from pytest_budgetbench.settings.config import OPTIONS

__all__ = ["SESSION_KEY", "assert_within_budget", "budget_cell", "budget_gate", "budget_search"]

DECLARED_KEY = pytest.StashKey[list[Option]]()
"""The flags tasks and strategies declare, as registered for this run."""

if TYPE_CHECKING:
    from pytest_budgetbench.engine.runner import CellResult
    from pytest_budgetbench.engine.session import BudgetBenchSession
    from pytest_budgetbench.pytest_face.progress import SweepProgress
    from pytest_budgetbench.records.safe_budgets import SafeBudgetRecord
    from pytest_budgetbench.reports.gates.verdicts import GateVerdict
    from pytest_budgetbench.sweep.cells import Cell


_registered: list[Option] = []
"""The declared flags of the registered tasks and strategies, as the latest
pytest_addoption found them (each Config calls it first, so it is that Config's)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    from pytest_budgetbench.engine.declared import flag_specs

    _registered[:] = flag_specs()
    add_options(parser, (*OPTIONS, *_registered))


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser) -> None:
    """Flags of the ``module:attr`` tasks and strategies the sweep names, which the
    registries cannot list when options are first added (e.g. their data flag)."""
    early_config.stash[DECLARED_KEY] = declared_flags(early_config, parser, _registered)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    settings = settings_of(config, config.stash.get(DECLARED_KEY, None))
    config.addinivalue_line("markers", "budgetbench: a cell or gate of a budget sweep")
    from pytest_budgetbench.pytest_face.collect import take_sweep_args

    take_sweep_args(config)
    if not settings.active:
        return
    from pytest_budgetbench.engine.session import BudgetBenchSession

    try:
        session = BudgetBenchSession(settings, worker_state=distributed.worker_state(config))
    except BudgetBenchError as exc:
        raise pytest.UsageError(redact(f"budgetbench: {exc}")) from None
    config.stash[SESSION_KEY] = session
    config.pluginmanager.register(SweepPlugin(config, session), "budgetbench-sweep")
    narrow_benchmark_table(config)


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Unmatched sweep selectors; --budgetbench-only deselects the tests outside the sweep."""
    select_sweep_items(config, items)


class SweepPlugin:
    """Hooks that exist only while a sweep runs."""

    def __init__(self, config: pytest.Config, session: BudgetBenchSession) -> None:
        self.config = config
        self.session = session
        self.finish_error = ""
        self.ci_warnings: list[str] = []
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
        if any(map(in_sweep, session.items)) and not self.session.started:
            self._start()
        self._expect([i for i in session.items if is_cell_item(i)])

    def _start(self) -> None:
        from pytest_budgetbench.pytest_face.summary import start_session

        start_session(self.config, self.session)

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

    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        # At once, not at unconfigure: the summary and the report come first, and cells
        # running in threads would go on calling the model meanwhile.
        self.session.interrupt()

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self._restore_sigterm()
        try:
            self.session.stop()
        except KeyboardInterrupt:  # a second Ctrl-C: one line, not a traceback out of pytest
            sys.stderr.write("budgetbench: interrupted again while stopping: cells in flight "
                             "were not waited for; resume the run with "
                             "--budgetbench-resume=latest\n")

    # -- --budgetbench-concurrency without xdist: cells run ahead in threads ------------
    def pytest_runtestloop(self, session: pytest.Session) -> None:
        parallel = self.session.settings.parallel_cells
        if parallel < 2 or self.session.is_worker or self.config.option.collectonly:
            return
        if self.distributed:
            return  # xdist's controller runs no test; its workers run one cell at a time
        cells = cells_of(session.items)
        self.session.prefetch([cell for cell in cells if not self.session.skip_reason(cell)])

    # -- collection: the budgetbench node, its cells and gates --------------------------
    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(self, collector: pytest.Collector) -> Any:
        report = yield
        if isinstance(collector, pytest.Session) and report.passed:
            from pytest_budgetbench.pytest_face.collect import add_sweep_module

            add_sweep_module(self.config, self.session, collector, report)
        return report

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """Cells and gates, and a user's test that asks for ``budget_cell``, are
        parametrized like any test: once per cell, once per gate."""
        parametrize_sweep(metafunc, self.session)


    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """Gates run after the cells they judge."""
        from pytest_budgetbench.pytest_face.collect import is_gate_item

        items.sort(key=is_gate_item)

    # -- reports: progress, teststatus, gates ------------------------------------------
    def _expect(self, cells: list[pytest.Item]) -> None:
        self._expect_ids([i.nodeid for i in cells], [item_cell(i) for i in cells])

    def _expect_ids(self, ids: list[str], cells: list[Cell | None] | None = None) -> None:
        from pytest_budgetbench.pytest_face.progress import sweep_progress

        self.progress = sweep_progress(self.config, self.session, ids, cells)

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
            self.session.verdicts.extend(gate_verdicts(report))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Any:
        report = yield
        present_report(item, call, report)
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
        except KeyboardInterrupt:  # Ctrl-C (again) while the report is written
            self.finish_error = (
                "budgetbench: interrupted while writing the report: the run's records are "
                f"kept; write it with `budgetbench report {self.session.store.run_dir}`")
            session.exitstatus = pytest.ExitCode.INTERRUPTED
            return
        from pytest_budgetbench.pytest_face.summary import write_ci_outputs

        self.ci_warnings = write_ci_outputs(self.session)  # the job summary, trend files

    @pytest.hookimpl(trylast=True)  # after pytest-benchmark's tables: the answer comes last
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.controller or not self.session.started:
            return  # no sweep item ran (e.g. `pytest tests/test_x.py` with ini budgets)
        if self.progress is not None:
            self.progress.close()
        from pytest_budgetbench.pytest_face.summary import write_sweep_summary

        write_sweep_summary(terminalreporter, self.session, self.finish_error,
                            self.ci_warnings)


@pytest.fixture
def budget_cell(request: pytest.FixtureRequest) -> CellResult:
    """The result of one sweep cell: its row (``.row``), prompt, prediction and quality.

    Ask for it in your own test to write assertions over every cell; each such test is
    parametrized over the sweep's cells. Without a sweep the test is skipped.
    """
    return run_budget_cell(request)


@pytest.fixture
def budget_gate(request: pytest.FixtureRequest) -> GateVerdict:
    """The verdict of one gate item over the cells of its strategy@budget."""
    session: BudgetBenchSession = request.config.stash[SESSION_KEY]
    spec = request.param
    elsewhere: set[str] = set()
    if distributed.is_worker(request.config):
        # Under xdist the selected cells run on every worker; wait for their rows.
        elsewhere = {c.cell_id for c in cells_of(request.session.items)}
    return judge_gate(request, session, spec, elsewhere)


@pytest.fixture
def budget_search(request: pytest.FixtureRequest) -> SafeBudgetRecord:
    """The smallest safe budget of one task and strategy in a budget search
    (``--budgets=search:LO..HI``): its record in safe_budgets.jsonl, probes included."""
    return run_budget_search(request)
