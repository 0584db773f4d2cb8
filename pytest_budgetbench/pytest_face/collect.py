"""The sweep in pytest's collection tree: one ``budgetbench`` collector under the session.

How it fits pytest (8 and 9 alike):

- ``budgetbench`` is a :class:`pytest.Module` whose object is
  :mod:`pytest_budgetbench.pytest_face.sweep_tests`, so its tests are made by pytest's own
  ``Metafunc.parametrize`` (through ``pytest_generate_tests``): ``cell[<cell id>]`` and
  ``gate[<kind> <strategy>@<budget>]`` (and a budget search's ``search[<task> <strategy>]``)
  are ordinary parametrized Functions, with the
  parametrization pytest 9.2's structured node ids (and its ``--lf`` cache) expect.
- It is added to the session's own collect report (a ``pytest_make_collect_report``
  wrapper), so pytest counts, selects (``-k``, ``-m``, ``--deselect``, ``--lf``, ``--ff``,
  ``--sw``) and reports its items like any other.
- Its node path is the rootdir, which is always an existing path and always among
  ``--lf``'s "last failed paths" when anything failed, so the cache plugin neither skips
  nor misfilters it.
- pytest resolves a command-line argument as a path on disk, and ``budgetbench`` is none;
  :func:`take_sweep_args` takes ``budgetbench[::...]`` arguments out of ``config.args``
  before collection and the collector keeps only the items they name, with pytest's own
  matching rule (``name[params]`` exactly, or ``name`` for all its parametrizations).
  Workers of xdist parse the same arguments and do the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_budgetbench.errors import BudgetBenchError
from pytest_budgetbench.pytest_face import nodeids
from pytest_budgetbench.pytest_face.nodeids import SWEEP_NODE
from pytest_budgetbench.redact import redact

if TYPE_CHECKING:
    from pytest_budgetbench.engine.session import BudgetBenchSession
    from pytest_budgetbench.sweep.cells import Cell

SELECTORS_KEY = pytest.StashKey["list[Selector]"]()
EXPLICIT_PATHS_KEY = pytest.StashKey[bool]()
"""True when the command line names paths (files, test ids) and no directory."""


@dataclass(frozen=True)
class Selector:
    """One ``budgetbench[::name[params]]`` argument of the command line."""

    text: str
    names: tuple[str, ...]

    @classmethod
    def parse(cls, arg: str) -> Selector:
        _path, names = nodeids.split(arg)
        return cls(arg, names)

    def matches(self, item: pytest.Item) -> bool:
        if not self.names:
            return True
        (name,) = self.names[-1:]
        if nodeids.has_params(name):
            return item.name == name
        return nodeids.function_of(item.name) == name


def is_sweep_arg(arg: str, invocation_dir: Path) -> bool:
    """``budgetbench`` or ``budgetbench::...``, unless a real path of that name exists."""
    path = nodeids.path_of(arg)
    if path.rstrip("/") != SWEEP_NODE:
        return False
    return nodeids.names_a_test(arg) or not (invocation_dir / path).exists()


def take_sweep_args(config: pytest.Config) -> None:
    """Move the sweep's node ids out of ``config.args`` (pytest would look for them on disk)
    into a selection the ``budgetbench`` collector applies."""
    invocation_dir = config.invocation_params.dir
    ours = [arg for arg in config.args if is_sweep_arg(arg, invocation_dir)]
    config.args[:] = [arg for arg in config.args if arg not in ours]
    config.stash[SELECTORS_KEY] = [Selector.parse(arg) for arg in ours]
    explicit = config.args_source == pytest.Config.ArgsSource.ARGS and bool(config.args)
    config.stash[EXPLICIT_PATHS_KEY] = explicit and not any(
        (invocation_dir / nodeids.path_of(arg)).is_dir() for arg in config.args
    )


def sweep_is_collected(config: pytest.Config, *, only: bool) -> bool:
    """The sweep runs unless the command line names only files or test ids (and no
    ``budgetbench`` argument): ``pytest tests/test_x.py::test_y`` runs just that test."""
    if only or config.stash.get(SELECTORS_KEY, []):
        return True
    return not config.stash.get(EXPLICIT_PATHS_KEY, False)


class SweepModule(pytest.Module):
    """``budgetbench``: the module :mod:`pytest_budgetbench.pytest_face.sweep_tests`, rooted at the
    rootdir, whose functions are parametrized over the sweep's cells and gates."""

    def _getobj(self) -> Any:
        from pytest_budgetbench.pytest_face import sweep_tests

        return sweep_tests

    def funcnamefilter(self, name: str) -> bool:
        return name in (nodeids.CELL, nodeids.GATE, nodeids.SEARCH)

    def classnamefilter(self, name: str) -> bool:
        return False

    def collect(self) -> list[pytest.Item | pytest.Collector]:
        from pytest_budgetbench.engine.session import SESSION_KEY

        session = self.config.stash[SESSION_KEY]
        # A function with no parameter sets would become one skipped placeholder item.
        empty = {name for name, params in (("cell", session.cells), ("gate", session.gates),
                                           ("search", session.searches)) if not params}
        items = [i for i in super().collect() if getattr(i, "originalname", "") not in empty]
        selectors = self.config.stash.get(SELECTORS_KEY, [])
        if selectors:
            items = [i for i in items if any(s.matches(i) for s in selectors)]  # type: ignore[arg-type]
        return items

    @classmethod
    def for_session(cls, session: pytest.Session) -> SweepModule:
        return cls.from_parent(session, path=session.config.rootpath, name=SWEEP_NODE,
                               nodeid=SWEEP_NODE)


