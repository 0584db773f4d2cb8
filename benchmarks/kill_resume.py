"""Kill a sweep with SIGKILL mid-episode, resume it, and check one row per cell.

    python benchmarks/kill_resume.py --out reports-kill -- \
        pytest --budgets=4096,8192 --budgetbench-tasks=bfcl_multi_turn_long_context \
               --budgetbench-items=5 --budgetbench-only

The sweep runs with ``--budgetbench-out=OUT``; once its cells file holds ``--after-rows``
rows and then either ``--grace`` more seconds have passed or, with ``--after-calls``, the
embedded server has answered that many more chat requests (an episode under way, some of
its calls done), the whole process group gets SIGKILL. The same command then runs again with
``--budgetbench-resume=latest`` to the end. Prints what each phase left and whether every
cell has exactly one row (the run's collected cell count is read from ``pytest --co``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def rows_of(out: Path) -> list[dict]:
    files = sorted(out.glob("*/cells.jsonl"))
    if not files:
        return []
    rows = []
    for line in files[-1].read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue  # a torn last line: the reader skips it too
    return rows


def chat_posts(out: Path) -> int:
    """Chat requests the run's embedded server has logged."""
    logs = sorted(out.glob("*/server.log"))
    if not logs:
        return 0
    return logs[-1].read_text(errors="replace").count("POST /v1/chat/completions")


def collected_cells(command: list[str]) -> int:
    listing = subprocess.run([*command, "--co", "-q"], capture_output=True, text=True,
                             timeout=600)
    return sum(1 for line in listing.stdout.splitlines() if "::cell[" in line)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--after-rows", type=int, default=1)
    parser.add_argument("--grace", type=float, default=20.0)
    parser.add_argument("--after-calls", type=int, default=None)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = [part for part in args.command if part != "--"]
    command = [*command, f"--budgetbench-out={args.out}"]
    expected = collected_cells(command)
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    reached: float | None = None
    posts = 0
    while process.poll() is None:
        if reached is None and len(rows_of(args.out)) >= args.after_rows:
            reached, posts = time.monotonic(), chat_posts(args.out)
        if reached is not None and (
                chat_posts(args.out) >= posts + args.after_calls if args.after_calls
                else time.monotonic() - reached >= args.grace):
            os.killpg(process.pid, signal.SIGKILL)  # the embedded server goes too
            break
        time.sleep(0.2)
    process.wait()
    killed_rows = rows_of(args.out)
    print(f"phase 1: {'SIGKILL' if reached else 'ended'} after {time.monotonic() - started:.0f} s"
          f" with {len(killed_rows)} rows of {expected} cells, {chat_posts(args.out)} chat "
          "requests answered or in flight")
    # The run by its directory: "latest" only takes a run that recorded a row, and a kill
    # during a sweep's first episode leaves none.
    runs = sorted(path.parent for path in args.out.glob("*/run.json"))
    target = runs[-1] if runs else "latest"
    resumed = subprocess.run([*command, f"--budgetbench-resume={target}"], capture_output=True,
                             text=True)
    rows = rows_of(args.out)
    ids = [row["cell_id"] for row in rows]
    print(f"phase 2: exit {resumed.returncode} after {time.monotonic() - started:.0f} s in all;"
          f" {len(rows)} rows, {len(set(ids))} distinct cells of {expected}")
    episodes = {}
    for path in args.out.glob("*/episodes.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            episodes[record["cell_id"]] = [call.get("cached") for call in record["calls"]]
    for row in rows:
        print(f"  {row['cell_id']}: {row['status']} calls={row.get('calls')} "
              f"call_tokens={row.get('call_tokens')} quality={row.get('quality')} "
              f"cached per call={episodes.get(row['cell_id'])}")
    tail = (resumed.stdout + resumed.stderr).strip().splitlines()[-25:]
    print("\n".join(tail))
    return 0 if len(rows) == len(set(ids)) == expected else 1


if __name__ == "__main__":
    sys.exit(main())
