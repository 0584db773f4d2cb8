"""The fault-injection suite's scenarios: real sweeps, in a pytest subprocess, against the
fake OpenAI-compatible server, with faults injected and processes killed.

Each scenario returns a :class:`FaultTally`. ``tests/test_faults.py`` asserts on them, and
``benchmarks/fault_suite.py`` prints them as a table. What must be zero, always: rows lost
(a cell with no row), duplicate rows (a cell with two final rows), graded failures (an
``ok`` row whose prediction is not what the endpoint really answered for that prompt) and
secret hits (a planted API key, URL password or URL query value found in any artifact:
the run directory, the report, stdout/stderr, the JUnit XML). Every sweep runs with a
planted ``OPENAI_API_KEY``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.fake_openai import FakeOpenAI, agent_responder, reading_responder

STRATEGIES = ("full_context", "truncation", "crashy")
BUDGETS = (512, 8192)
FAULT_KINDS = ("500", "429", "timeout", "malformed", "none", "null", "drop")
FINAL = ("ok", "violation")
PLANTED_KEY = "sk-plantedFAULTSUITEkey0123456789"
PLANTED_PASSWORD = "pw-plantedFAULTSUITE-42"
PLANTED_QUERY = "qs-plantedFAULTSUITE-77"
# httpx turns URL user info into a Basic header, which an echoing server sends back.
PLANTED_BASIC = base64.b64encode(f"bob:{PLANTED_PASSWORD}".encode()).decode()
PLANTED = (PLANTED_KEY, PLANTED_PASSWORD, PLANTED_QUERY, PLANTED_BASIC)
RETRY_AFTER_EXTREMES = ("429:inf", "429:1e400", "429:3600", "429:-5", "429:garbage",
                        "429:Fri, 01 Jan 9999 00:00:00 GMT", "429:Wed, 21 Oct 2015 07:28:00 GMT")

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
    secret_hits: int = 0
    changed: int = 0
    """Files the scenario only reads (a merge's sources) or must leave alone (a refused
    resume's rows and run.json) whose bytes changed."""

    @property
    def clean(self) -> bool:
        return (self.rows_lost == self.duplicate_rows == self.graded_failures
                == self.secret_hits == self.changed == 0)


def expected_cells(items: int, strategies: Sequence[str] = STRATEGIES,
                   budgets: Sequence[int] = BUDGETS) -> set[str]:
    return {f"memory-{i:04d}-{s}-{b}" for i in range(items) for s in strategies for b in budgets}


def sweep_command(fake_url: str, out: Path, items: int, *extra: str,
                  budgets: Sequence[int] = BUDGETS) -> list[str]:
    return [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
        "--budgets=" + ",".join(map(str, budgets)),
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
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(workdir), *sys.path]),
            "OPENAI_API_KEY": PLANTED_KEY}


def secret_hits(workdir: Path, secrets: Iterable[str] = PLANTED) -> int:
    """Occurrences of the planted secrets in every file under ``workdir`` (run directories,
    reports, the JUnit XML, the sweeps' saved stdout/stderr)."""
    needles = [secret.encode() for secret in secrets]
    hits = 0
    for path in workdir.rglob("*"):
        if path.is_file() and path.stat().st_size < 64 * 2**20:
            data = path.read_bytes()
            hits += sum(data.count(needle) for needle in needles)
    return hits


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


def only_run(out: Path) -> Path | None:
    """The one run directory in ``out``, or None where the sweep stopped before writing."""
    runs = [d for d in out.iterdir() if d.is_dir()] if out.exists() else []
    return runs[0] if runs else None


def run_dir_of(out: Path) -> Path:
    (run_dir,) = [d for d in out.iterdir() if d.is_dir()]
    return run_dir


