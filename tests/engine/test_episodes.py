"""Agent episodes: the runner loops call by call, enforces the budget on every call, and
records one row and one trajectory per episode cell."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.commands.regrade import regrade_run
from pytest_budgetbench.engine.episode import percentile, prompt_entries, shared_prefix
from pytest_budgetbench.errors import DataError
from pytest_budgetbench.messages import check_tool_pairs, text_of
from pytest_budgetbench.tasks import TaskOptions
from pytest_budgetbench.tasks.agent_lookup import LOOKUP_TOOL, AgentLookupTask
from pytest_budgetbench.tokens.gguf import GGUFCounter
from tests.fake_openai import FakeOpenAI, agent_responder
from tests.sweeps import rows_of, sweep_args

pytest_plugins = ["pytester"]


@pytest.fixture
def agent() -> Iterator[FakeOpenAI]:
    fake = FakeOpenAI(responder=agent_responder).start()
    yield fake
    fake.stop()


def episodes_of(tmp: Path) -> dict[str, dict]:
    (path,) = (tmp / "out").glob("*/episodes.jsonl")
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return {record["cell_id"]: record for record in records}


def lookup_args(fake: FakeOpenAI, tmp: Path, *extra: str) -> list[str]:
    return sweep_args(fake, tmp, "--budgetbench-tasks=agent_lookup", "--budgetbench-items=2",
                      "--budgetbench-task-options=lookups=4", "--budgetbench-memory-history=1200",
                      *extra)


def test_an_episode_is_one_row_with_every_call_counted_and_its_trajectory_kept(
    pytester: pytest.Pytester, agent: FakeOpenAI, tmp_path: Path
) -> None:
    result = pytester.runpytest(*lookup_args(agent, tmp_path, "--budgets=8192",
                                             "--budgetbench-strategies=full_context"))
    result.assert_outcomes(passed=2)
    rows = rows_of(tmp_path)
    assert len(rows) == 2
    episodes = episodes_of(tmp_path)
    for row in rows:
        # 4 lookups and the answer: five calls, each prompt longer than the last.
        assert row["calls"] == 5 and row["ended"] == "done"
        assert row["quality"] == 1.0 and row["status"] == "ok"
        tokens = row["call_tokens"]
        assert tokens == sorted(tokens) and len(set(tokens)) == 5
        assert row["counted_tokens"] == row["max_call_tokens"] == tokens[-1]
        assert row["sum_call_tokens"] == sum(tokens)
        assert row["token_count_match"] is True  # the fake counts as approx does
        assert row["violated_call"] is None
        episode = episodes[row["cell_id"]]
        trajectory = episode["trajectory"]
        check_tool_pairs(trajectory, "the recorded trajectory")
        assert [m["role"] for m in trajectory] == ["user"] + ["assistant", "tool"] * 4 + [
            "assistant"]
        assert trajectory[1]["content"] is None and trajectory[1]["tool_calls"]
        # full_context sends the trajectory as it is: every call's prompt is references.
        for call in episode["calls"]:
            assert call["prompt"] == [{"t": i} for i in range(call["seen"])]
    assert len(agent.requests) == 10


def test_a_call_over_budget_ends_the_episode_and_the_row_names_it(
    pytester: pytest.Pytester, agent: FakeOpenAI, tmp_path: Path
) -> None:
    result = pytester.runpytest(*lookup_args(agent, tmp_path, "--budgets=700",
                                             "--budgetbench-strategies=full_context"))
    rows = rows_of(tmp_path)
    assert {row["status"] for row in rows} == {"violation"}
    for row in rows:
        assert row["ended"] == "violation"
        assert 1 < row["violated_call"] == row["calls"]
        assert row["call_tokens"][-1] > 700 >= max(row["call_tokens"][:-1])
        assert f"(call {row['violated_call']})" in row["error"]
    # The calls before the violation were sent; the violating one never was.
    assert len(agent.requests) == sum(row["calls"] - 1 for row in rows)
    result.assert_outcomes(xfailed=2)


def test_strategies_change_outcomes_in_an_episode(
    pytester: pytest.Pytester, agent: FakeOpenAI, tmp_path: Path
) -> None:
    """truncation keeps the newest messages: the first record's result is gone by the
    answer, so the scripted agent cannot answer; full_context can."""
    pytester.runpytest(*lookup_args(agent, tmp_path, "--budgets=8192,900"))
    quality = {(row["strategy"], row["budget"]): row["quality"] for row in rows_of(tmp_path)
               if row["status"] == "ok"}
    assert quality[("full_context", 8192)] == 1.0
    assert quality.get(("truncation", 900), 0.0) == 0.0


def test_prompt_entries_name_trajectory_messages_and_keep_made_ones() -> None:
    trajectory = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                  {"role": "user", "content": "a"}]
    summary = {"role": "user", "content": "summary"}
    assert prompt_entries([trajectory[0], summary, trajectory[2]], trajectory) == [
        {"t": 0}, {"m": summary}, {"t": 2}]
    # An identical message later in the prompt refers to the later one.
    assert prompt_entries([trajectory[2]], trajectory) == [{"t": 0}]


def test_shared_prefix_and_percentile() -> None:
    assert shared_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert shared_prefix([], [1]) == 0
    assert percentile(list(range(1, 21)), 0.95) == 19
    assert percentile([5], 0.95) == 5


def test_the_lookup_task_is_deterministic_and_its_answer_sits_in_the_first_result() -> None:
    task = AgentLookupTask(TaskOptions(seed=3, items=2, extra={"lookups": 3}))
    first, again = task.load(), task.load()
    assert first == again
    item = first[0]
    key = item.meta["keys"][0]
    assert f"Record {key}: code {item.answer}." in item.meta["files"][key]


def test_the_lookup_evidence_is_the_first_record_line_as_its_tool_result_holds_it() -> None:
    for item in AgentLookupTask(TaskOptions(seed=5, items=4, extra={"lookups": 4})).load():
        first = item.meta["keys"][0]
        assert item.evidence == (f"Record {first}: code {item.answer}.",)
        assert not any(item.evidence[0] in text_of(m) for m in item.messages)
        env = AgentLookupTask(TaskOptions()).environment(item)
        call = {"id": "c0", "type": "function",
                "function": {"name": "lookup", "arguments": json.dumps({"key": first})}}
        results = env.respond({"role": "assistant", "content": None, "tool_calls": [call]})
        assert results is not None and results[0]["role"] == "tool"
        assert text_of(results[0]).count(item.evidence[0]) == 1


@pytest.mark.parametrize("mode", ["free-running", "teacher-forced"])
def test_a_run_killed_mid_episode_resumes_to_one_row_per_cell_from_the_cache(
    agent: FakeOpenAI, tmp_path: Path, mode: str
) -> None:
    """SIGKILL during the second episode's calls; the resume reruns that episode from its
    start, its sent calls answered by the response cache, and ends with one row a cell.
    (Teacher-forced: the same five calls, one per reference step, each predicted right.)"""
    agent.latency_s = 0.05
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
               *lookup_args(agent, tmp_path, "--budgets=8192",
                            "--budgetbench-strategies=full_context",
                            f"--budgetbench-episodes={mode}")]
    process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(agent.requests) < 7:
            time.sleep(0.005)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    sent_before = len(agent.requests)
    assert 7 <= sent_before < 10, "killed outside the second episode"
    assert len(rows_of(tmp_path)) == 1
    done = subprocess.run([*command, "--budgetbench-resume=latest"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:]
    rows = rows_of(tmp_path)
    assert sorted(row["cell_id"] for row in rows) == sorted(
        {row["cell_id"] for row in rows}) and len(rows) == 2
    assert all(row["calls"] == 5 and row["quality"] == 1.0 and row["episode_mode"] == mode
               for row in rows)
    # Two episodes of five calls: those answered before the kill were not sent again (the
    # one in flight when it died is sent again, as its reply was never stored).
    assert len(agent.requests) <= 11
    episodes = episodes_of(tmp_path)
    assert set(episodes) == {row["cell_id"] for row in rows}
    resumed = episodes[rows[-1]["cell_id"]]  # the episode the kill cut short, rerun
    # Its first call was answered (and stored) before its second was sent, so before the kill.
    assert resumed["calls"][0]["cached"] is True


def test_the_summary_counts_cached_answers_among_the_answers_only(
    pytester: pytest.Pytester, agent: FakeOpenAI, tmp_path: Path
) -> None:
    """Run again, an episode that went over budget at a later call had its earlier calls
    answered by the cache: its row is cached, but it is no answer, so the summary's count
    of cached answers leaves it out (it read "6 of 4 answers" on a real agent sweep)."""
    args = lookup_args(agent, tmp_path, "--budgets=8192,900")
    pytester.runpytest(*args)
    first = set((tmp_path / "out").glob("*/cells.jsonl"))
    result = pytester.runpytest(*args)
    (again,) = set((tmp_path / "out").glob("*/cells.jsonl")) - first
    rows = [json.loads(line) for line in again.read_text().splitlines()]
    answers = [row for row in rows if row["status"] == "ok"]
    assert any(row["cached"] and row["status"] == "violation" for row in rows)
    cached = sum(1 for row in answers if row["cached"])
    result.stdout.fnmatch_lines(
        [f"{cached} of {len(answers)} answers came from the response cache*"])


def test_regrade_grades_an_episode_from_its_recorded_trajectory_without_a_model_call(
    pytester: pytest.Pytester, agent: FakeOpenAI, tmp_path: Path
) -> None:
    pytester.runpytest(*lookup_args(agent, tmp_path, "--budgets=8192",
                                    "--budgetbench-strategies=full_context"))
    sent = len(agent.requests)
    (run_dir,) = (tmp_path / "out").glob("*/")
    result = regrade_run(run_dir)
    assert result.regraded == 2 and len(agent.requests) == sent
    out = result.out_dir
    regraded = [json.loads(line) for line in (out / "cells.jsonl").read_text().splitlines()]
    assert [row["quality"] for row in regraded] == [1.0, 1.0]
    recorded = (run_dir / "episodes.jsonl").read_bytes()
    assert (out / "episodes.jsonl").read_bytes() == recorded
    # Without its trajectory an episode cannot be graded: one line says so.
    (run_dir / "episodes.jsonl").unlink()
    with pytest.raises(DataError, match=r"has no trajectory in episodes\.jsonl"):
        regrade_run(run_dir, tmp_path / "again")


@pytest.mark.parametrize("spread", [["-n", "2"], ["--budgetbench-concurrency=3"]])
def test_episodes_under_xdist_and_concurrency_give_one_row_a_cell_and_the_same_outcome(
    pytester: pytest.Pytester, agent: FakeOpenAI, tmp_path: Path, spread: list[str]
) -> None:
    args = lookup_args(agent, tmp_path, "--budgets=8192,900", *spread)
    result = pytester.runpytest_subprocess(*args)
    assert result.ret == 0, result.stdout.str()[-2000:]
    rows = rows_of(tmp_path)
    assert len(rows) == len({row["cell_id"] for row in rows}) == 8
    assert set(episodes_of(tmp_path)) == {row["cell_id"] for row in rows}
    by_cell = {(row["strategy"], row["budget"]): row["quality"] for row in rows
               if row["status"] == "ok" and row["item_id"] == "0000"}
    assert by_cell[("full_context", 8192)] == 1.0


def test_a_strategy_that_does_not_handle_tool_calls_is_refused_before_any_cell(
    pytester: pytest.Pytester, agent: FakeOpenAI, tmp_path: Path
) -> None:
    result = pytester.runpytest(*lookup_args(
        agent, tmp_path, "--budgets=8192", "--budgetbench-strategies=full_context,summary_buffer"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*strategy 'summary_buffer' does not handle tool calls*"
                                 "use one of:*observation_masking*"
                                 "(task 'agent_lookup' is an agent's*"])
    assert agent.requests == []


@pytest.fixture(scope="module")
def qwen() -> GGUFCounter:
    """The default embedded model's counter (its template renders tool calls)."""
    pytest.importorskip("llama_cpp")
    from pytest_budgetbench.embedded_server.models import QWEN, model_dir

    path = model_dir() / QWEN.file_name
    if not path.is_file():
        pytest.skip("the default model is not fetched (budgetbench fetch-model)")
    return GGUFCounter(path)


