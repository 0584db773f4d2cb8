"""``budgetbench import-chats``: an OpenAI-style export plus questions -> jsonl records a
sweep reads as they are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_budgetbench.cli import EXIT_OK, EXIT_USAGE, main
from pytest_budgetbench.errors import DataError
from pytest_budgetbench.tasks import TaskOptions
from pytest_budgetbench.tasks import _fixtures as fx
from pytest_budgetbench.tasks.import_chats import import_chats, write_example
from pytest_budgetbench.tasks.jsonl import JsonlTask
from tests.fake_openai import FakeOpenAI
from tests.test_plugin import rows_of, sweep_args


def _load(path: Path) -> list:
    defaults = {option.key: option.default for option in JsonlTask.declared_options}
    return JsonlTask(TaskOptions(data_path=path, extra=defaults)).load()


def test_the_example_imports_into_records_with_tool_traffic_as_text(tmp_path: Path) -> None:
    export, questions = write_example(tmp_path)
    assert import_chats(export, questions, tmp_path / "chats.jsonl") == 4
    items = _load(tmp_path / "chats.jsonl")
    assert [item.item_id for item in items] == ["conv-0-q0", "conv-1-q0", "conv-2-q0",
                                                "conv-3-q0"]
    first = items[0]
    assert first.answer == ("Falcon0",) and first.category == "hardware"
    roles = [m["role"] for m in first.messages]
    assert "tool" not in roles and roles[-1] == "user"
    texts = [m["content"] for m in first.messages]
    assert '[tool call] lookup_ticket({"n": 0})' in texts
    assert "[tool result call_0] ticket 0: open" in texts
    assert all(isinstance(t, str) and t for t in texts)  # the content-less call is text now


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
    assert json.dumps(sent).count("[tool call]") == 1


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
