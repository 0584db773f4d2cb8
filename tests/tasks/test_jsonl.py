"""The declared ``jsonl`` / ``csv`` task: a team's own chats, named instances, graders, and
one line naming the file and line for every bad record."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.errors import ConfigError, DataError
from pytest_budgetbench.messages import as_sent, text_of
from pytest_budgetbench.options import resolve_values
from pytest_budgetbench.settings.task_grammar import parse_task_definition, split_top_level
from pytest_budgetbench.tasks import Item, Task, TaskOptions, resolve_task
from pytest_budgetbench.tasks import _fixtures as fx
from pytest_budgetbench.tasks.graders import AnswerGrader, parse_tolerance
from tests.fake_openai import FakeOpenAI
from tests.sweeps import rows_of, sweep_args
from tests.tasks.test_longmemeval import FakeJudge

CHAT = [{"role": "user", "content": "my dog is called Rex"},
        {"role": "assistant", "content": "Noted."}]
QUESTION = {"role": "user", "content": "What is my dog called?"}
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "lookup_pet", "arguments": '{"owner": "me"}'}}
TRAJECTORY = [{"role": "user", "content": "Look up my pet."},
              {"role": "assistant", "content": None, "tool_calls": [CALL]},
              {"role": "tool", "tool_call_id": "call_1", "content": "dog: Rex"},
              {"role": "assistant", "content": "Your dog is Rex."}]
TOOLS = [{"type": "function", "function": {
    "name": "lookup_pet", "description": "The user's pets.",
    "parameters": {"type": "object", "properties": {"owner": {"type": "string"}}}}}]


def _task(path: Path, **params: str) -> Task:
    cls = resolve_task("chats", {"chats": ("jsonl" if path.suffix != ".csv" else "csv",
                                           {"path": str(path), **params})})
    return cls(TaskOptions(data_path=path, extra=resolve_values(cls, {}, "--x")))


def _write(path: Path, *records: Any) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n"
                            for r in records), encoding="utf-8")
    return path


# -- a user project: 200 chats, no Python ---------------------------------------------------
def test_a_project_with_200_chats_runs_a_named_instance_with_no_python(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    fx.write_jsonl(pytester.path / "data" / "chats.jsonl", fx.support_chat_records(200))
    pytester.makeini(
        "[pytest]\n"
        "budgetbench_named_tasks =\n"
        "    support_chats = jsonl(path=data/chats.jsonl, grader=exact)\n"
        "    other = csv(path=data/other.csv)\n"
        "budgetbench_items = 200\n"
    )
    result = pytester.runpytest(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=128,4096", "--budgetbench-tasks=support_chats"))
    result.assert_outcomes(passed=600, xfailed=200)  # full_context over 128 is xfailed
    rows = rows_of(tmp_path)
    assert len(rows) == 800
    assert {r["task"] for r in rows} == {"support_chats"}
    assert rows[0]["cell_id"] == "support_chats-chat_0000+317558c9072d-full_context-128"
    assert {r["category"] for r in rows} == {"hardware", "account", "billing"}
    assert {r["grader"] for r in rows} == {"jsonl-exact/1"}
    ok = {(r["strategy"], r["budget"]): [] for r in rows}
    for row in rows:
        if row["status"] == "ok":
            ok[(row["strategy"], row["budget"])].append(row["quality"])
    # The evidence is the chat's first turn: all of history keeps it, 128 tokens do not.
    assert ok[("full_context", 4096)] == [1.0] * 200
    assert ok[("truncation", 4096)] == [1.0] * 200
    assert ok[("truncation", 128)] == [0.0] * 200
    exports = list((tmp_path / "out").glob("*/exports/support_chats_predictions.*.jsonl"))
    assert len(exports) == 3  # one per strategy@budget that sent a prompt


def test_an_inline_definition_and_its_data_flag_override_the_path(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    data = fx.write_jsonl(tmp_path / "real.jsonl", fx.support_chat_records(3))
    result = pytester.runpytest(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=4096", "--budgetbench-strategies=full_context",
        "--budgetbench-tasks=memory,tickets=jsonl(path=nowhere.jsonl, grader=f1)",
        f"--budgetbench-data-tickets={data}", "--budgetbench-items=3"))
    result.assert_outcomes(passed=6)
    graders = {r["task"]: r["grader"] for r in rows_of(tmp_path)}
    assert graders == {"memory": "memory-contains/1", "tickets": "jsonl-f1/1"}


def test_the_ini_twin_of_an_instance_data_flag_is_read(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    data = fx.write_jsonl(tmp_path / "c.jsonl", fx.support_chat_records(2))
    pytester.makeini(f"[pytest]\nbudgetbench_named_tasks = chats = jsonl\n"
                     f"budgetbench_data_chats = {data}\n")
    result = pytester.runpytest(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=4096", "--budgetbench-strategies=full_context",
        "--budgetbench-tasks=chats"))
    result.assert_outcomes(passed=2)


def test_a_custom_task_class_ids_use_its_name_not_its_module_path(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    pytester.makepyfile(mymem_tasks="""
        from pytest_budgetbench.tasks import Grade, Item, Task

        class MyJsonl(Task):
            name = "my_jsonl"
            grader_version = "mine/1"

            def load(self):
                return [Item("q0", ({"role": "user", "content": "hi"},
                                    {"role": "user", "content": "What?"}), "x", "all")]

            def grade(self, item, prediction):
                return Grade(0.0, prediction, self.grader_version)
    """)
    pytester.syspathinsert()
    result = pytester.runpytest(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=256", "--budgetbench-strategies=truncation",
        "--budgetbench-tasks=mymem_tasks:MyJsonl", "-v"))
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*cell?my_jsonl-q0-truncation-256?*PASSED*"])
    (row,) = rows_of(tmp_path)
    assert row["task"] == "my_jsonl"


# -- one line per bad input, before any cell ------------------------------------------------
BAD = [
    ({"messages": [*CHAT, QUESTION]}, "line 2: field 'answer' is missing"),
    ({"answer": "Rex"}, "line 2: the record has neither 'messages' nor 'history' + 'question'"),
    ({"history": CHAT, "answer": "Rex"}, "line 2: field 'question' is missing"),
    ({"messages": "hello", "answer": "Rex"},
     "line 2: field 'messages' must be a list of chat messages (got \"hello\" that is a str)"),
    ({"messages": [], "answer": "Rex"}, "line 2: field 'messages' is empty"),
    ({"messages": [QUESTION], "answer": "Rex"},
     "line 2: the history before the question is empty"),
    ({"history": [], "question": "Who?", "answer": "Rex"}, "line 2: field 'history' is empty"),
    ({"messages": [{"role": "bot", "content": "hi"}, QUESTION], "answer": "Rex"},
     "line 2: messages[0] has unknown role 'bot'"),
    ({"messages": [{"role": "user", "content": None}, QUESTION], "answer": "Rex"},
     "line 2: messages[0].content must be a string or a list of content parts (got null)"),
    ({"messages": [*CHAT, {"role": "assistant", "content": "x"}], "answer": "Rex"},
     "line 2: field 'messages' must end with the user's question"),
    ({"messages": [*CHAT, QUESTION], "answer": {"name": "Rex"}},
     "line 2: field 'answer' must be a string, a number or a list of them"),
    ({"messages": [*CHAT, QUESTION], "answer": []}, "line 2: field 'answer' is an empty list"),
    ({"history": CHAT, "question": 7, "answer": "Rex"},
     "line 2: field 'question' must be a non-empty string"),
    ({"messages": [*CHAT, QUESTION], "answer": "Rex", "category": ["a"]},
     "line 2: field 'category' must be a string or a number"),
    ("[1, 2]", "line 2: a record must be a JSON object (got list)"),
    ("{not json", "line 2: not valid JSON"),
    ({"id": "first", "messages": [*CHAT, QUESTION], "answer": "Rex"},
     "line 2: id 'first' is also line 1's; ids must be unique"),
    # An agent's trajectory: calls with ids, results naming them, each pair whole.
    ({"messages": [TRAJECTORY[0], {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": CALL["function"]}]}, TRAJECTORY[2], QUESTION],
      "answer": "Rex"},
     "line 2: field 'messages' returned message 1 with tool call 0 that is not {'id': str"),
    ({"messages": [*TRAJECTORY[:2], {"role": "tool", "content": "dog: Rex"}, QUESTION],
      "answer": "Rex"},
     "line 2: field 'messages' returned tool message 2 without a string 'tool_call_id'"),
    ({"messages": [*TRAJECTORY[:2], QUESTION], "answer": "Rex"},
     "line 2: field 'messages' broke a tool-call pair: call 'call_1' (lookup_pet) at message "
     "1 has no tool result before message 2"),
    ({"history": [TRAJECTORY[0], TRAJECTORY[2]], "question": "Pet?", "answer": "Rex"},
     "line 2: field 'history' broke a tool-call pair: the tool result at message 1 answers "
     "call 'call_1', which no assistant message just before it makes"),
    ({"messages": [*TRAJECTORY, QUESTION], "answer": "Rex", "tools": {"name": "lookup_pet"}},
     "line 2: field 'tools' must be a list of tools (got {'name': 'lookup_pet'} that is a "
     "dict); give the tools as the chat API's 'tools' takes them"),
    ({"messages": [*TRAJECTORY, QUESTION], "answer": "Rex", "tools": [{"name": "lookup_pet"}]},
     "line 2: field 'tools' has tool 0 that is not {'type': 'function', 'function': "
     "{'name': str"),
    # Evidence: strings or message indices inside the history.
    ({"messages": [*CHAT, QUESTION], "answer": "Rex", "evidence": [0, 3]},
     "line 2: field 'evidence' names message 3, but the history has 3 messages (indices 0 "
     "to 2)"),
    ({"history": CHAT, "question": "Who?", "answer": "Rex", "evidence": -1},
     "line 2: field 'evidence' names message -1, but the history has 3 messages"),
    ({"messages": [*CHAT, QUESTION], "answer": "Rex", "evidence": {"text": "Rex"}},
     "line 2: field 'evidence' must be a string, a message index or a list of them (got "
     '{"text": "Rex"} that is a dict)'),
    ({"messages": [*CHAT, QUESTION], "answer": "Rex", "evidence": ["Rex", 1.5]},
     "line 2: field 'evidence' must be a string, a message index or a list of them (got 1.5 "
     "that is a float)"),
    ({"messages": [*CHAT, QUESTION], "answer": "Rex", "evidence": [True]},
     "line 2: field 'evidence' must be a string, a message index or a list of them (got "
     "true that is a bool)"),
    ({"messages": [*CHAT, QUESTION], "answer": "Rex", "evidence": ["  "]},
     "line 2: field 'evidence' holds an empty string"),
    ({"messages": [*TRAJECTORY, QUESTION], "answer": "Rex", "evidence": [1]},
     "line 2: field 'evidence' names message 1, which has no text (a tool call or an image)"),
]


@pytest.mark.parametrize(("record", "expected"), BAD, ids=[b[1][8:40] for b in BAD])
def test_a_bad_record_is_one_line_naming_file_and_line(
    tmp_path: Path, record: Any, expected: str
) -> None:
    good = {"id": "first", "messages": [*CHAT, QUESTION], "answer": "Rex"}
    path = _write(tmp_path / "chats.jsonl", good, record)
    with pytest.raises(DataError) as info:
        _task(path).load()
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"task 'chats': {path} {expected}"), message


def test_an_agent_trajectory_keeps_its_calls_and_results_and_its_tools(tmp_path: Path) -> None:
    path = _write(tmp_path / "agent.jsonl",
                  {"id": "a1", "messages": [*TRAJECTORY, QUESTION], "answer": "Rex",
                   "tools": TOOLS},
                  {"id": "a2", "history": TRAJECTORY, "question": "Pet?", "answer": "Rex"})
    with_tools, without = _task(path).load()
    assert with_tools.messages == (*TRAJECTORY, QUESTION)  # nothing flattened to text
    assert with_tools.tools == tuple(TOOLS)
    assert without.messages[1]["tool_calls"] == [CALL] and without.tools == ()


def test_csv_cells_hold_a_trajectory_and_its_tools_as_json(tmp_path: Path) -> None:
    path = tmp_path / "agent.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["history", "question", "answer", "tools"])
        writer.writerow([json.dumps(TRAJECTORY), "Pet?", "Rex", json.dumps(TOOLS)])
        writer.writerow([json.dumps(TRAJECTORY), "Pet?", "Rex", "[{"])
    with pytest.raises(DataError, match=r"line 3: column 'tools' must hold a JSON list of "
                                        r"tools \(Expecting"):
        _task(path).load()
    path.write_text("\n".join(path.read_text().splitlines()[:2]) + "\n")
    (item,) = _task(path).load()
    assert item.messages[2] == TRAJECTORY[2] and item.tools == tuple(TOOLS)


def test_evidence_is_strings_as_given_or_message_indices_as_their_text(tmp_path: Path) -> None:
    path = _write(tmp_path / "chats.jsonl",
                  {"id": "s", "messages": [*CHAT, QUESTION], "answer": "Rex",
                   "evidence": ["called Rex", "Noted."]},
                  {"id": "i", "messages": [*TRAJECTORY, QUESTION], "answer": "Rex",
                   "evidence": [2, 0]},
                  {"id": "one", "history": CHAT, "question": "Who?", "answer": "Rex",
                   "evidence": "my dog is called Rex"},
                  {"id": "none", "messages": [*CHAT, QUESTION], "answer": "Rex"},
                  {"id": "empty", "messages": [*CHAT, QUESTION], "answer": "Rex",
                   "evidence": []})
    strings, indices, one, none, empty = _task(path).load()
    assert strings.evidence == ("called Rex", "Noted.")
    assert indices.evidence == ("dog: Rex", "Look up my pet.")  # the tool result, the request
    assert one.evidence == ("my dog is called Rex",)
    assert none.evidence == () and empty.evidence == ()
    for item in (strings, indices, one):
        assert all(any(span in text_of(m) for m in item.messages)
                   for span in item.evidence)


def test_evidence_indices_count_the_records_messages_not_an_added_system_prompt(
    tmp_path: Path
) -> None:
    path = _write(tmp_path / "chats.jsonl",
                  {"history": CHAT, "question": "Who?", "answer": "Rex", "evidence": [0, 2]},
                  {"messages": [*CHAT, QUESTION], "answer": "Rex", "facts": 1})
    first, second = _task(path, system_prompt="Be brief.", evidence_field="facts").load()
    assert first.evidence == () and second.evidence == ("Noted.",)
    first, _ = _task(path, system_prompt="Be brief.").load()
    assert first.messages[0] == {"role": "system", "content": "Be brief."}
    assert first.evidence == ("my dog is called Rex", "Who?")


def test_a_csv_evidence_cell_is_a_json_list_or_a_plain_string(tmp_path: Path) -> None:
    path = tmp_path / "chats.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "history", "question", "answer", "evidence"])
        writer.writerow(["l", json.dumps(CHAT), "Who?", "Rex", '["called Rex", 1]'])
        writer.writerow(["s", json.dumps(CHAT), "Who?", "Rex", "my dog is called Rex"])
        writer.writerow(["n", json.dumps(CHAT), "Who?", "Rex", ""])
        writer.writerow(["b", json.dumps(CHAT), "Who?", "Rex", "[7]"])
    with pytest.raises(DataError) as info:
        _task(path).load()
    assert str(info.value).startswith(
        f"task 'chats': {path} line 5: field 'evidence' names message 7, but the history has "
        "3 messages")
    path.write_text("\n".join(path.read_text().splitlines()[:4]) + "\n")
    listed, plain, absent = _task(path).load()
    assert listed.evidence == ("called Rex", "Noted.")
    assert plain.evidence == ("my dog is called Rex",)
    assert absent.evidence == ()


def _agent_sweep(pytester: pytest.Pytester, fake: FakeOpenAI, tmp_path: Path) -> None:
    """An agent trajectory with a tool call, as a team's own data, swept with prompts kept."""
    data = _write(tmp_path / "agent.jsonl", {"id": "a1", "messages": [
        {"role": "system", "content": "You help pet owners."},
        {"role": "user", "content": "Hi, my dog is called Rex. Look up his vaccinations."},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "rabies: 2025-03"},
        {"role": "assistant", "content": "His rabies shot was in March 2025."},
        QUESTION], "answer": "Rex", "tools": TOOLS})
    result = pytester.runpytest(*sweep_args(
        fake, tmp_path, "--budgets=4096", "--budgetbench-strategies=full_context",
        "--budgetbench-audit=full", f"--budgetbench-tasks=agent=jsonl(path={data})"))
    result.assert_outcomes(passed=1)


