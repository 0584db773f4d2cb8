"""``budgetbench import-chats``: an OpenAI-style transcript export plus questions -> the
``jsonl`` task's records.

The export is a JSON list of chats (or ``{"chats": [...]}``, or JSON lines), each with
``messages`` in the OpenAI chat format, an ``id``, and optionally the ``tools`` its model
was given. The questions file (JSON list or JSON lines) holds one question per record:
``chat_id``, ``question``, ``answer`` (a string, a number or a list), and optionally
``category``, ``id``, ``rubric`` and ``evidence``. Each question becomes one record: the
chat's messages as ``history``, its tools as ``tools``, then the question. ``evidence``
(the spans its answer needs: strings, or indices of the chat's messages in the export)
is written as text: an index becomes that message's text, which a flattened chat still
holds verbatim.

Tool traffic stays what it is: an assistant's ``tool_calls`` stay calls and ``tool``
results stay results tied to their call's id, so a strategy sees each pair and the model
gets the chat's tools. The legacy function format is brought to today's: a
``function_call`` becomes a tool call (its id ``fn_<message index>``), the ``function``
message that answers it a ``tool`` result, and a chat's ``functions`` its tools. A chat
whose calls and results do not pair up is one error naming it. ``flatten_tools``
(``--flatten-tools``), for an endpoint that refuses tool messages, flattens them to text
instead: calls become ``[tool call] name(arguments)`` lines of their message, results
assistant messages ``[tool result NAME] ...``, and the tools are dropped. A message with no
content left is dropped. The written file is then loaded as the ``jsonl`` task loads it,
so what this writes is what a sweep reads.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_budgetbench.errors import DataError, MalformedLine
from pytest_budgetbench.messages import (
    ROLES,
    Message,
    Tool,
    check_messages,
    check_tool_pairs,
    check_tools,
    text_of,
)
from pytest_budgetbench.tasks._data import json_lines, one_line, read_text
from pytest_budgetbench.tasks.base import TaskOptions

QUESTION_FIELDS = ("chat_id", "question", "answer")
OPTIONAL_FIELDS = ("category", "id", "rubric")


def import_chats(export: Path, questions: Path, out: Path, *,
                 flatten_tools: bool = False) -> int:
    """Write ``out`` (JSON lines) and return how many records it holds."""
    chats = dict(_chats(export, flatten_tools))
    records: list[dict[str, Any]] = []
    asked: Counter[str] = Counter()
    for where, question in _entries(questions):
        absent = [name for name in QUESTION_FIELDS if name not in question]
        if absent:
            raise DataError(f"import-chats: {questions} {where}: field(s) {', '.join(absent)} "
                            f"missing (a question needs {', '.join(QUESTION_FIELDS)})")
        chat_id = str(question["chat_id"])
        if chat_id not in chats:
            known = ", ".join(list(chats)[:5]) + (", ..." if len(chats) > 5 else "")
            raise DataError(f"import-chats: {questions} {where}: chat_id {chat_id!r} is not in "
                            f"{export} (its chats: {known})")
        chat = chats[chat_id]
        record: dict[str, Any] = {"id": question.get("id", f"{chat_id}-q{asked[chat_id]}"),
                                  "history": chat.messages, "question": question["question"],
                                  "answer": question["answer"]}
        if chat.tools:
            record["tools"] = chat.tools
        record.update({key: question[key] for key in OPTIONAL_FIELDS if key in question})
        if question.get("evidence") is not None:
            record["evidence"] = _evidence(question["evidence"], chat, f"{questions} {where}")
        asked[chat_id] += 1
        records.append(record)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records),
                       encoding="utf-8")
    except OSError as exc:
        raise DataError(f"import-chats: cannot write {out} ({exc.strerror or exc}): pass "
                        "--out a file path in a writable directory") from None
    _check(out)
    return len(records)


def _check(out: Path) -> None:
    from pytest_budgetbench.tasks.jsonl import JsonlTask

    defaults = {option.key: option.default for option in JsonlTask.declared_options}
    JsonlTask(TaskOptions(data_path=out, extra=defaults)).load()


def _entries(path: Path, key: str = "") -> list[tuple[str, dict[str, Any]]]:
    """The objects of a JSON list (``{key: [...]}`` too) or of JSON lines (a ``.jsonl``
    file, or one that is not one JSON document), each with where it is ("record 3",
    "line 4")."""
    try:
        text = read_text(path)
    except OSError as exc:
        raise DataError(f"import-chats: cannot read {path}: {one_line(exc)}") from None
    except MalformedLine as exc:
        raise DataError(f"import-chats: {path} line {exc.line}: {exc.problem}") from None
    try:
        data = None if path.suffix == ".jsonl" else json.loads(text)
    except json.JSONDecodeError:
        data = None
    if data is None:
        try:
            entries = [(f"line {number}", entry) for number, entry in json_lines(text)]
        except MalformedLine as exc:
            raise DataError(f"import-chats: {path} line {exc.line}: {exc.problem}") from None
    else:
        if isinstance(data, dict) and key and isinstance(data.get(key), list):
            data = data[key]
        if not isinstance(data, list):
            raise DataError(f"import-chats: {path} must hold a JSON list (or JSON lines) of "
                            f"objects (got {type(data).__name__})")
        entries = [(f"record {index}", entry) for index, entry in enumerate(data)]
    for where, entry in entries:
        if not isinstance(entry, dict):
            raise DataError(f"import-chats: {path} {where} is a {type(entry).__name__}, "
                            "not an object")
    return entries


@dataclass(frozen=True)
class Chat:
    """One chat of the export: its messages, and the tools its model was given."""

    messages: list[Message]
    tools: list[Tool]
    texts: list[str]
    """The text of each message of the export, by its index there (evidence names them)."""


def _evidence(raw: Any, chat: Chat, where: str) -> list[str]:
    """A question's evidence as text spans: a string as given, a message index as the text
    of that message of the chat."""
    spans: list[str] = []
    for span in raw if isinstance(raw, list) else [raw]:
        if isinstance(span, str) and span.strip():
            spans.append(span)
        elif isinstance(span, int) and not isinstance(span, bool) \
                and 0 <= span < len(chat.texts) and chat.texts[span].strip():
            spans.append(chat.texts[span])
        else:
            raise DataError(
                f"import-chats: {where}: evidence {span!r} is neither text nor the index of "
                f"a message with text in its chat (0 to {len(chat.texts) - 1}); give the "
                "text its answer needs, or the index of the message that holds it")
    return spans


def _chats(path: Path, flatten_tools: bool) -> list[tuple[str, Chat]]:
    chats = []
    seen: dict[str, str] = {}
    for index, (where, chat) in enumerate(_entries(path, "chats")):
        if not isinstance(chat.get("messages"), list):
            raise DataError(f"import-chats: {path} {where}: a chat needs a 'messages' list")
        chat_id = str(chat.get("id", index))
        if chat_id in seen:  # a question could not say which chat it is about
            raise DataError(f"import-chats: {path} {where}: chat id {chat_id!r} is also "
                            f"{seen[chat_id]}'s; give each chat its own id")
        seen[chat_id] = where
        messages = _messages(path, where, chat["messages"])
        texts = [text_of(message) for message in chat["messages"]]  # validated above
        if flatten_tools:  # no call is left to need a tool
            chats.append((chat_id, Chat(_flattened(messages), [], texts)))
        else:
            _check_pairs(path, where, messages)
            chats.append((chat_id, Chat(messages, _tools(path, where, chat), texts)))
    return chats


def _messages(path: Path, where: str, raw: list[Any]) -> list[Message]:
    """The chat's messages in today's chat format: a legacy ``function_call`` becomes a
    tool call with an id, and the ``function`` message that answers it a ``tool`` result
    naming that id; a message with nothing in it is dropped."""
    messages: list[Message] = []
    pending: list[tuple[str, str]] = []  # legacy calls not yet answered: (id, name)
    for index, message in enumerate(raw):
        where_message = f"import-chats: {path} {where}: messages[{index}]"
        if not isinstance(message, dict) or "role" not in message:
            raise DataError(f"{where_message} must be an object with a 'role'")
        role = message["role"]
        if role == "function":
            converted = _legacy_result(where_message, message, pending)
        elif role in ROLES:
            converted = _message(where_message, message, index, pending)
        else:
            raise DataError(f"{where_message} has unknown role {role!r} (known: "
                            f"{', '.join(sorted(ROLES | {'function'}))})")
        if converted.get("content") is not None or converted.get("tool_calls"):
            messages.append(converted)
    return messages


def _message(where: str, message: Message, index: int,
             pending: list[tuple[str, str]]) -> Message:
    out: Message = {"role": message["role"], "content": _content(message.get("content"))}
    for key in ("name", "tool_call_id"):
        if isinstance(message.get(key), str):
            out[key] = message[key]
    calls = [_call(where, number, call) for number, call in
             enumerate(_raw_calls(where, message.get("tool_calls")))]
    legacy = message.get("function_call")
    if isinstance(legacy, dict):
        call_id = f"fn_{index}"  # the legacy format has no ids; the message's index is one
        calls.append(_call(where, 0, {"id": call_id, "function": legacy}))
        pending.append((call_id, str(legacy.get("name"))))
    if calls:
        out["tool_calls"] = calls
    return out


def _raw_calls(where: str, calls: Any) -> list[Any]:
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise DataError(f"{where}.tool_calls must be a list of calls (got "
                        f"{one_line(repr(calls), 40)})")
    return calls


def _call(where: str, number: int, call: Any) -> dict[str, Any]:
    """A tool call as the chat API takes it; arguments an export stored parsed become
    JSON text again. An id it lacks is left for the check to report."""
    function = call.get("function", {}) if isinstance(call, dict) else None
    if not isinstance(function, dict):
        raise DataError(f"{where}.tool_calls[{number}] must be an object whose 'function' is "
                        "an object with 'name' and 'arguments' (got "
                        f"{one_line(repr(call), 60)})")
    arguments = function.get("arguments", "")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    out = {"type": "function", "function": {"name": function.get("name"),
                                            "arguments": arguments}}
    return {"id": call["id"], **out} if "id" in call else out


def _legacy_result(where: str, message: Message, pending: list[tuple[str, str]]) -> Message:
    """A legacy ``function`` result answers the open legacy call of its name (else the
    oldest open one); with none open it names no call, and the check says so."""
    name = message.get("name")
    result: Message = {"role": "tool", "content": _text(message.get("content"))}
    if pending:
        match = next((i for i, (_id, called) in enumerate(pending) if called == name), 0)
        call_id, called = pending.pop(match)
        result["tool_call_id"] = call_id
        name = name or called
    if isinstance(name, str):
        result["name"] = name
    return result


def _content(content: Any) -> Any:
    """Content the chat API takes: text, content parts, or None."""
    return content if content is None or isinstance(content, (str, list)) else _text(content)


def _check_pairs(path: Path, where: str, messages: list[Message]) -> None:
    try:
        check_messages(messages, "the chat")
        check_tool_pairs(messages, "the chat")
    except (TypeError, ValueError) as exc:
        raise DataError(f"import-chats: {path} {where}: {one_line(exc, 300)}; or pass "
                        "--flatten-tools to import tool calls and results as text") from None


def _tools(path: Path, where: str, chat: dict[str, Any]) -> list[Tool]:
    """The chat's ``tools`` (or legacy ``functions``, each one a tool's function)."""
    if chat.get("tools") is not None:
        tools = chat["tools"]
    elif isinstance(chat.get("functions"), list):
        tools = [{"type": "function", "function": function} for function in chat["functions"]]
    else:
        return []
    try:
        return check_tools(tools, "the chat's 'tools'")
    except TypeError as exc:
        raise DataError(f"import-chats: {path} {where}: {one_line(exc, 300)}") from None


def _flattened(messages: list[Message]) -> list[Message]:
    """The chat with its tool traffic as text (``--flatten-tools``), for an endpoint that
    refuses tool messages: calls become ``[tool call] name(arguments)`` lines of their
    message, a result an assistant message ``[tool result NAME] ...``."""
    flat: list[Message] = []
    for message in messages:
        role, content = message["role"], message.get("content")
        if role == "tool":
            name = message.get("name") or message.get("tool_call_id") or role
            flat.append({"role": "assistant", "content": f"[tool result {name}] {_text(content)}"})
            continue
        calls = message.get("tool_calls") or []
        if isinstance(content, list) and not calls:
            flat.append({"role": role, "content": content})
            continue
        lines = [_text(content)] + [
            f"[tool call] {call['function'].get('name') or '?'}({call['function']['arguments']})"
            for call in calls]
        text = "\n".join(line for line in lines if line)
        if text:
            flat.append({"role": role, "content": text})
    return flat


def _text(content: Any) -> str:
    return text_of({"content": content}) if isinstance(content, (list, str)) else (
        "" if content is None else str(content))


def write_example(folder: Path) -> tuple[Path, Path]:
    """A small generated export and its questions (the worked example in docs/tasks.md)."""
    from pytest_budgetbench.tasks._fixtures import openai_chat_export, write_json, write_jsonl

    chats, questions = openai_chat_export()
    return (write_json(folder / "export.json", chats),
            write_jsonl(folder / "questions.jsonl", questions))
