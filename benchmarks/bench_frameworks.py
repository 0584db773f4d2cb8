"""Framework memory policies, model-free: the sweep's wall time, and each policy's figures.

    .venv/bin/python benchmarks/bench_frameworks.py [--repeats N] [--out DIR] [--items N]

Runs, ``--repeats`` times in a fresh process (``pytest -n 2 --budgetbench-only`` in an
empty project: the machine's two cores; exact counts with the default model's GGUF; each
time a fresh out directory and count cache), the sweep of issue 40's "done when": every
framework policy that calls no model, as shipped and ``_exact``, over ``memory``,
``longmemeval`` (the shared oracle subset) and teacher-forced
``bfcl_multi_turn_long_context``, 20 items, budgets 1024/2048/4096,
``--budgetbench-model=none``. It prints each wall time, their median and the load average,
then, from the last run, per policy and budget: the violation rate, the
counter error (exact count - the framework's own: median, p95, max), the violations the
framework's counter let through, evidence retention and answer kept (docs/frameworks.md
gives these).

The OpenHands SDK needs Python 3.12: under 3.11 its policies are left out (said in the
output). Goal: the sweep under 2 minutes on 2 cores (median of 3, a quiet machine).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
from pathlib import Path

from bench_sweep_cache import run

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
LONGMEMEVAL = DATA / "longmemeval" / "longmemeval_oracle_subset60.json"
TRIMMING = ("langchain_trim_messages", "langchain_clear_tool_uses", "inspect_compaction_trim",
            "inspect_compaction_edit", "llamaindex_memory", "llamaindex_chat_memory_buffer")
"""The policies that call no model, each also run ``_exact``."""
OPENHANDS = ("openhands_no_op",)
"""The OpenHands SDK's one non-LLM condenser (Python 3.12 or newer); it counts nothing, so
it has no ``_exact`` variant."""


def policies() -> list[str]:
    names = [variant for name in TRIMMING for variant in (name, f"{name}_exact")]
    if sys.version_info >= (3, 12):
        names += OPENHANDS
    return names


def sweep(items: int) -> list[str]:
    return ["-n", "2", "--budgetbench-model=none", "--budgets=1024,2048,4096",
            "--budgetbench-tasks=memory,longmemeval,bfcl_multi_turn_long_context",
            f"--budgetbench-data-longmemeval={LONGMEMEVAL}", f"--budgetbench-items={items}",
            "--budgetbench-episodes=teacher-forced",
            f"--budgetbench-strategies={','.join(policies())}"]


def figures(run_dir: Path) -> None:
    """The per-policy table docs/frameworks.md gives, from the run's report."""
    from pytest_budgetbench.reports import build_report

    report = build_report([run_dir], run_dir / "bench-report", plots=False, resamples=200)
    errors = report.extra_tables["counter_error"].table
    summary = report.summary
    columns = [c for c in ("evidence_retention_mean", "answer_kept_mean") if c in summary]
    print(f"{'task':<30}{'strategy':<34}{'budget':>7}{'viol.':>7}{'err p50':>9}{'p95':>7}"
          f"{'max':>7}{'caused':>8}" + "".join(f"{c.removesuffix('_mean')[:12]:>14}"
                                               for c in columns))
    for _, line in summary.sort_values(["task", "strategy", "budget"]).iterrows():
        key = (errors["task"] == line["task"]) & (errors["strategy"] == line["strategy"]) & (
            errors["budget"] == line["budget"])
        error = errors[key].iloc[0] if key.any() else None
        cells = (f"{error['error_median']:>9.0f}{error['error_p95']:>7.0f}"
                 f"{error['error_max']:>7.0f}{int(error['violations_caused']):>8}"
                 if error is not None else f"{'':>31}")
        print(f"{line['task']:<30}{line['strategy']:<34}{int(line['budget']):>7}"
              f"{line['violation_rate']:>7.2f}{cells}"
              + "".join(f"{line[c]:>14.3f}" for c in columns))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench-frameworks"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--items", type=int, default=20)
    args = parser.parse_args()
    if not LONGMEMEVAL.is_file():
        sys.exit(f"the shared LongMemEval subset is not at {LONGMEMEVAL}")
    load1, load5, _ = os.getloadavg()
    walls: list[float] = []
    run_dir = None
    for repeat in range(args.repeats):
        out = args.out / str(repeat)
        shutil.rmtree(out, ignore_errors=True)
        wall, run_dir, started = run(out / "runs", out / "responses.sqlite", sweep(args.items))
        assert not started["server"], "a model-free sweep started the server"
        walls.append(wall)
        cells = len((run_dir / "cells.jsonl").read_text().splitlines())
        print(f"run {repeat}: {cells} cells in {wall:.1f} s", flush=True)
    if sys.version_info < (3, 12):
        print("left out: the OpenHands SDK's policies (Python 3.12 or newer)")
    print(f"cores {os.cpu_count()}, load average at start {load1:.2f} (1 min), "
          f"{load5:.2f} (5 min); median {statistics.median(walls):.1f} s of "
          f"{', '.join(f'{w:.1f}' for w in walls)}; goal < 120 s")
    if run_dir is not None:
        figures(run_dir)


if __name__ == "__main__":
    main()
