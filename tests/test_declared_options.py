"""Declared options: tasks and strategies declare what they read; the plugin builds their
flags from the registries and rejects an unknown key or a bad value before any cell runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_budgetbench.errors import ConfigError
from pytest_budgetbench.options import Option, check_keys, check_required, choice, positive_int
from tests.fake_openai import FakeOpenAI
from tests.sweeps import sweep_args

CUSTOM_TASK = '''
from pytest_budgetbench.options import DataFile, Option, positive_int
from pytest_budgetbench.tasks import Grade, Item, Task


class MyTask(Task):
    name = "my_task"
    grader_version = "my-contains/1"
    data = DataFile("lines.txt")
    declared_options = (*Task.declared_options,
                        Option("my_repeat", "times the question is asked", positive_int, 1,
                               flag="my-repeat"))

    def load(self):
        lines = self.options.data_path.read_text().split()
        times = self.option("my_repeat")
        return [Item(f"q{i}", ({"role": "user", "content": " ".join([line] * times)},),
                     "yes", "all") for i, line in enumerate(lines)]

    def grade(self, item, prediction):
        return Grade(float("yes" in prediction.lower()), prediction, self.grader_version)
'''

OPTION_STRATEGY = '''
from pytest_budgetbench.options import Option, positive_int
from pytest_budgetbench.strategies import Strategy


class Keep(Strategy):
    name = "keep"
    declared_options = (Option("keep_last", "messages kept", positive_int, 1),)

    def apply(self, messages, budget):
        self.context.info["keep_last"] = self.context.options["keep_last"]
        return list(messages)[-self.context.options["keep_last"]:]
'''


def _no_cell_ran(fake: FakeOpenAI, tmp: Path) -> None:
    assert fake.requests == []
    assert not list((tmp / "out").glob("*/cells.jsonl"))


def _usage_line(result: pytest.RunResult, needle: str) -> str:
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    lines = [line for line in result.stderr.lines if needle in line]
    assert len(lines) == 1, result.stderr.lines
    assert "Traceback" not in result.stderr.str()
    return lines[0]


def _rows(tmp: Path) -> list[dict]:
    (cells,) = (tmp / "out").glob("*/cells.jsonl")
    return [json.loads(line) for line in cells.read_text().splitlines()]


# -- strategy options ---------------------------------------------------------------------
def test_misspelled_strategy_option_is_one_usage_line_and_no_cell_runs(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    result = pytester.runpytest(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=2048", "--budgetbench-strategies=budgetmem_low",
        "--budgetbench-strategy-options=budgetmem_axes=reasoning"))
    line = _usage_line(result, "budgetmem_axes")
    assert "unknown key 'budgetmem_axes'" in line and "budgetmem_low" in line
    assert "budgetmem_axis" in line and "budgetmem_top_k" in line  # the accepted keys
    _no_cell_ran(fake_endpoint, tmp_path)


def test_invalid_strategy_option_value_names_key_strategy_and_choices(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    result = pytester.runpytest(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=2048",
        "--budgetbench-strategies=truncation,budgetmem_mid",
        "--budgetbench-strategy-options=budgetmem_axis=reasonin"))
    line = _usage_line(result, "reasonin")
    assert "budgetmem_axis" in line and "strategy 'budgetmem_mid'" in line
    assert "implementation|reasoning|capacity" in line
    _no_cell_ran(fake_endpoint, tmp_path)


def test_a_key_only_another_strategy_declares_is_rejected(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    result = pytester.runpytest(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=2048", "--budgetbench-strategies=truncation",
        "--budgetbench-strategy-options=rag_chunk=64"))
    line = _usage_line(result, "rag_chunk")
    assert "no strategy of this sweep (truncation) declares it" in line
    _no_cell_ran(fake_endpoint, tmp_path)


def test_a_declared_strategy_option_reaches_the_strategy_parsed(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    pytester.makepyfile(keep=OPTION_STRATEGY)
    pytester.syspathinsert()
    result = pytester.runpytest(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=8192", "--budgetbench-items=1",
        "--budgetbench-strategies=keep:Keep", "--budgetbench-strategy-options=keep_last=2"))
    result.assert_outcomes(passed=1)
    (row,) = _rows(tmp_path)
    assert row["strategy_info"] == {"keep_last": 2}
    assert len(fake_endpoint.requests[0]["messages"]) == 2


# -- task options -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("pairs", "expected"),
    [
        ("history_token=600", "unknown key 'history_token'"),
        ("history_tokens=lots", "history_tokens (task 'memory') must be a positive integer"),
    ],
)
def test_misspelled_or_invalid_task_option_is_one_usage_line(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path, pairs: str,
    expected: str,
) -> None:
    result = pytester.runpytest(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=2048", f"--budgetbench-task-options={pairs}"))
    line = _usage_line(result, "--budgetbench-task-options")
    assert expected in line
    if "unknown" in expected:
        assert "history_tokens" in line and "chunk_tokens" in line  # the accepted keys
    _no_cell_ran(fake_endpoint, tmp_path)


def test_task_option_key_value_sets_what_the_old_flag_set(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    def prompt_chars(*extra: str) -> int:
        fake_endpoint.requests.clear()
        result = pytester.runpytest(*sweep_args(
            fake_endpoint, tmp_path, "--budgets=100000", "--budgetbench-items=1",
            "--budgetbench-strategies=full_context", "--budgetbench-cache=off", *extra))
        result.assert_outcomes(passed=1)
        return sum(len(str(m["content"])) for m in fake_endpoint.requests[0]["messages"])

    flag = prompt_chars("--budgetbench-memory-history=600")
    pair = prompt_chars("--budgetbench-task-options=history_tokens=600")
    longer = prompt_chars("--budgetbench-memory-history=3000")
    assert flag == pair < longer


# -- flags built from the registry --------------------------------------------------------
def _write_custom_task(pytester: pytest.Pytester, tmp_path: Path) -> Path:
    pytester.makepyfile(mytask=CUSTOM_TASK)
    pytester.syspathinsert()
    data = tmp_path / "lines.txt"
    data.write_text("alpha beta\n")
    return data


@pytest.mark.parametrize("flag", ["--budgetbench-data-my_task", "--budgetbench-data-my-task"])
def test_module_attr_task_gets_its_data_flag_and_own_flag(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path, flag: str
) -> None:
    data = _write_custom_task(pytester, tmp_path)
    result = pytester.runpytest(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=2048", "--budgetbench-strategies=full_context",
        "--budgetbench-tasks=mytask:MyTask", f"{flag}={data}", "--budgetbench-my-repeat=3"))
    result.assert_outcomes(passed=2)
    asked = [r["messages"][-1]["content"] for r in fake_endpoint.requests]
    assert sorted(asked) == ["alpha alpha alpha", "beta beta beta"]


def test_module_attr_task_data_from_the_ini_twin(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    data = _write_custom_task(pytester, tmp_path)
    pytester.makeini(f"[pytest]\nbudgetbench_tasks = mytask:MyTask\n"
                     f"budgetbench_data_my_task = {data}\n")
    result = pytester.runpytest(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=2048", "--budgetbench-strategies=full_context"))
    result.assert_outcomes(passed=2)


def test_entry_point_task_gets_its_data_flag(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    data = _write_custom_task(pytester, tmp_path)
    dist = pytester.path / "mytask-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mytask\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[budgetbench.tasks]\nmy_task = mytask:MyTask\n")
    result = pytester.runpytest(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=2048", "--budgetbench-strategies=full_context",
        "--budgetbench-tasks=my_task", f"--budgetbench-data-my_task={data}"))
    result.assert_outcomes(passed=2)


def test_data_env_var_still_reaches_its_task(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    missing = tmp_path / "nowhere" / "locomo10.json"
    monkeypatch.setenv("BUDGETBENCH_DATA_LOCOMO", str(missing))
    result = pytester.runpytest(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=2048", "--budgetbench-tasks=locomo"))
    line = _usage_line(result, "locomo")
    assert str(missing) in line and "--budgetbench-data-locomo=PATH" in line


def test_without_a_sweep_the_declared_flags_parse_and_nothing_runs(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile("def test_plain():\n    assert True\n")
    result = pytester.runpytest("--budgetbench-rag-chunk=64", "--budgetbench-locomo-samples=rest",
                                "--budgetbench-chunk-tokens=128", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


# -- the check itself ---------------------------------------------------------------------
class _Owner:
    name = "owner"
    declared_options = (Option("size", "a size", positive_int, 1),
                        Option("mode", "a mode", choice("a", "b"), "a"))


class _Other:
    name = "other"
    declared_options = (Option("size", "a size, stricter", choice("1", "2"), "1"),)


def test_check_keys_accepts_declared_keys_and_names_the_owner_of_a_bad_value() -> None:
    check_keys("strategy", "--x", {"size": "2", "mode": "b"}, [_Owner, _Other])
    with pytest.raises(ConfigError, match=r"--x: size \(strategy 'other'\) must be one of 1\|2 "
                                          r"\(got '3'\)"):
        check_keys("strategy", "--x", {"size": "3"}, [_Owner, _Other])
    with pytest.raises(ConfigError, match=r"unknown key 'sise'.*accepted keys: mode, size"):
        check_keys("strategy", "--x", {"sise": "3"}, [_Owner, _Other])


class _NeedsModel:
    name = "needs_model"
    declared_options = (Option("model_dir", "where its model is", str, None, metavar="DIR",
                               flag="model-dir", required=True),)


def test_check_required_asks_for_a_required_option_only_when_it_is_missing() -> None:
    check_required("strategy", "--x", {"model_dir": "m"}, [_NeedsModel, _Other])
    check_required("strategy", "--x", {}, [_Other])  # no class of the sweep requires it
    with pytest.raises(ConfigError, match=r"^strategy 'needs_model' needs model_dir, where its "
                                          r"model is: pass --x=model_dir=DIR \(or "
                                          r"--budgetbench-model-dir\)$"):
        check_required("strategy", "--x", {"size": "2"}, [_Other, _NeedsModel])
