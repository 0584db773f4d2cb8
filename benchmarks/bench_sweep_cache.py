"""A sweep on the embedded model, cold and then with a warm response cache.

    .venv/bin/python benchmarks/bench_sweep_cache.py [--out DIR] [pytest sweep options...]

Runs the sweep (default: the main job, ``--budgets=2048,8192``) twice with a fresh cache
file, and prints, for each run: wall time, cells, model calls actually sent, and the
summed latency of those calls. The cold run's overhead ratio is its wall time over the
summed time of its unique model calls (strategy auxiliary calls included): the physical
limit of a sweep is that sum, so 1.0 would be no overhead at all.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_SWEEP = ["--budgets=2048,8192"]


def run(out: Path, cache: Path, sweep: list[str]) -> tuple[float, Path]:
    before = set(out.glob("*")) if out.exists() else set()
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *sweep,
               "--budgetbench-only", f"--budgetbench-out={out}",
               f"--budgetbench-cache-path={cache}"]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode not in (0, 1):
        sys.exit(f"sweep failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
    (run_dir,) = [d for d in set(out.glob("*")) - before if d.is_dir()]
    return wall, run_dir


def call_stats(run_dir: Path) -> dict[str, float]:
    rows = [json.loads(line) for line in (run_dir / "cells.jsonl").read_text().splitlines()]
    sent = [r for r in rows if r["status"] == "ok" and not r["cached"]]
    aux = [c for r in rows for c in (r.get("aux_calls") or []) if not c.get("cached")]
    return {
        "cells": len(rows),
        "calls_sent": len(sent) + len(aux),
        "calls_s": sum(r["model_s"] for r in sent) + sum(c["latency_s"] for c in aux),
        "cached_rows": sum(1 for r in rows if r.get("cached")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench-sweep-cache"))
    parser.add_argument("--warm-only", action="store_true",
                        help="keep --out and its cache; run warm only (after a cold run)")
    args, sweep = parser.parse_known_args()
    sweep = sweep or DEFAULT_SWEEP
    if not args.warm_only:
        shutil.rmtree(args.out, ignore_errors=True)
    cache = args.out / "responses.sqlite"
    results = []
    for label in ("warm",) if args.warm_only else ("cold", "warm"):
        wall, run_dir = run(args.out / "runs", cache, sweep)
        results.append((label, wall, call_stats(run_dir)))
    cold_wall = results[0][1] if not args.warm_only else float("nan")
    print(f"sweep: pytest {' '.join(sweep)}")
    print(f"{'run':<6}{'wall s':>9}{'cells':>7}{'sent':>6}{'cached':>8}{'calls s':>9}"
          f"{'wall/calls':>12}{'wall/cold':>11}")
    for label, wall, stats in results:
        ratio = wall / stats["calls_s"] if stats["calls_s"] else float("nan")
        print(f"{label:<6}{wall:>9.1f}{stats['cells']:>7}{stats['calls_sent']:>6}"
              f"{stats['cached_rows']:>8}{stats['calls_s']:>9.1f}{ratio:>12.3f}"
              f"{wall / cold_wall:>11.3f}")


if __name__ == "__main__":
    main()
