"""Cell ids: distinct items, strategies and tasks never share one, and ids that were
already clean stay exactly as they were (runs, baselines and --lf depend on them)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_budgetbench.errors import ConfigError
from pytest_budgetbench.sweep.cells import (
    Cell,
    adjacent_prompt_starts,
    build_cells,
    clean_part,
    id_part,
)
from tests.fake_openai import FakeOpenAI
from tests.sweeps import rows_of, sweep_args

PART = re.compile(r"[A-Za-z0-9_.@+]+")


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@pytest.mark.parametrize("text", ["memory", "0003", "chat_0000", "budgetmem@0.1",
                                  "full_context", "x", "a.b", "A9_z"])
def test_a_clean_id_is_kept_as_it_is(text: str) -> None:
    assert id_part(text) == text
    assert Cell("memory", 3, text, "rag", 2048).cell_id == f"memory-{text}-rag-2048"


@pytest.mark.parametrize(("first", "second"), [
    ("对话一", "对话二"), ("!!", "??"), ("a-b", "a_b"), ("a b", "a-b"), ("", "x"), ("_a", "a"),
])
def test_ids_that_clean_alike_get_distinct_parts(first: str, second: str) -> None:
    assert clean_part(first) == clean_part(second)  # what the id used to be, for both
    assert id_part(first) != id_part(second)


def test_a_cleaned_id_keeps_its_readable_form_and_a_stable_hash() -> None:
    assert id_part("a-b") == "a_b+" + _hash("a-b")
    assert id_part("对话一") == "x+" + _hash("对话一")
    cell = Cell("chats", 0, "conv-26 q1", "keep-ends", 512, repeat=2)
    assert cell.cell_id == (f"chats-conv_26_q1+{_hash('conv-26 q1')}-keep_ends+"
                            f"{_hash('keep-ends')}-512-r2")


@given(st.text(), st.text())
def test_distinct_texts_give_distinct_id_parts(first: str, second: str) -> None:
    if first != second:
        assert id_part(first) != id_part(second)


@given(st.text())
def test_an_id_part_is_safe_in_a_node_id_and_has_no_separator(text: str) -> None:
    part = id_part(text)
    assert PART.fullmatch(part), part  # no "-": the cell id's parts split back apart
    assert part == id_part(text)


def test_distinct_item_ids_give_distinct_cells() -> None:
    cells = build_cells({"chats": ["对话一", "对话二", "!!", "??"]}, ["truncation"], [512])
    assert len({c.cell_id for c in cells}) == 4


def test_two_items_with_one_id_are_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"task 'chats' item ids: 'q1' is given twice "
                                          r"\(entries 1 and 3\).*give each item its own id"):
        build_cells({"chats": ["q1", "q2", "q1"]}, ["truncation"], [512])


def test_two_strategies_with_one_name_are_a_config_error() -> None:
    with pytest.raises(ConfigError, match="--budgetbench-strategies names: 'same' is given "
                                          "twice"):
        build_cells({"memory": ["0000"]}, ["a:A", "b:B"], [512],
                    names={"a:A": "same", "b:B": "same"})


def test_items_that_share_a_prompt_start_run_next_to_each_other() -> None:
    """Items a, c (tools T1) and b, d (T2): a, c, then b, d, each item's cells in their own
    order; another task's items stay after, in order."""
    cells = build_cells({"agent": ["a", "b", "c", "d"], "memory": ["m1", "m2"]},
                        ["truncation", "rag"], [512, 2048])
    starts = {"agent": {"a": "T1", "b": "T2", "c": "T1", "d": "T2"},
              "memory": {"m1": "", "m2": ""}}
    ordered = adjacent_prompt_starts(cells, starts)
    assert sorted(ordered, key=cells.index) == cells  # the same cells
    items = [cell.item_id for cell in ordered]
    assert list(dict.fromkeys(items)) == ["a", "c", "b", "d", "m1", "m2"]
    assert [c for c in ordered if c.item_id == "c"] == [c for c in cells if c.item_id == "c"]
    assert adjacent_prompt_starts(cells, {"agent": dict.fromkeys("abcd", ""),
                                          "memory": starts["memory"]}) == cells


