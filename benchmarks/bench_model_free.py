"""The model-free sweep (``--budgetbench-model=none``): its wall time, counts cold and warm.

    .venv/bin/python benchmarks/bench_model_free.py [--repeats N] [--out DIR]

Runs two sweeps through the real plugin (``pytest --budgetbench-only`` in a fresh process,
in an empty project, exact counts with the default model's GGUF), each ``--repeats`` times:
once with a fresh out directory (the token-count and embedding caches cold) and once again
beside it (warm). It prints each time and the median per sweep and state, with the load
average at the start.

- ``default``: the README's sweep, the default task and strategies, ``--budgets=2048,8192``
  (60 cells);
- ``1000``: ``memory``, 50 items, 5 strategies, 4 budgets (1,000 cells).

Goals (issue 33): the 60 cells under 30 s and the 1,000 under 60 s on 2 cores, counting
included. Take the numbers on a quiet machine (load < 1): nothing else running.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
from pathlib import Path

from bench_sweep_cache import run

SWEEPS = {
    "default": ["--budgets=2048,8192"],
    "1000": ["--budgets=1024,2048,4096,8192", "--budgetbench-items=50",
             "--budgetbench-strategies=full_context,truncation,rag,lean_retrieval,"
             "checkpoint_context"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench-model-free"))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    load1, load5, _ = os.getloadavg()
    times: dict[tuple[str, str], list[float]] = {}
    cells: dict[str, int] = {}
    for name, sweep in SWEEPS.items():
        for repeat in range(args.repeats):
            out = args.out / f"{name}-{repeat}"
            shutil.rmtree(out, ignore_errors=True)
            for state in ("cold", "warm"):  # the second run finds the first one's caches
                wall, run_dir, started = run(out / "runs", out / "responses.sqlite",
                                             ["--budgetbench-model=none", *sweep])
                assert not started["server"], "a model-free sweep started the server"
                times.setdefault((name, state), []).append(wall)
                cells[name] = len((run_dir / "cells.jsonl").read_text().splitlines())
                print(f"{name:<8}{state:<6}{wall:>8.1f} s", flush=True)
    print(f"cores {os.cpu_count()}, load average at start {load1:.2f} (1 min), "
          f"{load5:.2f} (5 min)")
    print(f"{'sweep':<9}{'cells':>6}{'state':>7}{'median s':>10}{'runs':>24}")
    for (name, state), walls in times.items():
        runs = ", ".join(f"{w:.1f}" for w in walls)
        print(f"{name:<9}{cells[name]:>6}{state:>7}{statistics.median(walls):>10.1f}{runs:>24}")
    print("goals: default (60 cells) < 30 s, 1000 cells < 60 s, counting included")


if __name__ == "__main__":
    main()
