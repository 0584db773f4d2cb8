"""Config a team writes once: an ini that lists every task's data, and an endpoint URL with
user info beside an API key (one credential is sent, and said, never printed)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_budgetbench.config import Settings
from pytest_budgetbench.errors import ConfigError
from pytest_budgetbench.preflight import check_settings
from pytest_budgetbench.redact import forget_secrets
from tests.fake_openai import FakeOpenAI
from tests.test_config import load
from tests.test_plugin import sweep_args


@pytest.fixture(autouse=True)
def _fresh_secrets(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("BUDGETBENCH_DATA_HOTPOTQA", raising=False)
    forget_secrets()
    yield
    forget_secrets()


# -- data of tasks the sweep does not run --------------------------------------------------
def _checked(tmp_path: Path, **given: dict[str, str]) -> Settings:
    settings = load(cli={"budgets": "512", "tasks": "memory", "endpoint": "http://h/v1",
                         "out": str(tmp_path), **given.get("cli", {})},
                    ini=given.get("ini"))
    check_settings(settings)
    return settings


def test_an_ini_data_path_for_a_task_outside_the_sweep_is_ignored(tmp_path: Path) -> None:
    _checked(tmp_path, ini={"budgetbench_data_hotpotqa": "/data/hotpot.json"})


def test_an_env_data_path_for_a_task_outside_the_sweep_is_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BUDGETBENCH_DATA_HOTPOTQA", "/data/hotpot.json")
    _checked(tmp_path)


def test_a_data_flag_for_a_task_outside_the_sweep_is_still_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--budgetbench-data-hotpotqa is given but task "
                                          "'hotpotqa' is not in this sweep"):
        _checked(tmp_path, cli={"data_hotpotqa": "/data/hotpot.json"},
                 ini={"budgetbench_data_hotpotqa": "/data/other.json"})


def test_where_a_data_path_came_from_is_not_recorded(tmp_path: Path) -> None:
    settings = _checked(tmp_path, ini={"budgetbench_data_hotpotqa": "/data/hotpot.json"})
    assert "data_flags" not in settings.public()


def test_an_ini_listing_every_tasks_data_runs_a_subset(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    pytester.makeini("[pytest]\nbudgetbench_data_hotpotqa = data/hotpot.json\n"
                     "budgetbench_data_locomo = data/locomo10.json\n")
    result = pytester.runpytest(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=4096", "--budgetbench-strategies=full_context",
        "--budgetbench-tasks=memory", "--budgetbench-items=2"))
    result.assert_outcomes(passed=2)