def test_a_sweep_runs_items_of_one_tool_list_one_after_another(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    """Own data whose items alternate two tool lists: the items of each list are sent one
    after another (so a server that keeps its last prompt reuses the tools), the first
    list's first; --budgetbench-items still takes the data's first items."""
    def tool(name: str) -> dict[str, Any]:
        return {"type": "function", "function": {"name": name, "parameters": {
            "type": "object", "properties": {}}}}

    records = [{"id": f"q{i}", "answer": "x", "tools": [tool("pets" if i % 2 else "files")],
                "messages": [{"role": "user", "content": f"note {i}"},
                             {"role": "user", "content": f"question {i}"}]} for i in range(5)]
    data = tmp_path / "tools.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    result = pytester.runpytest(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=5000", "--budgetbench-items=4",
        "--budgetbench-strategies=full_context",
        f"--budgetbench-tasks=mine=jsonl(path={data}, grader=exact)"))
    result.assert_outcomes(passed=4)
    sent = [request["tools"][0]["function"]["name"] for request in fake_endpoint.requests]
    assert sent == ["files", "files", "pets", "pets"]
    assert [row["item_id"] for row in rows_of(tmp_path)] == ["q0", "q2", "q1", "q3"]


# -- in a sweep -----------------------------------------------------------------------------
def test_items_whose_ids_clean_alike_are_two_cells_two_rows_two_calls(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    records = [{"id": item_id, "answer": name,
                "messages": [{"role": "user", "content": f"my {pet} is called {name}"},
                             {"role": "user", "content": f"What is my {pet} called?"}]}
               for item_id, pet, name in (("对话一", "dog", "Rex"), ("对话二", "cat", "Tom"))]
    data = tmp_path / "ids.jsonl"
    data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records),
                    encoding="utf-8")
    args = sweep_args(fake_endpoint, tmp_path, "--budgets=5000",
                      "--budgetbench-strategies=full_context",
                      f"--budgetbench-tasks=chats=jsonl(path={data}, grader=exact)")
    result = pytester.runpytest(*args, "-v")
    result.assert_outcomes(passed=2)
    rows = rows_of(tmp_path)
    assert sorted(r["item_id"] for r in rows) == ["对话一", "对话二"]
    assert sorted(r["cell_id"] for r in rows) == sorted(
        f"chats-x+{_hash(i)}-full_context-5000" for i in ("对话一", "对话二"))
    assert len(fake_endpoint.requests) == 2
    result.stdout.fnmatch_lines([f"*cell?chats-x+{_hash('对话一')}-full_context-5000?*PASSED*",
                                 f"*cell?chats-x+{_hash('对话二')}-full_context-5000?*PASSED*"])

    # Resuming keeps both recorded cells: nothing is sent again, no row is added.
    result = pytester.runpytest(*args, "--budgetbench-resume=latest")
    result.assert_outcomes(passed=2)
    assert len(fake_endpoint.requests) == 2
    assert len(rows_of(tmp_path)) == 2


def test_a_task_with_two_items_of_one_id_stops_before_any_cell(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    pytester.makepyfile(twin_tasks="""
        from pytest_budgetbench.tasks import Grade, Item, Task

        class Twins(Task):
            name = "twins"
            grader_version = "twins/1"

            def load(self):
                question = ({"role": "user", "content": "What?"},)
                return [Item("q0", question, "a", "all"), Item("q0", question, "b", "all")]

            def grade(self, item, prediction):
                return Grade(0.0, prediction, self.grader_version)
    """)
    pytester.syspathinsert()
    result = pytester.runpytest(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=256", "--budgetbench-tasks=twin_tasks:Twins"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*task 'twins' item ids: 'q0' is given twice (entries 1 "
                                 "and 2)*give each item its own id"])
    assert fake_endpoint.requests == []


def test_strategy_names_that_clean_alike_are_one_usage_line(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    pytester.makepyfile(ends="""
        from pytest_budgetbench.strategies import Strategy

        class Dashed(Strategy):
            name = "keep-ends"

            def apply(self, messages, budget):
                return list(messages[-1:])

        class Underscored(Dashed):
            name = "keep_ends"
    """)
    pytester.syspathinsert()
    result = pytester.runpytest(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=256",
        "--budgetbench-strategies=ends:Dashed,ends:Underscored"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--budgetbench-strategies: 'ends:Dashed' and "
                                 "'ends:Underscored' are named 'keep-ends' and 'keep_ends', "
                                 "which read as one ('keep_ends') in cell ids; give one "
                                 "another name"])
    assert fake_endpoint.requests == []
