"""``budgetbench import-chats``: an OpenAI-style transcript export plus questions -> the
``jsonl`` task's records.

The export is a JSON list of chats (or ``{"chats": [...]}``, or JSON lines), each with
``messages`` in the chat format and an ``id``. The questions file (JSON list or JSON lines)
holds one question per record: ``chat_id``, ``question``, ``answer`` (a string, a number or
a list), and optionally ``category``, ``id`` and ``rubric``. Each question becomes one
record: the chat's messages as ``history``, then the question.

What an endpoint would refuse out of context is flattened to text: an assistant's
``tool_calls`` become ``[tool call] name(arguments)`` lines of its message, and a ``tool``
(or legacy ``function``) result becomes an assistant message ``[tool result] ...``; a
message with no content left is dropped. The written file is then loaded as the ``jsonl``
task loads it, so what this writes is what a sweep reads.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from pytest_budgetbench.errors import DataError, MalformedLine
from pytest_budgetbench.messages import ROLES, Message, text_of
from pytest_budgetbench.tasks._data import json_lines, one_line
from pytest_budgetbench.tasks.base import TaskOptions

QUESTION_FIELDS = ("chat_id", "question", "answer")
OPTIONAL_FIELDS = ("category", "id", "rubric")


def import_chats(export: Path, questions: Path, out: Path) -> int:
    """Write ``out`` (JSON lines) and return how many records it holds."""
    chats = dict(_chats(export))
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
        record: dict[str, Any] = {"id": question.get("id", f"{chat_id}-q{asked[chat_id]}"),
                                  "history": chats[chat_id], "question": question["question"],
                                  "answer": question["answer"]}
        record.update({key: question[key] for key in OPTIONAL_FIELDS if key in question})
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
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"import-chats: cannot read {path}: {one_line(exc)}") from None
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


def _chats(path: Path) -> list[tuple[str, list[Message]]]:
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
        messages = [m for m in (_flat(path, where, i, m) for i, m in
                                enumerate(chat["messages"])) if m is not None]
        chats.append((chat_id, messages))
    return chats


def _flat(path: Path, where: str, index: int, message: Any) -> Message | None:
    """A message the chat API takes in any context, or None when nothing is left of it."""
    if not isinstance(message, dict) or "role" not in message:
        raise DataError(f"import-chats: {path} {where}: messages[{index}] must be an object "
                        "with a 'role'")
    role, content = message["role"], message.get("content")
    if role in ("tool", "function"):
        name = message.get("name") or message.get("tool_call_id") or role
        return {"role": "assistant", "content": f"[tool result {name}] {_text(content)}"}
    if role not in ROLES:
        raise DataError(f"import-chats: {path} {where}: messages[{index}] has unknown role "
                        f"{role!r} (known: {', '.join(sorted(ROLES | {'function'}))})")
    lines = [_text(content)] if content else []
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise DataError(f"import-chats: {path} {where}: messages[{index}].tool_calls must be "
                        f"a list of calls (got {one_line(repr(calls), 40)})")
    for number, call in enumerate(calls):
        function = call.get("function", {}) if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise DataError(f"import-chats: {path} {where}: messages[{index}].tool_calls"
                            f"[{number}] must be an object whose 'function' is an object "
                            f"with 'name' and 'arguments' (got {one_line(repr(call), 60)})")
        lines.append(f"[tool call] {function.get('name', '?')}({function.get('arguments', '')})")
    if isinstance(content, list) and not message.get("tool_calls"):
        return {"role": role, "content": content}
    text = "\n".join(line for line in lines if line)
    return {"role": role, "content": text} if text else None


def _text(content: Any) -> str:
    return text_of({"content": content}) if isinstance(content, (list, str)) else (
        "" if content is None else str(content))


def write_example(folder: Path) -> tuple[Path, Path]:
    """A small generated export and its questions (the worked example in docs/tasks.md)."""
    from pytest_budgetbench.tasks._fixtures import openai_chat_export, write_json, write_jsonl

    chats, questions = openai_chat_export()
    return (write_json(folder / "export.json", chats),
            write_jsonl(folder / "questions.jsonl", questions))
