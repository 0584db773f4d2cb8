"""The fault-injection suite's scenarios: real sweeps, in a pytest subprocess, against the
fake OpenAI-compatible server, with faults injected and processes killed.

Each scenario returns a :class:`FaultTally`. ``tests/test_faults.py`` asserts on them, and
``benchmarks/fault_suite.py`` prints them as a table. What must be zero, always: rows lost
(a cell with no row), duplicate rows (a cell with two final rows) and graded failures (an
``ok`` row whose prediction is not what the endpoint really answered for that prompt).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.fake_openai import FakeOpenAI, reading_responder

STRATEGIES = ("full_context", "truncation", "crashy")
BUDGETS = (512, 8192)
FAULT_KINDS = ("500", "429", "timeout", "malformed", "none", "null", "drop")
FINAL = ("ok", "violation")

CRASHY_STRATEGY = '''
from pytest_budgetbench.strategies import Strategy


class Crashy(Strategy):
    """Truncates to the last two messages, and crashes on every third item."""

    name = "crashy"

    def apply(self, messages, budget):
        if self.context.item_id.endswith(("0002", "0005", "0008")):
            raise RuntimeError("injected strategy crash")
        return list(messages[:1]) + list(messages[-2:])
'''


@dataclass
class FaultTally:
    scenario: str
    faults_injected: int
    cells: int
    completed: int
    errored: int
    rows_lost: int
    duplicate_rows: int
    graded_failures: int
    exit_code: int
    wall_s: float

    @property
    def clean(self) -> bool:
        return self.rows_lost == self.duplicate_rows == self.graded_failures == 0


def expected_cells(items: int, strategies: Sequence[str] = STRATEGIES,
                   budgets: Sequence[int] = BUDGETS) -> set[str]:
    return {f"memory-{i:04d}-{s}-{b}" for i in range(items) for s in strategies for b in budgets}


def sweep_command(fake_url: str, out: Path, items: int, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
        "--budgets=" + ",".join(map(str, BUDGETS)),
        "--budgetbench-strategies=" + ",".join(
            "crashy_strategy:Crashy" if s == "crashy" else s for s in STRATEGIES),
        f"--budgetbench-items={items}",
        f"--budgetbench-endpoint={fake_url}",
        "--budgetbench-tokenizer=approx",
        f"--budgetbench-out={out}",
        "--budgetbench-report=off",
        "--budgetbench-memory-history=600",
        *extra,
    ]


def prepare(workdir: Path) -> Path:
    """A directory with the crashing strategy importable, to run sweeps in."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "crashy_strategy.py").write_text(CRASHY_STRATEGY)
    return workdir


def _env(workdir: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(workdir), *sys.path])}


def run_sweep(workdir: Path, command: list[str], timeout: float = 300) -> int:
    done = subprocess.run(command, cwd=workdir, env=_env(workdir), capture_output=True,
                          text=True, timeout=timeout)
    (workdir / "last-output.txt").write_text(done.stdout + done.stderr)
    return done.returncode


