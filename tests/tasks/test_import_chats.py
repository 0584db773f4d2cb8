"""``budgetbench import-chats``: an OpenAI-style export plus questions -> jsonl records a
sweep reads as they are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_budgetbench.commands.cli import EXIT_OK, EXIT_USAGE, main
from pytest_budgetbench.errors import DataError
from pytest_budgetbench.tasks import TaskOptions
from pytest_budgetbench.tasks import _fixtures as fx
from pytest_budgetbench.tasks.import_chats import import_chats, write_example
from pytest_budgetbench.tasks.jsonl import JsonlTask
from tests.fake_openai import FakeOpenAI
from tests.sweeps import rows_of, sweep_args


def _load(path: Path) -> list:
    defaults = {option.key: option.default for option in JsonlTask.declared_options}
    return JsonlTask(TaskOptions(data_path=path, extra=defaults)).load()


def test_the_example_imports_with_tool_calls_kept_as_calls_and_its_tools(
    tmp_path: Path,
) -> None:
    export, questions = write_example(tmp_path)
    assert import_chats(export, questions, tmp_path / "chats.jsonl") == 4
    items = _load(tmp_path / "chats.jsonl")
    assert [item.item_id for item in items] == ["conv-0-q0", "conv-1-q0", "conv-2-q0",
                                                "conv-3-q0"]
    first = items[0]
    assert first.answer == ("Falcon0",) and first.category == "hardware"
    assert [m["role"] for m in first.messages][-1] == "user"
    call = {"id": "call_0", "type": "function",
            "function": {"name": "lookup_ticket", "arguments": '{"n": 0}'}}
    at = next(i for i, m in enumerate(first.messages) if m.get("tool_calls"))
    assert first.messages[at] == {"role": "assistant", "content": None, "tool_calls": [call]}
    assert first.messages[at + 1] == {"role": "tool", "content": "ticket 0: open",
                                      "tool_call_id": "call_0"}
    assert "[tool call]" not in json.dumps(first.messages)
    assert first.tools == (fx.LOOKUP_TICKET,)


def test_flatten_tools_writes_tool_traffic_as_text_and_drops_the_tools(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export, questions = write_example(tmp_path)
    out = tmp_path / "flat.jsonl"
    assert main(["import-chats", str(export), str(questions), "--out", str(out),
                 "--flatten-tools"]) == EXIT_OK, capsys.readouterr().err
    first = _load(out)[0]
    assert "tool" not in [m["role"] for m in first.messages] and first.tools == ()
    texts = [m["content"] for m in first.messages]
    assert '[tool call] lookup_ticket({"n": 0})' in texts
    assert "[tool result call_0] ticket 0: open" in texts
    assert all(isinstance(t, str) and t for t in texts)  # the content-less call is text now
    assert "tools" not in json.loads(out.read_text().splitlines()[0])


def test_the_legacy_function_call_format_becomes_tool_calls_with_ids(tmp_path: Path) -> None:
    lookup = {"name": "lookup_pet", "parameters": {"type": "object", "properties": {}}}
    export = fx.write_json(tmp_path / "export.json", [{"id": "a", "functions": [lookup],
                                                       "messages": [
        {"role": "user", "content": "Which pet do I have?"},
        {"role": "assistant", "content": None,
         "function_call": {"name": "lookup_pet", "arguments": {"owner": "me"}}},
        {"role": "function", "name": "lookup_pet", "content": "a dog called Rex"},
        {"role": "assistant", "content": "A dog called Rex."}]}])
    questions = fx.write_jsonl(tmp_path / "q.jsonl", [
        {"chat_id": "a", "question": "What is my dog called?", "answer": "Rex"}])
    import_chats(export, questions, tmp_path / "o.jsonl")
    (item,) = _load(tmp_path / "o.jsonl")
    assert item.messages[1:3] == (
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "fn_1", "type": "function",
             "function": {"name": "lookup_pet", "arguments": '{"owner": "me"}'}}]},
        {"role": "tool", "content": "a dog called Rex", "tool_call_id": "fn_1",
         "name": "lookup_pet"})
    assert item.tools == ({"type": "function", "function": lookup},)


@pytest.mark.parametrize(("messages", "tools", "expected"), [
    ([{"role": "user", "content": "Pet?"},
      {"role": "assistant", "content": None, "tool_calls": [
          {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}],
     None, "the chat broke a tool-call pair: call 'c1' (f) at message 1 has no tool result "
           "before the prompt ends"),
    ([{"role": "user", "content": "Pet?"}, {"role": "tool", "content": "dog"}], None,
     "the chat returned tool message 1 without a string 'tool_call_id' (got None); or pass "
     "--flatten-tools to import tool calls and results as text"),
    ([{"role": "user", "content": "Pet?"}, {"role": "function", "content": "dog"}], None,
     "the chat returned tool message 1 without a string 'tool_call_id'"),
    ([{"role": "user", "content": "Pet?"}], [{"name": "f"}],
     "the chat's 'tools' has tool 0 that is not {'type': 'function'"),
], ids=["call-unanswered", "result-without-id", "legacy-result-without-call", "bad-tools"])
def test_tool_traffic_that_does_not_pair_up_is_one_line_naming_the_chat(
    tmp_path: Path, messages: list, tools: list | None, expected: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    export = fx.write_json(tmp_path / "export.json", [
        {"id": "a", "messages": [{"role": "user", "content": "hi"}]},
        {"id": "b", "messages": messages, **({"tools": tools} if tools else {})}])
    questions = fx.write_jsonl(tmp_path / "q.jsonl", [
        {"chat_id": "b", "question": "What is my pet?", "answer": "dog"}])
    assert main(["import-chats", str(export), str(questions), "--out",
                 str(tmp_path / "o.jsonl")]) == EXIT_USAGE
    (line,) = capsys.readouterr().err.splitlines()
    assert f"import-chats: {export} record 1: {expected}" in line
    assert main(["import-chats", str(export), str(questions), "--out",
                 str(tmp_path / "o.jsonl"), "--flatten-tools"]) == EXIT_OK


def test_the_command_writes_the_example_then_imports_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["import-chats", "--write-example", str(tmp_path / "demo")]) == EXIT_OK
    out = tmp_path / "demo" / "chats.jsonl"
    assert main(["import-chats", str(tmp_path / "demo" / "export.json"),
                 str(tmp_path / "demo" / "questions.jsonl"), "--out", str(out)]) == EXIT_OK
    assert f"wrote 4 records to {out}" in capsys.readouterr().out
    assert len(out.read_text().splitlines()) == 4


@pytest.mark.parametrize(("question", "expected"), [
    ({"chat_id": "conv-9", "question": "Q?", "answer": "x"},
     "questions.jsonl line 1: chat_id 'conv-9' is not in"),
    ({"chat_id": "conv-0", "answer": "x"}, "questions.jsonl line 1: field(s) question missing"),
])
def test_a_bad_question_is_one_line_naming_its_line(
    tmp_path: Path, question: dict, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    export, _ = write_example(tmp_path)
    questions = fx.write_jsonl(tmp_path / "questions.jsonl", [question])
    assert main(["import-chats", str(export), str(questions), "--out",
                 str(tmp_path / "o.jsonl")]) == EXIT_USAGE
    (line,) = capsys.readouterr().err.splitlines()
    assert expected in line


def test_an_unknown_role_in_the_export_names_chat_and_message(tmp_path: Path) -> None:
    export = fx.write_json(tmp_path / "export.json", [
        {"id": "a", "messages": [{"role": "bot", "content": "hi"}]}])
    questions = fx.write_jsonl(tmp_path / "q.jsonl", [
        {"chat_id": "a", "question": "Q?", "answer": "x"}])
    with pytest.raises(DataError, match=r"export.json record 0: messages\[0\] has unknown "
                                        r"role 'bot'"):
        import_chats(export, questions, tmp_path / "o.jsonl")


def test_imported_records_run_as_a_sweep(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    export, questions = write_example(tmp_path)
    import_chats(export, questions, pytester.path / "chats.jsonl")
    result = pytester.runpytest(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=4096", "--budgetbench-strategies=full_context",
        "--budgetbench-tasks=support=jsonl(path=chats.jsonl, grader=exact)"))
    result.assert_outcomes(passed=4)
    assert [row["quality"] for row in rows_of(tmp_path)] == [1.0] * 4
    sent = fake_endpoint.requests[0]["messages"]
    assert [m["role"] for m in sent].count("tool") == 1  # the call and its result, as sent
    assert sum(1 for m in sent if m.get("tool_calls")) == 1
    assert "[tool call]" not in json.dumps(sent)


def test_two_chats_of_one_id_are_an_error_naming_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chat = {"id": "c1", "messages": [{"role": "user", "content": "my dog is Rex"}]}
    export = tmp_path / "export.json"
    export.write_text(json.dumps([chat, {"id": "c2", "messages": chat["messages"]},
                                  {**chat, "messages": [{"role": "user", "content": "cat"}]}]))
    questions = tmp_path / "questions.jsonl"
    questions.write_text(json.dumps({"chat_id": "c1", "question": "Dog?", "answer": "Rex"}))
    assert main(["import-chats", str(export), str(questions), "--out",
                 str(tmp_path / "out.jsonl")]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err == (f"budgetbench: error: import-chats: {export} record 2: chat id 'c1' is also "
                   "record 0's; give each chat its own id\n")
    assert not (tmp_path / "out.jsonl").exists()


def test_a_questions_evidence_is_written_as_text_and_read_as_the_items(
    tmp_path: Path,
) -> None:
    """Evidence given as text passes through; given as the index of a message of the
    export's chat, it becomes that message's text, which the flattened chat still holds."""
    export, questions = write_example(tmp_path)
    chat = json.loads(export.read_text())[0]
    at = next(i for i, m in enumerate(chat["messages"]) if m["role"] == "tool")
    result_text = chat["messages"][at]["content"]
    lines = questions.read_text().splitlines()
    first = {**json.loads(lines[0]), "evidence": [at, "Falcon0"]}
    questions.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    for flatten in (False, True):
        out = tmp_path / f"chats-{flatten}.jsonl"
        import_chats(export, questions, out, flatten_tools=flatten)
        item = _load(out)[0]
        assert item.evidence == (result_text, "Falcon0")
        assert any(result_text in json.dumps(m) for m in item.messages)
    bad = {**first, "evidence": [len(chat["messages"])]}
    questions.write_text("\n".join([json.dumps(bad), *lines[1:]]) + "\n")
    with pytest.raises(DataError, match=r"evidence \d+ is neither text nor the index of a "
                                        r"message with text in its chat"):
        import_chats(export, questions, tmp_path / "bad.jsonl")
