"""The sweep in pytest's collection tree: one ``budgetbench`` collector under the session.

How it fits pytest (8 and 9 alike):

- ``budgetbench`` is a :class:`pytest.Module` whose object is
  :mod:`pytest_budgetbench.sweep_tests`, so its tests are made by pytest's own
  ``Metafunc.parametrize`` (through ``pytest_generate_tests``): ``cell[<cell id>]`` and
  ``gate[<kind> <strategy>@<budget>]`` are ordinary parametrized Functions, with the
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

from pytest_budgetbench import nodeids
from pytest_budgetbench.nodeids import SWEEP_NODE

if TYPE_CHECKING:
    from pytest_budgetbench.cells import Cell

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
    """``budgetbench``: the module :mod:`pytest_budgetbench.sweep_tests`, rooted at the
    rootdir, whose functions are parametrized over the sweep's cells and gates."""

    def _getobj(self) -> Any:
        from pytest_budgetbench import sweep_tests

        return sweep_tests

    def funcnamefilter(self, name: str) -> bool:
        return name in (nodeids.CELL, nodeids.GATE)

    def classnamefilter(self, name: str) -> bool:
        return False

    def collect(self) -> list[pytest.Item | pytest.Collector]:
        from pytest_budgetbench.session import SESSION_KEY

        session = self.config.stash[SESSION_KEY]
        # A function with no parameter sets would become one skipped placeholder item.
        empty = {name for name, params in (("cell", session.cells), ("gate", session.gates))
                 if not params}
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


def is_gate_item(item: pytest.Item) -> bool:
    return is_sweep_item(item) and nodeids.is_gate_name(item.name)


