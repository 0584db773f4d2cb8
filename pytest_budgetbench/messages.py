"""Chat messages in the OpenAI format, tool calls included, and the checks the runner
applies to them.

An agent's trajectory is plain OpenAI chat: an assistant message may carry ``tool_calls``
(its ``content`` then ``None`` or text), and each call is answered by a ``tool`` message
with the call's ``tool_call_id``. A call and its results are a *pair*: the results follow
the call at once, one per call id, before anything else. :func:`check_tool_pairs` is the
rule the runner applies to every prompt a strategy builds; :func:`exchanges` groups a
history into units that keep pairs whole, for strategies that drop or keep messages.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Message = dict[str, Any]
"""One chat message: ``{"role": "system"|"user"|"assistant"|"tool", "content": ...}``.

``content`` is a string, or a list of content parts (``{"type": "text", "text": ...}``,
``{"type": "image_url", ...}``) as the OpenAI chat API accepts; an assistant message with
``tool_calls`` may have ``content`` None. A ``tool`` message has ``tool_call_id``.
"""

Tool = dict[str, Any]
"""One tool in the OpenAI format: ``{"type": "function", "function": {"name": ...,
"description": ..., "parameters": {JSON schema}}}``."""


@dataclass(frozen=True)
class Schema:
    """A JSON schema a reply should follow, with the name the endpoint sees: a strategy
    passes one with an auxiliary call, and the endpoint gets it in the form it takes
    (:mod:`~pytest_budgetbench.model.structured`)."""

    name: str
    schema: Mapping[str, Any] = field(hash=False)

ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})


def text_of(message: Message) -> str:
    """The text of a message, joining text parts; image parts contribute nothing."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if part.get("type") == "text")


_IMMUTABLE = (str, int, float, bool, type(None))


def private_copy(messages: Sequence[Message]) -> list[Message]:
    """A copy of ``messages`` that nothing done to it reaches the originals through: a
    message of plain values (most) is copied shallowly, in a fraction of deepcopy's time
    (a third of a millisecond per cell of 80 messages), any other deeply."""
    return [dict(message) if all(type(v) in _IMMUTABLE for v in message.values())
            else copy.deepcopy(message) for message in messages]


def check_messages(value: object, produced_by: str) -> list[Message]:
    """Return ``value`` as a message list, or raise TypeError naming who produced it."""
    if not isinstance(value, list):
        raise TypeError(
            f"{produced_by} must return a list of chat messages "
            f"(got {value!r:.80} that is a {type(value).__name__})"
        )
    for index, message in enumerate(value):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise TypeError(
                f"{produced_by} returned an invalid message at index {index}: "
                f"each must be a dict with 'role' in {sorted(ROLES)} (got {message!r:.80})"
            )
        content = message.get("content")
        calls = message.get("tool_calls")
        if calls is not None:
            _check_calls(message, index, produced_by)
        if not isinstance(content, (str, list)) and not (content is None and calls):
            raise TypeError(
                f"{produced_by} returned message {index} without string or list 'content' "
                f"(got {type(content).__name__}; only an assistant message with tool_calls "
                "may have none)"
            )
        if isinstance(content, list):
            _check_parts(content, index, produced_by)
        if message["role"] == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise TypeError(
                f"{produced_by} returned tool message {index} without a string "
                f"'tool_call_id' (got {message.get('tool_call_id')!r:.40})"
            )
    _check_json(value, produced_by)
    return value


def _check_calls(message: Message, index: int, produced_by: str) -> None:
    """``tool_calls`` as the chat API takes them: on an assistant message, a non-empty list
    of ``{"id": str, "type": "function", "function": {"name": str, "arguments": str}}``."""
    calls = message.get("tool_calls")
    if message.get("role") != "assistant" or not isinstance(calls, list) or not calls:
        raise TypeError(
            f"{produced_by} returned message {index} with 'tool_calls' that is not a "
            "non-empty list on an assistant message"
        )
    for position, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if (not isinstance(call, dict) or not isinstance(call.get("id"), str)
                or not isinstance(function, dict)
                or not isinstance(function.get("name"), str)
                or not isinstance(function.get("arguments"), str)):
            raise TypeError(
                f"{produced_by} returned message {index} with tool call {position} that is "
                "not {'id': str, 'type': 'function', 'function': {'name': str, "
                f"'arguments': JSON text}} (got {call!r:.80})"
            )


def check_tools(value: object, produced_by: str) -> list[Tool]:
    """Return ``value`` as a tool list, or raise TypeError naming who produced it: a list
    of ``{"type": "function", "function": {"name": str, ...}}`` as the chat API takes it."""
    if not isinstance(value, list):
        raise TypeError(
            f"{produced_by} must be a list of tools (got {value!r:.80} that is a "
            f"{type(value).__name__})"
        )
    for index, tool in enumerate(value):
        function = tool.get("function") if isinstance(tool, dict) else None
        if (not isinstance(tool, dict) or tool.get("type") != "function"
                or not isinstance(function, dict)
                or not isinstance(function.get("name"), str) or not function["name"]):
            raise TypeError(
                f"{produced_by} has tool {index} that is not {{'type': 'function', "
                f"'function': {{'name': str, 'description': ..., 'parameters': {{JSON "
                f"schema}}}}}} (got {tool!r:.80})"
            )
    return value


def tool_calls_of(message: Message) -> list[dict[str, Any]]:
    """The tool calls a message makes (none for any message but an assistant's)."""
    calls = message.get("tool_calls")
    return list(calls) if message.get("role") == "assistant" and calls else []


