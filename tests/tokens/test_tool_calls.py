"""Tool calls end to end without a real model: counted (every counter, the tools view),
sent and read back (the fake endpoint), cached, and parsed from a reply's text."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.cache.database import entry_checksum
from pytest_budgetbench.cache.responses import CachingChatModel, ResponseStore
from pytest_budgetbench.errors import EndpointError, TokenizerError
from pytest_budgetbench.messages import Message, Tool, as_sent
from pytest_budgetbench.model.chat import ChatModel
from pytest_budgetbench.model.tool_parser import parse_tool_calls, parser_for
from pytest_budgetbench.tokens.approximate import ApproxCounter
from pytest_budgetbench.tokens.base import message_key
from pytest_budgetbench.tokens.content import text_only, tools_text
from pytest_budgetbench.tokens.framing import verify_additivity
from pytest_budgetbench.tokens.gguf import GGUFCounter, served_by_llama_cpp
from pytest_budgetbench.tokens.server import ServerCounter
from tests.fake_openai import FakeOpenAI

WEATHER: Tool = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TIME: Tool = {"type": "function", "function": {
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "name": "get_time", "strict": True}}
"""Keys out of the server's order, and one (strict) its types do not name."""
TOOLS = [WEATHER, TIME]
CALL = {"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
ASK: Message = {"role": "user", "content": "Weather in Paris?"}
CALLING: Message = {"role": "assistant", "content": None, "tool_calls": [CALL]}
RESULT: Message = {"role": "tool", "tool_call_id": "c1", "name": "get_weather",
                   "content": "18 C"}
EPISODE = [ASK, CALLING, RESULT]


# -- counting ------------------------------------------------------------------------------
def test_approx_counts_the_tools_json_and_the_calls_at_four_characters_a_token() -> None:
    counter = ApproxCounter()
    plain = counter.count_messages(EPISODE)
    assert counter.count_messages(EPISODE, TOOLS) == plain + -(-len(tools_text(TOOLS)) // 4)
    without_call = counter.count_messages([ASK, {"role": "assistant", "content": ""}, RESULT])
    assert plain - without_call == -(-len(json.dumps([CALL])) // 4)
    assert counter.exact is False


def test_the_tools_view_counts_the_tools_and_shares_the_rest() -> None:
    counter = ApproxCounter()
    view = counter.with_tools(TOOLS)
    assert counter.with_tools([]) is counter and counter.with_tools(None) is counter
    assert view.count_messages(EPISODE) == counter.count_messages(EPISODE, TOOLS)
    assert view.count_whole(EPISODE) == counter.count_whole(EPISODE, TOOLS)
    assert view.count_messages(EPISODE) > counter.count_messages(EPISODE)
    tools_cost = counter.count_text(tools_text(TOOLS))
    assert view.overhead() == counter.overhead() + tools_cost
    assert view.estimate([ASK]) == counter.estimate([ASK]) + tools_cost
    assert (view.name, view.exact, view.count_space) == (counter.name, counter.exact, None)
    view.count_message({"role": "user", "content": "once"})
    assert message_key({"role": "user", "content": "once"}) in counter._message_cache
    assert view.with_tools([WEATHER]).count_messages([ASK]) == counter.count_messages(
        [ASK], [WEATHER])  # a view of the counter, not of the view
    assert view.framing([ASK]) is None


def test_a_prompt_with_tool_keys_or_tools_is_counted_whole() -> None:
    calls: list[tuple[int, bool]] = []

    class Spy(ApproxCounter):
        def _count_prompt(self, messages: Any, tools: Any = None) -> int:
            calls.append((len(messages), bool(tools)))
            return super()._count_prompt(messages, tools)

    counter = Spy()
    additivity = verify_additivity(counter._count_prompt, counter.count_message)
    counter._additivity = additivity
    assert additivity.framing([ASK]) is not None  # a plain prompt adds up
    for prompt in ([ASK, CALLING, RESULT], [ASK, {**CALLING, "content": "ok"}, RESULT],
                   [{**ASK, "name": "bob"}]):
        assert additivity.framing(prompt) is None
        calls.clear()
        counter.count_messages(prompt)
        assert calls == [(len(prompt), False)]
    calls.clear()
    counter.count_messages([ASK], TOOLS)
    assert calls == [(1, True)]


def test_text_only_keeps_tool_keys() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
    message = {"role": "tool", "tool_call_id": "c1", "name": "look",
               "content": [{"type": "text", "text": "seen"}, image]}
    assert text_only([message]) == [{"role": "tool", "tool_call_id": "c1", "name": "look",
                                      "content": "seen"}]


def test_messages_are_sent_without_content_none_only_where_they_call_tools() -> None:
    assert as_sent([ASK, CALLING, RESULT]) == [
        ASK, {"role": "assistant", "tool_calls": [CALL]}, RESULT]
    with_text = {**CALLING, "content": "Checking."}
    assert as_sent([with_text]) == [with_text]


def test_llama_cpp_servers_conversion_drops_and_orders_keys_as_its_pydantic_model() -> None:
    pytest.importorskip("llama_cpp.server.types")
    messages, tools = served_by_llama_cpp([{**ASK, "name": "bob"}, CALLING, RESULT], TOOLS)
    assert messages == [ASK, {"role": "assistant", "tool_calls": [CALL]},
                        {"role": "tool", "content": "18 C", "tool_call_id": "c1"}]
    assert tools is not None
    assert [list(tool["function"]) for tool in tools] == [
        ["name", "description", "parameters"], ["name", "parameters"]]
    assert served_by_llama_cpp([ASK]) == ([ASK], None)  # a plain prompt as it is
    with pytest.raises(TokenizerError, match="server refuses this prompt"):
        served_by_llama_cpp([{"role": "assistant", "content": 3}], TOOLS)


TOOLS_TEMPLATE = (
    "{% if tools %}{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}{% endif %}"
    "{% for m in messages %}<{{ m.role }}>{% if m.content %}{{ m.content }}{% endif %}"
    "{% if m.tool_calls %}{{ m.tool_calls | tojson }}{% endif %}"
    "{% if m.tool_call_id %}[{{ m.tool_call_id }}]{% endif %}"
    "{% if m.name %}({{ m.name }}){% endif %}\n{% endfor %}<assistant>"
)


@pytest.fixture(scope="module")
def templated() -> GGUFCounter:
    """The embedded GGUF's vocabulary with a template that shows every tool key."""
    from tests.strategy_helpers import load_gguf

    pytest.importorskip("llama_cpp.server.types")
    from pytest_budgetbench.embedded_server.models import embedded_gguf_path

    load_gguf()  # skips where llama.cpp or the model is missing
    return GGUFCounter(embedded_gguf_path(), chat_template=TOOLS_TEMPLATE)


def test_gguf_renders_tools_and_tool_messages_as_llama_cpp_server(
    templated: GGUFCounter
) -> None:
    prompt, _ = templated.render(EPISODE, TOOLS)
    served_tools = served_by_llama_cpp([], TOOLS)[1]
    assert served_tools is not None
    assert prompt.startswith("".join(json.dumps(tool, ensure_ascii=False) + "\n"
                                     for tool in served_tools))
    assert "strict" not in prompt and '"description"' in prompt
    assert f"<assistant>{json.dumps([CALL])}<tool>18 C[c1]<assistant>" in prompt
    assert "(get_weather)" not in prompt  # the server's model drops a tool message's name
    plain = templated.count_messages(EPISODE)
    assert templated.count_messages(EPISODE, TOOLS) == plain + len(templated._llama.tokenize(
        "".join(json.dumps(t) + "\n" for t in served_tools).encode(), add_bos=False,
        special=True))
    assert templated.with_tools(TOOLS).count_messages(EPISODE) == templated.count_messages(
        EPISODE, TOOLS)


def test_hf_counter_renders_tools_and_tool_keys(tokenizer_json: Path) -> None:
    from pytest_budgetbench.tokens.huggingface import HFCounter

    counter = HFCounter(str(tokenizer_json), chat_template=TOOLS_TEMPLATE)
    plain = counter.count_messages(EPISODE)
    assert counter.count_messages(EPISODE, TOOLS) > plain + counter.count_text("get_time")
    assert plain > counter.count_messages([ASK, {"role": "assistant", "content": ""},
                                           {"role": "tool", "content": "18 C"}])


def test_vllm_tokenize_is_sent_the_tools(fake: FakeOpenAI) -> None:
    fake.tokenize_routes = {"vllm"}
    counter = ServerCounter(fake.base_url, fake.model)
    assert counter.count_messages(EPISODE, TOOLS) == ApproxCounter().count_messages(
        as_sent(EPISODE), TOOLS)
    assert counter.count_messages(EPISODE, TOOLS) > counter.count_messages(EPISODE)
    assert counter.exact


def test_llama_cpp_python_text_route_estimates_the_tools_and_stays_inexact(
    fake: FakeOpenAI
) -> None:
    fake.tokenize_routes = {"extras"}
    counter = ServerCounter(fake.base_url, fake.model)
    with_tools = counter.count_messages(EPISODE, TOOLS)
    assert with_tools == counter.count_messages(EPISODE) + counter.count_text(tools_text(TOOLS))
    assert counter.exact is False


# -- sending and reading back --------------------------------------------------------------
def calling(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"content": None, "tool_calls": [CALL]}


def test_tools_are_sent_and_a_calls_only_reply_is_read_back(fake: FakeOpenAI) -> None:
    fake.responder = calling
    reply = ChatModel(fake.base_url, fake.model).complete(EPISODE, max_tokens=8, tools=TOOLS)
    assert fake.requests[0]["tools"] == TOOLS
    assert fake.requests[0]["messages"][1] == {"role": "assistant", "tool_calls": [CALL]}
    assert (reply.text, reply.tool_calls, reply.parsed_tool_calls) == ("", (CALL,), 0)
    assert reply.message == {"role": "assistant", "content": None, "tool_calls": [CALL]}
    ChatModel(fake.base_url, fake.model).complete([ASK], max_tokens=8)
    assert "tools" not in fake.requests[1]


def test_a_reply_whose_calls_share_an_id_is_malformed_as_received(fake: FakeOpenAI) -> None:
    """Two calls with one id cannot be answered pair by pair: the reply is the model's
    error where it is received, never a trajectory that a strategy is blamed for."""
    fake.responder = calling
    fake.faults = ["duplicate_ids"]
    with pytest.raises(EndpointError) as info:
        ChatModel(fake.base_url, fake.model, attempts=3).complete(
            EPISODE, max_tokens=8, tools=TOOLS)
    assert str(info.value) == (
        f"malformed reply from {fake.base_url}: tool calls 1 and 2 of the reply share id "
        "'c1' (each call needs an id of its own, for its tool result)")
    assert len(fake.requests) == 1  # the same server would make the same reply: no retry


def test_arguments_sent_as_an_object_are_kept_as_json_text(fake: FakeOpenAI) -> None:
    """Some servers send a call's arguments as a JSON object, not its text: the call is
    kept as the OpenAI format has it (JSON text), never a Python repr of the object."""
    fake.responder = lambda messages: {"content": None, "tool_calls": [{
        **CALL, "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    reply = ChatModel(fake.base_url, fake.model).complete(EPISODE, max_tokens=8, tools=TOOLS)
    assert reply.tool_calls == ({**CALL, "function": {"name": "get_weather",
                                                      "arguments": '{"city": "Paris"}'}},)


HERMES_REPLY = '<tool_call>\n{"name": "get_time", "arguments": {"city": "Oslo"}}\n</tool_call>'


@pytest.mark.parametrize(("parser", "tools", "parsed"), [
    ("hermes", TOOLS, 1), ("none", TOOLS, 0), ("hermes", None, 0)])
def test_the_parser_reads_calls_from_text_only_when_on_and_the_request_has_tools(
    fake: FakeOpenAI, parser: Any, tools: list[Tool] | None, parsed: int
) -> None:
    fake.responder = lambda messages: HERMES_REPLY
    reply = ChatModel(fake.base_url, fake.model, tool_parser=parser).complete(
        [ASK], max_tokens=8, tools=tools)
    assert reply.parsed_tool_calls == len(reply.tool_calls) == parsed
    assert reply.text == ("" if parsed else HERMES_REPLY)


def test_the_parser_leaves_calls_the_server_made_alone(fake: FakeOpenAI) -> None:
    fake.responder = lambda messages: {"content": HERMES_REPLY, "tool_calls": [CALL]}
    reply = ChatModel(fake.base_url, fake.model, tool_parser="hermes").complete(
        [ASK], max_tokens=8, tools=TOOLS)
    assert (reply.tool_calls, reply.parsed_tool_calls, reply.text) == ((CALL,), 0,
                                                                        HERMES_REPLY)


def test_auto_parses_for_the_embedded_model_only() -> None:
    assert [parser_for("auto", True), parser_for("auto", False)] == ["hermes", "none"]
    assert [parser_for("hermes", False), parser_for("none", True)] == ["hermes", "none"]


# -- the response cache --------------------------------------------------------------------
def cached(fake: FakeOpenAI, path: Path, parser: Any = "hermes") -> CachingChatModel:
    chat = ChatModel(fake.base_url, fake.model, attempts=1, tool_parser=parser)
    return CachingChatModel(chat, ResponseStore(path, run_id="run"))


def test_a_cached_reply_keeps_its_tool_calls(fake: FakeOpenAI, tmp_path: Path) -> None:
    fake.responder = lambda messages: "Sure. " + HERMES_REPLY
    first = cached(fake, tmp_path / "r.sqlite").complete([ASK], max_tokens=8, tools=TOOLS)
    again = cached(fake, tmp_path / "r.sqlite").complete([ASK], max_tokens=8, tools=TOOLS)
    assert len(fake.requests) == 1 and again.cached
    assert (again.text, again.tool_calls, again.parsed_tool_calls) == (
        first.text, first.tool_calls, first.parsed_tool_calls) == ("Sure.", first.tool_calls, 1)
    assert first.tool_calls[0]["function"]["name"] == "get_time"


def test_the_cache_key_holds_the_parser_choice_for_requests_with_tools(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    fake.responder = lambda messages: HERMES_REPLY
    path = tmp_path / "r.sqlite"
    parsed = cached(fake, path, "hermes").complete([ASK], max_tokens=8, tools=TOOLS)
    raw = cached(fake, path, "none").complete([ASK], max_tokens=8, tools=TOOLS)
    assert len(fake.requests) == 2 and not raw.cached
    assert (len(parsed.tool_calls), len(raw.tool_calls)) == (1, 0)
    cached(fake, path, "hermes").complete([ASK], max_tokens=8)
    assert cached(fake, path, "none").complete([ASK], max_tokens=8).cached  # no tools: one key


def test_a_changed_byte_in_stored_tool_calls_is_a_miss(fake: FakeOpenAI, tmp_path: Path) -> None:
    fake.responder = calling
    path = tmp_path / "r.sqlite"
    cached(fake, path).complete([ASK], max_tokens=8, tools=TOOLS)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE responses SET tool_calls = replace(tool_calls, 'Paris', 'Pariz')")
    db.close()
    again = cached(fake, path).complete([ASK], max_tokens=8, tools=TOOLS)
    assert not again.cached and len(fake.requests) == 2
    assert json.loads(again.tool_calls[0]["function"]["arguments"]) == {"city": "Paris"}


def test_a_cache_file_from_before_tool_calls_keeps_its_replies(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    path = tmp_path / "old.sqlite"
    old = ResponseStore(path, run_id="old")
    key = "k" * 64
    with sqlite3.connect(path) as db:
        db.executescript(
            "CREATE TABLE responses (key TEXT PRIMARY KEY, text TEXT NOT NULL, prompt_tokens "
            "INTEGER, completion_tokens INTEGER, latency_s REAL NOT NULL, run_id TEXT NOT "
            "NULL, created REAL NOT NULL, checksum TEXT);")
        db.execute("INSERT INTO responses VALUES (?, 'Rex', 12, 3, 0.25, 'old', 0, ?)",
                   (key, entry_checksum(key, "Rex", 12, 3, 0.25)))
    db.close()
    found = old.lookup(key)  # the columns are added on opening; the entry's checksum holds
    assert found is not None and (found.text, found.tool_calls, found.cached) == (
        "Rex", (), True)
    assert old.rejected_since(0) == {}
    fake.responder = calling
    chat = CachingChatModel(ChatModel(fake.base_url, fake.model), old)
    chat.complete([ASK], max_tokens=8, tools=TOOLS)
    again = chat.complete([ASK], max_tokens=8, tools=TOOLS)
    assert again.cached and again.tool_calls == (CALL,) and len(fake.requests) == 1


# -- the parser ----------------------------------------------------------------------------
QWEN_REPLY = ('```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris",\n'
              '    "unit": "c"\n  }\n}\n```')
"""What the embedded Qwen2.5-Coder-0.5B answered to a two-tool request (measured)."""


def names_and_arguments(text: str) -> list[tuple[str, dict[str, Any]]]:
    return [(call["function"]["name"], json.loads(call["function"]["arguments"]))
            for call in parse_tool_calls(text, TOOLS).tool_calls]


@pytest.mark.parametrize(("text", "calls", "rest"), [
    (QWEN_REPLY, [("get_weather", {"city": "Paris", "unit": "c"})], ""),
    (HERMES_REPLY, [("get_time", {"city": "Oslo"})], ""),
    ('<tool_call>{"name": "get_time", "arguments": {"city": "Oslo"}}',  # cut off
     [("get_time", {"city": "Oslo"})], ""),
    ('<tool_call>{"name": "unknown", "arguments": {}}</tool_call>',  # a tag: any name
     [("unknown", {})], ""),
    ('Checking.\n<tool_call>\n{"name": "get_time", "arguments": {"city": "A"}}\n</tool_call>'
     '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "B"}}\n</tool_call>',
     [("get_time", {"city": "A"}), ("get_weather", {"city": "B"})], "Checking."),
    ('{"name": "get_time", "arguments": "{\\"city\\": \\"Rome\\"}"}',  # arguments as text
     [("get_time", {"city": "Rome"})], ""),
    ('Calling [{"name": "get_time", "parameters": {"city": "X"}}, '
     '{"name": "get_weather", "arguments": {"city": "Y"}}] now',
     [("get_time", {"city": "X"}), ("get_weather", {"city": "Y"})], "Calling  now"),
    ('```\n{"name": "get_time", "arguments": {}}\n{"name": "get_time", "arguments": {}}\n```',
     [("get_time", {}), ("get_time", {})], ""),
])
def test_calls_are_read_from_tags_fences_and_bare_json(
    text: str, calls: list[tuple[str, dict[str, Any]]], rest: str
) -> None:
    assert names_and_arguments(text) == calls
    assert parse_tool_calls(text, TOOLS).text == rest


@pytest.mark.parametrize("text", [
    "The weather is fine.",
    '```json\n{"name": "delete_everything", "arguments": {}}\n```',  # not a tool of the request
    '{"name": "get_time", "arguments": {}, "reason": "extra key"}',
    '{"city": "Paris"}',
    '<tool_call>not json</tool_call>',
    "[]",
])
def test_text_that_makes_no_call_stays_text(text: str) -> None:
    assert parse_tool_calls(text, TOOLS) == parse_tool_calls(text, []) == (
        parse_tool_calls(text, TOOLS).__class__(text, ()))


def test_call_ids_are_made_from_the_reply_so_a_replay_is_identical() -> None:
    first = parse_tool_calls(QWEN_REPLY + "\n" + HERMES_REPLY, TOOLS)
    again = parse_tool_calls(QWEN_REPLY + "\n" + HERMES_REPLY, TOOLS)
    assert first == again
    ids = [call["id"] for call in first.tool_calls]
    assert ids[0].startswith("call_0_") and ids[1].startswith("call_1_") and len(set(ids)) == 2
    other = parse_tool_calls(HERMES_REPLY + " ", TOOLS).tool_calls[0]["id"]
    assert other != parse_tool_calls(HERMES_REPLY, TOOLS).tool_calls[0]["id"]
    assert all(call["type"] == "function" for call in first.tool_calls)
