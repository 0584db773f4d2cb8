"""Config a team writes once: an ini that lists every task's data, and an endpoint URL with
user info beside an API key (one credential is sent, and said, never printed)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_budgetbench.engine.preflight import check_settings
from pytest_budgetbench.engine.wiring import credential_line
from pytest_budgetbench.errors import ConfigError
from pytest_budgetbench.model.chat import ChatModel, probe_endpoint
from pytest_budgetbench.redact import forget_secrets, redact, request_target
from pytest_budgetbench.settings.config import Settings
from pytest_budgetbench.tokens.server import ServerCounter
from tests.fake_openai import FakeOpenAI
from tests.settings.test_config import load
from tests.sweeps import sweep_args

KEY = "sk-teamKEYabcdef123456"
PASSWORD = "pw-team-0042xyz"
BASIC = "Basic " + base64.b64encode(f"bob:{PASSWORD}".encode()).decode()
QUESTION = [{"role": "user", "content": "What is my dog called?"}]


@pytest.fixture(autouse=True)
def _fresh_secrets(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("BUDGETBENCH_DATA_HOTPOTQA", raising=False)
    forget_secrets()
    yield
    forget_secrets()


def _with_userinfo(fake: FakeOpenAI) -> str:
    return fake.base_url.replace("http://", f"http://bob:{PASSWORD}@")


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


# -- which credential goes -------------------------------------------------------------------
def test_the_api_key_wins_over_url_user_info(fake_endpoint: FakeOpenAI) -> None:
    url = _with_userinfo(fake_endpoint)
    assert probe_endpoint(url, KEY) == [fake_endpoint.model]
    ChatModel(url, fake_endpoint.model, api_key=KEY).complete(QUESTION, max_tokens=4)
    assert fake_endpoint.authorizations == [f"Bearer {KEY}"] * 2


def test_url_user_info_is_basic_auth_when_no_key_is_set(fake_endpoint: FakeOpenAI) -> None:
    url = _with_userinfo(fake_endpoint)
    probe_endpoint(url, None)
    ChatModel(url, fake_endpoint.model).complete(QUESTION, max_tokens=4)
    assert fake_endpoint.authorizations == [BASIC] * 2


def test_the_token_server_sends_the_key_too(fake_endpoint: FakeOpenAI) -> None:
    fake_endpoint.tokenize_routes = {"vllm"}
    ServerCounter(_with_userinfo(fake_endpoint), fake_endpoint.model, KEY).count_text("probe")
    assert set(fake_endpoint.authorizations) == {f"Bearer {KEY}"}


def test_request_target_drops_user_info_only_for_a_key() -> None:
    url = f"https://bob:{PASSWORD}@host:8443/v1?api-version=2"
    assert request_target(url, KEY) == ("https://host:8443/v1", {"api-version": "2"})
    assert request_target(url, None) == (f"https://bob:{PASSWORD}@host:8443/v1",
                                         {"api-version": "2"})


@pytest.mark.parametrize(("endpoint", "key", "says"), [
    (f"http://bob:{PASSWORD}@h:8/v1", KEY, "budgetbench: credential for http://h:8/v1: the "
     "API key in $OPENAI_API_KEY, as Bearer (the URL's user info is not sent)"),
    ("http://h:8/v1", KEY, "budgetbench: credential for http://h:8/v1: the API key in "
     "$OPENAI_API_KEY, as Bearer"),
    (f"http://bob:{PASSWORD}@h:8/v1", None, "budgetbench: credential for http://h:8/v1: the "
     "URL's user info, as Basic auth ($OPENAI_API_KEY is not set)"),
    ("http://h:8/v1?key=qs-secret-99", None, "budgetbench: credential for http://h:8/v1: "
     "none ($OPENAI_API_KEY is not set); the URL's query parameters go with every request"),
])
def test_the_credential_line_names_the_credential_and_no_secret(
    monkeypatch: pytest.MonkeyPatch, endpoint: str, key: str | None, says: str
) -> None:
    if key:
        monkeypatch.setenv("OPENAI_API_KEY", key)
    assert credential_line(load(cli={"endpoint": endpoint})) == says
    assert redact(says) == says  # printed through the redaction layer, unchanged


def test_no_credential_line_for_the_embedded_model() -> None:
    assert credential_line(load()) is None


def test_a_sweep_says_its_credential_once_and_sends_only_the_key(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    host = fake_endpoint.base_url.split("://", 1)[1]
    result = pytester.runpytest(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=4096", "--budgetbench-strategies=full_context",
        "--budgetbench-items=1", f"--budgetbench-endpoint={_with_userinfo(fake_endpoint)}",
        f"--junitxml={tmp_path / 'junit.xml'}"))
    result.assert_outcomes(passed=1)
    said = [line for line in result.outlines if line.startswith("budgetbench: credential")]
    assert said == [f"budgetbench: credential for http://{host}: the API key in "
                    "$OPENAI_API_KEY, as Bearer (the URL's user info is not sent)"]
    assert set(fake_endpoint.authorizations) == {f"Bearer {KEY}"}
    written = [p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file()]
    for text in (*written, result.stdout.str(), result.stderr.str()):
        assert KEY not in text and PASSWORD not in text
