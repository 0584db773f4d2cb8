"""Sweeps that are cheap to repeat: the response cache, resume, shards, xdist groups and
bounded concurrency, end to end against the fake endpoint."""

from __future__ import annotations

import csv
import fnmatch
import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.commands.cli import main
from pytest_budgetbench.engine.resume import run_definition, started_at
from pytest_budgetbench.records import definition
from pytest_budgetbench.settings.config import Settings
from tests.fake_openai import FakeOpenAI, agent_responder
from tests.sweeps import sweep_args


def rows_in(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "cells.jsonl").read_text().splitlines()]


def runs_in(tmp: Path) -> list[Path]:
    """Run directories, oldest first (two runs can start within the same second)."""
    return sorted((d for d in (tmp / "out").iterdir() if d.is_dir()), key=started_at)


def sweep(pytester: pytest.Pytester, fake: FakeOpenAI, tmp: Path, *extra: str
          ) -> pytest.RunResult:
    return pytester.runpytest(*sweep_args(fake, tmp, "--budgets=1024,8192",
                                          "--budgetbench-items=3", *extra))


def test_a_warm_rerun_sends_nothing_and_keeps_the_original_latencies(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    fake_endpoint.latency_s = 0.05
    sweep(pytester, fake_endpoint, tmp_path).assert_outcomes(passed=9, xfailed=3)
    sent = len(fake_endpoint.requests)
    sweep(pytester, fake_endpoint, tmp_path).assert_outcomes(passed=9, xfailed=3)
    assert len(fake_endpoint.requests) == sent
    cold, warm = (rows_in(run) for run in runs_in(tmp_path))
    latency = {r["cell_id"]: r["model_s"] for r in cold if r["status"] == "ok"}
    warm_ok = [r for r in warm if r["status"] == "ok"]
    assert all(r["cached"] for r in warm_ok)
    assert {r["cell_id"]: r["model_s"] for r in warm_ok} == latency
    assert min(latency.values()) >= 0.05  # the model's time, not the cache's
    assert [r["prediction"] for r in warm_ok] == [
        r["prediction"] for r in cold if r["status"] == "ok"]


def test_refresh_sends_every_distinct_prompt_again(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    sweep(pytester, fake_endpoint, tmp_path)
    sent = len(fake_endpoint.requests)
    sweep(pytester, fake_endpoint, tmp_path, "--budgetbench-cache=refresh")
    assert len(fake_endpoint.requests) == 2 * sent
    second = rows_in(runs_in(tmp_path)[1])
    assert sum(not r["cached"] for r in second if r["status"] == "ok") == sent


def test_cache_off_shares_nothing_across_runs_but_still_sends_each_prompt_once(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    sweep(pytester, fake_endpoint, tmp_path, "--budgetbench-cache=off")
    sweep(pytester, fake_endpoint, tmp_path, "--budgetbench-cache=off")
    assert not (tmp_path / "out" / "responses.sqlite").exists()
    for run in runs_in(tmp_path):
        ok = [r for r in rows_in(run) if r["status"] == "ok"]
        assert len({r["prompt_sha256"] for r in ok}) == 6 and len(ok) == 9
    assert len(fake_endpoint.requests) == 12


def test_sampled_replies_are_neither_cached_nor_deduplicated(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    sweep(pytester, fake_endpoint, tmp_path, "--budgetbench-temperature=0.7")
    assert len(fake_endpoint.requests) == 9
    assert all(r["cached"] is False for r in rows_in(runs_in(tmp_path)[0]) if r["status"] == "ok")


def test_resume_keeps_recorded_cells_and_reruns_errors_into_the_same_run(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    fake_endpoint.faults = ["500"] * 2
    result = sweep(pytester, fake_endpoint, tmp_path, "--budgetbench-retries=1")
    result.assert_outcomes(passed=7, xfailed=3, errors=2)
    (run,) = runs_in(tmp_path)
    sent = len(fake_endpoint.requests)
    result = sweep(pytester, fake_endpoint, tmp_path, f"--budgetbench-resume={run}")
    result.assert_outcomes(passed=9, xfailed=3)  # recorded violations xfail again
    # The summary counts each cell once: the superseded error rows are not items.
    counts = re.findall(r" (?:1024|8192) +(\d+) ", result.stdout.str())
    assert counts == ["3"] * 4
    assert "Benchmark fixture was not used" not in result.stdout.str()
    assert runs_in(tmp_path) == [run]
    # Only the two errored cells ran; one of them (truncation@8192 of item 0, whose prompt
    # is full_context@8192's) found its reply in the cache.
    assert len(fake_endpoint.requests) == sent + 1
    rows = rows_in(run)
    final = [r for r in rows if r["status"] != "error"]
    assert len(final) == 12 and len({r["cell_id"] for r in final}) == 12
    info = json.loads((run / "run.json").read_text())
    assert len(info["resumed"]) == 1


def test_resume_latest_picks_the_newest_run(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    sweep(pytester, fake_endpoint, tmp_path, "--budgetbench-items=1")
    sweep(pytester, fake_endpoint, tmp_path)
    newest = runs_in(tmp_path)[-1]
    before = len(rows_in(newest))
    sweep(pytester, fake_endpoint, tmp_path, "--budgetbench-resume=latest")
    assert len(runs_in(tmp_path)) == 2 and len(rows_in(newest)) == before


@pytest.mark.parametrize(
    ("resume", "message"),
    [("nowhere", "not a run directory"), ("latest", "found no run in")],
)
def test_resume_of_nothing_is_a_usage_error(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path, resume: str,
    message: str,
) -> None:
    result = sweep(pytester, fake_endpoint, tmp_path, f"--budgetbench-resume={resume}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--budgetbench-resume*{message}*"])


def test_resume_with_another_model_is_refused(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    sweep(pytester, fake_endpoint, tmp_path)
    result = sweep(pytester, fake_endpoint, tmp_path, "--budgetbench-resume=latest",
                   "--budgetbench-model=other-model")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*was made with model 'fake-model'*'other-model'*"])


def test_shards_split_by_item_and_merge_into_the_unsharded_report(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    for shard in ("1/2", "2/2"):
        sweep(pytester, fake_endpoint, tmp_path, f"--budgetbench-shard={shard}")
    first, second = (rows_in(run) for run in runs_in(tmp_path))
    items = [{r["item_id"] for r in rows} for rows in (first, second)]
    assert items == [{"0000", "0002"}, {"0001"}]
    assert len(first) + len(second) == 12
    assert {r["cell_id"] for r in first}.isdisjoint(r["cell_id"] for r in second)
    assert [run.name.endswith(f"-shard{i}of2") for i, run in enumerate(runs_in(tmp_path), 1)
            ] == [True, True]
    merged = tmp_path / "merged"
    assert main(["report", *map(str, runs_in(tmp_path)), "--out", str(merged), "--no-plots"]) == 0
    with (merged / "summary.csv").open() as handle:
        assert {row["n_items"] for row in csv.DictReader(handle)} == {"3"}


def test_concurrency_runs_cells_ahead_but_never_exceeds_its_bound(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    fake_endpoint.latency_s = 0.1
    # One distinct prompt per cell, so no cell waits on another's identical request.
    result = sweep(pytester, fake_endpoint, tmp_path, "--budgetbench-concurrency=3",
                   "--budgetbench-items=8", "--budgetbench-strategies=truncation",
                   "--budgets=1024")
    result.assert_outcomes(passed=8)
    assert fake_endpoint.max_in_flight == 3
    rows = rows_in(runs_in(tmp_path)[0])
    assert len(rows) == 8 and len({r["cell_id"] for r in rows}) == 8


def test_under_xdist_an_items_cells_stay_on_one_worker(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    result = pytester.runpytest_subprocess(
        *sweep_args(fake_endpoint, tmp_path, "--budgets=1024,8192", "--budgetbench-items=4",
                    "-n", "2"))
    result.assert_outcomes(passed=12, xfailed=4)
    workers: dict[str, set[str]] = defaultdict(set)
    for row in rows_in(runs_in(tmp_path)[0]):
        workers[row["item_id"]].add(row["worker"])
    assert all(len(w) == 1 for w in workers.values())
    assert set().union(*workers.values()) == {"gw0", "gw1"}
    # Identical prompts were sent once, across both workers.
    assert len(fake_endpoint.requests) == 8


# -- a resume is of the same run: what defines a cell must match ---------------------------
def _refused(result: pytest.RunResult) -> str:
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    (line,) = [line for line in result.stderr.lines if "budgetbench:" in line]
    return line


@pytest.mark.parametrize(("first", "then", "named"), [
    ("--budgetbench-seed=0", "--budgetbench-seed=1", "--budgetbench-seed 0, this session asks 1"),
    ("--budgetbench-memory-history=500", "--budgetbench-memory-history=1500",
     "task 'memory' option history_tokens 500, this session asks 1500"),
    ("--budgetbench-max-tokens=32", "--budgetbench-max-tokens=64",
     "--budgetbench-max-tokens 32, this session asks 64"),
])
def test_resume_with_a_setting_that_defines_cells_changed_is_refused_in_one_line(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path, first: str,
    then: str, named: str,
) -> None:
    sweep(pytester, fake_endpoint, tmp_path, first)
    (run,) = runs_in(tmp_path)
    rows, info = rows_in(run), (run / "run.json").read_text()
    line = _refused(sweep(pytester, fake_endpoint, tmp_path, "--budgetbench-resume=latest",
                          then))
    assert f"run {run.name} was made with {named}" in line
    assert "resume with the run's settings, or start a new run" in line
    assert rows_in(run) == rows and (run / "run.json").read_text() == info


def _other_value(value: object) -> object:
    """A value of the same kind as ``value`` that is not equal to it."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, dict):
        return {**value, "other": "other"}
    return f"{value}-other" if value is not None else "other"


@pytest.mark.parametrize("setting", definition.CELL_SETTINGS)
def test_every_setting_the_definition_declares_is_recorded_and_a_change_is_named(
    setting: str,
) -> None:
    """By construction, not by list: whatever run_definition records, it records every
    declared setting, and a change of any one is the one difference, named with both
    values. (The end-to-end test below runs a resume for the ones a flag sets.)"""
    settings = Settings(tasks=("memory",), strategies=("full_context",))
    arguments: dict[str, Any] = {"model": "m", "tokenizer": "approx-chars/4",
                                 "aux_models": {"summary": "s"}}
    recorded = run_definition(settings, **arguments)
    assert set(definition.CELL_SETTINGS) <= set(recorded["settings"])
    if setting in arguments:
        changed = run_definition(settings, **{**arguments, setting: _other_value(
            arguments[setting])})
    else:
        value = recorded["settings"][setting]
        other = _other_value({} if value is None and setting == "grader" else value)
        changed = run_definition(replace(settings, **{setting: other}), **arguments)
    (difference,) = definition.differences(recorded, changed)
    line = definition.describe([difference], "{what} {old}, this session asks {new}")
    assert setting.replace("_", "-") in line or setting in line or "counter" in line
    assert definition.show(recorded["settings"][setting]) in line
    assert definition.show(changed["settings"][setting]) in line


@pytest.mark.parametrize(("flag", "first", "then"), [
    ("--budgetbench-max-calls", "100", "2"),
    ("--budgetbench-agent-max-tokens", "256", "16"),
    ("--budgetbench-max-tokens", "32", "16"),
    ("--budgetbench-temperature", "0", "0.5"),
    ("--budgetbench-seed", "0", "3"),
    ("--budgetbench-episodes", "free-running", "teacher-forced"),
])
def test_an_agent_sweep_resumed_with_a_changed_episode_setting_is_refused(
    pytester: pytest.Pytester, tmp_path: Path, flag: str, first: str, then: str
) -> None:
    agent = FakeOpenAI(responder=agent_responder).start()
    try:
        def lookup(*extra: str) -> pytest.RunResult:
            return pytester.runpytest(*sweep_args(
                agent, tmp_path, "--budgets=8192", "--budgetbench-tasks=agent_lookup",
                "--budgetbench-items=1", "--budgetbench-task-options=lookups=3", *extra))

        lookup("--budgetbench-strategies=full_context", f"{flag}={first}").assert_outcomes(
            passed=1)
        (run,) = runs_in(tmp_path)
        rows, info = rows_in(run), (run / "run.json").read_text()
        line = _refused(lookup("--budgetbench-resume=latest",
                               "--budgetbench-strategies=full_context,observation_masking",
                               f"{flag}={then}"))
    finally:
        agent.stop()
    recorded = json.loads(info)["definition"]["settings"]
    name = flag.removeprefix("--budgetbench-").replace("-", "_")
    assert f"run {run.name} was made with {flag} {definition.show(recorded[name])}, " \
           f"this session asks " in line
    assert rows_in(run) == rows and (run / "run.json").read_text() == info


def test_resume_may_change_settings_that_leave_cells_as_they_are(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    sweep(pytester, fake_endpoint, tmp_path, "--budgetbench-strategies=truncation")
    result = sweep(pytester, fake_endpoint, tmp_path, "--budgetbench-resume=latest",
                   "--budgetbench-concurrency=2", "--budgetbench-timeout=60",
                   "--budgetbench-audit=hash", "--budgetbench-retries=1",
                   "--budgetbench-strategies=truncation,full_context")
    result.assert_outcomes(passed=9, xfailed=3)
    (run,) = runs_in(tmp_path)
    assert len(rows_in(run)) == 12


def test_run_json_records_the_definition_of_its_cells(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    data = tmp_path / "chats.jsonl"
    data.write_text(json.dumps({"id": "q1", "history": [{"role": "user", "content": "Rex"}],
                                "question": "Dog?", "answer": "Rex"}) + "\n")
    sweep(pytester, fake_endpoint, tmp_path, f"--budgetbench-tasks=memory,c=jsonl(path={data})")
    (run,) = runs_in(tmp_path)
    block = json.loads((run / "run.json").read_text())["definition"]
    assert block["settings"]["seed"] == 0 and block["settings"]["model"] == "fake-model"
    assert block["settings"]["tokenizer"] == "approx-chars/4"
    assert block["tasks"]["memory"]["options"]["history_tokens"] == 2000
    assert sorted(block["tasks"]["memory"]["items"]) == ["0000", "0001", "0002"]
    assert block["tasks"]["memory"]["data"] is None
    import hashlib

    assert block["tasks"]["c"]["data"] == {
        "path": str(data), "sha256": hashlib.sha256(data.read_bytes()).hexdigest()}


def test_resume_after_the_data_file_changed_is_refused(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    data = tmp_path / "chats.jsonl"
    record = {"id": "q1", "history": [{"role": "user", "content": "my dog is Rex"}],
              "question": "Dog?", "answer": "Rex"}
    data.write_text(json.dumps(record) + "\n")
    task = f"--budgetbench-tasks=c=jsonl(path={data})"
    sweep(pytester, fake_endpoint, tmp_path, task)
    data.write_text(json.dumps({**record, "answer": "Max"}) + "\n")
    line = _refused(sweep(pytester, fake_endpoint, tmp_path, "--budgetbench-resume=latest",
                          task))
    assert f"was made with task 'c' data {data} of sha256 '" in line
    assert "this session asks '" in line


def _forget_definition(run: Path) -> None:
    """Make run.json look like one written before run definitions."""
    info = json.loads((run / "run.json").read_text())
    del info["definition"]
    (run / "run.json").write_text(json.dumps(info))


def test_resume_of_an_older_run_checks_its_settings_and_says_what_it_cannot_check(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    sweep(pytester, fake_endpoint, tmp_path, "--budgetbench-memory-history=500")
    (run,) = runs_in(tmp_path)
    _forget_definition(run)
    line = _refused(sweep(pytester, fake_endpoint, tmp_path, "--budgetbench-resume=latest"))
    assert "task 'memory' option history_tokens 500, this session asks 2000" in line
    result = sweep(pytester, fake_endpoint, tmp_path, "--budgetbench-resume=latest",
                   "--budgetbench-memory-history=500")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([f"*warning: run {run.name} was made before run.json recorded "
                                 "a definition*could not be*"])


def test_resume_whose_rows_recorded_other_golds_is_refused_naming_the_item(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    sweep(pytester, fake_endpoint, tmp_path)
    (run,) = runs_in(tmp_path)
    _forget_definition(run)  # an older run: only its rows can tell
    rows = rows_in(run)
    rows = [{**r, "gold": ["Denver", "Lisbon"]} if r["item_id"] == "0001" else r for r in rows]
    (run / "cells.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    line = _refused(sweep(pytester, fake_endpoint, tmp_path, "--budgetbench-resume=latest"))
    assert "recorded task 'memory' item 0001 with gold [\"Denver\", \"Lisbon\"]" in line
    assert "the items changed since the run" in line


def test_a_run_in_use_by_another_session_is_refused(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    import os

    from pytest_budgetbench.records.store import RunStore

    sweep(pytester, fake_endpoint, tmp_path)
    (run,) = runs_in(tmp_path)
    rows = rows_in(run)
    other = RunStore(run)
    other.lock()  # another session, resuming the same run
    try:
        line = _refused(sweep(pytester, fake_endpoint, tmp_path,
                              "--budgetbench-resume=latest"))
    finally:
        other.unlock()
    assert f"run {run} is in use by another budgetbench session (pid {os.getpid()})" in line
    assert rows_in(run) == rows
    result = sweep(pytester, fake_endpoint, tmp_path, "--budgetbench-resume=latest")
    result.assert_outcomes(passed=9, xfailed=3)



# -- Ctrl-C: stop within seconds, the cells in flight left for the resume ---------------------
@pytest.mark.parametrize(("method", "line"), [
    ("finish", "budgetbench: interrupted while writing the report: the run's records are "
     "kept; write it with `budgetbench report *`"),
    ("stop", "budgetbench: interrupted again while stopping: cells in flight were not "
     "waited for; resume the run with --budgetbench-resume=latest"),
])
def test_a_ctrl_c_while_the_session_ends_is_one_line_not_a_traceback(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path, method: str,
    line: str
) -> None:
    """The second Ctrl-C of an impatient user lands where the session ends: writing the
    report, or stopping the cells and the server. It used to print pytest's traceback."""
    pytester.makeconftest(f"""
        from pytest_budgetbench.engine.session import BudgetBenchSession

        def interrupted(self):
            raise KeyboardInterrupt  # the Ctrl-C, as it lands in this method

        BudgetBenchSession.{method} = interrupted
        """)
    result = pytester.runpytest_subprocess(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=8192", "--budgetbench-items=1"))
    output = "\n".join((*result.stdout.lines, *result.stderr.lines))
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    assert any(fnmatch.fnmatch(text, line) for text in output.splitlines()), output


def test_ctrl_c_starts_no_model_call_and_leaves_the_episodes_in_flight_for_the_resume(
    tmp_path: Path,
) -> None:
    """Two episodes in flight in threads (--budgetbench-concurrency=2), their first calls
    held by the endpoint: after SIGINT (once the summary shows the interrupt was handled)
    the held replies are let go, and no further call is sent (the threads used to play
    their episodes to the end, 30-40 s on the embedded model, before the process could
    exit); no row is written for them, and the resume completes both."""
    agent = FakeOpenAI(responder=agent_responder).start()
    agent.hold = threading.Event()
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly",
               *sweep_args(agent, tmp_path, "--budgets=8192", "--budgetbench-tasks=agent_lookup",
                           "--budgetbench-items=2", "--budgetbench-task-options=lookups=4",
                           "--budgetbench-strategies=full_context",
                           "--budgetbench-concurrency=2")]
    try:
        # A shell's background job (CI may start this suite as one) ignores SIGINT, and
        # the child would inherit that: give it the default action that Ctrl-C meets.
        process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True,
                                   preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                                    signal.SIG_DFL))
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(process.stdout or ()),
                                  daemon=True)
        reader.start()
        try:
            deadline = time.monotonic() + 120  # guards, not measures
            while time.monotonic() < deadline and len(agent.requests) < 2:
                time.sleep(0.01)
            assert len(agent.requests) == 2, "both episodes should be in their first call"
            process.send_signal(signal.SIGINT)
            while time.monotonic() < deadline and not any("KeyboardInterrupt" in line
                                                          for line in lines):
                time.sleep(0.01)
            agent.hold.set()  # the calls in flight end; none may follow them
            process.wait(timeout=120)
            reader.join(timeout=10)
        finally:
            agent.hold.set()
            process.kill()
        output = "".join(lines)
        assert len(agent.requests) == 2, output[-3000:]
        run = runs_in(tmp_path)[0]
        assert not (run / "cells.jsonl").exists() or rows_in(run) == []
        agent.hold = None
        resumed = subprocess.run([*command, "--budgetbench-resume=latest"], cwd=tmp_path,
                                 capture_output=True, text=True, timeout=300)
    finally:
        agent.stop()
    assert resumed.returncode == 0, resumed.stdout[-2000:]
    rows = rows_in(run)
    assert len(rows) == 2 and all(r["ended"] == "done" and r["calls"] == 5 for r in rows)
