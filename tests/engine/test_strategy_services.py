"""What the runner hands a strategy: named auxiliary models, options, and a row note."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fake_openai import FakeOpenAI
from tests.sweeps import rows_of, sweep_args

ASKING_STRATEGY = """
from pytest_budgetbench.options import Option, positive_int
from pytest_budgetbench.strategies import Strategy


class AskSmall(Strategy):
    name = "ask_small"
    declared_options = (Option("tier", "a tier", str.upper, "MID"),
                        Option("k", "a count", positive_int, 1))

    def apply(self, messages, budget):
        small = self.context.aux_models.get("small", self.context.aux)
        reply = small.complete(list(messages[-1:]), max_tokens=4, purpose="probe")
        self.context.info["reply"] = reply
        self.context.info["tier"] = self.context.options.get("tier")
        return list(messages[:1]) + list(messages[-1:])
"""


def test_named_aux_models_options_and_info_reach_the_row(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    pytester.makepyfile(ask_small=ASKING_STRATEGY)
    pytester.syspathinsert()
    small = FakeOpenAI(model="small-model").start()
    try:
        result = pytester.runpytest(*sweep_args(
            fake_endpoint, tmp_path, "--budgets=1024", "--budgetbench-items=2",
            "--budgetbench-strategies=ask_small:AskSmall",
            f"--budgetbench-aux-models=small={small.base_url}",
            "--budgetbench-strategy-options=tier=LOW,k=3"))
    finally:
        small.stop()
    result.assert_outcomes(passed=2)
    assert [r["model"] for r in small.requests] == ["small-model", "small-model"]
    assert len(fake_endpoint.requests) == 2  # the answers only
    for row in rows_of(tmp_path):
        (call,) = row["aux_calls"]
        assert call["model"] == "small" and call["purpose"] == "probe"
        assert row["strategy_info"] == {"reply": "unknown", "tier": "LOW"}
    run_info = json.loads(next((tmp_path / "out").glob("*/run.json")).read_text())
    assert run_info["settings"]["aux_models"] == {"small": small.base_url}


@pytest.mark.parametrize(
    ("option", "message"),
    [("--budgetbench-aux-models=small", "must be KEY=VALUE pairs"),
     ("--budgetbench-strategy-options=a=1,,b=2", "must be KEY=VALUE pairs"),
     ("--budgetbench-shard=3/2", "must be i/n with 1 <= i <= n"),
     ("--budgetbench-cache=maybe", "must be one of on|off|refresh"),
     ("--budgetbench-concurrency=0", "must be a positive integer"),
     ("--budgetbench-reference=truncation@abc", "names no strategy of this sweep")],
)
def test_bad_values_are_one_line_usage_errors(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path, option: str,
    message: str,
) -> None:
    result = pytester.runpytest(*sweep_args(fake_endpoint, tmp_path, "--budgets=1024", option))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}*"])