def tally(scenario: str, faults_injected: int, run_dir: Path | None, expected: set[str],
          exit_code: int, wall_s: float, *, secrets_in: Path | None = None,
          graded: bool = True) -> FaultTally:
    """The scenario's counts from its run directory. ``graded``: check each ok row's
    prediction against what the reading fake answers (single-call cells of the memory
    task; an agent episode's answer is its last reply, checked by the episode's own
    tests)."""
    rows = _rows(run_dir / "cells.jsonl") if run_dir else []
    prompts = _prompts(run_dir / "prompts.jsonl") if run_dir else {}
    final = Counter(r["cell_id"] for r in rows if r["status"] in FINAL)
    recorded = {r["cell_id"] for r in rows}
    last_status = {r["cell_id"]: r["status"] for r in rows}
    graded_wrongly = [
        r for r in rows if graded and r["status"] == "ok"
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
        secret_hits=secret_hits(secrets_in) if secrets_in else 0,
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
                      time.monotonic() - started, secrets_in=workdir)
        fake.inject(0.0, FAULT_KINDS)
        started = time.monotonic()
        code = run_sweep(workdir, [*command, "--budgetbench-resume=latest"])
        resumed = tally("faults, then resume", len(fake.injected), run_dir_of(out),
                        expected_cells(items),
                        code, time.monotonic() - started, secrets_in=workdir)
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
                     expected_cells(items), code, time.monotonic() - started,
                     secrets_in=workdir)
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
        # Enough attempts that no request exhausts them (0.2^10 = 1e-7 a request): the
        # injection's order depends on how the workers interleave, and with 5 attempts
        # (0.2^5 = 3e-4 a request) a run erred a cell this scenario does not expect.
        command = sweep_command(fake.base_url, out, items, "-n", "2", "--budgetbench-retries=10")
        started = time.monotonic()
        code = run_sweep(workdir, command)
        return tally("xdist -n 2, faults", len(fake.injected), run_dir_of(out),
                     expected_cells(items), code,
                     time.monotonic() - started, secrets_in=workdir)
    finally:
        fake.stop()


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux's /proc): xdist's workers."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, dead but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _row_count(out: Path) -> int:
    cells = _cells_file(out)
    return cells.read_bytes().count(b"\n") if cells else 0


