"""pytest-budgetbench's pytest plugin: options, cell generation, summary and gates.

Without ``--budgets`` (or its ini twin ``budgetbench_budgets``) the plugin registers its
options and nothing else: no items, no output, no heavy imports. With it, the plugin adds
one test per task item x strategy x budget and delegates the work to the run object.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pytest

from pytest_budgetbench.config import OPTIONS, OptionSpec, Settings, load_settings
from pytest_budgetbench.errors import BudgetBenchError, BudgetExceeded
from pytest_budgetbench.redact import redact, register_secret, register_url

SESSION_KEY = pytest.StashKey["BudgetBenchSession"]()
CELL_KEY = pytest.StashKey["Cell"]()
COLLECTOR_NAME = "budgetbench"
LOADGROUP_KEY = "budgetbench_loadgroup"
DECLARED_KEY = pytest.StashKey[list[OptionSpec]]()
"""The flags tasks and strategies declare, as registered for this run."""

if TYPE_CHECKING:
    from pytest_budgetbench.cells import Cell
    from pytest_budgetbench.runner import CellResult
    from pytest_budgetbench.session import BudgetBenchSession


_registered: list[OptionSpec] = []
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
    if any(":" in name for name in (*tasks, *strategies)):
        from pytest_budgetbench.declared import flag_specs

        specs += flag_specs(tasks, strategies, registered=False, known=specs)
        _add_options(parser, specs)
    early_config.stash[DECLARED_KEY] = specs


def _named(config: pytest.Config, dest: str) -> list[str]:
    """The raw names --budgetbench-<dest> or its ini twin gives, before settings exist."""
    raw = getattr(config.known_args_namespace, f"budgetbench_{dest}", None)
    if raw is None:
        raw = config.getini(f"budgetbench_{dest}") or ""
    return [part.strip() for part in str(raw).split(",") if part.strip()]


def _add_options(parser: pytest.Parser, specs: Sequence[OptionSpec]) -> None:
    group = parser.getgroup("budgetbench", "memory strategies under a token budget")
    added = {option.dest for option in group.options}
    for spec in specs:
        if f"budgetbench_{spec.dest}" in added:
            continue
        default = f" (default: {spec.default})" if spec.default not in (None, ()) else ""
        env = f" [env {spec.env}]" if spec.env else ""
        group.addoption(
            *spec.flags,
            dest=f"budgetbench_{spec.dest}",
            default=None,
            metavar=spec.metavar or spec.dest.upper(),
            help=f"{spec.help}{default}{env}",
        )
        parser.addini(spec.ini, help=spec.help, default="")


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
            _check_names(settings)
    except BudgetBenchError as exc:
        raise pytest.UsageError(redact(exc)) from None
    return settings


def _register_secrets(settings: Settings) -> None:
    """Tell the redaction layer every secret this run knows, before any text leaves."""
    register_secret(settings.api_key)
    for url in (settings.endpoint, settings.judge_endpoint, *(settings.aux_models or {}).values()):
        register_url(url)


def _check_names(settings: Settings) -> None:
    from pytest_budgetbench.preflight import check_settings

    check_settings(settings)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    settings = _settings(config)
    config.addinivalue_line("markers", "budgetbench: a cell of a budget sweep")
    if not settings.active:
        return
    from pytest_budgetbench.session import WORKER_KEY, BudgetBenchSession

    workerinput = getattr(config, "workerinput", None)
    state = workerinput.get(WORKER_KEY) if workerinput else None
    try:
        session = BudgetBenchSession(settings, worker_state=state)
    except BudgetBenchError as exc:
        raise pytest.UsageError(redact(f"budgetbench: {exc}")) from None
    if getattr(config.option, "dist", "no") == "load":
        # -n alone means "load"; keep an item's cells on one worker, where its caches are.
        config.option.dist = "loadgroup"
    if workerinput and workerinput.get(LOADGROUP_KEY):
        # Workers parse the command line afresh, so they learn of the switch from us.
        config.option.loadgroup = True
    config.stash[SESSION_KEY] = session
    config.pluginmanager.register(SweepPlugin(config, session), "budgetbench-sweep")


class SweepPlugin:
    """Hooks that exist only while a sweep runs."""

    def __init__(self, config: pytest.Config, session: BudgetBenchSession) -> None:
        self.config = config
        self.session = session
        self.finish_error = ""

    # -- controller: endpoint up before any cell ---------------------------------------
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if self.session.is_worker or self.config.option.collectonly:
            return
        from pytest_budgetbench.preflight import NothingToRun

        try:
            self.session.start()
        except NothingToRun as exc:
            pytest.exit(str(exc), returncode=pytest.ExitCode.OK)
        except BudgetBenchError as exc:
            raise pytest.UsageError(redact(f"budgetbench: {exc}")) from None

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        from pytest_budgetbench.session import WORKER_KEY

        node.workerinput[WORKER_KEY] = self.session.worker_state()
        node.workerinput[LOADGROUP_KEY] = self.config.option.dist == "loadgroup"

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.session.stop()

    # -- --budgetbench-concurrency without xdist: cells run ahead in threads ------------
    def pytest_runtestloop(self, session: pytest.Session) -> None:
        concurrency = self.session.settings.concurrency or 1
        if concurrency < 2 or self.session.is_worker or self.config.option.collectonly:
            return
        if getattr(self.config.option, "dist", "no") != "no":
            return  # xdist's controller runs no test; its workers run one cell at a time
        cells = [item.stash[CELL_KEY] for item in session.items if CELL_KEY in item.stash]
        self.session.prefetch([cell for cell in cells if not self.session.skip_reason(cell)])

    # -- collection: one Function per cell ---------------------------------------------
    # tryfirst: pytest's own -k/-m deselection then sees the generated cells too.
    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        try:
            cells = self.session.cells
        except BudgetBenchError as exc:
            raise pytest.UsageError(redact(f"budgetbench: {exc}")) from None
        collector = SweepCollector.from_parent(session, name=COLLECTOR_NAME, nodeid=COLLECTOR_NAME)
        items.extend(collector.make_item(cell) for cell in cells)

    # -- failures: shown without secrets, in the terminal and in --junitxml --------------
    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Any:
        report = yield
        if "budget_cell" in getattr(item, "fixturenames", ()):
            from pytest_budgetbench.failures import scrub_report

            scrub_report(report, call.excinfo)
        return report

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """A user's test that asks for ``budget_cell`` runs once per cell."""
        if "budget_cell" not in metafunc.fixturenames:
            return
        cells = self.session.cells
        metafunc.parametrize(
            "budget_cell", cells, ids=[c.cell_id for c in cells], indirect=True
        )

    # -- end of session ----------------------------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.session.is_worker or self.config.option.collectonly:
            return
        if not self.session.store.cells_path.exists():
            return
        try:
            self.session.gate_failures = self.session.finish()
        except BudgetBenchError as exc:  # e.g. a full disk: one line, not a traceback
            self.finish_error = redact(f"budgetbench: {exc}")
        if self.session.gate_failures or self.finish_error:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.session.is_worker or self.config.option.collectonly:
            return
        from pytest_budgetbench.reports.terminal import write_summary

        write_summary(terminalreporter, self.session)
        if self.finish_error:
            terminalreporter.write_line(self.finish_error, red=True, bold=True)


