"""Counting through the servers teams run: ``auto`` counts exactly what each server's chat
route counts (``usage.prompt_tokens``), tools and template variables included, against
loopback servers built from each server's documented routes (tests.fake_servers)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.engine import preflight
from pytest_budgetbench.engine.wiring import counted_server, make_counter
from pytest_budgetbench.errors import ConfigError, TokenizerError
from pytest_budgetbench.messages import as_sent
from pytest_budgetbench.model.chat import ChatModel
from pytest_budgetbench.model.endpoint import Endpoint
from pytest_budgetbench.model.servers import detect_server
from pytest_budgetbench.settings.config import Settings
from pytest_budgetbench.tokens.gguf import GGUFCounter
from pytest_budgetbench.tokens.ollama import MODELS_ENV, OllamaCounter, manifest_path
from tests.fake_openai import FakeOpenAI
from tests.fake_servers import TGI, VLLM, FakeServer, LlamaServer, Ollama, SGLang, render
from tests.strategy_helpers import load_gguf

TOOLS: list[Any] = [{"type": "function", "function": {
    "name": "get_time", "description": "The time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
ASK = {"role": "user", "content": "What time is it in Paris?"}
CALLED: list[Any] = [
    {"role": "system", "content": "You answer with tools."}, ASK,
    {"role": "assistant", "content": "", "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_time", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18:04"},
    {"role": "user", "content": "And in Oslo?"}]


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI().start()
    yield server
    server.stop()


def _endpoint(fake: FakeOpenAI) -> Endpoint:
    """The endpoint as the controller resolves it: probed for its server."""
    return Endpoint(base_url=fake.base_url, model=fake.model,
                    server=detect_server(fake.base_url, fake.model, None))


def _served(fake: FakeOpenAI, messages: list[Any], tools: list[Any] | None = None,
            **chat: Any) -> int | None:
    """The server's own count of a prompt: its chat reply's ``usage.prompt_tokens``."""
    return ChatModel(fake.base_url, fake.model, **chat).complete(
        messages, max_tokens=4, tools=tools).prompt_tokens


# -- the servers with a route that counts ----------------------------------------------------
@pytest.mark.parametrize(("server", "name"), [
    (LlamaServer(), "server:/apply-template+/tokenize"),
    (TGI(), "server:/chat_tokenize"),
    (SGLang(), "server:/v1/tokenize"),
    (VLLM(), "server:/tokenize"),
])
@pytest.mark.parametrize("tools", [None, TOOLS], ids=["no tools", "tools"])
def test_auto_counts_what_each_servers_chat_route_counts(
    fake: FakeOpenAI, server: FakeServer, name: str, tools: list[Any] | None
) -> None:
    fake.server = server
    counter = make_counter("auto", _endpoint(fake))
    assert (counter.name, counter.exact) == (name, True)
    for prompt in ([ASK], CALLED):
        assert counter.count_messages(prompt, tools) == _served(fake, prompt, tools)
    assert counter.count_messages(CALLED, TOOLS) > counter.count_messages(CALLED)


def test_llama_server_counts_the_template_prompt_with_the_bos_and_special_tokens(
    fake: FakeOpenAI
) -> None:
    """The template leaves the BOS to the tokenizer, and the chat route adds it: counting
    the template's prompt without add_special would be one short on every prompt."""
    fake.server = server = LlamaServer()
    counter = make_counter("auto", _endpoint(fake))
    counted = counter.count_messages(CALLED, TOOLS)
    (applied, tokenized) = server.posts[-2:]
    assert applied == ("/apply-template", {"messages": as_sent(CALLED), "tools": TOOLS})
    assert tokenized == ("/tokenize", {"content": render(as_sent(CALLED), TOOLS),
                                       "add_special": True,
                                       "parse_special": True})
    assert counted == _served(fake, CALLED, TOOLS)


def test_a_strategy_measures_an_assistant_tool_call_on_llama_server(fake: FakeOpenAI) -> None:
    """llama-server refuses to continue an assistant message that calls tools, so the
    message alone after the anchor cannot be counted there: a strategy that plans by
    message counts (truncation) still gets its count, with a user turn after it."""
    fake.server = LlamaServer()
    counter = make_counter("auto", _endpoint(fake))
    call = CALLED[2]
    measured = counter.count_message(call)
    after = {"role": "user", "content": "."}
    anchor = {"role": "system", "content": "."}
    assert measured == (counter.count_whole([anchor, call, after])
                        - counter.count_whole([anchor, after])) > 0
    assert counter.estimate(CALLED) > counter.estimate([m for m in CALLED if m is not call])