def test_an_exact_counter_gives_the_token_ids_whose_shared_prefix_is_prefix_reuse(
    qwen: GGUFCounter,
) -> None:
    """What prefix_reuse compares: the ids are the counted prompt, and a prompt that only
    appends to the previous one repeats all of it (its generation prompt opens the reply
    that follows); masking the result instead gives up what follows the change."""
    tools = [LOOKUP_TOOL]
    first = [{"role": "user", "content": "Look up R1."}]
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "lookup",
                                                      "arguments": '{"key": "R1"}'}}]}
    second = [*first, call, {"role": "tool", "tool_call_id": "c1", "content": "code ABC"}]
    ids_first = qwen.prompt_token_ids(first, tools)
    ids_second = qwen.prompt_token_ids(second, tools)
    assert ids_first is not None and ids_second is not None
    assert len(ids_first) == qwen.count_messages(first, tools)
    assert len(ids_second) == qwen.count_messages(second, tools)
    reused = shared_prefix(ids_first, ids_second)
    assert reused == len(ids_first)
    masked = [*first, call, {"role": "tool", "tool_call_id": "c1", "content": "[omitted]"}]
    assert shared_prefix(ids_second, qwen.prompt_token_ids(masked, tools) or []) < len(
        ids_second) - 3


ORPHANER = """
from pytest_budgetbench.strategies import Strategy


class Orphaner(Strategy):
    '''Claims to handle tool calls, then drops every call and keeps its results.'''

    name = "orphaner"
    handles_tools = True

    def apply(self, messages, budget):
        return [m for m in messages if not m.get("tool_calls")]
"""


