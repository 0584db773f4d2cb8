"""Report extensions: tables and plots that a strategy family adds to every report.

The generic report knows only rows. A strategy that records its own notes on the row
(``strategy_info``) can turn them into extra tables and plots with an extension, an object
with a ``name`` and two methods (see :class:`ReportExtension`). Extensions come from the
``budgetbench.reports`` entry-point group, e.g. in a package's pyproject.toml::

    [project.entry-points."budgetbench.reports"]
    budgetmem = "pytest_budgetbench.strategies.budgetmem.report:EXTENSION"

or, in-process, from :func:`register_report_extension`. Each extra table is written as
``<name>.csv`` (when it has rows), under its name in report.json, and as a section of
report.md and report.html.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from pytest_budgetbench.reports.load import ReportError

if TYPE_CHECKING:
    import pandas as pd

    from pytest_budgetbench.reports.plots import Plot
    from pytest_budgetbench.reports.render import Column

ENTRY_POINT_GROUP = "budgetbench.reports"


@dataclass(frozen=True)
class ExtraTable:
    """One table an extension adds: ``name`` is its CSV file stem and report.json key."""

    name: str
    title: str
    note: str
    table: pd.DataFrame
    view: tuple[Column, ...]


class ReportExtension(Protocol):
    """What an extension provides. Both methods see only the report's frames, never a
    strategy object; either may return an empty list.

    An extension may also set ``row_fields``, a tuple of the row fields its ``tables``
    reads beyond the report's own (``load.REPORT_FIELDS``), e.g. ``("strategy_info",)``:
    the report then loads only those. Without it, every field is loaded, which costs
    memory on large runs.
    """

    name: str

    def tables(self, rows: pd.DataFrame) -> list[ExtraTable]:
        """Extra tables from the merged rows (one per cell, as ``Report.rows``)."""
        ...

    def plots(self, summary: pd.DataFrame, out_dir: Path) -> list[Plot]:
        """Extra figures from the summary table, written under ``out_dir``."""
        ...


_registered: dict[str, ReportExtension] = {}


def register_report_extension(extension: ReportExtension) -> None:
    """Add an extension to every report this process builds (replacing one of its name)."""
    _registered[extension.name] = extension


def report_extensions() -> list[ReportExtension]:
    """The entry points' extensions, then the registered ones, one per name."""
    found: dict[str, ReportExtension] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            extension = ep.load()
        except (ImportError, AttributeError) as exc:
            raise ReportError(
                f"report extension '{ep.name}' ({ep.value}, entry point group "
                f"{ENTRY_POINT_GROUP}) cannot be loaded: {exc}; fix or uninstall the package "
                "that declares it"
            ) from exc
        found.setdefault(getattr(extension, "name", ep.name), extension)
    found.update(_registered)
    return list(found.values())
