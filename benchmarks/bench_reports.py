"""Aggregate 100,000 synthetic rows (5 strategies x 5 budgets x 4,000 items) with 2,000
bootstrap resamples per interval, and print how long each stage takes.

    .venv/bin/python benchmarks/bench_reports.py [--items 4000] [--resamples 2000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pytest_budgetbench.reports import build_report, load, tables
from pytest_budgetbench.reports.synthetic import synthetic_rows, write_run

T = TypeVar("T")


def timed(label: str, action: Callable[[], T]) -> T:
    started = time.perf_counter()
    result = action()
    print(f"{label:<44} {time.perf_counter() - started:8.2f} s")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=4000)
    parser.add_argument("--resamples", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        rows = timed("generate rows", lambda: synthetic_rows(items=args.items))
        timed(f"write {len(rows):,} rows", lambda: write_run(run_dir, rows))
        frame = timed("read + merge cells.jsonl", lambda: load.load([run_dir]))
        items = timed("item table (repeats averaged)", lambda: tables.item_table(frame))
        summary = timed(
            "summary (bootstrap per cell)",
            lambda: tables.summary_table(frame, items, resamples=args.resamples, seed=0),
        )
        timed(
            "paired (paired bootstrap per cell)",
            lambda: tables.paired_table(items, tables.Reference(), resamples=args.resamples,
                                        seed=0),
        )
        timed(
            "categories (summary + paired per category)",
            lambda: tables.category_table(frame, items, tables.Reference(),
                                          resamples=args.resamples, seed=0),
        )
        report = timed(
            "build_report, all files and plots",
            lambda: build_report([run_dir], Path(tmp) / "report", resamples=args.resamples),
        )
        print(f"{len(summary)} summary cells, {len(report.paired)} paired cells, "
              f"{len(report.categories)} category cells, {len(frame):,} rows")


if __name__ == "__main__":
    main()