def test_a_llama_server_without_jinja_is_one_line_before_any_cell_of_a_sweep_with_tools(
    fake: FakeOpenAI
) -> None:
    fake.server = LlamaServer(jinja=False)
    endpoint = _endpoint(fake)
    counter = make_counter("auto", endpoint)
    assert counter.count_messages(CALLED) == _served(fake, CALLED)  # no tools: exact
    with pytest.raises(ConfigError) as info:
        preflight.check_tokenizer(Settings(), lambda: make_counter("auto", endpoint),
                                  tools=True)
    message = str(info.value)
    assert "\n" not in message
    assert "started without --jinja" in message and "restart it with --jinja" in message
    assert "tools param requires --jinja flag" in message


def test_an_sglang_whose_tokenize_takes_no_messages_is_refused_in_one_line(
    fake: FakeOpenAI
) -> None:
    fake.server = SGLang(messages=False)
    counter = make_counter("auto", _endpoint(fake))  # its text route answers
    with pytest.raises(TokenizerError) as info:
        counter.count_messages([ASK])
    assert "takes no chat messages" in str(info.value) and "hf:PATH" in str(info.value)


def test_chat_template_kwargs_go_with_the_count_and_with_the_request_alike(
    fake: FakeOpenAI
) -> None:
    fake.server = server = VLLM()
    kwargs = {"enable_thinking": False}  # the fake's template adds an empty think block
    counter = make_counter("auto", _endpoint(fake), chat_template_kwargs=kwargs)
    counted = counter.count_messages([ASK])
    assert server.posts[-1][1]["chat_template_kwargs"] == kwargs
    assert counted == _served(fake, [ASK], chat_template_kwargs=kwargs)
    assert fake.requests[-1]["chat_template_kwargs"] == kwargs
    assert counted > make_counter("auto", _endpoint(fake)).count_messages([ASK])
    assert ChatModel(fake.base_url, fake.model, chat_template_kwargs=kwargs).params[
        "chat_template_kwargs"] == kwargs  # the response cache keys on them


def test_chat_template_kwargs_are_refused_with_a_counter_that_renders_its_own(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    with pytest.raises(TokenizerError) as info:
        make_counter(f"gguf:{tmp_path / 'm.gguf'}", _endpoint(fake),
                     chat_template_kwargs={"enable_thinking": False})
    assert "renders its own without them" in str(info.value)


# -- Ollama: the model's GGUF, checked against Ollama's counts -------------------------------
@pytest.fixture(scope="module")
def ollama_gguf() -> GGUFCounter:
    """The counter the fake Ollama counts with: the embedded model's GGUF, its template's
    tool calls given objects as Ollama gives them (skips where llama.cpp is missing)."""
    path = load_gguf()._path
    return GGUFCounter(path, object_arguments=True)


def _ollama(fake: FakeOpenAI, counts: GGUFCounter, served_from: str, **options: Any) -> Ollama:
    fake.server = server = Ollama(counts.count_messages, served_from=served_from, **options)
    return server


def test_ollama_counts_with_its_models_gguf_checked_by_probes(
    fake: FakeOpenAI, ollama_gguf: GGUFCounter
) -> None:
    server = _ollama(fake, ollama_gguf, str(ollama_gguf._path))
    counter = make_counter("auto", _endpoint(fake))
    assert isinstance(counter, OllamaCounter) and counter.exact
    assert counter.name == f"ollama:{fake.model}"
    assert [entry["probe"] for entry in counter.checked] == [
        "system and user", "multi-turn", "a tool", "a tool call and its result"]
    assert server.chats == 4  # one one-token reply per probe
    for prompt, tools in (([ASK], None), (CALLED, None), (CALLED, TOOLS)):
        assert counter.count_messages(prompt, tools) == _served(fake, prompt, tools)
    assert "matched Ollama's counts" in counter.exactness


def test_ollama_finds_the_gguf_through_its_manifest_when_from_is_elsewhere(
    fake: FakeOpenAI, ollama_gguf: GGUFCounter, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    models = tmp_path / "models"
    digest = "sha256:" + "ab" * 32
    blob = models / "blobs" / digest.replace(":", "-")
    blob.parent.mkdir(parents=True)
    os.symlink(ollama_gguf._path, blob)
    manifest = manifest_path(models, "team/smol:q4")
    assert manifest == models / "manifests/registry.ollama.ai/team/smol/q4"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:00"},
        {"mediaType": "application/vnd.ollama.image.model", "digest": digest}]}))
    monkeypatch.setenv(MODELS_ENV, str(models))
    fake.model = "team/smol:q4"
    _ollama(fake, ollama_gguf, "/elsewhere/blobs/sha256-ab")
    counter = make_counter("auto", _endpoint(fake))
    assert isinstance(counter, OllamaCounter) and counter.gguf == blob