def sigterm_under_xdist(workdir: Path, items: int = 4) -> tuple[int, int, FaultTally]:
    """SIGTERM the controller of ``-n 2`` while its workers wait on slow model calls (3 s
    each, less than the 5 s execnet gives a worker whose controller went away). Workers
    used to finish their call and append its row after the controller had exited.
    Returns the rows when the controller exited, the rows once every worker is gone, and
    the tally of an immediate resume (a healthy endpoint)."""
    fake = FakeOpenAI().start()
    try:
        fake.latency_s = 3.0
        out = prepare(workdir) / "out"
        command = sweep_command(fake.base_url, out, items, "-n", "2")
        process = subprocess.Popen(command, cwd=workdir, env=_env(workdir),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while not fake.in_flight and process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            workers = _children(process.pid)
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        at_exit = _row_count(out)
        deadline = time.monotonic() + 120  # a guard: today's workers end with their call
        while any(map(_running, workers)) and time.monotonic() < deadline:
            time.sleep(0.1)
        after = _row_count(out)
        fake.latency_s = 0.0
        started = time.monotonic()
        code = run_sweep(workdir, [*command, "--budgetbench-resume=latest"])
        resumed = tally("SIGTERM under xdist, resume", 0, run_dir_of(out),
                        expected_cells(items), code, time.monotonic() - started,
                        secrets_in=workdir)
        return at_exit, after, resumed
    finally:
        fake.stop()


def endpoint_down(workdir: Path) -> tuple[FaultTally, str]:
    """No server at the endpoint: one clear error before any cell runs."""
    from pytest_budgetbench.model.chat import free_port

    out = prepare(workdir) / "out"
    started = time.monotonic()
    code = run_sweep(workdir, sweep_command(f"http://127.0.0.1:{free_port()}/v1", out, 2))
    result = tally("endpoint down at start", 1, only_run(out), set(), code,
                   time.monotonic() - started, secrets_in=workdir)
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
        result = tally("malformed dataset line", 1, only_run(out), set(), code,
                       time.monotonic() - started, secrets_in=workdir)
        return result, (workdir / "last-output.txt").read_text()
    finally:
        fake.stop()


def _planted_url(fake: FakeOpenAI) -> str:
    """The fake's URL with a planted password and a planted query-string key."""
    host = fake.base_url.split("://", 1)[1]
    return f"http://bob:{PLANTED_PASSWORD}@{host}?key={PLANTED_QUERY}"


def _output(workdir: Path) -> str:
    return (workdir / "last-output.txt").read_text()


def planted_secrets(workdir: Path, items: int = 3) -> list[FaultTally]:
    """Planted key, URL password and URL query value, grepped across every artifact, for
    the sweeps that leaked them: the default tokenizer against an endpoint without
    /tokenize (pytest printed make_counter's arguments), the server tokenizer (httpx put
    the full URL in every error), and a server that echoes the Authorization header in its
    401 bodies. All under ``-l`` (locals in tracebacks) and ``--junitxml``, report on."""
    fake = FakeOpenAI().start()
    try:
        results = []
        for label, tokenizer, faults in (
            ("secrets: tokenizer=auto", "auto", ()),
            ("secrets: tokenizer=server", "server", ()),
            ("secrets: 401 echoes the key", "approx", ("401echo",)),
        ):
            run_root = prepare(workdir / tokenizer)
            out = run_root / "out"
            fake.inject(0.4 if faults else 0.0, faults, seed=11)
            before = len(fake.injected)
            command = [*sweep_command(_planted_url(fake), out, items, "-l",
                                      f"--junitxml={run_root / 'junit.xml'}"),
                       f"--budgetbench-tokenizer={tokenizer}", "--budgetbench-report=on"]
            started = time.monotonic()
            code = run_sweep(run_root, command)
            # Without a tokenize route nothing can be counted: the sweep stops before its
            # first cell with one usage line, so only the secrets are judged.
            expected = expected_cells(items) if tokenizer == "approx" else set()
            results.append(tally(label, len(fake.injected) - before + len(PLANTED),
                                 only_run(out), expected, code,
                                 time.monotonic() - started, secrets_in=run_root))
        return results
    finally:
        fake.stop()


def planted_secrets_in_episodes(workdir: Path, items: int = 2) -> FaultTally:
    """The same planted secrets through a teacher-forced agent sweep (episodes.jsonl, each
    step's prediction, the viewer's trajectories), its server echoing the key in the 401s
    of 30% of calls, under ``-l`` and ``--junitxml``, report on; then a resume without
    faults completes the errored episodes."""
    fake = FakeOpenAI(responder=agent_responder).start()
    try:
        run_root = prepare(workdir)
        out = run_root / "out"
        fake.inject(0.3, ("401echo",), seed=7)
        command = [*agent_command(_planted_url(fake), out, items, "-l",
                                  f"--junitxml={run_root / 'junit.xml'}",
                                  "--budgetbench-strategies=full_context,observation_masking",
                                  "--budgetbench-episodes=teacher-forced"),
                   "--budgetbench-report=on"]
        started = time.monotonic()
        run_sweep(run_root, command)
        injected = len(fake.injected)
        fake.inject(0.0, ())
        code = run_sweep(run_root, [*command, "--budgetbench-resume=latest"])
        return tally("secrets: teacher-forced episodes, 401 echoes the key",
                     injected + len(PLANTED), only_run(out),
                     agent_cells(items, ("full_context", "observation_masking")), code,
                     time.monotonic() - started, secrets_in=run_root, graded=False)
    finally:
        fake.stop()


def retry_after_extremes(workdir: Path, items: int = 4) -> FaultTally:
    """429s whose Retry-After is inf, 1e400, 3600, negative, garbage or an HTTP date (far
    future or past), under --budgetbench-timeout=5: no overflow, no hour-long sleep; each
    cell ends answered or as an error row."""
    fake = FakeOpenAI().start()
    try:
        fake.inject(0.35, RETRY_AFTER_EXTREMES, seed=5)
        out = prepare(workdir) / "out"
        command = sweep_command(fake.base_url, out, items, "--budgetbench-timeout=5",
                                "--budgetbench-retries=3")
        started = time.monotonic()
        try:
            code = run_sweep(workdir, command, timeout=240)
        except subprocess.TimeoutExpired:  # slept on a huge Retry-After: a failure
            code = -int(signal.SIGKILL)
        return tally("Retry-After extremes", len(fake.injected), only_run(out),
                     expected_cells(items), code, time.monotonic() - started,
                     secrets_in=workdir)
    finally:
        fake.stop()


def incomparable_baseline(workdir: Path, items: int = 2) -> tuple[FaultTally, str]:
    """A baseline at budgets 300,5000 and a run at 301,5001: the regression gate has
    nothing to compare, and must fail saying so rather than pass."""
    fake = FakeOpenAI().start()
    try:
        prepare(workdir)
        base_out, out = workdir / "base", workdir / "out"
        run_sweep(workdir, [*sweep_command(fake.base_url, base_out, items, budgets=(300, 5000)),
                            "--budgetbench-report=on"])
        baseline = run_dir_of(base_out) / "report" / "report.json"
        command = [*sweep_command(fake.base_url, out, items, budgets=(301, 5001)),
                   "--budgetbench-report=on", f"--budgetbench-baseline={baseline}",
                   "--budgetbench-max-regression=0.05"]
        started = time.monotonic()
        code = run_sweep(workdir, command)
        # Stopped before the first cell (nothing comparable is known up front): no run.
        result = tally("incomparable baseline", 1, only_run(out), set(), code,
                       time.monotonic() - started, secrets_in=workdir)
        return result, _output(workdir)
    finally:
        fake.stop()


def mount_tmpfs(directory: Path, size: str = "200k") -> bool:
    """Mount a small tmpfs (needs root and mount rights); False where that is not allowed."""
    directory.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                           str(directory)], capture_output=True)
    return done.returncode == 0