def shared_call_id(calls: Sequence[dict[str, Any]]) -> str:
    """What is wrong with one reply's tool calls, "" when nothing: each call needs an id of
    its own, since a tool result answers one id (two calls that share one make a
    trajectory whose pairs no prompt can keep, whoever builds it)."""
    first: dict[str, int] = {}
    for number, call in enumerate(calls, 1):
        call_id = str(call.get("id"))
        if call_id in first:
            return (f"tool calls {first[call_id]} and {number} of the reply share id "
                    f"{call_id!r} (each call needs an id of its own, for its tool result)")
        first[call_id] = number
    return ""


def check_tool_pairs(messages: Sequence[Message], produced_by: str) -> None:
    """Raise ValueError naming ``produced_by`` and the pair when a prompt breaks one: a
    tool result whose call is not open just before it, or a call whose result does not
    follow before any other message (or before the prompt ends)."""
    open_calls: dict[str, tuple[int, str]] = {}
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in open_calls:
                raise ValueError(
                    f"{produced_by} broke a tool-call pair: the tool result at message {index} "
                    f"answers call {call_id!r}, which no assistant message just before it "
                    "makes (keep a call and its results together, or drop both)"
                )
            del open_calls[str(call_id)]
            continue
        _unanswered(open_calls, f"message {index}", produced_by)
        for call in tool_calls_of(message):
            open_calls[str(call.get("id"))] = (index, str(call.get("function", {}).get("name")))
    _unanswered(open_calls, "the prompt ends", produced_by)


def _unanswered(open_calls: dict[str, tuple[int, str]], before: str, produced_by: str) -> None:
    if not open_calls:
        return
    call_id, (at, name) = next(iter(open_calls.items()))
    raise ValueError(
        f"{produced_by} broke a tool-call pair: call {call_id!r} ({name}) at message {at} "
        f"has no tool result before {before} (keep a call and its results together, or "
        "drop both)"
    )


def as_sent(messages: Sequence[Message]) -> list[Message]:
    """``messages`` as a request carries them: an assistant message that only calls tools
    (``content`` None) goes without ``content``. The chat API reads the key's absence as
    None, and llama-cpp-python's server refuses a None there (its assistant message type
    takes a string or nothing), so every request, and every count of one, sends this form."""
    return [{key: value for key, value in message.items() if key != "content"}
            if message.get("content") is None and tool_calls_of(message) else message
            for message in messages]


def shared_prefix(first: Sequence[Any], second: Sequence[Any]) -> int:
    """How many leading entries two sequences share (two prompts' token ids, their
    messages' digests): what a server's prompt cache can reuse."""
    length = 0
    for left, right in zip(first, second, strict=False):
        if left != right:
            break
        length += 1
    return length


def arguments_as_objects(messages: Sequence[Message]) -> list[Message]:
    """``messages`` with each tool call's ``arguments`` parsed from its JSON text into an
    object, as vLLM (and llama.cpp's own server) hand them to a chat template: a template's
    ``arguments | tojson`` then writes the object, not an escaped string that a model would
    copy. Arguments that do not parse to an object stay the text they are."""
    converted: list[Message] = []
    for message in messages:
        calls = tool_calls_of(message)
        if not calls:
            converted.append(message)
            continue
        converted.append({**message, "tool_calls": [_with_object_arguments(c) for c in calls]})
    return converted


def _with_object_arguments(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        parsed = json.loads(function["arguments"])
    except ValueError:
        return call
    if not isinstance(parsed, dict):
        return call
    return {**call, "function": {**function, "arguments": parsed}}


def exchanges(messages: Sequence[Message]) -> list[list[Message]]:
    """``messages`` in units that keep tool-call pairs whole: an assistant message with
    tool calls together with the tool results that follow it; every other message alone.
    A strategy that keeps or drops whole units never breaks a pair."""
    units: list[list[Message]] = []
    for message in messages:
        if message.get("role") == "tool" and units and tool_calls_of(units[-1][0]):
            units[-1].append(message)
        else:
            units.append([message])
    return units


def _check_parts(parts: list[Any], index: int, produced_by: str) -> None:
    """Content parts as the chat API takes them: dicts with a ``type``, text parts with a
    string ``text``."""
    for position, part in enumerate(parts):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise TypeError(
                f"{produced_by} returned message {index} with content part {position} that is "
                f"not a {{'type': ...}} dict (got {part!r:.80} that is a {type(part).__name__})"
            )
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise TypeError(
                f"{produced_by} returned message {index} with text part {position} whose "
                f"'text' is not a string (got {type(part.get('text')).__name__})"
            )


def _check_json(messages: list[Message], produced_by: str) -> None:
    """The prompt must travel as JSON, to the model and into the record."""
    try:
        json.dumps(messages, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{produced_by} returned messages that JSON cannot hold: {exc}"
        ) from None


def split_ends(messages: Sequence[Message]) -> tuple[list[Message], list[Message], list[Message]]:
    """Split a prompt into (leading system messages, history, final user query).

    Every strategy keeps the system prompt and the final user query; what it chooses
    among is the history between them. An agent's trajectory that ends with tool results
    has no query (``[]``): its last call and results end the history, and a strategy that
    drops history must drop them with their call (:func:`exchanges`).
    """
    head_end = 0
    while head_end < len(messages) and messages[head_end].get("role") in ("system", "developer"):
        head_end += 1
    tail_start = len(messages)
    if tail_start > head_end and messages[-1].get("role") == "user":
        tail_start -= 1
    head = list(messages[:head_end])
    return head, list(messages[head_end:tail_start]), list(messages[tail_start:])
