"""Teacher-forced agent episodes (--budgetbench-episodes=teacher-forced): at each step of
the task's reference trajectory the strategy builds the prompt from the reference so far,
the budget holds on the call, the model predicts the next action and is scored, and the
reference action with its real result follows, whatever the model predicted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.messages import tool_calls_of
from pytest_budgetbench.tasks.agent_lookup import AgentLookupTask
from pytest_budgetbench.tasks.base import ReferenceStep, TaskOptions, same_calls_step
from tests.engine.test_episodes import agent, episodes_of, lookup_args  # noqa: F401 (a fixture)
from tests.fake_openai import FakeOpenAI, agent_responder
from tests.sweeps import rows_of

pytest_plugins = ["pytester"]

FORCED = "--budgetbench-episodes=teacher-forced"


def stubborn_responder(messages: list[dict[str, Any]]) -> str | dict[str, Any]:
    """A model that looks up the first record at every step, whatever it has seen."""
    request = next(m["content"] for m in messages if m.get("role") == "user")
    first = request.split("in this order: ")[1].split(",")[0]
    return {"content": None, "tool_calls": [{"id": "call_x", "type": "function", "function": {
        "name": "lookup", "arguments": json.dumps({"key": first})}}]}


@pytest.fixture
def stubborn() -> Iterator[FakeOpenAI]:
    fake = FakeOpenAI(responder=stubborn_responder).start()
    yield fake
    fake.stop()


def test_each_reference_step_is_predicted_scored_and_followed_by_the_reference(
    pytester: pytest.Pytester, agent: FakeOpenAI, tmp_path: Path  # noqa: F811
) -> None:
    """The scripted agent predicts every step right when it sees the whole reference; with
    old tool results masked at a small budget it loses the answer step (the code), not the
    lookups (the request still says which comes next)."""
    result = pytester.runpytest(*lookup_args(
        agent, tmp_path, "--budgets=8192,700", FORCED,
        "--budgetbench-strategies=full_context,observation_masking"))
    header = next(line for line in result.stdout.lines if "name acc." in line)
    masked_line = next(line for line in result.stdout.lines
                       if line.split()[:2] == ["observation_masking", "700"])
    # quality is the exact step accuracy, name acc. the name-only one; then retention.
    column = header.split().index("quality")
    assert masked_line.split()[column] == "0.800" and masked_line.split()[-2:][0] == "1.000"
    rows = {(r["item_id"], r["strategy"], r["budget"]): r for r in rows_of(tmp_path)}
    full = rows[("0000", "full_context", 8192)]
    assert (full["status"], full["episode_mode"], full["steps"], full["steps_exact"],
            full["steps_name"], full["quality"], full["name_accuracy"]) == (
        "ok", "teacher-forced", 5, 5, 5, 1.0, 1.0)
    assert full["grader"] == "agent-lookup-contains/1+same-calls/1"
    masked = rows[("0000", "observation_masking", 700)]
    assert (masked["status"], masked["steps"], masked["steps_exact"], masked["steps_name"],
            masked["quality"], masked["name_accuracy"]) == ("ok", 5, 4, 5, 0.8, 1.0)
    assert masked["evidence_retention"] is not None and masked["evidence_retention"] < 1.0
    assert all(call <= 700 for call in masked["call_tokens"])
    episode = episodes_of(tmp_path)[masked["cell_id"]]
    assert [call["step"] for call in episode["calls"]] == [1, 2, 3, 4, 5]
    assert [call["exact"] for call in episode["calls"]] == [True, True, True, True, False]
    assert episode["calls"][-1]["predicted"]["content"] == "unknown"
    # The trajectory is the reference's: its calls carry the reference's ids.
    reference_ids = [call["id"] for m in episode["trajectory"] for call in tool_calls_of(m)]
    assert reference_ids == ["ref-0", "ref-1", "ref-2", "ref-3"]
    # The viewer shows each step's scores and the model's prediction beside the reference.
    from pytest_budgetbench.reports.viewer import Side, viewer_data
    from tests.reports.test_viewer import cells_of

    (cells_file,) = (tmp_path / "out").glob("*/cells.jsonl")
    cells = cells_of(rows_of(tmp_path))
    items = viewer_data([Side("", [cells_file.parent])], cells)["items"]
    column = next(i for i, cell in enumerate(cells)
                  if (cell.strategy, cell.budget) == ("observation_masking", 700))
    item = next(item for item in items if item["key"].endswith("0000"))
    last = next(row for row in item["rows"] if row["c"] == column)["ep"]["calls"][-1]
    assert (last["sp"], last["sx"], last["sn"]) == (5, False, True)
    assert item["msgs"][last["pr"]][:2] == ["assistant", "unknown"]
    # Each call lists the evidence shown so far, each span kept or dropped: masked here.
    assert [(span.startswith("Record R"), kept) for span, kept in last["ev"]] == [(True, False)]
    assert episode["calls"][-1]["evidence"] == [[last["ev"][0][0], False]]


def test_a_wrong_prediction_does_not_change_the_trajectory_that_follows(
    pytester: pytest.Pytester, stubborn: FakeOpenAI, tmp_path: Path
) -> None:
    pytester.runpytest(*lookup_args(stubborn, tmp_path, "--budgets=8192", FORCED,
                                    "--budgetbench-strategies=full_context"))
    row = rows_of(tmp_path)[0]
    # Right at the first lookup only; the right function at every lookup; no answer.
    assert (row["steps"], row["steps_exact"], row["steps_name"], row["quality"],
            row["name_accuracy"]) == (5, 1, 4, 0.2, 0.8)
    episode = episodes_of(tmp_path)[row["cell_id"]]
    results = [m["content"] for m in episode["trajectory"] if m["role"] == "tool"]
    keys = [json.loads(call["function"]["arguments"])["key"]
            for m in episode["trajectory"] for call in tool_calls_of(m)]
    assert len(set(keys)) == 4 and all(f"Record {key}:" in text
                                       for key, text in zip(keys, results, strict=True))


def test_a_step_over_budget_ends_the_episode_as_a_violation(
    pytester: pytest.Pytester, agent: FakeOpenAI, tmp_path: Path  # noqa: F811
) -> None:
    pytester.runpytest(*lookup_args(agent, tmp_path, "--budgets=500", FORCED,
                                    "--budgetbench-strategies=full_context"))
    row = rows_of(tmp_path)[0]
    assert row["status"] == "violation" and row["quality"] is None
    assert row["violated_call"] == row["steps"] and row["steps"] < 5
    assert "would send" in row["error"]


def test_model_free_teacher_forced_counts_every_step_and_sends_nothing(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.runpytest("--budgetbench-model=none", FORCED, "--budgets=8192,700",
                       "--budgetbench-tokenizer=approx", "--budgetbench-tasks=agent_lookup",
                       "--budgetbench-items=2", "--budgetbench-task-options=lookups=4",
                       "--budgetbench-memory-history=1200",
                       "--budgetbench-strategies=full_context,observation_masking",
                       f"--budgetbench-out={tmp_path / 'out'}", "-p", "no:cacheprovider")
    rows = {(r["item_id"], r["strategy"], r["budget"]): r for r in rows_of(tmp_path)}
    full = rows[("0000", "full_context", 8192)]
    assert (full["status"], full["steps"], full["steps_exact"], full["quality"]) == (
        "ok", 5, None, None)
    assert full["evidence_retention"] == 1.0 and full["evidence_total"] == 4  # steps 2-5
    masked = rows[("0000", "observation_masking", 700)]
    assert masked["evidence_retention"] < 1.0
    episode = episodes_of(tmp_path)[masked["cell_id"]]
    assert all(call["cached"] is None and call["predicted"] is None
               for call in episode["calls"])


@pytest.mark.parametrize(("extra", "expected"), [
    (["--budgetbench-tasks=memory"],
     "*--budgetbench-episodes=teacher-forced runs agent episodes, and no task of the sweep "
     "(memory) is one: *"),
    (["--budgetbench-tasks=plain_agent:NoReference"],
     "*--budgetbench-episodes=teacher-forced: task 'no_reference' has no reference "
     "trajectory to force (its reference_steps gives none); *"),
])
def test_teacher_forcing_what_has_no_reference_is_one_line_before_any_cell(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path,
    extra: list[str], expected: str
) -> None:
    pytester.makepyfile(plain_agent="""
        from pytest_budgetbench.tasks.agent_lookup import AgentLookupTask
        from pytest_budgetbench.tasks import EpisodicTask

        class NoReference(AgentLookupTask):
            name = "no_reference"
            reference_steps = EpisodicTask.reference_steps
        """)
    pytester.syspathinsert()
    result = pytester.runpytest(
        FORCED, "--budgets=8192", f"--budgetbench-endpoint={fake_endpoint.base_url}",
        "--budgetbench-tokenizer=approx", "--budgetbench-strategies=full_context",
        f"--budgetbench-out={tmp_path / 'out'}", "-p", "no:cacheprovider", *extra)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([expected])
    assert fake_endpoint.requests == []


def test_the_default_step_checker_compares_names_then_parsed_arguments() -> None:
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "lookup",
                                                     "arguments": '{"key": "R1"}'}}]}
    reference = ReferenceStep(call)
    spaced = {**call, "tool_calls": [{**call["tool_calls"][0], "function": {
        "name": "lookup", "arguments": '{ "key" : "R1" }'}}]}
    other = {**call, "tool_calls": [{**call["tool_calls"][0], "function": {
        "name": "lookup", "arguments": '{"key": "R2"}'}}]}
    assert same_calls_step(spaced, reference).exact
    assert (same_calls_step(other, reference).exact, same_calls_step(other, reference).name) \
        == (False, True)
    text = {"role": "assistant", "content": "R1"}
    assert (same_calls_step(text, reference).exact, same_calls_step(text, reference).name) \
        == (False, False)


def test_agent_lookup_reference_replays_into_the_answer_its_grader_accepts() -> None:
    task = AgentLookupTask(TaskOptions(items=3))
    for item in task.load():
        environment = task.environment(item)
        trajectory = environment.start()
        steps = task.reference_steps(item)
        for index, step in enumerate(steps):
            assert task.score_step(item, steps, index, step.action).exact
            trajectory.append(step.action)
            following = environment.respond(step.action)
            if following is None:
                break
            trajectory += following
        assert index == len(steps) - 1
        assert task.grade_trajectory(item, trajectory).quality == 1.0
        assert all(span in json.dumps(trajectory) for span in item.evidence)
        assert agent_responder(trajectory[:-1]) == item.answer  # the scripted agent agrees