def _passed_cells(junit: Path) -> set[str]:
    if not junit.exists():
        return set()
    passed = set()
    for case in ElementTree.parse(junit).iter("testcase"):
        name = case.get("name", "")
        if name.startswith("cell[") and not any(
                case.find(tag) is not None for tag in ("failure", "error", "skipped")):
            passed.add(name[len("cell["):].split("]")[0])
    return passed


def _torn_lines(run_dir: Path) -> int:
    torn = 0
    for name in ("cells.jsonl", "prompts.jsonl"):
        path = run_dir / name
        if path.exists():
            data = path.read_bytes()
            torn += int(bool(data) and not data.endswith(b"\n"))
            for line in data.splitlines():
                try:
                    json.loads(line)
                except ValueError:
                    torn += 1
    return torn


def disk_full(workdir: Path, items: int = 20) -> tuple[FaultTally, str] | None:
    """A sweep whose run directory and report share a 200 KB tmpfs: when the disk fills,
    the cell being written errors (never PASSED), the records stay line-aligned, and the
    report that cannot be written is one line, not an OSError traceback. Rows lost counts
    cells reported passed without a whole row, and torn lines. None where mounting is not
    allowed."""
    prepare(workdir)
    out = workdir / "out"
    if not mount_tmpfs(out):
        return None
    fake = FakeOpenAI().start()
    try:
        junit = workdir / "junit.xml"
        command = [*sweep_command(fake.base_url, out, items, f"--junitxml={junit}"),
                   "--budgetbench-report=on"]
        started = time.monotonic()
        code = run_sweep(workdir, command)
        wall = time.monotonic() - started
        run_dir = run_dir_of(out)
        rows = _rows(run_dir / "cells.jsonl")
        recorded = {r["cell_id"] for r in rows if r["status"] == "ok"}
        passed = _passed_cells(junit)
        base = tally("disk full (200 KB tmpfs)", 1, run_dir, set(), code, wall,
                     secrets_in=workdir)
        base.cells = len(expected_cells(items))
        base.rows_lost = len(passed - recorded) + _torn_lines(run_dir)
        return base, _output(workdir)
    finally:
        fake.stop()
        subprocess.run(["umount", str(out)], capture_output=True)


MISBEHAVING_STRATEGIES = '''
import time

from pytest_budgetbench.strategies import Strategy


class _Base(Strategy):
    def apply(self, messages, budget):
        return list(messages)[-1:]


class ListContent(_Base):
    name = "list_content"

    def apply(self, messages, budget):
        return [{"role": "user", "content": ["a", "b"]}]


class NotJson(_Base):
    name = "not_json"

    def apply(self, messages, budget):
        return [{"role": "user", "content": "hi", "extra": object()}]


class InitRaises(_Base):
    name = "init_raises"

    def __init__(self):
        raise ValueError("no init for you")


class Hangs(_Base):
    name = "hangs"

    def apply(self, messages, budget):
        time.sleep(30)
        return list(messages)
'''
MISBEHAVING = ("list_content", "not_json", "init_raises", "hangs")


