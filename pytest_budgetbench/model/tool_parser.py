"""Tool calls read from a reply's text, for endpoints that return them there.

llama-cpp-python's server (0.3.x) renders a request's tools into the prompt with the GGUF's
template but never parses the model's answer: the call comes back in ``content`` and
``tool_calls`` is null (abetlen/llama-cpp-python#1784). llama.cpp's own llama-server
(``--jinja``) parses ``<tool_call>`` blocks itself and leaves any other form as text. The
embedded Qwen2.5-Coder answers
a two-tool request with a fenced block, for example::

    ```json
    {
      "name": "get_weather",
      "arguments": {"city": "Paris", "unit": "c"}
    }
    ```

and its template asks for ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
(the Hermes format). :func:`parse_tool_calls` reads, in the order they appear:

- ``<tool_call>...</tool_call>`` blocks (the closing tag may be cut off by ``max_tokens``):
  any tool name, since the model said it is calling;
- fenced blocks (```json or bare ```), and bare JSON in the text: only where every
  value is ``{"name": <a tool of the request>, "arguments": {...}}`` (``parameters`` is
  taken for ``arguments``, as some models write), or a list of such objects, so a JSON
  answer is never mistaken for a call.

A block may hold several calls, one JSON value after another. The calls become OpenAI
``tool_calls`` (arguments as JSON text) with ids made from the reply itself,
``call_<index>_<sha256 of the reply, 8 hex>``, so a reply served again from the response
cache, or made again, gives the same ids. What is not a call stays the reply's text.

The choice is ``--budgetbench-tool-parser`` (:func:`parser_for`): ``auto`` parses for the
embedded model only (a user's server, vLLM say, parses with its own parser), ``hermes``
always, ``none`` never.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pytest_budgetbench.messages import Tool

ToolParser = Literal["hermes", "none"]
"""What an endpoint's client does with a reply that has tools but no ``tool_calls``."""

_TAGGED = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_FENCED = re.compile(r"```[A-Za-z_]*[ \t]*\n(.*?)```", re.DOTALL)
_DECODER = json.JSONDecoder()


def parser_for(choice: str, embedded: bool) -> ToolParser:
    """The parser ``--budgetbench-tool-parser=choice`` means for an endpoint: ``auto`` is
    ``hermes`` for the embedded server, which never parses, and ``none`` for any other."""
    if choice == "auto":
        return "hermes" if embedded else "none"
    return "hermes" if choice == "hermes" else "none"


@dataclass(frozen=True)
class ParsedReply:
    """A reply's text split into the calls found in it and the text that is left."""

    text: str
    tool_calls: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class _Span:
    start: int
    end: int
    calls: list[tuple[str, str]]
    """(name, arguments as JSON text) of each call the span holds."""


def parse_tool_calls(text: str, tools: Sequence[Tool]) -> ParsedReply:
    """The calls ``text`` makes to ``tools`` (see the module's docstring), and the rest of
    the text, stripped; ``text`` unchanged and no calls when it makes none."""
    names = {str(tool.get("function", {}).get("name")) for tool in tools}
    spans = [span for match in _TAGGED.finditer(text)
             if (span := _block(match, names=None)) is not None]
    spans += [span for match in _FENCED.finditer(text)
              if not _inside(match.start(), spans)
              and (span := _block(match, names=names)) is not None]
    spans += list(_bare_json(text, names, spans))
    if not spans:
        return ParsedReply(text, ())
    spans.sort(key=lambda span: span.start)
    rest, position = [], 0
    for span in spans:
        rest.append(text[position:span.start])
        position = span.end
    rest.append(text[position:])
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]
    calls = [(name, arguments) for span in spans for name, arguments in span.calls]
    return ParsedReply("".join(rest).strip(), tuple(
        {"id": f"call_{index}_{digest}", "type": "function",
         "function": {"name": name, "arguments": arguments}}
        for index, (name, arguments) in enumerate(calls)))


def _inside(position: int, spans: Sequence[_Span]) -> bool:
    return any(span.start <= position < span.end for span in spans)


def _block(match: re.Match[str], names: set[str] | None) -> _Span | None:
    """The calls of a tagged or fenced block, or None when it holds anything else."""
    values = _json_values(match.group(1))
    if values is None:
        return None
    calls = _calls_of(values, names)
    return None if calls is None else _Span(match.start(), match.end(), calls)


def _json_values(body: str) -> list[Any] | None:
    """The JSON values ``body`` holds one after another, or None if it holds anything else
    (or nothing)."""
    values: list[Any] = []
    position = 0
    while True:
        while position < len(body) and body[position].isspace():
            position += 1
        if position == len(body):
            return values or None
        try:
            value, position = _DECODER.raw_decode(body, position)
        except ValueError:
            return None
        values.append(value)


def _bare_json(text: str, names: set[str], taken: Sequence[_Span]) -> Iterator[_Span]:
    """Calls written as bare JSON outside the blocks already ``taken``."""
    position = 0
    while position < len(text):
        start = _next_opening(text, position)
        if start is None:
            return
        if _inside(start, taken):
            position = start + 1
            continue
        try:
            value, end = _DECODER.raw_decode(text, start)
        except ValueError:
            position = start + 1
            continue
        calls = _calls_of([value], names)
        if calls is None or _inside(end - 1, taken):
            position = start + 1
            continue
        yield _Span(start, end, calls)
        position = end


def _next_opening(text: str, position: int) -> int | None:
    found = [index for index in (text.find("{", position), text.find("[", position))
             if index >= 0]
    return min(found) if found else None


def _calls_of(values: Sequence[Any], names: set[str] | None) -> list[tuple[str, str]] | None:
    """``values`` as calls, where each is a call (or a non-empty list of calls) to one of
    ``names`` (any name when None); else None."""
    calls: list[tuple[str, str]] = []
    for value in values:
        for item in value if isinstance(value, list) and value else [value]:
            call = _call_of(item, names)
            if call is None:
                return None
            calls.append(call)
    return calls


def _call_of(value: Any, names: set[str] | None) -> tuple[str, str] | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    if names is not None and value["name"] not in names:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict) or not value.keys() <= {"name", "arguments",
                                                                 "parameters"}:
        return None
    return value["name"], json.dumps(arguments, ensure_ascii=False)
