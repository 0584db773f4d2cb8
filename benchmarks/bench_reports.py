"""Build the report of 100,000 and 1,000,000 synthetic rows (5 strategies x 5 budgets x
4,000 or 40,000 items, 3 categories) with 2,000 bootstrap resamples per interval, each in
a fresh child process, and print its wall time, peak memory and stages.

    .venv/bin/python benchmarks/bench_reports.py [--rows 100000,1000000] [--resamples 2000]
        [--code DIR]

Goal (issue 15): 1M rows in < 60 s and < 1 GB peak RSS on 2 cores. Peak RSS is the
child's ``ru_maxrss``: the process that reads cells.jsonl and writes every report file
(plots included). ``--code DIR`` builds with another checkout of the package (``git
archive <rev> | tar -x -C DIR``) for a before/after table on one machine. The load
average at start and end is printed: numbers taken beside other work are not comparable.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_budgetbench.reports.synthetic import iter_synthetic_rows, write_run  # noqa: E402

CELLS_PER_ITEM = 25  # 5 strategies x 5 budgets, one task, one repeat
# The child: build_report, with the outermost call of each stage timed.
CHILD = """\
import functools, json, resource, sys, time
from pathlib import Path
from pytest_budgetbench.reports import builder, load, tables, viewer

stages = {}
depth = [0]

def timed(label, function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        if depth[0]:
            return function(*args, **kwargs)
        depth[0] += 1
        started, cpu = time.perf_counter(), time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            wall_s, cpu_s = stages.get(label, (0.0, 0.0))
            stages[label] = (wall_s + time.perf_counter() - started,
                             cpu_s + time.process_time() - cpu)
            depth[0] -= 1
    return wrapper

load.load = timed("read cells.jsonl", load.load)
for name in ("item_table", "summary_table", "paired_table", "category_table"):
    setattr(tables, name, timed(name, getattr(tables, name)))
builder._write = timed("write files + plots", builder._write)

def timed_within(label, function):  # a stage inside another, timed whatever the depth
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        started, cpu = time.perf_counter(), time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            stages[label] = (time.perf_counter() - started, time.process_time() - cpu)
    return wrapper

viewer.viewer_data = timed_within("(of which the viewer's data)", viewer.viewer_data)
run_dir, out, resamples = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
started = time.perf_counter()
report = builder.build_report([run_dir], out, resamples=resamples)
wall = time.perf_counter() - started
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall_s": wall, "rows": len(report.rows), "stages": stages,
                  "cpu_s": usage.ru_utime + usage.ru_stime, "maxrss_kb": usage.ru_maxrss}))
"""


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def build(run_dir: Path, out: Path, resamples: int, code: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(code)}
    done = subprocess.run([sys.executable, "-c", CHILD, str(run_dir), str(out), str(resamples)],
                          capture_output=True, text=True, env=env, cwd=code)
    if done.returncode != 0:
        sys.exit(f"report build failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="100000,1000000")
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--code", type=Path, default=ROOT,
                        help="a checkout whose pytest_budgetbench builds the reports")
    args = parser.parse_args()
    code = args.code.resolve()
    print(f"load average at start: {load_average()} ({os.cpu_count()} cores); code: {code}")
    print("goal: 1,000,000 rows in < 60 s and < 1 GB peak RSS on 2 cores\n")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for rows in (int(n) for n in args.rows.split(",")):
            run_dir = Path(tmp) / f"run-{rows}"
            started = time.perf_counter()
            write_run(run_dir, iter_synthetic_rows(items=rows // CELLS_PER_ITEM))
            size = (run_dir / "cells.jsonl").stat().st_size
            print(f"wrote {rows:,} rows ({size / 2**20:.0f} MiB) in "
                  f"{time.perf_counter() - started:.1f} s; building (load {load_average()})",
                  flush=True)
            result = build(run_dir, Path(tmp) / f"report-{rows}", args.resamples, code)
            results.append((rows, result))
            print("  stage wall/cpu s: " + ", ".join(
                f"{name} {wall:.1f}/{cpu:.1f}" for name, (wall, cpu) in result["stages"].items()),
                flush=True)
            (run_dir / "cells.jsonl").unlink()
    # CPU seconds (user + system, all threads) are what contention changes least.
    print(f"\n{'rows':>10}{'wall s':>9}{'cpu s':>8}{'peak MiB':>10}{'KB/row':>8}   goal")
    for rows, result in results:
        wall, peak = float(result["wall_s"]), int(result["maxrss_kb"])
        met = "met" if wall < 60 and peak * 1024 < 1e9 else "missed"
        goal = f"{met} (< 60 s, < 1 GB)" if rows == 1_000_000 else ""
        print(f"{rows:>10,}{wall:>9.1f}{float(result['cpu_s']):>8.1f}{peak / 1024:>10.0f}"
              f"{peak / rows:>8.2f}   {goal}")
    print(f"\nload average at end: {load_average()}")


if __name__ == "__main__":
    main()
