"""What a sweep writes to the terminal outside its cells: the lines at its start (the
credential line, warnings, the embedded model's starting line) and the summary at its end.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from pytest_budgetbench.errors import BudgetBenchError
from pytest_budgetbench.redact import redact

if TYPE_CHECKING:
    from pytest_budgetbench.engine.session import BudgetBenchSession


def start_session(config: pytest.Config, session: BudgetBenchSession) -> None:
    """Start the sweep's session, with its lines; a usage error or nothing to run ends
    pytest."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and not session.settings.endpoint \
            and not session.settings.model_free:
        session.on_server_start = starting_line(config, session, reporter)
    from pytest_budgetbench.engine.preflight import NothingToRun
    from pytest_budgetbench.engine.wiring import credential_line

    credential = credential_line(session.settings)
    if reporter is not None and credential:
        reporter.write_line(redact(credential))

    try:
        session.start()
    except NothingToRun as exc:
        pytest.exit(str(exc), returncode=pytest.ExitCode.OK)
    except BudgetBenchError as exc:
        raise pytest.UsageError(redact(f"budgetbench: {exc}")) from None
    for note in session.notes:
        if reporter is not None:
            reporter.write_line(redact(f"budgetbench: warning: {note}"), yellow=True)
    if reporter is not None and session.settings.model_free:
        reporter.write_line(f"budgetbench: model-free sweep (--budgetbench-model=none): every "
                            f"prompt is built, counted ({session.counter_name}) and held to "
                            "its budget; nothing is sent and no model starts")
    shard = session.settings.shard
    if reporter is not None and shard is not None:  # a job's log says which part it ran
        reporter.write_line(f"budgetbench: shard {shard[0]}/{shard[1]} "
                            f"({session.settings.shard_source})")


def starting_line(config: pytest.Config, session: BudgetBenchSession,
                  reporter: Any) -> Callable[[], None]:
    """The line printed when the embedded server really starts: on the first cache
    miss, inside a cell's test (under xdist: in the controller, at a worker's request),
    so past the output capture, as pytest's live logging writes."""
    description = session.embedded_description()
    capture = config.pluginmanager.get_plugin("capturemanager")

    def write() -> None:
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            reporter.write_line(f"Starting the embedded model ({description})…")

    return write


def write_sweep_summary(terminalreporter: Any, run: BudgetBenchSession,
                        finish_error: str) -> None:
    """The end of the sweep's output: the summary, cache rejections, replicas taken out, a
    server never started, and the error that stopped its finish (``finish_error``, when not
    empty)."""
    from pytest_budgetbench.engine.wiring import replica_lines
    from pytest_budgetbench.reports.terminal import write_summary

    write_summary(terminalreporter, run.store.run_dir, run.settings,
                  report=run.report if run.report_dir is not None else None,
                  verdicts=run.verdicts, report_dir=run.report_dir,
                  report_missing=run.report_missing)
    for line in run.cache_rejections():
        terminalreporter.write_line(f"budgetbench: {line}", yellow=True)
    for line in replica_lines(run.store.run_dir, since=run.created):
        terminalreporter.write_line(redact(f"budgetbench: {line}"), yellow=True)
    endpoint = run.endpoint
    if endpoint is not None and endpoint.embedded and not run.server_needed:
        terminalreporter.write_line("budgetbench: the embedded model was not started: the "
                                    "response cache held every reply this run needed")
    if finish_error:
        terminalreporter.write_line(finish_error, red=True, bold=True)
