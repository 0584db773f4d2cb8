"""Tool-bearing prompts on the real embedded Qwen2.5-Coder: the runner's count is the
server's own ``usage.prompt_tokens`` (tools rendered by the template, assistant tool calls
with and without text and with their arguments as objects, tool results, several tools),
and its text replies parse into calls."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.embedded_server import models as gguf_models
from pytest_budgetbench.messages import Message, Tool

pytest.importorskip("llama_cpp")
pytestmark = pytest.mark.integration


def function_tool(name: str, description: str, **properties: Any) -> Tool:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties,
                       "required": list(properties)[:1]}}}


WEATHER = function_tool("get_weather", "Current weather in a city",
                        city={"type": "string", "description": "City name"},
                        unit={"type": "string", "enum": ["c", "f"]})
TIME = function_tool("get_time", "Current local time in a city", city={"type": "string"})
# What a server's pydantic model drops or reorders: an extra key, parameters out of order.
STRICT = {"type": "function", "function": {
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    "strict": True, "name": "read_file", "description": "Read a file (ünïcode, \"quoted\")"},
    "response": {"type": "string"}}
TOOLS = [WEATHER, TIME]


def call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


ASK: Message = {"role": "user", "content": "What is the weather and the time in Paris?"}
CALLS_ONLY: Message = {"role": "assistant", "content": None,
                       "tool_calls": [call("c1", "get_weather", city="Paris", unit="c")]}
CALLS_WITH_TEXT: Message = {"role": "assistant", "content": "Let me check both.",
                            "tool_calls": [call("c2", "get_weather", city="Paris"),
                                           call("c3", "get_time", city="Paris")]}
RESULT_1: Message = {"role": "tool", "tool_call_id": "c1", "content": "18 C, cloudy"}
RESULT_2: Message = {"role": "tool", "tool_call_id": "c2", "name": "get_weather",
                     "content": '{"temp": 18}'}
RESULT_3: Message = {"role": "tool", "tool_call_id": "c3", "content": "14:05"}
SYSTEM: Message = {"role": "system", "content": "You are a terse assistant."}

PROMPTS: list[tuple[str, list[Message], list[Tool]]] = [
    ("one tool", [ASK], [WEATHER]),
    ("two tools", [ASK], TOOLS),
    ("system and tools", [SYSTEM, ASK], TOOLS),
    ("call without text", [ASK, CALLS_ONLY, RESULT_1], TOOLS),
    ("calls with text", [SYSTEM, ASK, CALLS_WITH_TEXT, RESULT_2, RESULT_3], TOOLS),
    ("a second turn", [ASK, CALLS_ONLY, RESULT_1, {"role": "assistant", "content": "18 C."},
                       {"role": "user", "content": "And the time?"}], TOOLS),
    ("extra keys dropped", [{**ASK, "name": "bob"}, CALLS_ONLY, RESULT_1],
     [*TOOLS, STRICT]),
    ("calls without tools", [ASK, CALLS_WITH_TEXT, RESULT_2, RESULT_3], []),
]
"""(what it covers, messages, tools): every shape a tool-using episode sends."""


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    """The default model's server and its exact counter."""
    from pytest_budgetbench.embedded_server.models import QWEN
    from pytest_budgetbench.embedded_server.process import EmbeddedServer
    from pytest_budgetbench.model.chat import ChatModel
    from pytest_budgetbench.tokens.gguf import GGUFCounter

    if not (gguf_models.model_dir() / QWEN.file_name).is_file():
        pytest.skip("the default model is not fetched (budgetbench fetch-model)")
    server = EmbeddedServer(n_ctx=4096, threads=2, model_name=QWEN.name,
                            log_path=Path(tmp_path_factory.mktemp("qwen")) / "server.log")
    server.start()
    try:
        yield (GGUFCounter(server.model_path, object_arguments=True),
               ChatModel(server.base_url, QWEN.alias, tool_parser="hermes"))
    finally:
        server.stop()


def test_the_embedded_server_renders_earlier_calls_arguments_as_objects(
    qwen: tuple[Any, Any]
) -> None:
    """As vLLM does: the template writes the arguments object, not an escaped string (whose
    count differs, so the server's count tells which it rendered)."""
    from pytest_budgetbench.tokens.gguf import GGUFCounter

    counter, chat = qwen
    messages = [ASK, CALLS_ONLY, RESULT_1]
    prompt, _ = counter.render(messages, TOOLS)
    assert '"arguments": {"city": "Paris", "unit": "c"}' in prompt
    as_text = GGUFCounter(counter._path)
    assert '"arguments": "{\\"city\\"' in as_text.render(messages, TOOLS)[0]
    served = chat.complete(messages, max_tokens=1, tools=TOOLS).prompt_tokens
    assert served == counter.count_messages(messages, TOOLS) != as_text.count_messages(
        messages, TOOLS)


@pytest.mark.parametrize(("messages", "tools"), [(m, t) for _, m, t in PROMPTS],
                         ids=[name for name, _, _ in PROMPTS])
def test_tool_bearing_prompts_count_exactly_as_the_server(
    qwen: tuple[Any, Any], messages: list[Message], tools: list[Tool]
) -> None:
    counter, chat = qwen
    reply = chat.complete(messages, max_tokens=1, tools=tools)
    assert counter.count_messages(messages, tools) == reply.prompt_tokens
    assert counter.with_tools(tools).count_messages(messages) == reply.prompt_tokens


def test_the_embedded_models_text_reply_is_read_as_a_call(qwen: tuple[Any, Any]) -> None:
    _, chat = qwen
    reply = chat.complete([{"role": "user", "content": "What is the weather in Paris?"}],
                          max_tokens=64, tools=TOOLS)
    assert reply.parsed_tool_calls == len(reply.tool_calls) >= 1
    first = reply.tool_calls[0]["function"]
    assert first["name"] == "get_weather"
    assert json.loads(first["arguments"])["city"] == "Paris"
