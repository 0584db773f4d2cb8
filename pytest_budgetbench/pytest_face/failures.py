"""How a cell's failure is shown: never with a secret in it.

pytest renders a failing test's traceback with each frame's arguments (and, under ``-l``,
its locals), and writes the same text to ``--junitxml``. A cell's frames can hold the API
key or an endpoint URL with credentials, so:

- an error of ours (:class:`BudgetBenchError`) is shown as its own message only, one
  line, with no frames: the message says what happened and how to fix it;
- anything else keeps pytest's rendering, with every string in it redacted;
- captured output and log sections are redacted too.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pytest_budgetbench.errors import BudgetBenchError
from pytest_budgetbench.redact import redact

_MAX_DEPTH = 12  # pytest's repr objects nest a few levels; nothing deeper is text we show


def scrub_report(report: Any, excinfo: Any) -> None:
    """Rewrite a pytest TestReport in place so that no secret is shown or saved."""
    if report.longrepr is not None:
        if excinfo is not None and isinstance(excinfo.value, BudgetBenchError):
            report.longrepr = _our_error(excinfo)
        report.longrepr = _scrub(report.longrepr, 0)
    report.sections = [(title, redact(content)) for title, content in report.sections]
    if isinstance(getattr(report, "wasxfail", None), str):
        report.wasxfail = redact(report.wasxfail)


def _our_error(excinfo: Any) -> Any:
    """Our error as ``TypeName: message``, no frames, no chained exception (its text is a
    library's, e.g. httpx's, with the full URL)."""
    longrepr = excinfo.getrepr(style="value", chain=False, showlocals=False, funcargs=False)
    line = f"{type(excinfo.value).__name__}: {excinfo.value}"
    for entry in getattr(longrepr.reprtraceback, "reprentries", []):
        entry.lines = line.splitlines()
    return longrepr


def _scrub(value: Any, depth: int) -> Any:
    """``value`` with every string in it redacted; pytest's repr objects (dataclasses) are
    rewritten in place."""
    if depth > _MAX_DEPTH:
        return value
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, tuple):
        return tuple(_scrub(item, depth + 1) for item in value)
    if isinstance(value, list):
        return [_scrub(item, depth + 1) for item in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            current = getattr(value, field.name, None)
            if current is not None:
                object.__setattr__(value, field.name, _scrub(current, depth + 1))
        return value
    return value
