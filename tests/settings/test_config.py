"""Settings: precedence, validation that names the bad value, and no secret in records."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any, get_type_hints

import pytest

from pytest_budgetbench.engine.declared import flag_specs
from pytest_budgetbench.errors import ConfigError
from pytest_budgetbench.options import Option
from pytest_budgetbench.settings.config import (
    OPTIONS,
    Settings,
    literal_values,
    load_settings,
    parse_budgets,
)

DECLARED = flag_specs()
ALL = (*OPTIONS, *DECLARED)

SECRET = "sk-secret-123"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for spec in ALL:
        if spec.env:
            monkeypatch.delenv(spec.env, raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


def _default(dest: str) -> Any:
    return next(spec.default for spec in ALL if spec.dest == dest)


def lookups(
    cli: dict[str, Any] | None = None, ini: dict[str, str] | None = None
) -> tuple[Callable[[str], Any], Callable[[str], Any]]:
    """Stand-ins for config.getoption (None when not given) and config.getini ("" when unset)."""
    cli = cli or {}
    ini = ini or {}
    return (lambda dest: cli.get(dest)), (lambda name: ini.get(name, ""))


def load(cli: dict[str, Any] | None = None, ini: dict[str, str] | None = None) -> Settings:
    return load_settings(*lookups(cli, ini), DECLARED)


def test_defaults() -> None:
    settings = load()
    assert settings == Settings()
    assert settings.active is False
    assert settings.endpoint is None
    assert settings.items == _default("items")
    assert settings.data_paths == {}


def test_cli_beats_ini_beats_env_beats_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load().endpoint is None
    monkeypatch.setenv("BUDGETBENCH_ENDPOINT", "http://env:1/v1")
    assert load().endpoint == "http://env:1/v1"
    ini = {"budgetbench_endpoint": "http://ini:2/v1"}
    assert load(ini=ini).endpoint == "http://ini:2/v1"
    assert load(cli={"endpoint": "http://cli:3/v1"}, ini=ini).endpoint == "http://cli:3/v1"


def test_precedence_for_an_option_without_env() -> None:
    assert load().items == _default("items")
    assert load(ini={"budgetbench_items": "97"}).items == 97
    assert load(cli={"items": "3"}, ini={"budgetbench_items": "97"}).items == 3


def test_empty_ini_or_env_falls_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BUDGETBENCH_ENDPOINT", "")
    assert load(ini={"budgetbench_endpoint": ""}).endpoint is None


def test_data_paths_come_from_env_and_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BUDGETBENCH_DATA_HOTPOTQA", "/data/hotpot.json")
    settings = load(cli={"data_needle": "/data/needle"})
    assert settings.data_paths == {"hotpotqa": "/data/hotpot.json", "needle": "/data/needle"}


def test_declared_flags_land_by_key_and_key_value_pairs_win() -> None:
    settings = load(cli={"memory_history": "600", "rag_chunk": "64", "locomo_samples": "rest",
                         "strategy_options": "rag_chunk=32"})
    assert settings.task_flags == {"history_tokens": "600", "locomo_samples": "rest"}
    assert settings.strategy_flags == {"rag_chunk": "64"}
    assert settings.raw_strategy_options() == {"rag_chunk": "32"}
    assert settings.raw_task_options()["history_tokens"] == "600"


def test_declared_flag_reads_its_ini_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BUDGETBENCH_LOCOMO_SAMPLES", "first")
    assert load().task_flags == {"locomo_samples": "first"}
    assert load(ini={"budgetbench_chunk_tokens": "64"}).task_flags["chunk_tokens"] == "64"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("2048", (2048,)), ("8192, 2048,512", (512, 2048, 8192)), (" 4096 ", (4096,))],
)
def test_budgets_are_sorted_and_deduplicated(raw: str, expected: tuple[int, ...]) -> None:
    assert parse_budgets(raw) == expected
    settings = load(cli={"budgets": raw})
    assert settings.budgets == expected
    assert settings.active is True


def test_name_lists_are_split_and_stripped() -> None:
    settings = load(cli={"strategies": " truncation , rag,", "tasks": "memory"})
    assert settings.strategies == ("truncation", "rag")
    assert settings.tasks == ("memory",)


@pytest.mark.parametrize(
    ("dest", "raw"),
    [
        ("budgets", "abc"),
        ("budgets", "0"),
        ("budgets", "-1"),
        ("budgets", ""),
        ("budgets", "2048,x"),
        ("budgets", "2048,,4096"),
        ("budgets", "1.5"),
        ("items", "0"),
        ("items", "many"),
        ("seed", "x"),
        ("tokenizer", "hf:"),
        ("tokenizer", "gguf:"),
        ("tokenizer", "bogus"),
        ("audit", "x"),
        ("shuffle", "yes"),
        ("max_violation_rate", "1.5"),
        ("max_violation_rate", "-0.1"),
        ("max_violation_rate", "lots"),
        ("min_answer_kept", "1.5"),
        ("min_answer_kept", "truncation@x=0.5"),
        ("temperature", "-1"),
        ("rag_chunk", "0"),
        ("memory_history", "0"),
        ("chunk_tokens", "many"),
        ("reference", "@8192"),
        ("reference", "@8192"),
    ],
)
def test_bad_values_raise_config_error_naming_the_value(dest: str, raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(cli={dest: raw})
    message = str(info.value)
    assert repr(raw) in message or f"={raw} " in message
    spec = next(s for s in ALL if s.dest == dest)
    assert spec.flags[0] in message  # and the option it belongs to


@pytest.mark.parametrize(("cli", "expected"), [
    ({"min_retention": "truncation@2048=0.5,truncation@2048=0"},
     "--budgetbench-min-retention sets 'truncation@2048' twice with different values, 0.5 "
     "and 0: keep the one you mean"),
    ({"min_retention": "0.5,0"}, "--budgetbench-min-retention sets the floor of every "
     "non-reference strategy@budget twice with different values, 0.5 and 0"),
    ({"min_answer_kept": "rag@2048=0.5,rag@2048=0.6"},
     "--budgetbench-min-answer-kept sets 'rag@2048' twice with different values"),
    ({"task_options": "history_tokens=600,history_tokens=900"},
     "--budgetbench-task-options sets 'history_tokens' twice with different values"),
    ({"strategy_options": "rag_chunk=64,rag_chunk=128"},
     "--budgetbench-strategy-options sets 'rag_chunk' twice with different values"),
    ({"aux_models": "aux=http://a/v1,aux=http://b/v1"},
     "--budgetbench-aux-models sets 'aux' twice with different values"),
    ({"grader": "locomo:first-line,locomo:official"},
     "--budgetbench-grader sets task 'locomo' twice with different values"),
    ({"named_tasks": "a=jsonl(path=x.jsonl),a=jsonl(path=y.jsonl)"},
     "--budgetbench-named-tasks sets task 'a' twice with different values"),
    ({"named_tasks": "a=jsonl(path=x.jsonl)", "tasks": "a=jsonl(path=y.jsonl)"},
     "--budgetbench-tasks with --budgetbench-named-tasks sets task 'a' twice with different "
     "values"),
])
def test_a_key_given_twice_with_different_values_is_refused_never_last_wins(
    cli: dict[str, str], expected: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load(cli=cli)
    assert str(info.value).startswith(expected)


def test_a_key_given_twice_with_the_same_value_is_taken_once() -> None:
    settings = load(cli={"min_retention": "0.5,truncation@2048=0.2,0.5,truncation@2048=0.2",
                         "task_options": "history_tokens=600,history_tokens=600"})
    assert settings.min_retention == {"": 0.5, "truncation@2048": 0.2}
    assert settings.task_options == {"history_tokens": "600"}


def test_an_answer_kept_floor_is_read_as_the_retention_floors_are() -> None:
    settings = load(cli={"min_answer_kept": "0.6,rag@2048=0.8"})
    assert settings.min_answer_kept == {"": 0.6, "rag@2048": 0.8}
    assert settings.answer_kept_floor("rag", 2048, reference=False) == 0.8
    assert settings.answer_kept_floor("truncation", 2048, reference=False) == 0.6
    assert settings.answer_kept_floor("full_context", 2048, reference=True) is None
    assert settings.retention_floor("rag", 2048, reference=False) is None  # its own flag


def test_core_task_and_strategy_options_are_one_type() -> None:
    assert all(type(spec) is Option for spec in ALL)
    assert {spec.section for spec in OPTIONS} == {""}
    assert {spec.section for spec in DECLARED} == {"data", "task", "strategy"}


def test_each_core_default_and_choice_is_stated_once_in_settings() -> None:
    hints = get_type_hints(Settings)
    for spec in OPTIONS:
        field = next(f for f in dataclasses.fields(Settings) if f.name == spec.dest)
        assert spec.default == (None if field.default is dataclasses.MISSING else field.default)
        for value in literal_values(hints[spec.dest]):
            assert spec.read(value.upper(), "x") == value
        if literal_values(hints[spec.dest]):
            with pytest.raises(ConfigError, match="must be one of " + "[|]".join(
                    literal_values(hints[spec.dest]))):
                spec.read("neither", spec.flags[0])
    assert literal_values(hints["cache"]) == ("on", "off", "refresh")


@pytest.mark.parametrize(("dest", "raw", "expected"),
                         [("report", "OFF", "off"), ("audit", "Hash", "hash"),
                          ("cache", " Refresh ", "refresh"), ("vision", "on", "on")])
def test_a_choice_is_taken_in_any_case(dest: str, raw: str, expected: str) -> None:
    assert getattr(load(cli={dest: raw}), dest) == expected


def test_a_bad_choice_names_the_choices_and_the_value() -> None:
    with pytest.raises(ConfigError, match=r"^--budgetbench-report must be one of on\|off "
                                          r"\(got 'maybe'\)$"):
        load(cli={"report": "maybe"})


def test_bad_ini_value_raises_too() -> None:
    with pytest.raises(ConfigError, match="'abc'"):
        load(ini={"budgetbench_budgets": "abc"})


def test_unicode_digit_budget_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        load(cli={"budgets": "²"})


@pytest.mark.parametrize("rate", ["0", "0.05", "1"])
def test_valid_rates(rate: str) -> None:
    assert load(cli={"max_violation_rate": rate}).max_violation_rate == float(rate)


def test_valid_reference_values() -> None:
    assert load(cli={"reference": "full_context@8192"}).reference == "full_context@8192"
    assert load(cli={"reference": "full_context"}).reference == "full_context"


def test_the_regression_test_defaults_to_non_inferiority_which_needs_a_margin() -> None:
    gate = {"baseline": "old/report.json", "max_regression": "0.05"}
    assert load(cli=gate).regression_test == "noninferiority"
    assert load(cli=gate, ini={"budgetbench_regression_test": "harm"}).regression_test == "harm"
    with pytest.raises(ConfigError, match="must be one of"):
        load(cli={**gate, "regression_test": "strict"})
    with pytest.raises(ConfigError, match=r"--budgetbench-max-regression=0 under the "
                       r"non-inferiority test can never pass.*--budgetbench-regression-test=harm"):
        load(cli={**gate, "max_regression": "0"})
    assert load(cli={**gate, "max_regression": "0", "regression_test": "harm"}) \
        .max_regression == 0.0


def test_baseline_without_max_regression_raises() -> None:
    with pytest.raises(ConfigError, match="go together"):
        load(cli={"baseline": "old/report.json"})
    with pytest.raises(ConfigError, match="go together"):
        load(cli={"max_regression": "0.05"})
    settings = load(cli={"baseline": "old/report.json", "max_regression": "0.05"})
    assert settings.baseline == "old/report.json"
    assert settings.max_regression == 0.05


def test_judge_endpoint_without_judge_model_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError) as info:
        load(cli={"judge_endpoint": "http://judge:9/v1"})
    assert "--budgetbench-judge-model" in str(info.value)
    assert "http://judge:9/v1" in str(info.value)
    monkeypatch.setenv("BUDGETBENCH_JUDGE_MODEL", "judge-1")
    settings = load(cli={"judge_endpoint": "http://judge:9/v1"})
    assert settings.judge_model == "judge-1"


def test_public_settings_never_contain_the_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    settings = load(cli={"budgets": "512", "endpoint": "http://host:1/v1"})
    assert settings.api_key == SECRET
    public = json.dumps(settings.public(), default=str)
    assert SECRET not in public
    assert "OPENAI_API_KEY" in public  # the variable's name is fine to record


def test_api_key_from_a_custom_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_LLM_KEY", SECRET)
    settings = load(cli={"api_key_env": "MY_LLM_KEY"})
    assert settings.api_key == SECRET
    assert SECRET not in json.dumps(settings.public(), default=str)
    monkeypatch.setenv("MY_LLM_KEY", "")
    assert settings.api_key is None


def test_public_settings_redact_a_key_in_the_endpoint_url() -> None:
    settings = load(cli={"endpoint": f"https://user:{SECRET}@api.example.com/v1?key={SECRET}"})
    assert SECRET not in json.dumps(settings.public(), default=str)


def test_a_budget_search_from_the_ini_is_its_grid_model_free_unless_a_model_is_named(
) -> None:
    from pytest_budgetbench.sweep.search import BudgetSearch

    ini = {"budgetbench_budgets": "search:512..1024", "budgetbench_min_retention": "0.9",
           "budgetbench_search_step": "128"}
    settings = load(ini=ini)
    assert settings.search == BudgetSearch(512, 1024, 128)
    assert settings.budgets == (512, 640, 768, 896, 1024) and settings.active
    assert settings.model_free
    named = load(cli={"model": "qwen"}, ini=ini)
    assert (named.model, named.model_free) == ("qwen", False)
    served = load(cli={"endpoint": "http://host:1/v1"}, ini=ini)
    assert served.model is None and not served.model_free
    assert load(cli={"budgets": "512,1024"}, ini={"budgetbench_search_step": "128"}).search \
        is None  # a step alone, from a team's ini, searches nothing
    assert json.loads(json.dumps(settings.public(), default=str))["search"] == {
        "lo": 512, "hi": 1024, "step": 128}