def misbehaving_strategies(workdir: Path, items: int = 2) -> FaultTally:
    """Plug-ins that misbehave outside apply()'s happy path (bad content parts, a value JSON
    cannot hold, a raising constructor, a hang past --budgetbench-strategy-timeout), next
    to a sound strategy: every cell still gets exactly one row, the sound one's ok."""
    fake = FakeOpenAI().start()
    try:
        prepare(workdir)
        (workdir / "odd_strategies.py").write_text(MISBEHAVING_STRATEGIES)
        out = workdir / "out"
        specs = ",".join(f"odd_strategies:{cls}" for cls in
                         ("ListContent", "NotJson", "InitRaises", "Hangs"))
        command = [*sweep_command(fake.base_url, out, items),
                   f"--budgetbench-strategies={specs},truncation",
                   "--budgetbench-strategy-timeout=0.5"]
        started = time.monotonic()
        code = run_sweep(workdir, command)
        expected = expected_cells(items, (*MISBEHAVING, "truncation"))
        return tally("misbehaving plug-ins", len(MISBEHAVING), run_dir_of(out), expected, code,
                     time.monotonic() - started, secrets_in=workdir)
    finally:
        fake.stop()


def same_name_strategies(workdir: Path) -> tuple[FaultTally, str]:
    """A plug-in named like a built-in: one usage line, nothing run (it used to pass with
    half the rows, or report the plug-in's quality as the built-in's)."""
    fake = FakeOpenAI().start()
    try:
        prepare(workdir)
        (workdir / "impostor.py").write_text(
            "from pytest_budgetbench.strategies.truncation import Truncation\n\n"
            "class SameName(Truncation):\n    name = 'truncation'\n"
        )
        out = workdir / "out"
        command = [*sweep_command(fake.base_url, out, 2),
                   "--budgetbench-strategies=truncation,impostor:SameName"]
        started = time.monotonic()
        code = run_sweep(workdir, command)
        result = tally("same-name strategies", 1, only_run(out), set(), code,
                       time.monotonic() - started, secrets_in=workdir)
        return result, _output(workdir)
    finally:
        fake.stop()


def failed_start_then_resume(workdir: Path, items: int = 4) -> FaultTally:
    """A run with errored cells, then a start that fails (a bad data path), then
    ``--budgetbench-resume=latest``: the resume finds the real run, not the failed start,
    and completes its error cells."""
    fake = FakeOpenAI().start()
    try:
        prepare(workdir)
        out = workdir / "out"
        fake.inject(0.4, ("500",), seed=3)
        run_sweep(workdir, [*sweep_command(fake.base_url, out, items), "--budgetbench-retries=1"])
        faults_injected = len(fake.injected)
        fake.inject(0.0, ())
        run_sweep(workdir, [*sweep_command(fake.base_url, out, items),
                            "--budgetbench-tasks=hotpotqa",
                            "--budgetbench-data-hotpotqa=/nope/hotpot.json"])
        started = time.monotonic()
        code = run_sweep(workdir, [*sweep_command(fake.base_url, out, items),
                                   "--budgetbench-resume=latest"])
        return tally("failed start, then resume", faults_injected + 1, run_dir_of(out),
                     expected_cells(items), code, time.monotonic() - started,
                     secrets_in=workdir)
    finally:
        fake.stop()


def dripping_reply(workdir: Path, items: int = 1) -> tuple[FaultTally, list[dict]]:
    """The first reply drips in, a byte a second for ten minutes, under
    --budgetbench-timeout=1 --budgetbench-retries=1: its cell errors (the timeout bounds
    the whole request), the sweep goes on. Returns the tally and the error rows."""
    fake = FakeOpenAI().start()
    try:
        fake.faults = ["drip"]
        out = prepare(workdir) / "out"
        command = sweep_command(fake.base_url, out, items, "--budgetbench-timeout=1",
                                "--budgetbench-retries=1")
        started = time.monotonic()
        try:  # a guard against the hang, not a measure of time
            code = run_sweep(workdir, command, timeout=180)
        except subprocess.TimeoutExpired:
            code = -int(signal.SIGKILL)
        run_dir = only_run(out)
        result = tally("dripping reply", 1, run_dir, expected_cells(items), code,
                       time.monotonic() - started, secrets_in=workdir)
        rows = _rows(run_dir / "cells.jsonl") if run_dir else []
        return result, [r for r in rows if r["status"] == "error"]
    finally:
        fake.stop()