def test_an_agent_trajectory_runs_end_to_end_with_its_calls_unflattened(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    _agent_sweep(pytester, fake_endpoint, tmp_path)
    (row,) = rows_of(tmp_path)
    assert row["status"] == "ok" and row["quality"] == 1.0
    (prompts,) = (tmp_path / "out").glob("*/prompts.jsonl")
    (record,) = [json.loads(line) for line in prompts.read_text().splitlines()]
    roles = [m["role"] for m in record["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert record["messages"][2] == {"role": "assistant", "content": None, "tool_calls": [CALL]}
    assert record["messages"][3]["tool_call_id"] == "call_1"
    (sent,) = fake_endpoint.requests
    # The model got the pair as messages (a call-only message goes without "content").
    assert sent["messages"] == as_sent(record["messages"])


def test_an_agent_trajectory_sends_its_tools_with_the_call(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    _agent_sweep(pytester, fake_endpoint, tmp_path)
    (sent,) = fake_endpoint.requests
    assert sent.get("tools") == TOOLS


@pytest.mark.parametrize(("grader", "answer", "expected"), [
    ("choice", "Rex", "field 'answer' is 'Rex', not one option letter (grader=choice)"),
    ("numeric", "many", "field 'answer' is 'many', not a number (grader=numeric)"),
    ("regex", "(unclosed", "field 'answer' is not a regular expression"),
])
def test_a_gold_answer_the_grader_cannot_use_is_refused_at_load(
    tmp_path: Path, grader: str, answer: str, expected: str
) -> None:
    path = _write(tmp_path / "c.jsonl", {"messages": [*CHAT, QUESTION], "answer": answer})
    with pytest.raises(DataError, match=f"line 1: {re.escape(expected)}"):
        _task(path, grader=grader).load()


def test_a_bad_record_in_a_sweep_is_a_usage_error_and_no_cell_runs(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    records = fx.support_chat_records(5)
    del records[3]["answer"]
    data = fx.write_jsonl(tmp_path / "chats.jsonl", records)
    result = pytester.runpytest(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=512", f"--budgetbench-tasks=c=jsonl(path={data})"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    lines = [line for line in result.stderr.lines if "line 4" in line]
    assert lines == [f"ERROR: budgetbench: task 'c': {data} line 4: field 'answer' is missing "
                     "(fields: id, messages, category); map yours with answer_field="]
    assert fake_endpoint.requests == []


@pytest.mark.parametrize(("tasks", "expected"), [
    ("c=jsonl(grader=fuzzy)", "task 'c' (c=jsonl(...)): grader must be one of exact|contains"),
    ("c=jsonl(answer_feld=x)", "task 'jsonl' declares no option 'answer_feld'; accepted keys: "
                               "path, answer_field"),
    ("c=jsonl(path=x", "is not a task definition NAME=TASK(KEY=VALUE, ...)"),
    ("memory=jsonl", "'memory' is already the name of a registered task"),
    ("c=memory(path=x)", "task 'memory' reads no data file, so it takes no path="),
    ("c=jsonl(grader=judge)", "task 'c' grades with an LLM judge (grader=judge): pass "
                              "--budgetbench-judge-endpoint"),
])
def test_a_bad_definition_is_one_usage_line(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path, tasks: str,
    expected: str,
) -> None:
    data = fx.write_jsonl(tmp_path / "c.jsonl", fx.support_chat_records(2))
    result = pytester.runpytest(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=512", f"--budgetbench-tasks={tasks}",
        *([f"--budgetbench-data-c={data}"] if "path" not in tasks and "memory=" not in tasks
          else [])))
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    assert expected in result.stderr.str()
    assert "Traceback" not in result.stderr.str()


# -- the definition syntax ------------------------------------------------------------------
def test_definitions_split_at_top_level_commas_and_values_may_be_quoted() -> None:
    raw = 'memory,a=jsonl(path=x.jsonl, grader=f1),b=csv(system_prompt="Be brief, please.")'
    assert split_top_level(raw) == ["memory", "a=jsonl(path=x.jsonl, grader=f1)",
                                    'b=csv(system_prompt="Be brief, please.")']
    assert parse_task_definition(split_top_level(raw)[2], "--x") == (
        "b", ("csv", {"system_prompt": "Be brief, please."}))
    with pytest.raises(ConfigError, match="sets 'grader' twice"):
        parse_task_definition("a=jsonl(grader=f1, grader=exact)", "--x")


def test_an_instance_presets_declared_defaults_and_keeps_the_base_contract(
    tmp_path: Path,
) -> None:
    cls = resolve_task("s", {"s": ("jsonl", {"path": "d.jsonl", "grader": "numeric",
                                              "tolerance": "5%"})})
    assert cls.name == "s" and cls.default_data_path == "d.jsonl"
    assert resolve_task("s", {"s": ("jsonl", {"grader": "numeric", "tolerance": "5%",
                                              "path": "d.jsonl"})}) is cls  # stable
    defaults = {option.key: option.default for option in cls.declared_options}
    assert defaults["grader"] == "numeric" and defaults["tolerance"] == parse_tolerance("5%")
    assert resolve_task("jsonl").declared_options[1].default == "contains"  # base untouched


# -- CSV ------------------------------------------------------------------------------------
def test_csv_rows_hold_json_message_lists_and_several_answers(tmp_path: Path) -> None:
    path = tmp_path / "chats.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "history", "question", "expected", "category"])
        writer.writerow(["t1", json.dumps(CHAT), "What is my dog called?", '["Rex", "Rexy"]',
                         "pets"])
        writer.writerow(["t2", "not json", "Q?", "x", ""])
    task = _task(path, answer_field="expected")
    with pytest.raises(DataError, match=rf"{path.name} line 3: column 'history' must hold a "
                                        r"JSON list of chat messages"):
        task.load()
    path.write_text("\n".join(path.read_text().splitlines()[:2]) + "\n")
    (item,) = task.load()
    assert item.answer == ("Rex", "Rexy") and item.category == "pets"
    assert item.messages[-1] == {"role": "user", "content": "What is my dog called?"}
    assert task.grade(item, "Rexy").quality == 1.0


# -- graders --------------------------------------------------------------------------------
def _item(*golds: str, rubric: str = "") -> Item:
    return Item("i", (*CHAT, QUESTION), golds, "all",
                {"question": "What is my dog called?", "rubric": rubric})


@pytest.mark.parametrize(("grader", "golds", "reply", "quality", "extracted"), [
    ("exact", ("Rex",), "Rex.\nHe is a good dog.", 1.0, "Rex."),
    ("exact", ("Rex",), "It is Rex", 0.0, "It is Rex"),
    ("contains", ("Rex", "Rexy"), "Your dog is called Rexy!", 1.0, "Your dog is called Rexy!"),
    ("contains", ("Rex",), "Rexford", 0.0, "Rexford"),
    ("f1", ("the red fox",), "red fox", 1.0, "red fox"),
    ("f1", ("red fox", "blue"), "a red dog", 0.5, "a red dog"),
    ("regex", (r"\b4411\b",), "Order 4411 shipped", 1.0, "4411"),
    ("choice", ("B",), "The answer is (B).", 1.0, "B"),
    ("choice", ("B",), "(A) or maybe (B)", 0.0, ""),
    ("choice", ("A",), "A dog", 0.0, ""),
])
def test_built_in_graders(grader: str, golds: tuple[str, ...], reply: str, quality: float,
                          extracted: str) -> None:
    grade = AnswerGrader(grader).grade(_item(*golds), reply)
    assert (round(grade.quality, 4), grade.extracted) == (quality, extracted)
    assert grade.grader == f"jsonl-{grader}/1"
    assert AnswerGrader(grader).grade(_item(*golds), "  ").quality == 0.0


@pytest.mark.parametrize(("tolerance", "reply", "quality"), [
    ("0", "It cost 1,200 dollars", 1.0), ("0", "1201", 0.0), ("1", "1201", 1.0),
    ("1%", "1211.5", 1.0), ("1%", "1213", 0.0), ("0", "about twelve hundred", 0.0),
])
def test_numeric_grader_reads_the_first_number_within_tolerance(
    tolerance: str, reply: str, quality: float
) -> None:
    grader = AnswerGrader("numeric", parse_tolerance(tolerance))
    assert grader.grade(_item("1200"), reply).quality == quality
    assert grader.grader_id == f"jsonl-numeric/1;tolerance={tolerance}"


def test_judge_grader_sends_question_gold_and_rubric_and_reads_yes() -> None:
    judge = FakeJudge("Yes, it is.")
    grade = AnswerGrader("judge", judge=judge).grade(_item("Rex", rubric="Name the dog."), "Rex")
    assert grade.quality == 1.0 and grade.grader == "jsonl-judge/1;judge=judge-model-x"
    (prompt,) = judge.prompts
    assert "What is my dog called?" in prompt and "Rex" in prompt and "Name the dog." in prompt
    assert AnswerGrader("judge", judge=FakeJudge("no")).grade(_item("Rex"), "Max").quality == 0.0


def test_a_callable_grader_by_module_attr(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.jsonl", {"messages": [*CHAT, QUESTION], "answer": "Rex"})
    task = _task(path, grader="tests.tasks.test_jsonl:shouting_grader")
    (item,) = task.load()
    assert task.grader_id == "tests.tasks.test_jsonl:shouting_grader/2"
    assert task.grade(item, "REX").quality == 1.0
    assert task.grade(item, "rex").quality == 0.5


def shouting_grader(prediction: str, item: Item) -> float:
    """Full marks for the gold in capitals, half for it in any case."""
    if item.answer[0].upper() in prediction:
        return 1.0
    return 0.5 if item.answer[0].lower() in prediction.lower() else 0.0


shouting_grader.grader_version = 2  # type: ignore[attr-defined]
