"""Reports built from run records: summary, paired and category tables with bootstrap
intervals, plots, report.json/.md/.html, and the gates the plugin applies.

Importing this package is cheap: numpy, pandas and matplotlib load only when a name below
is first used, because the plugin imports in every pytest session, sweep or not.

    from pytest_budgetbench.reports import build_report, violation_gate, regression_gate
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pytest_budgetbench.errors import Requirement

if TYPE_CHECKING:
    from pytest_budgetbench.reports.builder import (
        Report,
        ReportSettings,
        build_report,
        compute_report,
        write_report,
    )
    from pytest_budgetbench.reports.extensions import (
        ExtraTable,
        ReportExtension,
        register_report_extension,
    )
    from pytest_budgetbench.reports.gates.judging import (
        answer_kept_gate,
        check_baseline_comparable,
        gate_verdict,
        regression_gate,
        retention_gate,
        violation_gate,
    )
    from pytest_budgetbench.reports.load import ReportError
    from pytest_budgetbench.reports.tables import Prices, Reference

REQUIREMENTS = (Requirement("numpy", "reports"), Requirement("pandas", "reports"),
                Requirement("matplotlib", "reports"))
"""What the tables, gates, plots and HTML import: the ``reports`` extra. A sweep without
it writes its records and the terminal summary, and says how to build the report later."""

_EXPORTS = {
    "build_report": "builder",
    "compute_report": "builder",
    "write_report": "builder",
    "Report": "builder",
    "ReportSettings": "builder",
    "ExtraTable": "extensions",
    "ReportExtension": "extensions",
    "register_report_extension": "extensions",
    "violation_gate": "gates.judging",
    "gate_verdict": "gates.judging",
    "regression_gate": "gates.judging",
    "retention_gate": "gates.judging",
    "answer_kept_gate": "gates.judging",
    "check_baseline_comparable": "gates.judging",
    "ReportError": "load",
    "Prices": "tables",
    "Reference": "tables",
}

__all__ = [
    "REQUIREMENTS",
    "ExtraTable",
    "Prices",
    "Reference",
    "Report",
    "ReportError",
    "ReportExtension",
    "ReportSettings",
    "answer_kept_gate",
    "build_report",
    "check_baseline_comparable",
    "compute_report",
    "gate_verdict",
    "register_report_extension",
    "regression_gate",
    "retention_gate",
    "violation_gate",
    "write_report",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        # AttributeError (not ImportError) lets `from ... import <submodule>` fall through
        # to the normal submodule import.
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
