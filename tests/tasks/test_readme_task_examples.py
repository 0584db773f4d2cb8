"""The manual's "Write a task" and "Write a grader" examples (docs/tasks.md) run as written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pytest_budgetbench.tasks import Item
from pytest_budgetbench.tasks.graders import AnswerGrader
from tests.fake_openai import FakeOpenAI
from tests.sweeps import rows_of, sweep_args

TASKS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "tasks.md"


def _python_block(section: str, opening: str) -> str:
    """The first ```python block under ``## section`` whose text starts with ``opening``."""
    text = TASKS_PAGE.read_text(encoding="utf-8")
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", body, re.DOTALL)
    return next(block for block in blocks if block.startswith(opening))


def test_the_write_a_task_example_runs_as_a_sweep(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    pytester.makepyfile(mymanuals=_python_block("Write a task", "import json"))
    pytester.syspathinsert()
    manuals = [{"id": "m1", "title": "Router X2", "product": "router",
                "text": "Note: my router is called Falcon. " + "Keep it dry. " * 200,
                "questions": [{"question": "What is my router called?", "answer": "Falcon"}]}]
    data = tmp_path / "manuals.json"
    data.write_text(json.dumps(manuals))
    result = pytester.runpytest(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=8192", "--budgetbench-strategies=full_context",
        "--budgetbench-tasks=mymanuals:Manuals", f"--budgetbench-data-manuals={data}",
        "--budgetbench-chunk-tokens=64"))
    result.assert_outcomes(passed=1)
    (row,) = rows_of(tmp_path)
    assert (row["cell_id"], row["category"], row["grader"]) == (
        "manuals-m1_0-full_context-8192", "router", "manuals-contains/1")
    assert row["quality"] == 1.0
    assert len(fake_endpoint.requests[0]["messages"]) > 3  # the manual, chunked
    assert list((tmp_path / "out").glob("*/exports/manuals_predictions.jsonl"))


def test_the_write_a_grader_example_is_a_jsonl_grader(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(mygraders=_python_block("Write a grader", "# mygraders.py"))
    pytester.syspathinsert()
    grader = AnswerGrader("mygraders:refund_policy")
    item = Item("r1", ({"role": "user", "content": "Refund?"},), ("120",), "refunds")
    assert grader.grader_id == "mygraders:refund_policy/2"
    assert grader.grade(item, "Within 30 days you get 120 back.").quality == 1.0
    assert grader.grade(item, "You get 120 back.").quality == 0.5
    assert grader.grade(item, "").quality == 0.0