def test_a_strategy_that_orphans_a_tool_result_is_one_clear_error_naming_the_pair(
    pytester: pytest.Pytester, agent: FakeOpenAI, tmp_path: Path
) -> None:
    pytester.makepyfile(orphaner=ORPHANER)
    pytester.syspathinsert()
    result = pytester.runpytest(*lookup_args(
        agent, tmp_path, "--budgets=8192", "--budgetbench-strategies=orphaner:Orphaner",
        "--budgetbench-items=1"))
    (row,) = rows_of(tmp_path)
    assert row["status"] == "error" and row["calls"] is None
    assert row["error"].startswith(
        "strategy 'orphaner' broke a tool-call pair: the tool result at message 1 answers "
        "call 'call_0_")
    assert row["error"].endswith(f"(cell {row['cell_id']})")
    assert "\n" not in row["error"]
    # The first call had nothing to orphan; the second prompt was refused before sending.
    assert len(agent.requests) == 1
    result.assert_outcomes(errors=1)


def test_a_reply_whose_calls_share_an_id_is_the_models_error_not_the_strategys(
    pytester: pytest.Pytester, agent: FakeOpenAI, tmp_path: Path
) -> None:
    agent.faults = ["", "duplicate_ids"]  # the reply to the episode's second call
    result = pytester.runpytest(*lookup_args(
        agent, tmp_path, "--budgets=8192", "--budgetbench-strategies=full_context",
        "--budgetbench-items=1"))
    (row,) = rows_of(tmp_path)
    assert row["status"] == "error" and row["quality"] is None
    assert row["error"].startswith(f"malformed reply from {agent.base_url}: tool calls 1 and "
                                   "2 of the reply share id 'call_1_")
    assert row["error"].endswith("; it answered call 2 of the episode")
    assert "strategy" not in row["error"] and "\n" not in row["error"]
    assert len(agent.requests) == 2  # the malformed reply never made a third prompt
    result.assert_outcomes(errors=1)


