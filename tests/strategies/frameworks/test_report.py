"""The counter-error table: a policy's own count of its prompt against the exact count, and
the violations its counter let through; the estimate reaches the row from a real sweep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_budgetbench.records.episodes import EPISODES_FILE, read_episodes
from pytest_budgetbench.records.prompts import PROMPTS_FILE, read_prompts
from pytest_budgetbench.records.rows import Status
from pytest_budgetbench.reports import build_report
from pytest_budgetbench.reports.summary import percentile
from pytest_budgetbench.reports.synthetic import make_row, write_run
from tests.fake_openai import FakeOpenAI, agent_responder
from tests.sweeps import rows_of, sweep_args

pytest.importorskip("pandas")


def _row(item: str, budget: int, estimated: int | None, counted: int,
         status: Status = Status.OK) -> dict[str, object]:
    return make_row("memory", item, "langchain_trim_messages", budget, status=status,
                    counted_tokens=counted, estimated_tokens=estimated)


def test_the_error_is_exact_minus_estimate_and_violations_are_split_by_cause(
        tmp_path: Path) -> None:
    rows = [
        _row("a", 1000, 900, 950),                        # +50, fits
        _row("b", 1000, 990, 1100, Status.VIOLATION),    # +110: its counter let it through
        _row("c", 1000, 1200, 1300, Status.VIOLATION),   # +100: over by its own count too
        _row("d", 1000, 800, 780),                        # -20: it overcounted
        _row("e", 1000, None, 700),                       # no estimate: not in the table
        make_row("memory", "a", "truncation", 1000, counted_tokens=900),
    ]
    run = write_run(tmp_path / "run", rows)
    report = build_report([run], tmp_path / "out", plots=False, resamples=50)
    table = report.extra_tables["counter_error"].table
    assert list(table["strategy"]) == ["langchain_trim_messages"]
    line = table.iloc[0]
    assert line["cells"] == 4
    assert line["error_median"] == pytest.approx(75.0)  # of -20, 50, 100, 110
    assert (line["error_p95"], line["error_max"]) == (110, 110)
    assert line["undercounted"] == pytest.approx(0.75)
    assert (line["violations"], line["violations_caused"]) == (2, 1)
    document = json.loads((tmp_path / "out" / "report.json").read_text())
    assert document["counter_error"][0]["violations_caused"] == 1
    assert "own count against the exact count" in (tmp_path / "out" / "report.md").read_text()


def test_the_p95_is_the_nearest_rank_a_value_that_occurred() -> None:
    values = [float(v) for v in range(1, 21)]
    assert percentile(values, 0.95) == 19.0
    assert percentile([3.0], 0.95) == 3.0
    assert percentile([5.0, 1.0], 0.5) == 1.0


COUNTING = """
from pytest_budgetbench.strategies import Strategy

class Counting(Strategy):
    name = "counting"
    handles_tools = True

    def apply(self, messages, budget):
        self.context.estimated_tokens = len(messages)  # a counter of its own
        return list(messages)
"""


def test_a_strategys_estimate_reaches_its_row_and_an_episode_keeps_its_largest_calls(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makepyfile(counting=COUNTING)
    pytester.syspathinsert()
    fake = FakeOpenAI(responder=agent_responder).start()
    try:
        result = pytester.runpytest(*sweep_args(
            fake, tmp_path, "--budgets=100000", "--budgetbench-strategies=counting:Counting",
            "--budgetbench-tasks=memory,agent_lookup", "--budgetbench-items=2",
            "--budgetbench-audit=full"))
    finally:
        fake.stop()
    result.assert_outcomes(passed=4)
    rows = rows_of(tmp_path)
    (run_dir,) = (tmp_path / "out").glob("*/")
    single = {row["cell_id"]: row for row in rows if row["task"] == "memory"}
    prompts = list(read_prompts(run_dir / PROMPTS_FILE, single))
    assert len(prompts) == 2
    for prompt in prompts:
        assert single[prompt.cell_id]["estimated_tokens"] == len(prompt.messages) > 2
    episodes = read_episodes(run_dir / EPISODES_FILE)
    for row in (row for row in rows if row["task"] == "agent_lookup"):
        calls = episodes[row["cell_id"]].calls
        assert len(calls) >= 2
        # each call's own estimate: the messages its trajectory held when it was built
        assert [call.estimated_tokens for call in calls] == [call.seen for call in calls]
        largest = row["call_tokens"].index(max(row["call_tokens"]))
        assert row["estimated_tokens"] == calls[largest].seen
