"""A sweep on the embedded model, cold and then with a warm response cache.

    .venv/bin/python benchmarks/bench_sweep_cache.py [--out DIR] [pytest sweep options...]

Runs the sweep (default: the main job, ``--budgets=2048,8192``) through the real plugin,
``pytest --budgetbench-only`` in a subprocess, twice with a fresh cache file, and prints,
for each run: wall time, cells, model calls actually sent, the summed latency of those
calls, and whether the run started the embedded server (its "Starting the embedded
model" line) and loaded the embedding model (sentence-transformers or onnxruntime
imported by the end of the pytest process; without xdist that process runs every cell).

Goals (issue 15): the cold run's wall time over the summed time of its unique model calls
(strategy auxiliary calls included) at most 1.05 (the physical limit of a sweep is that
sum, so 1.0 would be no overhead at all); the warm rerun at most 2% of the cold run, and
starting neither the server nor the embedding model. The table's first line gives the
load average at start: take the numbers on a quiet machine (load < 1).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_SWEEP = ["--budgets=2048,8192"]
LOADED_MARK = "BENCH_LOADED"
LAUNCHER = (
    "import json, sys, pytest\n"
    "code = pytest.main(sys.argv[1:])\n"
    f"print({LOADED_MARK!r}, json.dumps([m for m in ('sentence_transformers', 'onnxruntime')"
    " if m in sys.modules]))\n"
    "sys.exit(code)\n"
)
STARTING_LINE = "Starting the embedded model"
REPO = Path(__file__).resolve().parents[1]


def project(out: Path) -> Path:
    """An empty project to run the sweep in, as a user's would be: run from this checkout,
    pytest would also collect (and import) the project's own test suite."""
    directory = out / "project"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "pytest.ini").write_text("[pytest]\n")
    return directory


def run(out: Path, cache: Path, sweep: list[str]) -> tuple[float, Path, dict[str, bool]]:
    """One sweep through pytest in a fresh process: its wall time, run directory, and what
    it started."""
    before = set(out.glob("*")) if out.exists() else set()
    command = [sys.executable, "-c", LAUNCHER, "-q", "-p", "no:cacheprovider", *sweep,
               "--budgetbench-only", f"--budgetbench-out={out}",
               f"--budgetbench-cache-path={cache}"]
    # This checkout's code, whatever is installed.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env,
                          cwd=project(out.parent))
    wall = time.perf_counter() - started
    if done.returncode not in (0, 1):
        sys.exit(f"sweep failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
    (run_dir,) = [d for d in set(out.glob("*")) - before if d.is_dir()]
    loaded = next((json.loads(line.split(" ", 1)[1]) for line in done.stdout.splitlines()
                   if line.startswith(LOADED_MARK)), [])
    return wall, run_dir, {"server": STARTING_LINE in done.stdout, "embedder": bool(loaded)}


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
    load1, load5, _ = os.getloadavg()
    for label in ("warm",) if args.warm_only else ("cold", "warm"):
        wall, run_dir, started = run(args.out / "runs", cache, sweep)
        results.append((label, wall, call_stats(run_dir), started))
    cold_wall = results[0][1] if not args.warm_only else float("nan")
    print(f"sweep: pytest {' '.join(sweep)}")
    print(f"cores {os.cpu_count()}, load average at start {load1:.2f} (1 min), "
          f"{load5:.2f} (5 min)")
    print(f"{'run':<6}{'wall s':>9}{'cells':>7}{'sent':>6}{'cached':>8}{'calls s':>9}"
          f"{'wall/calls':>12}{'wall/cold':>11}{'server':>8}{'embedder':>10}")
    for label, wall, stats, started in results:
        ratio = wall / stats["calls_s"] if stats["calls_s"] else float("nan")
        print(f"{label:<6}{wall:>9.1f}{stats['cells']:>7}{stats['calls_sent']:>6}"
              f"{stats['cached_rows']:>8}{stats['calls_s']:>9.1f}{ratio:>12.3f}"
              f"{wall / cold_wall:>11.3f}{_yes(started['server']):>8}"
              f"{_yes(started['embedder']):>10}")
    print("goals: cold wall/calls <= 1.05; warm wall/cold <= 0.02, starting no server and "
          "no embedder")


def _yes(flag: bool) -> str:
    return "started" if flag else "-"


if __name__ == "__main__":
    main()