def test_an_endpoint_failure_names_the_call_of_the_episode_it_failed(
    pytester: pytest.Pytester, agent: FakeOpenAI, tmp_path: Path
) -> None:
    """A 500 (or a timeout) at the second call: the row's error says which call, as a
    malformed reply's does."""
    agent.faults = ["", "500"]
    result = pytester.runpytest(*lookup_args(
        agent, tmp_path, "--budgets=8192", "--budgetbench-strategies=full_context",
        "--budgetbench-items=1", "--budgetbench-retries=1"))
    (row,) = rows_of(tmp_path)
    assert row["status"] == "error"
    assert row["error"].endswith("; it failed call 2 of the episode"), row["error"]
    assert "500" in row["error"] and "\n" not in row["error"]
    result.assert_outcomes(errors=1)


def hermes_agent(messages: list[dict[str, Any]]) -> str:
    """The scripted agent, its calls written as text in <tool_call> blocks, as a server
    that does not parse them (llama-cpp-python's) returns them."""
    reply = agent_responder(messages)
    if isinstance(reply, str):
        return reply
    return "".join(
        "<tool_call>" + json.dumps({"name": call["function"]["name"],
                                    "arguments": json.loads(call["function"]["arguments"])})
        + "</tool_call>" for call in reply["tool_calls"])