def unmatched_selectors(config: pytest.Config, items: list[pytest.Item]) -> list[str]:
    """Arguments that named no sweep item (a typo, or a cell of another sweep)."""
    ours = [i for i in items if is_sweep_item(i)]
    return [s.text for s in config.stash.get(SELECTORS_KEY, [])
            if not any(s.matches(i) for i in ours)]


def is_sweep_item(item: pytest.Item) -> bool:
    return isinstance(item.parent, SweepModule)


def item_cell(item: pytest.Item) -> Cell | None:
    """The cell an item runs: a generated cell, or a user's test over ``budget_cell``."""
    callspec = getattr(item, "callspec", None)
    cell = callspec.params.get("budget_cell") if callspec is not None else None
    return cell


def cells_of(items: list[pytest.Item]) -> list[Cell]:
    """The cells ``items`` run, each once, in order."""
    cells = [c for c in map(item_cell, items) if c is not None]
    return list({c.cell_id: c for c in cells}.values())


def is_gate_item(item: pytest.Item) -> bool:
    return is_sweep_item(item) and nodeids.is_gate_name(item.name)


def is_cell_item(item: pytest.Item) -> bool:
    return is_sweep_item(item) and nodeids.is_cell_name(item.name)


def uses_budget_cell(item: pytest.Item) -> bool:
    return "budget_cell" in getattr(item, "fixturenames", ())


def in_sweep(item: pytest.Item) -> bool:
    """A cell, a gate, or a user's test over the cells."""
    return is_sweep_item(item) or uses_budget_cell(item)


def select_sweep_items(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A selector that names no sweep item is a usage error; --budgetbench-only deselects
    every test that is not part of the sweep."""
    from pytest_budgetbench.engine.session import SESSION_KEY

    unmatched = unmatched_selectors(config, items)
    if unmatched:
        hint = ("see the ids with: pytest --co -q" if SESSION_KEY in config.stash
                else "no sweep runs: pass --budgets=N,N")
        raise pytest.UsageError(f"not found: {', '.join(unmatched)} ({hint})")
    if not config.getoption("budgetbench_only", False):
        return
    keep = [i for i in items if in_sweep(i)]
    if len(keep) < len(items):
        kept = set(map(id, keep))
        config.hook.pytest_deselected(items=[i for i in items if id(i) not in kept])
        items[:] = keep


def add_sweep_module(config: pytest.Config, session: BudgetBenchSession,
                     collector: pytest.Session, report: pytest.CollectReport) -> None:
    """Put the ``budgetbench`` node first in the session's collect report, when the sweep
    is collected; bad data is a usage error, not a collection error of one node."""
    if sweep_is_collected(config, only=config.getoption("budgetbench_only")):
        from pytest_budgetbench.engine.preflight import NothingToRun, check_not_empty

        try:  # bad data is a usage error, not a collection error of one node
            check_not_empty(session.settings, session.planned_cells)
            session.gates  # noqa: B018 - built once, here
        except NothingToRun as exc:
            pytest.exit(str(exc), returncode=pytest.ExitCode.OK)
        except BudgetBenchError as exc:
            raise pytest.UsageError(redact(f"budgetbench: {exc}")) from None
        # First: the cells run (and are timed) before the tests that read them.
        report.result.insert(0, SweepModule.for_session(collector))


def present_report(item: pytest.Item, call: pytest.CallInfo[None],
                   report: pytest.TestReport) -> None:
    """A sweep item's report, or one of a user's test over the cells, as shown."""
    if is_sweep_item(item) or uses_budget_cell(item):
        # Failures are shown without secrets, in the terminal and in --junitxml.
        from pytest_budgetbench.pytest_face.failures import scrub_report

        scrub_report(report, call.excinfo)
    if is_sweep_item(item):
        # The heading of a failure names the node id, which can be pasted back.
        path, lineno, _domain = report.location
        report.location = (path, lineno, item.nodeid)