class SweepCollector(pytest.Collector):
    """The parent of every generated cell; cells need no test file."""

    def collect(self) -> list[pytest.Item]:  # pragma: no cover - items are made directly
        return []

    def make_item(self, cell: Cell) -> pytest.Function:
        name = f"cell[{cell.cell_id}]"
        if getattr(self.config.option, "loadgroup", False):
            # xdist's loadgroup schedules by an "@group" suffix of the node id; it adds one
            # itself only on pytest < 9.2 (it sets Item._nodeid), so the cell names its own.
            name += f"@{cell.group}"
        item = pytest.Function.from_parent(self, name=name, callobj=_run_cell)
        item.stash[CELL_KEY] = cell
        item.add_marker(pytest.mark.budgetbench)
        item.add_marker(pytest.mark.xdist_group(cell.group))
        return item


def _run_cell(budget_cell: CellResult, request: pytest.FixtureRequest) -> None:
    """The test body of a generated cell: the prompt must have fit its budget."""
    __tracebackhide__ = True
    gated = request.config.stash[SESSION_KEY].settings.max_violation_rate is not None
    assert_within_budget(budget_cell, gated=gated)


def assert_within_budget(result: CellResult, *, gated: bool = False) -> None:
    """Fail a cell over budget. A reference strategy's violation is xfailed instead, and so
    is any violation when a --budgetbench-max-violation-rate gate judges them in aggregate.
    """
    __tracebackhide__ = True
    if result.status != "violation":
        return
    if result.reference:
        pytest.xfail(f"reference strategy over budget: {result.violation}")
    if gated:
        pytest.xfail(f"counted by --budgetbench-max-violation-rate: {result.violation}")
    raise BudgetExceeded(result.violation)


@pytest.fixture
def budget_cell(request: pytest.FixtureRequest) -> CellResult:
    """The result of one sweep cell: its row (``.row``), prompt, prediction and quality.

    Ask for it in your own test to write assertions over every cell; each such test is
    parametrized over the sweep's cells. Needs ``--budgets``.
    """
    session = request.config.stash.get(SESSION_KEY, None)
    if session is None:
        raise pytest.UsageError("the budget_cell fixture needs a sweep: pass --budgets=N,N")
    cell = getattr(request, "param", None) or request.node.stash[CELL_KEY]
    reason = session.skip_reason(cell)
    if reason:
        pytest.skip(reason)
    timer = _benchmark_timer(request)
    result = session.run_cell(cell, timer)
    if timer is not None and timer.timed:
        request.getfixturevalue("benchmark").extra_info.update(
            quality=result.quality, counted_tokens=result.row.counted_tokens
        )
    return result


def _benchmark_timer(request: pytest.FixtureRequest) -> _ModelCallTimer | None:
    """Time the model call exactly once through pytest-benchmark, when it is active."""
    config = request.config
    # pytest-benchmark switches itself off under xdist (it reads PYTEST_XDIST_WORKER).
    if not config.pluginmanager.hasplugin("benchmark") or os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    if (config.stash[SESSION_KEY].settings.concurrency or 1) > 1:
        return None  # cells run ahead in threads; there is no call left to time
    if getattr(config.option, "benchmark_disable", False) or getattr(
        config.option, "dist", "no"
    ) != "no":
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
        completion = benchmark.pedantic(call, rounds=1, iterations=1)
        benchmark.extra_info["output_tokens"] = completion.completion_tokens
        self.timed = True
        return completion
