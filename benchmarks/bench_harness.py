"""The harness's own cost: sweeps against a zero-latency fake endpoint, so every second
measured is overhead (pytest, strategies, exact token counting, HTTP, grading, records).

    .venv/bin/python benchmarks/bench_harness.py [--sections counting,per-cell,scaling]
        [--counting-items 1000,4000] [--strategies a,b] [--scale 10,100,1000] [--code DIR]

1. Counting (the goal of issue 15, item 3): ms per cell of truncation at 1,000 and 4,000
   items x 2 budgets, and the share of it spent in the token counter (every TokenCounter
   method, timed at the outermost call). Goal: counting is no longer the bulk of a cell,
   now that a prompt is counted from its messages' cached counts wherever the template
   was verified to allow it. ``--code DIR`` runs the sweeps on another checkout of the
   package (``git archive <rev> | tar -x -C DIR``), for a before/after table on one
   machine.
2. Overhead per cell by strategy: the marginal cost of a cell, from two sweeps of 10 and
   40 items at 2048 and 8192 tokens: (wall(40) - wall(10)) / (30 items x 2 budgets).
3. Wall time and peak memory (max RSS of the pytest process) against items, with
   full_context and truncation at two budgets, to show linear growth.

Token counts use the embedded model's GGUF tokenizer (exact), as a real sweep does. The
load average at start is printed: numbers taken beside other work are not comparable.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_budgetbench.embedded_server.models import embedded_gguf_path  # noqa: E402
from pytest_budgetbench.tokens.gguf import GGUFCounter  # noqa: E402
from tests.fake_openai import FakeOpenAI  # noqa: E402
from tests.fake_servers import CountsWith  # noqa: E402

STRATEGIES = ("full_context", "truncation", "rag", "lean_retrieval", "checkpoint_context",
              "compression", "summary_buffer")
SECTIONS = ("counting", "per-cell", "scaling")
# Runs pytest in-process after wrapping every public TokenCounter method with a timer that
# counts only the outermost call (count_messages calls count_message: counted once).
LAUNCHER = """\
import functools, resource, sys, time
import pytest
from pytest_budgetbench.tokens import base as budget

spent = [0.0]
depth = [0]

def timed(method):
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        if depth[0]:
            return method(*args, **kwargs)
        depth[0] += 1
        started = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - started
            depth[0] -= 1
    return wrapper

for name in ("count_messages", "count_message", "count_text", "overhead", "estimate",
             "additivity", "framing"):
    if hasattr(budget.TokenCounter, name):
        setattr(budget.TokenCounter, name, timed(getattr(budget.TokenCounter, name)))
code = pytest.main(sys.argv[1:])
print("MAXRSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
print("COUNTING_S", spent[0])
sys.exit(code)
"""


@dataclass(frozen=True)
class Sweep:
    wall_s: float
    counting_s: float
    peak_mib: float


def sweep(fake: FakeOpenAI, out: Path, items: int, strategies: str, code: Path) -> Sweep:
    """One sweep in a fresh process, on the package found under ``code``."""
    command = [
        sys.executable, "-c", LAUNCHER, "-q", "-p", "no:cacheprovider",
        "--budgets=2048,8192", "--budgetbench-only", f"--budgetbench-items={items}",
        f"--budgetbench-strategies={strategies}", f"--budgetbench-endpoint={fake.base_url}",
        f"--budgetbench-tokenizer=gguf:{embedded_gguf_path()}", f"--budgetbench-out={out}",
        "--budgetbench-report=off", "--budgetbench-cache=off", "--budgetbench-audit=hash",
    ]
    env = {**os.environ, "PYTHONPATH": str(code)}
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=code)
    wall = time.perf_counter() - started
    rss = re.search(r"MAXRSS_KB (\d+)", done.stdout)
    counting = re.search(r"COUNTING_S ([0-9.e+-]+)", done.stdout)
    if done.returncode not in (0, 1) or not rss or not counting:
        sys.exit(f"sweep failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
    return Sweep(wall, float(counting.group(1)), int(rss.group(1)) / 1024)


def counting_share(fake: FakeOpenAI, root: Path, sizes: list[int], code: Path) -> None:
    print(f"truncation x 2 budgets: ms per cell and the share spent counting ({code})")
    print(f"{'items':>7}{'cells':>7}{'wall s':>9}{'ms/cell':>9}{'count ms/cell':>15}"
          f"{'counting':>10}")
    for items in sizes:
        result = sweep(fake, root / f"count-{items}", items, "truncation", code)
        cells = items * 2
        print(f"{items:>7}{cells:>7}{result.wall_s:>9.1f}{result.wall_s / cells * 1000:>9.1f}"
              f"{result.counting_s / cells * 1000:>15.1f}"
              f"{result.counting_s / result.wall_s:>10.0%}", flush=True)


def per_cell(fake: FakeOpenAI, root: Path, strategies: list[str], code: Path) -> None:
    print("harness overhead per cell (zero-latency endpoint, exact GGUF counts)")
    print(f"{'strategy':<20}{'10 items s':>12}{'40 items s':>12}{'ms/cell':>10}"
          f"{'count ms/cell':>15}")
    for name in strategies:
        small = sweep(fake, root / f"{name}-10", 10, name, code)
        large = sweep(fake, root / f"{name}-40", 40, name, code)
        marginal = (large.wall_s - small.wall_s) / 60 * 1000
        counting = (large.counting_s - small.counting_s) / 60 * 1000
        print(f"{name:<20}{small.wall_s:>12.2f}{large.wall_s:>12.2f}{marginal:>10.1f}"
              f"{counting:>15.1f}", flush=True)


def scaling(fake: FakeOpenAI, root: Path, sizes: list[int], code: Path) -> None:
    print("\nwall time and peak memory against items (full_context,truncation x 2 budgets)")
    print(f"{'items':>7}{'cells':>7}{'wall s':>9}{'ms/cell':>9}{'peak MiB':>10}")
    for items in sizes:
        result = sweep(fake, root / f"scale-{items}", items, "full_context,truncation", code)
        cells = items * 4
        print(f"{items:>7}{cells:>7}{result.wall_s:>9.1f}{result.wall_s / cells * 1000:>9.1f}"
              f"{result.peak_mib:>10.0f}", flush=True)


def _ints(text: str) -> list[int]:
    return [int(n) for n in text.split(",") if n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--counting-items", default="1000,4000")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--scale", default="10,100,1000")
    parser.add_argument("--code", type=Path, default=ROOT,
                        help="a checkout whose pytest_budgetbench the sweeps run")
    args = parser.parse_args()
    sections = args.sections.split(",")
    code = args.code.resolve()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          f"({os.cpu_count()} cores)\n")
    fake = FakeOpenAI().start()
    # It reports the GGUF's counts: under its own chars/4 the exact counts would read as
    # prompts it cut, and every cell would be an error instead of a reply.
    fake.server = CountsWith(GGUFCounter(embedded_gguf_path()))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            if "counting" in sections:
                counting_share(fake, Path(tmp), _ints(args.counting_items), code)
            if "per-cell" in sections:
                per_cell(fake, Path(tmp), args.strategies.split(","), code)
            if "scaling" in sections:
                scaling(fake, Path(tmp), _ints(args.scale), code)
    finally:
        fake.stop()
        print(f"\nload average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