def kill_after_rows(workdir: Path, command: list[str], out: Path, rows: int) -> None:
    """Start a sweep and SIGKILL it once its run's cells file holds ``rows`` rows."""
    process = subprocess.Popen(command, cwd=workdir, env=_env(workdir),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            cells_file = _cells_file(out)
            if cells_file and cells_file.read_bytes().count(b"\n") >= rows:
                break
            time.sleep(0.005)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()


def run_dir_of(out: Path) -> Path:
    (run_dir,) = [d for d in out.iterdir() if d.is_dir()]
    return run_dir


def tally(scenario: str, faults_injected: int, run_dir: Path | None, expected: set[str],
          exit_code: int, wall_s: float) -> FaultTally:
    rows = _rows(run_dir / "cells.jsonl") if run_dir else []
    prompts = _prompts(run_dir / "prompts.jsonl") if run_dir else {}
    final = Counter(r["cell_id"] for r in rows if r["status"] in FINAL)
    recorded = {r["cell_id"] for r in rows}
    last_status = {r["cell_id"]: r["status"] for r in rows}
    graded_wrongly = [
        r for r in rows if r["status"] == "ok"
        and r["prediction"] != reading_responder(prompts.get(r["cell_id"], []))
    ]
    return FaultTally(
        scenario=scenario,
        faults_injected=faults_injected,
        cells=len(expected),
        completed=len(final),
        errored=sum(1 for status in last_status.values() if status == "error"),
        rows_lost=len(expected - recorded) if run_dir else 0,
        duplicate_rows=sum(count - 1 for count in final.values()),
        graded_failures=len(graded_wrongly),
        exit_code=exit_code,
        wall_s=round(wall_s, 2),
    )


def _rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_bytes().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue  # a torn last line from a kill; the reader skips it the same way
    return rows


def _prompts(path: Path) -> dict[str, list[dict]]:
    return {p["cell_id"]: p["messages"] for p in _rows(path) if "messages" in p}


# -- scenarios ---------------------------------------------------------------------------
def transient_faults(workdir: Path, items: int = 6, rate: float = 0.3) -> list[FaultTally]:
    """Random faults of every kind; then a resume, with the endpoint healthy, reruns the
    cells that errored."""
    fake = FakeOpenAI().start()
    try:
        fake.timeout_s = 1.0
        fake.inject(rate, FAULT_KINDS, seed=7)
        out = prepare(workdir) / "out"
        command = sweep_command(fake.base_url, out, items, "--budgetbench-retries=4",
                                "--budgetbench-timeout=0.5")
        started = time.monotonic()
        code = run_sweep(workdir, command)
        first = tally("faults injected", len(fake.injected), run_dir_of(out),
                      expected_cells(items), code,
                      time.monotonic() - started)
        fake.inject(0.0, FAULT_KINDS)
        started = time.monotonic()
        code = run_sweep(workdir, [*command, "--budgetbench-resume=latest"])
        resumed = tally("faults, then resume", len(fake.injected), run_dir_of(out),
                        expected_cells(items),
                        code, time.monotonic() - started)
        return [first, resumed]
    finally:
        fake.stop()


def kill_and_resume(workdir: Path, items: int = 6, kill_at: Sequence[int] = (1, 9, 17)
                    ) -> FaultTally:
    """SIGKILL the sweep at several points, resuming each time, then let it finish."""
    fake = FakeOpenAI().start()
    try:
        fake.latency_s = 0.02
        out = prepare(workdir) / "out"
        command = sweep_command(fake.base_url, out, items)
        started = time.monotonic()
        kill_after_rows(workdir, command, out, kill_at[0])
        for rows in kill_at[1:]:
            kill_after_rows(workdir, [*command, "--budgetbench-resume=latest"], out, rows)
        code = run_sweep(workdir, [*command, "--budgetbench-resume=latest"])
        return tally(f"SIGKILL x{len(kill_at)}, resume", len(fake.injected), run_dir_of(out),
                     expected_cells(items), code, time.monotonic() - started)
    finally:
        fake.stop()


def _cells_file(out: Path) -> Path | None:
    """The cells file of the single run in ``out``, once it exists."""
    runs = [d for d in out.iterdir() if d.is_dir()] if out.exists() else []
    return next((r / "cells.jsonl" for r in runs if (r / "cells.jsonl").exists()), None)


def under_xdist(workdir: Path, items: int = 6, rate: float = 0.2) -> FaultTally:
    """Two xdist workers share the run, its records and its response cache."""
    fake = FakeOpenAI().start()
    try:
        fake.inject(rate, ("500", "429", "drop"), seed=3)
        out = prepare(workdir) / "out"
        command = sweep_command(fake.base_url, out, items, "-n", "2", "--budgetbench-retries=5")
        started = time.monotonic()
        code = run_sweep(workdir, command)
        return tally("xdist -n 2, faults", len(fake.injected), run_dir_of(out),
                     expected_cells(items), code,
                     time.monotonic() - started)
    finally:
        fake.stop()


def endpoint_down(workdir: Path) -> tuple[FaultTally, str]:
    """No server at the endpoint: one clear error before any cell runs."""
    from pytest_budgetbench.model import free_port

    out = prepare(workdir) / "out"
    started = time.monotonic()
    code = run_sweep(workdir, sweep_command(f"http://127.0.0.1:{free_port()}/v1", out, 2))
    runs = [d for d in out.iterdir() if d.is_dir()] if out.exists() else []
    result = tally("endpoint down at start", 1, runs[0] if runs else None, set(), code,
                   time.monotonic() - started)
    return result, (workdir / "last-output.txt").read_text()


def malformed_dataset(workdir: Path) -> tuple[FaultTally, str]:
    """A dataset file with a broken line: one clear error naming it, nothing run."""
    fake = FakeOpenAI().start()
    try:
        data = prepare(workdir) / "hotpot.jsonl"
        good = {"_id": "a1", "question": "Q?", "answer": "A", "type": "bridge",
                "level": "easy", "supporting_facts": [], "context": [["T", ["Text."]]]}
        data.write_text(json.dumps(good) + "\n" + '{"_id": "a2", "question": \n')
        out = workdir / "out"
        command = [*sweep_command(fake.base_url, out, 2), "--budgetbench-tasks=hotpotqa",
                   f"--budgetbench-data-hotpotqa={data}"]
        started = time.monotonic()
        code = run_sweep(workdir, command)
        runs = [d for d in out.iterdir() if d.is_dir()] if out.exists() else []
        result = tally("malformed dataset line", 1, runs[0] if runs else None, set(), code,
                       time.monotonic() - started)
        return result, (workdir / "last-output.txt").read_text()
    finally:
        fake.stop()


def all_scenarios(root: Path) -> list[FaultTally]:
    return [
        *transient_faults(root / "transient"),
        kill_and_resume(root / "kill"),
        under_xdist(root / "xdist"),
        endpoint_down(root / "down")[0],
        malformed_dataset(root / "dataset")[0],
    ]
