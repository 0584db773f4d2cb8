"""tau2_retail: history from the retail domain, the first-action proxy grader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_budgetbench.errors import DataError
from pytest_budgetbench.tasks import Item, TaskOptions
from pytest_budgetbench.tasks._fixtures import tau2_retail_domain
from pytest_budgetbench.tasks.tau2_retail import Tau2RetailTask, first_json_object, same_value

REAL = Path(__file__).resolve().parents[3] / "shared" / "data" / "tau2_bench"
GOOD = {"name": "find_user_id_by_name_zip",
        "arguments": {"first_name": "Yusuf", "last_name": "Rossi", "zip": "19122"}}


def _task(path: Path | None, chunk_tokens: int = 128, variant: str | None = None
          ) -> Tau2RetailTask:
    extra = {"grader_variants": {"tau2_retail": variant}} if variant else {}
    return Tau2RetailTask(TaskOptions(data_path=path, chunk_tokens=chunk_tokens, extra=extra))


@pytest.fixture
def domain(tmp_path: Path) -> Path:
    return tau2_retail_domain(tmp_path / "data" / "tau2" / "domains" / "retail")


@pytest.fixture
def item(domain: Path) -> Item:
    (only,) = _task(domain).load()  # the task without actions is skipped
    return only


def test_history_holds_policy_scenario_and_records(item: Item) -> None:
    assert item.item_id == "0" and item.category == "find_user_id_by_name_zip"
    assert item.meta == {"split": "train", "actions": 2}
    system, *history, request = item.messages
    assert "find_user_id_by_name_zip(first_name, last_name, zip)" in system["content"]
    texts = [str(m["content"]) for m in history]
    assert sum(t.startswith("[Retail policy] (part ") for t in texts) > 1
    assert any("exchange your keyboard in order #W2378156" in t for t in texts)
    records = "".join(t.split("\n", 1)[1] for t in texts if t.startswith("[Database"))
    parsed = json.loads(records)
    assert set(parsed["users"]) == {"yusuf_rossi_9620"}  # found by name + zip
    assert set(parsed["orders"]) == {"#W2378156"}
    assert request["role"] == "user" and '"arguments"' in request["content"]


def test_parent_folders_are_accepted(domain: Path) -> None:
    for root in (domain, domain.parent, domain.parent.parent, domain.parents[2]):
        assert len(_task(root).load()) == 1


@pytest.mark.parametrize(
    ("reply", "quality"),
    [
        (json.dumps(GOOD), 1.0),
        (f"```json\n{json.dumps(GOOD, indent=2)}\n```", 1.0),
        ('I will authenticate first: {"name": "find_user_id_by_name_zip", "arguments": '
         '{"first_name": "Yusuf", "last_name": "Rossi", "zip": "19122"}}', 1.0),
        # tau2 compares with ==: case, spaces and types count.
        ('{"name": "find_user_id_by_name_zip", "arguments": '
         '{"first_name": "yusuf", "last_name": "ROSSI ", "zip": 19122}}', 0.0),
        ('{"name": "find_user_id_by_name_zip", "arguments": "{\\"first_name\\": \\"Yusuf\\", '
         '\\"last_name\\": \\"Rossi\\", \\"zip\\": \\"19122\\"}"}', 1.0),
        # Without compare_args tau2 compares the predicted call's keys: an extra one fails...
        ('{"name": "find_user_id_by_name_zip", "arguments": {"first_name": "Yusuf", '
         '"last_name": "Rossi", "zip": "19122", "extra": 1}}', 0.0),
        # ... and a missing one is not compared.
        ('{"name": "find_user_id_by_name_zip", "arguments": {"first_name": "Yusuf", '
         '"last_name": "Rossi"}}', 1.0),
        (' {"name": " find_user_id_by_name_zip", "arguments": {}}', 0.0),
        ('{"name": "find_user_id_by_email", "arguments": {"email": "yusuf.rossi@example.com"}}',
         0.0),
        ("I'll look the user up by name and zip code.", 0.0),
        ("", 0.0),
        ("Connection refused", 0.0),
        ("{not json}", 0.0),
    ],
)
def test_first_action_grader(domain: Path, item: Item, reply: str, quality: float) -> None:
    grade = _task(domain).grade(item, reply)
    assert grade.quality == quality
    assert grade.grader == "tau2-retail-first-action-proxy/2"


def test_all_args_variant_also_fails_a_missing_argument(domain: Path, item: Item) -> None:
    strict = _task(domain, variant="all-args")
    missing = '{"name": "find_user_id_by_name_zip", "arguments": {"first_name": "Yusuf", ' \
              '"last_name": "Rossi"}}'
    assert strict.grade(item, missing).quality == 0.0
    grade = strict.grade(item, json.dumps(GOOD))
    assert grade.quality == 1.0 and grade.grader == "tau2-retail-first-action-proxy/2+all-args"


def test_partial_arguments_are_reported(domain: Path, item: Item) -> None:
    reply = '{"name": "find_user_id_by_name_zip", "arguments": {"first_name": "Yusuf", ' \
            '"last_name": "Rossi", "zip": "00000"}}'
    grade = _task(domain).grade(item, reply)
    assert grade.quality == 0.0
    assert grade.detail["name_ok"] is True
    assert grade.detail["argument_match"] == pytest.approx(2 / 3)


def test_compare_args_limit_what_is_compared(domain: Path, item: Item) -> None:
    transfer = Item("t", item.messages, {"name": "transfer_to_human_agents",
                                         "arguments": {"summary": "long text"},
                                         "compare_args": []}, "transfer_to_human_agents")
    reply = '{"name": "transfer_to_human_agents", "arguments": {"summary": "other words"}}'
    assert _task(domain).grade(transfer, reply).quality == 1.0


def test_value_comparison() -> None:
    assert same_value("19122", 19122) and same_value(" Rossi", "rossi")
    assert same_value(["1", "2"], ["1", "2"]) and not same_value(["2", "1"], ["1", "2"])
    assert not same_value(None, "x") and not same_value(True, 1)
    assert first_json_object('x {"a": {"b": 1}} y {"c": 2}') == {"a": {"b": 1}}
    assert first_json_object("[1, 2]") is None


def test_data_errors(tmp_path: Path, domain: Path) -> None:
    with pytest.raises(DataError) as exc:
        _task(tmp_path / "nowhere").load()
    message = str(exc.value)
    assert "task 'tau2_retail' needs" in message and "tasks.json" in message
    assert "--budgetbench-data-tau2_retail" in message and "\n" not in message
    (domain / "db.json").write_text('{"users": {}}', encoding="utf-8")
    with pytest.raises(DataError, match=r"db\.json"):
        _task(domain).load()


@pytest.mark.skipif(not (REAL / "domains" / "retail" / "tasks.json").is_file(),
                    reason="shared tau2-bench data not present")
def test_real_retail_domain() -> None:
    task = _task(REAL, chunk_tokens=512)
    items = task.load()
    assert len(items) == 112  # 114 tasks, two without any expected action
    assert {"find_user_id_by_name_zip", "find_user_id_by_email"} <= {i.category for i in items}
    for item in items:
        assert len(item.messages) > 5
        gold = json.dumps({"name": item.answer["name"], "arguments": item.answer["arguments"]})
        assert task.grade(item, gold).quality == 1.0, item.item_id
        assert item.meta["split"] in ("train", "test", None)


@pytest.mark.parametrize("name", ["policy.md", "split_tasks.json"])
def test_a_domain_file_that_is_not_utf8_is_one_line_naming_its_line(
    domain: Path, name: str
) -> None:
    (domain / name).write_bytes(b'{"train": ["0"],\n "test": ["1\xff"]}\n')
    with pytest.raises(DataError) as exc:
        _task(domain).load()
    message = str(exc.value)
    assert name in message and "line 2" in message and "0xff" in message, message
    assert "\n" not in message
