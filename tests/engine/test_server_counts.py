"""Sweeps against the servers teams run: ``auto`` counts through the server and run.json
says which and how; a server whose context is smaller than the largest budget is refused
before any cell; a prompt the server cut is an error naming both counts, never a grade,
and its reply is not kept in the response cache."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.records.run_json import read_run, server_of
from pytest_budgetbench.tokens.approximate import ApproxCounter
from tests.fake_openai import FakeOpenAI, agent_responder
from tests.fake_servers import VLLM, FakeServer, LlamaServer
from tests.sweeps import rows_of, sweep_args

pytest_plugins = ["pytester"]


def _auto(fake: FakeOpenAI, tmp: Path, *extra: str) -> list[str]:
    return sweep_args(fake, tmp, "--budgetbench-tokenizer=auto", "--budgetbench-items=2",
                      *extra)


def test_auto_against_llama_server_counts_exactly_and_run_json_says_how(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    fake_endpoint.server = LlamaServer(8192)
    result = pytester.runpytest(*_auto(fake_endpoint, tmp_path, "--budgets=8192",
                                       "--budgetbench-memory-history=600"))
    result.assert_outcomes(passed=4)
    for row in rows_of(tmp_path):
        assert row["tokenizer"] == "server:/apply-template+/tokenize"
        assert row["tokenizer_exact"] is True and row["token_count_match"] is True
    (run,) = [d for d in (tmp_path / "out").iterdir() if d.is_dir()]
    info = read_run(run)
    assert info is not None
    server = server_of(info)
    assert server is not None
    assert (server["kind"], server["context"]) == ("llama-server", 8192)
    assert server["counter"] == "server:/apply-template+/tokenize"
    assert server["exact"] == "all exact"
    assert server["probed"][0] == "GET /props: HTTP 200"


def test_a_server_whose_context_is_below_the_largest_budget_is_refused_before_any_cell(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    fake_endpoint.server = LlamaServer(1024)
    result = pytester.runpytest(*_auto(fake_endpoint, tmp_path, "--budgets=512,2048"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.stderr.lines if line.startswith("ERROR:")]
    assert len(errors) == 1, result.stderr.str()
    result.stderr.fnmatch_lines([
        "*the llama-server at * holds 1024 tokens of context (GET /props "
        "default_generation_settings.n_ctx), below the sweep's largest budget 2048: its "
        "prompts would be cut or refused; start llama-server with a larger -c*"])
    assert fake_endpoint.requests == [] and not list((tmp_path / "out").glob("*/cells.jsonl"))


def _cached_replies(tmp: Path) -> int:
    with sqlite3.connect(tmp / "out" / "responses.sqlite") as db:
        return int(db.execute("SELECT count(*) FROM responses").fetchone()[0])


def test_a_prompt_the_server_cut_is_an_error_naming_both_counts_and_is_not_cached(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    fake_endpoint.server = VLLM(context=None)  # exact counts; it reports no context
    fake_endpoint.cut_at = 300  # and cuts longer prompts silently, as Ollama does
    args = _auto(fake_endpoint, tmp_path, "--budgets=256,4096")
    result = pytester.runpytest(*args)
    rows = {(row["strategy"], row["budget"]): row for row in rows_of(tmp_path)
            if row["item_id"] == rows_of(tmp_path)[0]["item_id"]}
    cut = rows[("full_context", 4096)]
    assert cut["status"] == "error" and cut["quality"] is None and cut["prediction"] is None
    assert cut["server_prompt_tokens"] == 300 and cut["token_count_match"] is False
    assert (f"the server counted 300 prompt tokens where the sweep sent "
            f"{cut['counted_tokens']} (tokenizer server:/tokenize exact): it cut the prompt"
            ) in cut["error"]
    assert "likely cause: the server's context size" in cut["error"]
    whole = rows[("truncation", 256)]
    assert whole["status"] == "ok" and whole["token_count_match"] is True
    statuses = [row["status"] for row in rows_of(tmp_path)]
    result.assert_outcomes(passed=statuses.count("ok"), errors=statuses.count("error"),
                           xfailed=statuses.count("violation"))
    # Only the whole prompts' replies are kept: a rerun would send the cut ones again.
    assert statuses.count("error") and _cached_replies(tmp_path) == statuses.count("ok")


def test_an_agent_episode_whose_call_was_cut_is_an_error_naming_the_call(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    agent = FakeOpenAI(responder=agent_responder).start()
    try:
        agent.server = VLLM(context=None)
        agent.cut_at = 900  # the first calls fit, a later one is cut
        result = pytester.runpytest(*sweep_args(
            agent, tmp_path, "--budgets=8192", "--budgetbench-strategies=full_context",
            "--budgetbench-tokenizer=auto",
            "--budgetbench-tasks=agent_lookup", "--budgetbench-items=1",
            "--budgetbench-task-options=lookups=4", "--budgetbench-memory-history=1200"))
    finally:
        agent.stop()
    result.assert_outcomes(errors=1)
    (row,) = rows_of(tmp_path)
    assert row["status"] == "error" and row["quality"] is None
    assert "it cut the prompt" in row["error"] and "of the episode" in row["error"]
    assert "answered call 1 " not in row["error"]  # the first call was whole


class _CountsALittleLess(FakeServer):
    """A server whose tokenizer counts each prompt 2 tokens under chars/4."""

    def prompt_tokens(self, payload: dict[str, Any]) -> int:
        return ApproxCounter().count_messages(payload["messages"], payload.get("tools")) - 2


def test_a_small_difference_on_an_approximate_counter_stays_a_warning(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    fake_endpoint.server = _CountsALittleLess()
    result = pytester.runpytest(*sweep_args(fake_endpoint, tmp_path, "--budgets=4096",
                                            "--budgetbench-items=2"))
    result.assert_outcomes(passed=4)
    rows = rows_of(tmp_path)
    assert all(row["status"] == "ok" and row["token_count_match"] is False for row in rows)
    assert all(row["server_prompt_tokens"] == row["counted_tokens"] - 2 for row in rows)
    result.stdout.fnmatch_lines(["*warning: on 4 admitted cells our token count differs from "
                                 "the server's usage.prompt_tokens*"])


def test_a_cut_on_an_approximate_counter_past_its_slack_is_an_error(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    fake_endpoint.cut_at = 100
    result = pytester.runpytest(*sweep_args(fake_endpoint, tmp_path, "--budgets=4096",
                                            "--budgetbench-items=1",
                                            "--budgetbench-strategies=full_context"))
    result.assert_outcomes(errors=1)
    (row,) = rows_of(tmp_path)
    assert row["counted_tokens"] > 200  # more than twice what the server saw
    assert "(tokenizer approx-chars/4 approx, slack " in row["error"]
    assert row["server_prompt_tokens"] == 100



def test_a_gguf_counter_rendering_arguments_as_text_allows_for_them_and_no_more() -> None:
    """llama-server renders parsed arguments 2 tokens shorter a call than the JSON text a
    gguf: counter renders (measured): that is no cut; a message lost is."""
    from pytest_budgetbench.engine.calls import cut_by_server
    from pytest_budgetbench.model.chat import Completion
    from pytest_budgetbench.tokens.gguf import GGUFCounter
    from tests.strategy_helpers import load_gguf

    text_arguments = load_gguf()
    object_arguments = GGUFCounter(text_arguments._path, object_arguments=True)
    prompt: list[Any] = [{"role": "user", "content": "Look up R1 and R2."}]
    for index in (1, 2):
        prompt += [{"role": "assistant", "content": "", "tool_calls": [{
            "id": f"call_{index}", "type": "function",
            "function": {"name": "lookup", "arguments": f'{{"key": "R{index}"}}'}}]},
            {"role": "tool", "tool_call_id": f"call_{index}", "content": f"R{index}: ABC."}]
    counted = text_arguments.count_messages(prompt)

    def reply(prompt_tokens: int) -> Completion:
        return Completion("x", prompt_tokens, 1, 0.1)

    assert cut_by_server(prompt, counted, reply(counted - 4), text_arguments, "?") is None
    assert cut_by_server(prompt, counted, reply(counted - 40), text_arguments, "?")
    assert cut_by_server(prompt, counted, reply(counted - 1), object_arguments, "?")
