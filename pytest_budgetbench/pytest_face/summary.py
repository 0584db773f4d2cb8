"""What a sweep writes to the terminal outside its cells: the lines at its start (the
credential line, warnings, the embedded model's starting line) and the summary at its end.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_budgetbench.errors import BudgetBenchError
from pytest_budgetbench.redact import redact

if TYPE_CHECKING:
    from pytest_budgetbench.engine.session import BudgetBenchSession
    from pytest_budgetbench.reports.builder import Report


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
                        finish_error: str, ci_warnings: Sequence[str] = ()) -> None:
    """The end of the sweep's output: the summary, cache rejections, replicas taken out, a
    server never started, the CI files that could not be written (``ci_warnings``), in a
    GitHub Actions job the failed gates' annotations, and the error that stopped its
    finish (``finish_error``, when not empty)."""
    from pytest_budgetbench.engine.wiring import replica_lines
    from pytest_budgetbench.reports import ci
    from pytest_budgetbench.reports.terminal import write_summary

    write_summary(terminalreporter, run.store.run_dir, run.settings,
                  report=run.report if run.report_dir is not None else None,
                  verdicts=run.verdicts, report_dir=run.report_dir,
                  report_missing=run.report_missing)
    if ci.in_github_actions():  # workflow commands: annotations on the run and the PR
        for line in ci.gate_annotations(run.verdicts, search_gate_failures(run)):
            terminalreporter.write_line(line)
    for line in ci_warnings:
        terminalreporter.write_line(f"budgetbench: warning: {line}", yellow=True)
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


def search_gate_failures(run: BudgetBenchSession) -> list[str]:
    """A budget search's failed gates (--budgetbench-max-safe-budget), one line each: its
    verdicts are its records', not gate items'."""
    if run.settings.search is None:
        return []
    return [record["gate"] for record in run.store.safe_budgets() if record["gate"]]


def write_ci_outputs(run: BudgetBenchSession) -> list[str]:
    """What a CI job reads of the sweep, written by the controller once at its end: the job
    summary (--budgetbench-job-summary, by default GitHub's $GITHUB_STEP_SUMMARY), the
    trend files (--budgetbench-trend) and, in a GitHub Actions step, the run directory as
    the step's output ``run_dir`` ($GITHUB_OUTPUT). Returns a line for each that could not
    be written; the run's records stand either way."""
    from pytest_budgetbench.errors import BudgetBenchError
    from pytest_budgetbench.reports import ci

    settings, warnings = run.settings, []
    report, missing = _ci_report(run)
    if settings.job_summary is not None:
        try:
            _write_job_summary(run, Path(settings.job_summary), report, missing)
        except (OSError, BudgetBenchError) as exc:
            warnings.append(f"the job summary could not be written to "
                            f"{settings.job_summary}: {exc}")
    if settings.trend is not None:
        try:
            if report is None:
                raise BudgetBenchError(missing or "no report was computed")
            ci.write_trend(report.summary, Path(settings.trend))
        except (OSError, BudgetBenchError) as exc:
            warnings.append(f"the trend files could not be written to {settings.trend}: {exc}")
    try:
        ci.set_step_output("run_dir", str(run.store.run_dir))
    except (OSError, ValueError) as exc:
        warnings.append(f"the step output run_dir could not be written: {exc}")
    return [redact(line) for line in warnings]


def _ci_report(run: BudgetBenchSession) -> tuple[Report | None, str | None]:
    """The computed report the CI files show (None in a budget search, whose answer is
    its table, or without the ``reports`` extra), and why there is none."""
    if run.settings.search is not None or (run.settings.job_summary is None
                                           and run.settings.trend is None):
        return None, None
    from pytest_budgetbench import reports
    from pytest_budgetbench.errors import BudgetBenchError, check_installed

    try:
        check_installed(reports.REQUIREMENTS, "the job summary's tables",
                        f"then `budgetbench report {run.store.run_dir} --job-summary FILE`")
        return run.computed_report(), None
    except BudgetBenchError as exc:  # a core install, or a report that cannot be computed
        return None, str(exc)


def _write_job_summary(run: BudgetBenchSession, path: Path, report: Report | None,
                       missing: str | None) -> None:
    from pytest_budgetbench.reports import ci
    from pytest_budgetbench.reports.terminal import format_safe_budgets

    facts = [("run directory", str(run.store.run_dir))]
    if report is None:
        model = run.endpoint.model if run.endpoint is not None else None
        facts = [("runs", run.run_id), ("model", str(model)),
                 ("tokenizer", run.counter_name), *facts]
    blocks = []
    if run.settings.search is not None:
        blocks.append(("Smallest safe budget",
                       "\n".join(format_safe_budgets(run.store.safe_budgets()))))
    markdown = ci.job_summary(run.verdicts, report, failures=search_gate_failures(run),
                              facts=facts, notes=[missing] if missing else [], blocks=blocks)
    where = str(run.report_dir or run.store.run_dir)
    ci.append_job_summary(path, markdown, where=where)