def test_an_ollama_model_not_on_this_machine_is_one_line_naming_what_to_pass(
    fake: FakeOpenAI, ollama_gguf: GGUFCounter, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MODELS_ENV, str(tmp_path))
    _ollama(fake, ollama_gguf, "/elsewhere/blobs/sha256-ab")
    with pytest.raises(TokenizerError) as info:
        make_counter("auto", _endpoint(fake))
    message = str(info.value)
    assert "\n" not in message and "/elsewhere/blobs/sha256-ab" in message
    assert f"{MODELS_ENV}=DIR" in message and "--budgetbench-tokenizer=gguf:PATH" in message


def test_an_ollama_template_that_counts_otherwise_is_refused_naming_both_counts(
    fake: FakeOpenAI, ollama_gguf: GGUFCounter
) -> None:
    class Otherwise(GGUFCounter):
        def count_messages(self, messages: Any, tools: Any = None) -> int:
            return super().count_messages(messages, tools) + 3

    other = Otherwise(ollama_gguf._path, object_arguments=True)
    _ollama(fake, other, str(ollama_gguf._path))
    with pytest.raises(TokenizerError) as info:
        make_counter("auto", _endpoint(fake))
    probe = [{"role": "system", "content": "You are terse."},
             {"role": "user", "content": "Name one colour."}]
    mine = ollama_gguf.count_messages(probe)
    assert (f"probe 'system and user': Ollama counted {mine + 3} prompt tokens, the GGUF "
            f"{mine}") in str(info.value)
    assert "--budgetbench-tokenizer=approx" in str(info.value)


def test_tools_that_ollama_renders_otherwise_are_refused_and_plain_prompts_stay_exact(
    fake: FakeOpenAI, ollama_gguf: GGUFCounter
) -> None:
    def counts(messages: Any, tools: Any) -> int:
        return ollama_gguf.count_messages(messages, tools) + (2 if tools else 0)

    fake.server = Ollama(counts, served_from=str(ollama_gguf._path))
    counter = make_counter("auto", _endpoint(fake))
    assert counter.count_messages(CALLED) == _served(fake, CALLED)
    with pytest.raises(TokenizerError) as info:
        counter.count_messages(CALLED, TOOLS)
    assert "renders tools" in str(info.value) and "prompts with tools are refused" in (
        counter.exactness)


def test_a_worker_builds_the_controllers_ollama_counter_without_probing_again(
    fake: FakeOpenAI, ollama_gguf: GGUFCounter
) -> None:
    server = _ollama(fake, ollama_gguf, str(ollama_gguf._path))
    endpoint = _endpoint(fake)
    controller = make_counter("auto", endpoint)
    probes = server.chats
    handed = Endpoint(**vars(counted_server(endpoint, controller)))  # as worker_state does
    worker = make_counter("auto", handed)
    assert server.chats == probes and worker.name == controller.name
    assert worker.count_messages(CALLED, TOOLS) == controller.count_messages(CALLED, TOOLS)
    assert handed.server["exact"] == controller.exactness


def test_the_server_tokenizer_on_ollama_says_to_use_auto(
    fake: FakeOpenAI, ollama_gguf: GGUFCounter
) -> None:
    _ollama(fake, ollama_gguf, str(ollama_gguf._path))
    with pytest.raises(TokenizerError) as info:
        make_counter("server", _endpoint(fake))
    assert "no tokenizer route" in str(info.value) and "tokenizer=auto" in str(info.value)


def test_an_ollama_model_without_the_tools_capability_is_probed_plain_and_refuses_tools(
    fake: FakeOpenAI, ollama_gguf: GGUFCounter
) -> None:
    server = _ollama(fake, ollama_gguf, str(ollama_gguf._path), capabilities=("completion",))
    counter = make_counter("auto", _endpoint(fake))
    assert server.chats == 2 and counter.count_messages(CALLED) == _served(fake, CALLED)
    with pytest.raises(TokenizerError) as info:
        counter.count_messages(CALLED, TOOLS)
    assert "takes no tools (its /api/show capabilities)" in str(info.value)


def test_a_llama_server_not_told_by_the_probe_is_recognised_by_its_tokenize_answer(
    fake: FakeOpenAI
) -> None:
    """The embedded llama-server under ``server``, or one whose /props a proxy hides: its
    /tokenize answers the vLLM-shaped probe with tokens and no count, and /apply-template
    answers, so it counts as llama-server does."""
    from pytest_budgetbench.tokens.server import ServerCounter

    fake.server = LlamaServer()
    counter = ServerCounter(fake.base_url, fake.model)  # no dialect: the probe decides
    assert counter.count_messages(CALLED, TOOLS) == _served(fake, CALLED, TOOLS)
    assert (counter.name, counter.exact) == ("server:/apply-template+/tokenize", True)
