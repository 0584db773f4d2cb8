"""``jsonl`` and ``csv``: a team's own chats as a task, declared, not coded.

One record per line (a JSONL object, or a CSV row) holds an OpenAI chat history and the
gold answer(s)::

    {"id": "c1", "messages": [{"role": "user", "content": "My order is #4411."},
                              {"role": "assistant", "content": "Noted."},
                              {"role": "user", "content": "What is my order number?"}],
     "answer": "4411", "category": "orders"}

``messages`` ends with the user's question; or give ``history`` (the messages before it)
and ``question`` (its text). ``answer`` is a string, a number or a list of them (any one
is right); ``category``, ``id`` and ``rubric`` (for ``grader=judge``) are optional, and so
is ``evidence`` (:attr:`Item.evidence`): the spans the answer needs, a list of strings, each
verbatim text of the history, or of message indices (0-based into the record's messages,
or its history then its question), each standing for that message's whole text; or one
string. In a CSV, ``messages`` and ``history`` cells hold the JSON list, and an ``answer``
or ``evidence`` cell that is a JSON list holds several values, any other one string. Every
field name is an option (``answer_field=expected``), and so is the grader
(:mod:`pytest_budgetbench.tasks.graders`).

An agent's trajectory stays as it is: an assistant message with ``tool_calls`` (its
``content`` null or text) and the ``tool`` messages that answer it (``tool_call_id``) are
kept as messages, so strategies see each call with its result; an optional ``tools`` list
(OpenAI tool schemas) becomes :attr:`Item.tools`, sent and counted with the item's call
(a CSV's ``tools`` cell holds the JSON list).

The whole file is checked when it loads, before any cell runs: a bad record is one line
naming the file, the line and the field (a missing field, a wrong type, an empty history,
a message with an unknown role, a tool call without an id, a tool result whose call does
not come just before it, tools that are not tool schemas, evidence that is not strings or
indices, an index past the history).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from pytest_budgetbench.errors import ConfigError, DataError, MalformedLine, MalformedRecord
from pytest_budgetbench.messages import (
    ROLES,
    Message,
    Tool,
    check_messages,
    check_tool_pairs,
    check_tools,
    text_of,
)
from pytest_budgetbench.options import DataFile, Option
from pytest_budgetbench.tasks._data import (
    cell_suffix,
    flag,
    json_lines,
    one_line,
    read_text,
    resolve_file,
)
from pytest_budgetbench.tasks.base import GoldAnswers, Grade, Item, Task, TaskOptions
from pytest_budgetbench.tasks.graders import (
    AnswerGrader,
    Tolerance,
    gold_problem,
    parse_grader,
    parse_tolerance,
)

DEFAULT_CATEGORY = "all"


def _field(key: str, default: str) -> Option:
    return Option(f"{key}_field", f"record field that holds the {key.replace('_', ' ')} "
                  f"(jsonl, csv)", _field_name, default)


def _field_name(raw: str) -> str:
    if not raw:
        raise ValueError("must name a field")
    return raw


OPTIONS = (
    Option("grader", "how replies are graded: exact | contains | f1 | regex | choice | numeric "
           "| judge | module:attr (jsonl, csv)", parse_grader, "contains"),
    Option("tolerance", "grader=numeric: how far from the gold a number may be, e.g. 0.5 or "
           "2% (jsonl, csv)", parse_tolerance, Tolerance(0.0)),
    Option("system_prompt", "a system message for records that start without one (jsonl, "
           "csv)", str, ""),
    _field("messages", "messages"),
    _field("history", "history"),
    _field("question", "question"),
    _field("answer", "answer"),
    _field("category", "category"),
    _field("id", "id"),
    _field("rubric", "rubric"),
    _field("tools", "tools"),
    _field("evidence", "evidence"),
)


class JsonlTask(Task):
    """Chats from a JSON-lines file, one record per line."""

    name = "jsonl"
    grader_version = "jsonl-contains/1"
    """The default grader's id; :attr:`grader_id` names the chosen one."""
    data = DataFile("a .jsonl file of chats, one record per line")
    declared_options = (*Task.declared_options, *OPTIONS)
    file_kind: ClassVar[str] = "JSON-lines"

    def __init__(self, options: TaskOptions) -> None:
        super().__init__(options)
        grader = str(self.option("grader"))
        if grader == "judge" and options.judge is None:
            raise ConfigError(
                f"task '{self.name}' grades with an LLM judge (grader=judge): pass "
                "--budgetbench-judge-endpoint=URL --budgetbench-judge-model=ID")
        self.grader = AnswerGrader(grader, self.option("tolerance"), options.judge)

    @property
    def grader_id(self) -> str:
        return self.grader.grader_id

    # -- loading ---------------------------------------------------------------------------
    def load(self) -> list[Item]:
        given = self._path()
        if given is not None and given.is_dir():
            raise DataError(f"task '{self.name}' needs a {self.file_kind} file, not the "
                            f"directory {given}: pass {flag(self.name)} with the file's path")
        path = resolve_file(self.name, given, (self.data.what,) if self.data else ())
        items: list[Item] = []
        seen: dict[str, int] = {}
        for line, record in self._records(path):
            try:
                item = self._item(line, record)
            except MalformedRecord as exc:
                raise self._bad(path, line, str(exc)) from None
            if item.item_id in seen:
                raise self._bad(path, line, f"id {item.item_id!r} is also line "
                                f"{seen[item.item_id]}'s; ids must be unique")
            seen[item.item_id] = line
            items.append(item)
        if not items:
            raise DataError(f"task '{self.name}' cannot read {path}: the file holds no "
                            f"record; point {flag(self.name)} at a {self.file_kind} file")
        return items

    def _path(self) -> Path | None:
        return self.options.data_path

    def _bad(self, path: Path, line: int, problem: str) -> DataError:
        return DataError(f"task '{self.name}': {path} line {line}: {one_line(problem, 240)}")

    def _records(self, path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
        try:  # line by line: the first bad line is the one reported, whatever is wrong
            for number, record in json_lines(_read(self.name, path)):
                if not isinstance(record, dict):
                    raise self._bad(path, number, f"a record must be a JSON object (got "
                                    f"{type(record).__name__})")
                yield number, record
        except MalformedLine as exc:
            raise self._bad(path, exc.line, exc.problem) from None

    def _item(self, line: int, record: dict[str, Any]) -> Item:
        fields = {key: str(self.option(f"{key}_field")) for key in
                  ("messages", "history", "question", "answer", "category", "id", "rubric",
                   "tools", "evidence")}
        messages, question = self._messages(record, fields)
        evidence = self._evidence(record, fields["evidence"], messages)
        prompt = str(self.option("system_prompt"))
        if prompt and messages[0]["role"] not in ("system", "developer"):
            messages.insert(0, {"role": "system", "content": prompt})
        tools = self._tools(record, fields["tools"])
        rubric = self._optional_text(record, fields["rubric"])
        golds = self._golds(record, fields["answer"], rubric)
        item_id = self._optional_text(record, fields["id"]) or f"{line:04d}"
        category = self._optional_text(record, fields["category"]) or DEFAULT_CATEGORY
        return Item(item_id=item_id, messages=tuple(messages), answer=golds,
                    category=category, tools=tuple(tools), evidence=evidence,
                    meta={"line": line, "question": question, "rubric": rubric})

    def _messages(self, record: dict[str, Any], fields: dict[str, str]) -> tuple[
            list[Message], str]:
        if fields["messages"] in record:
            messages = self._message_list(record, fields["messages"])
            last = messages[-1]
            if last["role"] != "user":
                raise MalformedRecord(
                    f"field '{fields['messages']}' must end with the user's question (its "
                    f"last message has role '{last['role']}'); or give "
                    f"'{fields['history']}' and '{fields['question']}'")
            question = text_of(last)
        elif fields["history"] in record or fields["question"] in record:
            for key in ("history", "question"):
                if fields[key] not in record:
                    other = fields["history" if key == "question" else "question"]
                    raise MalformedRecord(f"field '{fields[key]}' is missing (the record has "
                                          f"'{other}'; fields: {', '.join(record)})")
            messages = self._message_list(record, fields["history"])
            question = record[fields["question"]]
            if not isinstance(question, str) or not question.strip():
                raise MalformedRecord(f"field '{fields['question']}' must be a non-empty string "
                                      f"(got {_described(question)})")
            messages.append({"role": "user", "content": question})
        else:
            raise MalformedRecord(
                f"the record has neither '{fields['messages']}' nor '{fields['history']}' + "
                f"'{fields['question']}' (fields: {', '.join(record) or 'none'}); map yours "
                "with messages_field=, or history_field= and question_field=")
        if not any(m["role"] not in ("system", "developer") for m in messages[:-1]):
            raise MalformedRecord("the history before the question is empty: a record needs the "
                                  "conversation the question is about")
        _check_tool_traffic(messages, fields["messages"] if fields["messages"] in record
                            else fields["history"])
        return messages, question

    def _message_list(self, record: dict[str, Any], key: str) -> list[Message]:
        value = self._json_cell(record[key], key)
        if not isinstance(value, list):
            raise MalformedRecord(f"field '{key}' must be a list of chat messages (got "
                                  f"{_described(value)})")
        if not value:
            raise MalformedRecord(f"field '{key}' is empty: a record needs the conversation "
                                  "the question is about")
        return [_message(message, f"{key}[{index}]") for index, message in enumerate(value)]

    def _tools(self, record: dict[str, Any], key: str) -> list[Tool]:
        """The record's tools (OpenAI tool schemas), sent with its call; none when absent."""
        if key not in record or record[key] is None:
            return []
        try:
            return check_tools(self._json_cell(record[key], key, "a JSON list of tools"),
                               f"field '{key}'")
        except TypeError as exc:
            raise MalformedRecord(f"{exc}; give the tools as the chat API's 'tools' takes "
                                  "them, or leave the field out") from None

    def _evidence(self, record: dict[str, Any], key: str, messages: list[Message]
                  ) -> tuple[str, ...]:
        """The record's evidence spans: a string as given, a message index as that message's
        text (indices count the record's messages, before a ``system_prompt`` is added).

        Whether a string is verbatim in the history is checked by the core before any cell.
        """
        if key not in record or record[key] is None:
            return ()
        value = self._list_cell(record[key])
        spans: list[str] = []
        for span in value if isinstance(value, list) else [value]:
            if isinstance(span, bool) or not isinstance(span, (str, int)):
                raise MalformedRecord(f"field '{key}' must be a string, a message index or a "
                                      f"list of them (got {_described(span)})")
            if isinstance(span, str):
                if not span.strip():
                    raise MalformedRecord(f"field '{key}' holds an empty string: give the text "
                                          "the answer needs, as the history has it")
                spans.append(span)
                continue
            if not 0 <= span < len(messages):
                raise MalformedRecord(f"field '{key}' names message {span}, but the history has "
                                      f"{len(messages)} messages (indices 0 to "
                                      f"{len(messages) - 1})")
            text = text_of(messages[span])
            if not text.strip():
                raise MalformedRecord(f"field '{key}' names message {span}, which has no text "
                                      "(a tool call or an image): name the message with the "
                                      "text, or give the text itself")
            spans.append(text)
        return tuple(spans)

    def _json_cell(self, value: Any, key: str, what: str = "a JSON list of chat messages"
                   ) -> Any:
        """A record's value as it is (JSON); :class:`CsvTask` parses its cells."""
        return value

    def _golds(self, record: dict[str, Any], key: str, rubric: str) -> tuple[str, ...]:
        grader = str(self.option("grader"))
        if key not in record:
            if grader == "judge" and rubric:
                return ()
            raise MalformedRecord(f"field '{key}' is missing (fields: {', '.join(record)}); map "
                                  "yours with answer_field=")
        value = self._list_cell(record[key])
        values = value if isinstance(value, list) else [value]
        if not values:
            raise MalformedRecord(f"field '{key}' is an empty list: give at least one answer")
        golds = []
        for gold in values:
            if isinstance(gold, bool) or not isinstance(gold, (str, int, float)):
                raise MalformedRecord(f"field '{key}' must be a string, a number or a list of "
                                      f"them (got {_described(gold)})")
            problem = gold_problem(grader, str(gold))
            if problem is not None:
                raise MalformedRecord(f"field '{key}' {problem}")
            golds.append(str(gold))
        return tuple(golds)

    def _list_cell(self, value: Any) -> Any:
        """A value that is one or a list (answer, evidence) as it is; :class:`CsvTask` parses a
        cell that holds a JSON list."""
        return value

    @staticmethod
    def _optional_text(record: dict[str, Any], key: str) -> str:
        value = record.get(key)
        if value is None or value == "":
            return ""
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise MalformedRecord(f"field '{key}' must be a string or a number (got "
                                  f"{_described(value)})")
        return str(value)

    # -- grading ---------------------------------------------------------------------------
    def gold_answers(self, item: Item) -> GoldAnswers | None:
        """The gold answers, any one right, where the grader matches normalised text
        (exact, contains, f1); None for one that reads a pattern, a letter, a number, a
        judge's verdict or a callable's."""
        return self.grader.gold_answers(item)

    def grade(self, item: Item, prediction: str) -> Grade:
        return self.grader.grade(item, prediction)

    def export(self, item: Item, prediction: str, cell_id: str) -> tuple[str, dict[str, Any]]:
        """``<task>_predictions.<strategy>-<budget>.jsonl``: id, prediction, gold answers."""
        return (f"{self.name}_predictions.{cell_suffix(cell_id)}.jsonl",
                {"id": item.item_id, "prediction": prediction or "",
                 "answer": list(item.answer), "category": item.category})


class CsvTask(JsonlTask):
    """The same records as CSV rows with a header; JSON lists in the message columns."""

    name = "csv"
    grader_version = "jsonl-contains/1"
    data = DataFile("a .csv file of chats with a header row")
    file_kind = "CSV"

    def _records(self, path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
        try:
            rows = _csv_rows(_read(self.name, path))
        except MalformedLine as exc:
            raise self._bad(path, exc.line, exc.problem) from None
        header: list[str] | None = None
        for line, row in rows:
            if header is None:
                header = row
                continue
            record = {key: value for key, value in zip(header, row, strict=False)
                      if value != ""}
            if record:
                yield line, record

    def _json_cell(self, value: Any, key: str, what: str = "a JSON list of chat messages"
                   ) -> Any:
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise MalformedRecord(f"column '{key}' must hold {what} ({exc.msg} at column "
                                  f"{exc.colno})") from None

    def _list_cell(self, value: Any) -> Any:
        if isinstance(value, str) and value.lstrip().startswith("["):
            try:
                return json.loads(value)
            except json.JSONDecodeError:
                return value
        return value


def _csv_rows(text: str) -> list[tuple[int, list[str]]]:
    """The non-blank rows of a CSV text, each with the line it starts on.

    Records end at a CSV line end (CR LF, LF or CR) outside quotes, never at U+2028 and
    the like; a cell may be as long as the text; a quote left open is an error at the line
    its record starts on (:class:`~pytest_budgetbench.errors.MalformedLine`).
    """
    limit = csv.field_size_limit()
    # The limit is process-wide: raised only while this text is read, and only as far
    # as a cell of this text can reach.
    csv.field_size_limit(max(limit, len(text) + 1))
    try:
        reader = csv.reader(io.StringIO(text, newline=""), strict=True)
        rows: list[tuple[int, list[str]]] = []
        start = 1
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return rows
            except csv.Error as exc:
                problem = ("a quoted cell is never closed: add its closing '\"'"
                           if "unexpected end of data" in str(exc) else f"not valid CSV ({exc})")
                raise MalformedLine(start, problem) from None
            if row:
                rows.append((start, row))
            start = reader.line_num + 1
    finally:
        csv.field_size_limit(limit)


def _read(task: str, path: Path) -> str:
    """The file's text; a byte that is not UTF-8 is a MalformedLine, for the caller to name
    with the file."""
    try:
        return read_text(path)
    except OSError as exc:
        raise DataError(f"task '{task}' cannot read {path}: {one_line(exc)}; pass "
                        f"{flag(task)}") from None


def _message(value: Any, where: str) -> Message:
    if not isinstance(value, dict):
        raise MalformedRecord(f"{where} must be an object with 'role' and 'content' (got "
                              f"{_described(value)})")
    if "role" not in value:
        raise MalformedRecord(f"{where} has no 'role'")
    role = value["role"]
    if role not in ROLES:
        raise MalformedRecord(f"{where} has unknown role {role!r} "
                              f"(known: {', '.join(sorted(ROLES))})")
    content = value.get("content")
    if content is None and value.get("tool_calls"):
        return dict(value)  # an assistant's tool calls: checked with the whole list
    if isinstance(content, list):
        if not all(isinstance(part, dict) and isinstance(part.get("type"), str)
                   for part in content):
            raise MalformedRecord(f"{where}.content must be a string or a list of "
                                  "{'type': ...} content parts")
    elif not isinstance(content, str):
        raise MalformedRecord(f"{where}.content must be a string or a list of content parts "
                              f"(got {_described(content)})")
    return dict(value)


def _check_tool_traffic(messages: list[Message], key: str) -> None:
    """Tool calls and results as the chat API takes them: each call with an id, each
    result naming its call, each call answered at once (the pairs strategies keep)."""
    where = f"field '{key}'"
    try:
        check_messages(messages, where)
    except TypeError as exc:
        raise MalformedRecord(f"{exc}; write tool calls and results in the OpenAI chat "
                              "format") from None
    try:
        check_tool_pairs(messages, where)
    except ValueError as exc:
        raise MalformedRecord(str(exc)) from None


def _described(value: Any) -> str:
    if value is None:
        return "null"
    return f"{json.dumps(value, ensure_ascii=False, default=str)[:40]} that is a " \
           f"{type(value).__name__}"
