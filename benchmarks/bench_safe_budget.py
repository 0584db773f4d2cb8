"""The budget search against the brute force it must equal: wall time and cells, cold and
warm, on the default task.

    .venv/bin/python benchmarks/bench_safe_budget.py [--repeats N] [--out DIR] [--hi HI]

Each repeat runs, in fresh processes through the real plugin (model-free, exact counts with
the default model's GGUF, the default task and strategies, 10 items):

- ``search``: ``--budgets=search:512..HI`` with retention >= 0.9 and violation rate <=
  0.05 (the search items, 64-token grid);
- ``brute``: ``--budgets=512,576,...,HI``, every budget of that grid as cells;

each once with its caches cold (a fresh out directory) and once again warm. It prints the
times, the cells each ran, the medians, the load average at the start, and checks that the
search's safe budgets are the brute force's (computed from the brute force's rows).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
from collections import defaultdict
from pathlib import Path

from bench_sweep_cache import run

FLOORS = ["--budgetbench-min-retention=0.9", "--budgetbench-max-violation-rate=0.05",
          "--budgetbench-model=none"]


def brute_answers(run_dir: Path, grid: list[int]) -> dict[str, int | None]:
    """Each strategy's smallest grid budget from which on every grid budget meets the
    floors, from the brute force's rows."""
    cells: dict[tuple[str, int], list[dict[str, object]]] = defaultdict(list)
    for line in (run_dir / "cells.jsonl").read_text().splitlines():
        row = json.loads(line)
        cells[(row["strategy"], row["budget"])].append(row)
    answers: dict[str, int | None] = {}
    for strategy in sorted({s for s, _ in cells}):
        answers[strategy] = None
        for budget in reversed(grid):
            rows = cells[(strategy, budget)]
            over = sum(r["status"] == "violation" for r in rows)
            kept = [float(r["evidence_retention"]) for r in rows  # type: ignore[arg-type]
                    if r["status"] == "ok" and r["evidence_retention"] is not None]
            if over / len(rows) > 0.05 or not kept or sum(kept) / len(kept) < 0.9:
                break
            answers[strategy] = budget
    return answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench-safe-budget"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hi", type=int, default=4096)
    args = parser.parse_args()
    grid = list(range(512, args.hi + 1, 64))
    sweeps = {"search": [f"--budgets=search:512..{args.hi}", *FLOORS],
              "brute": [f"--budgets={','.join(map(str, grid))}", "--budgetbench-model=none"]}
    load1, load5, _ = os.getloadavg()
    times: dict[tuple[str, str], list[float]] = {}
    cells: dict[str, int] = {}
    for repeat in range(args.repeats):
        runs: dict[str, Path] = {}
        for name, sweep in sweeps.items():
            out = args.out / f"{name}-{repeat}"
            shutil.rmtree(out, ignore_errors=True)
            for state in ("cold", "warm"):
                wall, run_dir, started = run(out / "runs", out / "responses.sqlite",
                                             [*sweep, "--budgetbench-report=off"])
                assert not started["server"], "a model-free sweep started the server"
                times.setdefault((name, state), []).append(wall)
                cells[name] = len((run_dir / "cells.jsonl").read_text().splitlines())
                runs[name] = run_dir
                print(f"{name:<8}{state:<6}{wall:>8.1f} s {cells[name]:>6} cells", flush=True)
        found = {r["strategy"]: r["safe_budget"] for r in map(json.loads, (
            runs["search"] / "safe_budgets.jsonl").read_text().splitlines())}
        expected = brute_answers(runs["brute"], grid)
        print(f"safe budgets: search {found}, brute force {expected}")
        assert found == expected, "the search differs from the brute force"
    print(f"cores {os.cpu_count()}, load average at start {load1:.2f} (1 min), "
          f"{load5:.2f} (5 min)")
    print(f"{'run':<8}{'cells':>6}{'state':>7}{'median s':>10}{'runs':>24}")
    for (name, state), walls in times.items():
        shown = ", ".join(f"{w:.1f}" for w in walls)
        print(f"{name:<8}{cells[name]:>6}{state:>7}{statistics.median(walls):>10.1f}{shown:>24}")


if __name__ == "__main__":
    main()