@pytest.mark.parametrize(("parser", "notes", "quality"), [("auto", 1, 0.0), ("hermes", 0, 1.0)])
def test_calls_written_as_text_that_no_parser_reads_are_named_once_a_run(
    pytester: pytest.Pytester, agent: FakeOpenAI, tmp_path: Path, parser: str, notes: int,
    quality: float
) -> None:
    agent.responder = hermes_agent
    result = pytester.runpytest(*lookup_args(
        agent, tmp_path, "--budgets=8192", "--budgetbench-strategies=full_context",
        f"--budgetbench-tool-parser={parser}"))
    result.assert_outcomes(passed=2)
    assert [row["quality"] for row in rows_of(tmp_path)] == [quality, quality]
    output = result.stdout.str()
    assert output.count("--budgetbench-tool-parser") == notes, output[-3000:]
    if notes:
        result.stdout.fnmatch_lines(["*hold tool calls as text*pass "
                                     "--budgetbench-tool-parser=hermes*"])


def test_diff_pairs_two_runs_of_episodes_item_by_item(
    pytester: pytest.Pytester, agent: FakeOpenAI, tmp_path: Path
) -> None:
    """A memory-policy change as a team would diff it: the same episode cells, run B's
    agent forgets to look anything up, and diff names the drop and the flipped items."""
    pytest.importorskip("pandas")
    from pytest_budgetbench.reports.diff import diff_runs

    args = ("--budgets=8192", "--budgetbench-strategies=full_context")
    pytester.runpytest(*lookup_args(agent, tmp_path / "a", *args))
    agent.responder = lambda messages: "I do not know."
    pytester.runpytest(*lookup_args(agent, tmp_path / "b", *args))
    (run_a,), (run_b,) = ((tmp_path / side / "out").glob("*/") for side in ("a", "b"))
    diff = diff_runs(run_a, run_b, resamples=200)
    (cell,) = diff.table.to_dict("records")
    assert (cell["strategy"], cell["budget"], cell["n_paired"]) == ("full_context", 8192, 2)
    assert (cell["quality_a"], cell["quality_b"], cell["worse"]) == (1.0, 0.0, 2)
    assert diff.regressions(0.1)
