"""Sweeps against several replicas of one model: wall time against the physical limit.

    .venv/bin/python benchmarks/bench_replicas.py [--cells 400] [--latency 0.5]
        [--concurrency 16] [--replicas 1,2,4] [--tokenizer approx] [--code DIR]

Each replica is a fake OpenAI-compatible server (tests/fake_openai.py) on loopback, in a
process of its own, that answers every request after ``--latency`` seconds. A sweep of
``--cells`` truncation cells (one budget, so no two cells send the same prompt) runs
against the first 1, 2 and 4 of them with ``--budgetbench-concurrency=C`` (requests in
flight at each replica). No harness could finish sooner than the physical limit,
``cells x latency / (replicas x C)``; the table gives:

- ``sweep s``: the cells' phase, from the start of the first cell (its row's time less
  its strategy and model seconds) to the row of the last; the process's start, collection
  and exit are in ``process s``;
- ``ratio``: sweep s / limit (the goal: within 1.2 on a quiet machine);
- ``overhead ms/cell``: (sweep s - limit) / cells, the harness's serial share per cell;
- ``cpu ms/cell``: the pytest process's CPU time (user + system) per cell.

The load average at start and end is printed: numbers taken beside other work are not
comparable. ``--code DIR`` runs the sweeps on another checkout of the package (``git
archive <rev> | tar -x -C DIR``), for a before/after table on one machine; the fake
replicas are always this checkout's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SERVE = """\
import sys, time
from tests.fake_openai import FakeOpenAI
server = FakeOpenAI()
# Keep-alive, as vLLM and llama.cpp serve: a new connection per request is not the harness's
# cost. Without Nagle: the handler writes headers and body apart, and Nagle's algorithm with
# the client's delayed ACK would hold each reply 40 ms on a kept-alive connection.
handler = server._server.RequestHandlerClass
handler.protocol_version = "HTTP/1.1"
handler.disable_nagle_algorithm = True
server.start()
server.latency_s = float(sys.argv[1])
print(server.base_url, flush=True)
sys.stdin.read()  # serve until the benchmark closes our stdin
"""


@dataclass(frozen=True)
class Sweep:
    process_s: float
    sweep_s: float
    cpu_s: float
    rows: int
    statuses: dict[str, int]


def start_replicas(count: int, latency: float) -> list[tuple[subprocess.Popen[str], str]]:
    """``count`` fake replicas, each in its own process (one process's GIL would be
    shared by every replica's requests), with their URLs."""
    replicas = []
    for _ in range(count):
        process = subprocess.Popen([sys.executable, "-c", SERVE, str(latency)], cwd=ROOT,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                   env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert process.stdout is not None
        replicas.append((process, process.stdout.readline().strip()))
    return replicas


def sweep(urls: list[str], out: Path, cells: int, concurrency: int, tokenizer: str,
          code: Path) -> Sweep:
    command = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--budgets=4096",
        "--budgetbench-only", f"--budgetbench-items={cells}",
        "--budgetbench-strategies=truncation", f"--budgetbench-endpoint={','.join(urls)}",
        f"--budgetbench-concurrency={concurrency}", f"--budgetbench-tokenizer={tokenizer}",
        f"--budgetbench-out={out}", "--budgetbench-report=off", "--budgetbench-cache=off",
        "--budgetbench-audit=hash", "--budgetbench-progress=0",
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    # Run outside the checkout: its rootdir would collect the project's own tests too.
    done = subprocess.run(command, capture_output=True, text=True, cwd=out.parent,
                          env={**os.environ, "PYTHONPATH": str(code)})
    process_s = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    (run_dir,) = [d for d in out.iterdir() if d.is_dir()]
    rows = [json.loads(line) for line in (run_dir / "cells.jsonl").read_text().splitlines()]
    if done.returncode not in (0, 1) or not rows:
        sys.exit(f"sweep failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
    first = min(r["time"] - (r["model_s"] or 0) - (r["strategy_s"] or 0) for r in rows)
    statuses: dict[str, int] = {}
    for row in rows:
        statuses[row["status"]] = statuses.get(row["status"], 0) + 1
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Sweep(process_s, max(r["time"] for r in rows) - first, cpu, len(rows), statuses)


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=400)
    parser.add_argument("--latency", type=float, default=0.5)
    parser.add_argument("--concurrency", type=int, default=16,
                        help="requests in flight at each replica")
    parser.add_argument("--replicas", default="1,2,4")
    parser.add_argument("--tokenizer", default="approx")
    parser.add_argument("--code", type=Path, default=ROOT,
                        help="a checkout whose pytest_budgetbench the sweeps run")
    args = parser.parse_args()
    counts = [int(n) for n in args.replicas.split(",")]
    print(f"load average at start: {load()} ({os.cpu_count()} cores)")
    print(f"{args.cells} truncation cells, {args.latency:g} s latency per request, "
          f"--budgetbench-concurrency={args.concurrency} per replica, tokenizer "
          f"{args.tokenizer}, code {args.code.resolve()}\n")
    print(f"{'replicas':>8}{'in flight':>10}{'limit s':>9}{'sweep s':>9}{'ratio':>7}"
          f"{'overhead ms/cell':>18}{'cpu ms/cell':>13}{'process s':>11}  statuses")
    replicas = start_replicas(max(counts), args.latency)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for count in counts:
                in_flight = count * args.concurrency
                limit = args.cells * args.latency / in_flight
                result = sweep([url for _, url in replicas[:count]], Path(tmp) / str(count),
                               args.cells, args.concurrency, args.tokenizer,
                               args.code.resolve())
                overhead = (result.sweep_s - limit) / args.cells * 1000
                print(f"{count:>8}{in_flight:>10}{limit:>9.2f}{result.sweep_s:>9.2f}"
                      f"{result.sweep_s / limit:>7.2f}{overhead:>18.1f}"
                      f"{result.cpu_s / args.cells * 1000:>13.1f}{result.process_s:>11.1f}"
                      f"  {result.statuses}", flush=True)
    finally:
        for process, _ in replicas:
            assert process.stdin is not None
            process.stdin.close()
            process.wait(10)
        print(f"\nload average at end: {load()}")


if __name__ == "__main__":
    main()