def agent_command(fake_url: str, out: Path, items: int, *extra: str) -> list[str]:
    """An ``agent_lookup`` sweep: episodes of tool calls against the scripted fake agent."""
    return [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
        "--budgets=8192", "--budgetbench-tasks=agent_lookup", f"--budgetbench-items={items}",
        "--budgetbench-task-options=lookups=3", f"--budgetbench-endpoint={fake_url}",
        "--budgetbench-tokenizer=approx", f"--budgetbench-out={out}",
        "--budgetbench-report=off", *extra,
    ]


def _digests(paths: Iterable[Path]) -> dict[str, str]:
    return {str(path): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in paths if path.is_file()}


EPISODE_CAPS = (("--budgetbench-max-calls", "2"), ("--budgetbench-agent-max-tokens", "16"))


def changed_episode_caps(workdir: Path, items: int = 2) -> list[tuple[FaultTally, str]]:
    """An agent sweep with full_context, then a resume that adds observation_masking and
    changes an episode cap: refused in one line naming the setting and both values, the
    run's rows and run.json untouched (it used to run the new cells under the new cap).
    Returns each tally with the resume's output."""
    fake = FakeOpenAI(responder=agent_responder).start()
    results = []
    try:
        for flag, value in EPISODE_CAPS:
            run_root = prepare(workdir / flag.removeprefix("--budgetbench-"))
            out = run_root / "out"
            run_sweep(run_root, agent_command(fake.base_url, out, items,
                                              "--budgetbench-strategies=full_context"))
            run_dir = run_dir_of(out)
            before = _digests([run_dir / "cells.jsonl", run_dir / "run.json"])
            started = time.monotonic()
            code = run_sweep(run_root, agent_command(
                fake.base_url, out, items, "--budgetbench-resume=latest",
                "--budgetbench-strategies=full_context,observation_masking",
                f"{flag}={value}"))
            result = tally(f"resume, {flag.removeprefix('--budgetbench-')} changed", 1,
                           run_dir, {f"agent_lookup-{i:04d}-full_context-8192"
                                     for i in range(items)},
                           code, time.monotonic() - started, secrets_in=run_root,
                           graded=False)
            after = _digests(Path(path) for path in before)
            result.changed = sum(after.get(path) != digest for path, digest in before.items())
            results.append((result, _output(run_root)))
        return results
    finally:
        fake.stop()


WITHOUT_OVERRIDES = ("setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner")
"""util-linux's setpriv without the capabilities that let root ignore permission bits."""


def read_only_prefix() -> list[str]:
    """The prefix of a command for which permission bits hold: root ignores them, so as
    root the command runs without the capabilities that override them."""
    return list(WITHOUT_OVERRIDES) if os.geteuid() == 0 else []


def make_read_only(location: Path) -> None:
    """``location`` and the files in it made read-only, as ``chmod -R a-w`` does."""
    for path in (*location.iterdir(), location):
        path.chmod(0o555 if path.is_dir() else 0o444)


def read_only_merge(workdir: Path, items: int = 3) -> tuple[FaultTally, str]:
    """``budgetbench cache merge`` from a cache made read-only as ``chmod -R a-w`` does
    (as root, without the capabilities that override permission bits): every entry
    merges and the source's bytes stay as they were. None where no file can be made
    unwritable here."""
    fake = FakeOpenAI().start()
    try:
        prepare(workdir)
        source, into = workdir / "source", workdir / "into"
        source.mkdir()
        run_sweep(workdir, [*sweep_command(fake.base_url, workdir / "out", items),
                            f"--budgetbench-cache-path={source / 'responses.sqlite'}"])
    finally:
        fake.stop()
    with sqlite3.connect(source / "responses.sqlite") as db:
        entries = db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]
    make_read_only(source)
    prefix = read_only_prefix()
    before = _digests(source.iterdir())
    started = time.monotonic()
    try:
        done = subprocess.run([*prefix, sys.executable, "-m", "pytest_budgetbench.commands.cli",
                               "cache", "merge", str(source), "--into", str(into)],
                              cwd=workdir, env=_env(workdir), capture_output=True, text=True,
                              timeout=120)
        changed = _digests(source.iterdir()) != before
    finally:
        source.chmod(0o755)
    with sqlite3.connect(into / "responses.sqlite") as db:
        merged = db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]
    result = FaultTally("merge from a read-only cache", 1, entries, merged, 0,
                        entries - merged, 0, 0, done.returncode,
                        round(time.monotonic() - started, 2), changed=int(changed))
    return result, done.stdout + done.stderr


