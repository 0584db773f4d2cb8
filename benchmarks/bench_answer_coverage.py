"""How much ``answer_kept`` can see: per task and category, the share of items whose gold
answer (normalised as the task's grader normalises it) occurs in the item's evidence, and
the share where it occurs in the history only inside the evidence (unique).

    .venv/bin/python benchmarks/bench_answer_coverage.py [--data DIR]

Reads the built-in generated tasks (memory, needle: 50 and 30 items) and the official
files under ``--data`` (default ``../shared/data``, read by path, never copied): LoCoMo,
LongMemEval oracle and S, HotpotQA. A task whose file is missing is left out with a line.
An item counts in ``in evidence`` when :func:`pytest_budgetbench.engine.answers.watch`
watches it (the row's ``answer_kept`` is then a value, not null), and in ``unique`` when its
watch is unique. The docs' coverage table (docs/reports.md) is this script's output.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

from pytest_budgetbench.engine.answers import watch
from pytest_budgetbench.tasks import Task, TaskOptions
from pytest_budgetbench.tasks.hotpotqa import HotpotQATask
from pytest_budgetbench.tasks.locomo import LoCoMoTask
from pytest_budgetbench.tasks.longmemeval import LongMemEvalTask
from pytest_budgetbench.tasks.memory import MemoryTask
from pytest_budgetbench.tasks.needle import NeedleTask

ROOT = Path(__file__).resolve().parent.parent


def tasks(data: Path) -> list[tuple[str, Task]]:
    """(label, task) of every task measured; official files by path under ``data``."""
    found: list[tuple[str, Task]] = [("memory", MemoryTask(TaskOptions(items=50))),
                                     ("needle", NeedleTask(TaskOptions(items=30)))]
    files = [("locomo", LoCoMoTask, "locomo/locomo_conv26_conv30.json"),
             ("longmemeval oracle", LongMemEvalTask,
              "longmemeval/longmemeval_oracle_subset60.json"),
             ("longmemeval S", LongMemEvalTask, "longmemeval/longmemeval_s_subset6.json"),
             ("hotpotqa", HotpotQATask, "hotpotqa/hotpot_dev_distractor_first30.json")]
    for label, cls, name in files:
        path = data / name
        if path.exists():
            found.append((label, cls(TaskOptions(data_path=path))))
        else:
            print(f"{label}: left out ({path} not found)")
    return found


def coverage(task: Task) -> dict[str, list[int]]:
    """Per category (and "all"): [items, answer in evidence, unique to it]."""
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for item in task.load():
        found = watch(task.gold_answers(item), item)
        for key in (item.category, "all"):
            counts[key][0] += 1
            counts[key][1] += found is not None
            counts[key][2] += found is not None and found.unique
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    args = parser.parse_args()
    print(f"{'task':<20}{'category':<28}{'items':>6}{'in evidence':>13}{'unique':>9}")
    for label, task in tasks(args.data):
        started = time.perf_counter()
        counts = coverage(task)
        for category in sorted(counts, key=lambda c: (c == "all", c)):
            n, held, unique = counts[category]
            print(f"{label:<20}{category:<28}{n:>6}{held / n:>12.0%} {unique / n:>8.0%}"
                  f"  ({held}, {unique})")
        print(f"{'':<20}({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
