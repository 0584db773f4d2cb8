"""The harness's own cost: sweeps against a zero-latency fake endpoint, so every second
measured is overhead (pytest, strategies, exact token counting, HTTP, grading, records).

    .venv/bin/python benchmarks/bench_harness.py [--strategies a,b] [--scale 10,100,1000]

1. Overhead per cell by strategy: the marginal cost of a cell, from two sweeps of 10 and
   40 items at 2048 and 8192 tokens: (wall(40) - wall(10)) / (30 items x 2 budgets).
2. Wall time and peak memory (max RSS of the pytest process) against items, with
   full_context and truncation at two budgets, to show linear growth.

Token counts use the embedded model's GGUF tokenizer (exact), as a real sweep does.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_budgetbench.model import embedded_gguf_path
from tests.fake_openai import FakeOpenAI

STRATEGIES = ("full_context", "truncation", "rag", "lean_retrieval", "checkpoint_context",
              "compression", "summary_buffer")
LAUNCHER = (
    "import resource, sys, pytest\n"
    "code = pytest.main(sys.argv[1:])\n"
    "print('MAXRSS_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    "sys.exit(code)\n"
)


def sweep(fake: FakeOpenAI, out: Path, items: int, strategies: str) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one sweep in a fresh process."""
    command = [
        sys.executable, "-c", LAUNCHER, "-q", "-p", "no:cacheprovider",
        "--budgets=2048,8192", "--budgetbench-only", f"--budgetbench-items={items}",
        f"--budgetbench-strategies={strategies}", f"--budgetbench-endpoint={fake.base_url}",
        f"--budgetbench-tokenizer=gguf:{embedded_gguf_path()}", f"--budgetbench-out={out}",
        "--budgetbench-report=off", "--budgetbench-cache=off", "--budgetbench-audit=hash",
    ]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - started
    found = re.search(r"MAXRSS_KB (\d+)", done.stdout)
    if done.returncode not in (0, 1) or not found:
        sys.exit(f"sweep failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
    return wall, int(found.group(1)) / 1024


def per_cell(fake: FakeOpenAI, root: Path, strategies: list[str]) -> None:
    print("harness overhead per cell (zero-latency endpoint, exact GGUF counts)")
    print(f"{'strategy':<20}{'10 items s':>12}{'40 items s':>12}{'ms/cell':>10}")
    for name in strategies:
        small, _ = sweep(fake, root / f"{name}-10", 10, name)
        large, _ = sweep(fake, root / f"{name}-40", 40, name)
        print(f"{name:<20}{small:>12.2f}{large:>12.2f}{(large - small) / 60 * 1000:>10.1f}")


def scaling(fake: FakeOpenAI, root: Path, sizes: list[int]) -> None:
    print("\nwall time and peak memory against items (full_context,truncation x 2 budgets)")
    print(f"{'items':>7}{'cells':>7}{'wall s':>9}{'ms/cell':>9}{'peak MiB':>10}")
    for items in sizes:
        wall, rss = sweep(fake, root / f"scale-{items}", items, "full_context,truncation")
        cells = items * 4
        print(f"{items:>7}{cells:>7}{wall:>9.1f}{wall / cells * 1000:>9.1f}{rss:>10.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--scale", default="10,100,1000")
    parser.add_argument("--skip-per-cell", action="store_true")
    args = parser.parse_args()
    fake = FakeOpenAI().start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            if not args.skip_per_cell:
                per_cell(fake, Path(tmp), args.strategies.split(","))
            scaling(fake, Path(tmp), [int(n) for n in args.scale.split(",")])
    finally:
        fake.stop()


if __name__ == "__main__":
    main()