def agent_cells(items: int, strategies: Sequence[str] = ("full_context",)) -> set[str]:
    return {f"agent_lookup-{i:04d}-{s}-8192" for i in range(items) for s in strategies}


def duplicate_call_ids(workdir: Path, items: int = 4) -> tuple[FaultTally, list[str]]:
    """Replies whose two tool calls share one id, in 30% of an agent sweep's calls: each
    such episode errors as the model's malformed reply (never "strategy ... broke a
    tool-call pair"), no episode is graded on it, and a resume completes them. Returns
    the tally (after the resume) and the first run's error messages."""
    fake = FakeOpenAI(responder=agent_responder).start()
    try:
        fake.inject(0.3, ("duplicate_ids",), seed=13)
        out = prepare(workdir) / "out"
        command = agent_command(fake.base_url, out, items,
                                "--budgetbench-strategies=full_context")
        started = time.monotonic()
        run_sweep(workdir, command)
        errors = [r["error"] for r in _rows(run_dir_of(out) / "cells.jsonl")
                  if r["status"] == "error"]
        injected = len(fake.injected)
        fake.inject(0.0, ())
        code = run_sweep(workdir, [*command, "--budgetbench-resume=latest"])
        return tally("tool calls sharing an id", injected, run_dir_of(out),
                     agent_cells(items), code, time.monotonic() - started,
                     secrets_in=workdir, graded=False), errors
    finally:
        fake.stop()


def malformed_replica(workdir: Path, items: int = 6) -> tuple[FaultTally, list[dict]]:
    """Two replicas, one of which answers every request with HTTP 200 and a body that is
    not JSON: its requests are retried at the other, which answers, so it is taken out
    as for a 5xx and no cell errors on its account. Returns the tally and the replica
    events (replicas.jsonl)."""
    good, bad = FakeOpenAI().start(), FakeOpenAI().start()
    try:
        bad.inject(1.0, ("malformed",))
        out = prepare(workdir) / "out"
        started = time.monotonic()
        code = run_sweep(workdir, sweep_command(f"{good.base_url},{bad.base_url}", out,
                                                items))
        run_dir = run_dir_of(out)
        return (tally("replica answering 200 malformed", len(bad.injected), run_dir,
                      expected_cells(items), code, time.monotonic() - started,
                      secrets_in=workdir), _rows(run_dir / "replicas.jsonl"))
    finally:
        good.stop()
        bad.stop()


def all_scenarios(root: Path) -> list[FaultTally]:
    full = disk_full(root / "disk")
    return [
        *transient_faults(root / "transient"),
        kill_and_resume(root / "kill"),
        under_xdist(root / "xdist"),
        endpoint_down(root / "down")[0],
        malformed_dataset(root / "dataset")[0],
        *planted_secrets(root / "secrets"),
        planted_secrets_in_episodes(root / "secrets-episodes"),
        retry_after_extremes(root / "retry"),
        incomparable_baseline(root / "baseline")[0],
        misbehaving_strategies(root / "plugins"),
        same_name_strategies(root / "same-name")[0],
        failed_start_then_resume(root / "failed-start"),
        dripping_reply(root / "drip")[0],
        *(result for result, _output in changed_episode_caps(root / "caps")),
        read_only_merge(root / "read-only-merge")[0],
        duplicate_call_ids(root / "duplicate-ids")[0],
        malformed_replica(root / "malformed-replica")[0],
        *([full[0]] if full else []),
    ]
