"""memgpt: scripted well-formed and malformed replies for each prompt kind, calls held to
the budget and recorded on the row, memory reused across budgets but never across items."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.messages import Message, text_of
from pytest_budgetbench.strategies import load_strategy
from pytest_budgetbench.strategies.base import Regime, StrategyContext
from pytest_budgetbench.strategies.memgpt import (
    MEMGPT_WINDOW,
    MEMORIES,  # noqa: F401 - cleared around each test by fresh_memories (conftest.py)
    MEMORY_HEADER,
    PAGE_SIZE,
    PRESSURE_WARNING,
    SUMMARY_INSTRUCTION,
    MemGPT,
    Memory,
    parse_calls,
    parse_summary,
)
from pytest_budgetbench.testing import HashingEmbedder, check_strategy
from pytest_budgetbench.tokens.approximate import ApproxCounter
from tests.strategy_helpers import (
    ScriptedAux,
    graded_sweep,
    memory_items,
    run_with_aux,
    scripted_responder,
)

pytestmark = pytest.mark.usefixtures("fresh_memories")

Replies = dict[str, str]
"""A scripted reply by prompt kind: core_edit, summarise, search."""

GOOD: Replies = {
    "core_edit": '```json\n{"calls": [{"name": "core_memory_append", "arguments": '
                 '{"label": "human", "content": "The user keeps notes."}}]}\n```',
    "summarise": "The user talked about gardens and plans.",
    "search": 'Sure. {"calls": [{"name": "conversation_search", '
              '"arguments": {"query": "parrot called", "page": 0}}]}',
}
MALFORMED: dict[str, list[str]] = {
    "core_edit": ["I will remember that.", '{"memory": "the user"}',
                  '{"calls": [{"name": "core_memory_append", "arguments": {"label": "pet"}}]}'],
    "summarise": ["", '{"text": "no summary key"}'],
    "search": ["Let me look.", '{"calls": [{"name": "web_search", "arguments": {}}]}'],
}


def kind_of(messages: Sequence[Message]) -> str:
    system, last = text_of(messages[0]), text_of(messages[-1])
    if system == SUMMARY_INSTRUCTION:
        return "summarise"
    if PRESSURE_WARNING in last:
        return "core_edit"
    if "Question to answer next" in last:
        return "search"
    return "answer"


def _run(messages: list[Message], budget: int, replies: Replies = GOOD,
         strategy: MemGPT | None = None, **options: Any
         ) -> tuple[list[Message], ScriptedAux, StrategyContext]:
    return run_with_aux(strategy or MemGPT(), messages, budget,
                        lambda sent: replies[kind_of(sent)],
                        {"memgpt_window": MEMGPT_WINDOW.default, **options})


def _item(index: int = 0, history_tokens: int = 1500) -> list[Message]:
    return list(memory_items(index + 1, history_tokens)[index].messages)


def test_is_a_registered_persistent_auxiliary_strategy() -> None:
    assert isinstance(load_strategy("memgpt"), MemGPT)
    assert MemGPT.regimes == {Regime.AUXILIARY_MODEL, Regime.PERSISTENT_STATEFUL}


def test_conforms() -> None:
    check_strategy(MemGPT, max_examples=40)


def test_sends_a_prompt_that_fits_unchanged_without_calls() -> None:
    messages = _item(history_tokens=300)
    prompt, aux, context = _run(messages, 10_000)
    assert prompt == messages and aux.calls == [] and context.aux_failures == 0


def test_well_formed_replies_build_core_memory_summary_and_hits_within_budget() -> None:
    messages = _item()
    budget = 512
    prompt, aux, context = _run(messages, budget)
    purposes = [purpose for purpose, _count, _prompt in aux.calls]
    assert {"memgpt/core_edit", "memgpt/summarise", "memgpt/search"} <= set(purposes)
    assert purposes[-1] == "memgpt/search"  # construction first, one query-time call
    assert all(count <= budget for _purpose, count, _prompt in aux.calls)
    assert ApproxCounter().count_messages(prompt) <= budget
    assert prompt[0] == messages[0] and prompt[-1] == messages[-1]
    memory = text_of(prompt[1])
    assert memory.startswith(MEMORY_HEADER)
    assert "The user keeps notes." in memory and "gardens and plans" in memory
    assert "[retrieved memories]" in memory and context.aux_failures == 0
    info = context.info["memgpt"]
    construction, query = info["construction"], info["query"]
    assert info["window"] == budget and construction["reused"] is False
    assert construction["aux_calls"] == len(aux.calls) - 1 and query["aux_calls"] == 1
    assert construction["flushes"] >= 1 and construction["evicted"] > 0
    assert construction["input_tokens"] + query["input_tokens"] == sum(c[1] for c in aux.calls)


def test_pressure_warning_comes_before_the_flush_and_sees_the_queue() -> None:
    _prompt, aux, _context = _run(_item(), 512)
    first_edit = next(i for i, c in enumerate(aux.calls) if c[0] == "memgpt/core_edit")
    first_flush = next(i for i, c in enumerate(aux.calls) if c[0] == "memgpt/summarise")
    assert first_edit < first_flush
    assert "Could you give me ideas for a garden" in text_of(aux.calls[first_edit][2][-1])


@pytest.mark.parametrize(("kind", "reply"),
                         [(k, r) for k, replies in MALFORMED.items() for r in replies])
def test_a_malformed_reply_is_one_failure_per_call_and_the_cell_goes_on(
    kind: str, reply: str
) -> None:
    budget = 512
    prompt, aux, context = _run(_item(), budget, {**GOOD, kind: reply})
    calls_of_kind = [c for c in aux.calls if kind_of(c[2]) == kind]
    assert calls_of_kind and context.aux_failures == len(calls_of_kind)
    assert ApproxCounter().count_messages(prompt) <= budget
    assert prompt[-1]["content"].startswith("What is my")
    info = context.info["memgpt"]
    phase = info["query"] if kind == "search" else info["construction"]
    assert phase["aux_failures"] == len(calls_of_kind)
    if kind == "search":  # it searched the question itself instead
        assert info["query"]["hits"] > 0


def test_an_edit_call_beside_a_bad_one_still_runs() -> None:
    reply = json.dumps({"calls": [
        {"name": "core_memory_append", "arguments": {"label": "human", "content": "Likes tea."}},
        {"name": "core_memory_append", "arguments": {"label": "nowhere", "content": "x"}}]})
    prompt, _aux, context = _run(_item(), 512, {**GOOD, "core_edit": reply})
    assert "Likes tea." in text_of(prompt[1]) and context.aux_failures > 0


def test_parsing_tolerates_fences_lists_prose_and_string_arguments() -> None:
    call = {"name": "archival_memory_insert", "arguments": {"content": "x"}}
    expected = ([("archival_memory_insert", {"content": "x"})], True)
    assert parse_calls("```json\n" + json.dumps({"calls": [call]}) + "\n```") == expected
    assert parse_calls("Here: " + json.dumps([call]) + " done") == expected
    assert parse_calls(json.dumps(call)) == expected
    stringly = {"name": "archival_memory_insert", "arguments": json.dumps({"content": "x"})}
    assert parse_calls(json.dumps(stringly)) == expected
    assert parse_calls('{"calls": []}') == ([], True)
    assert parse_calls("no json [at all") == ([], False)
    assert parse_summary('{"summary": " s "}') == "s" and parse_summary("plain") == "plain"
    assert parse_summary("```\nnothing\n```") == ""


def test_core_edits_that_miss_or_overflow_are_rejected() -> None:
    strategy = MemGPT()
    strategy.reset(StrategyContext(tokens=ApproxCounter()))
    memory = Memory(window=512)
    strategy._edit(memory, "core_memory_append", {"label": "human", "content": "Has a dog."})
    strategy._edit(memory, "core_memory_replace",
                   {"label": "human", "old_content": "dog", "new_content": "cat"})
    strategy._edit(memory, "core_memory_replace",
                   {"label": "human", "old_content": "parrot", "new_content": "x"})
    strategy._edit(memory, "core_memory_append", {"label": "persona", "content": "word " * 500})
    assert memory.core == {"persona": "", "human": "Has a cat."}
    assert memory.rejected_edits == 2


def test_archival_search_pages_through_the_run_embedder() -> None:
    strategy = MemGPT()
    strategy.reset(StrategyContext(tokens=ApproxCounter(), embedder_factory=HashingEmbedder))
    memory = Memory(window=512, archival=[f"note {i} about the garden" for i in range(7)])
    first = strategy.archival_memory_search(memory, "garden note", 0)
    second = strategy.archival_memory_search(memory, "garden note", 1)
    assert len(first) == PAGE_SIZE and len(second) == 7 - PAGE_SIZE
    assert set(first) | set(second) == set(memory.archival)


def test_archival_inserts_are_found_at_query_time() -> None:
    insert = json.dumps({"calls": [{"name": "archival_memory_insert",
                                    "arguments": {"content": "The parrot is called Rufus."}}]})
    search = json.dumps({"calls": [{"name": "archival_memory_search",
                                    "arguments": {"query": "parrot name"}}]})
    prompt, _aux, context = _run(_item(), 512, {**GOOD, "core_edit": insert, "search": search})
    assert "- The parrot is called Rufus." in text_of(prompt[1])
    assert context.info["memgpt"]["construction"]["archival"] > 0


def test_memory_is_reused_across_budgets_at_or_above_the_window_only() -> None:
    messages = _item()
    _p, first, info_first = _run(messages, 700, memgpt_window=600)
    _p, second, info_second = _run(messages, 900, memgpt_window=600)
    _p, third, info_third = _run(messages, 500, memgpt_window=600)
    assert info_first.info["memgpt"]["construction"]["reused"] is False
    assert info_second.info["memgpt"]["construction"]["reused"] is True
    assert [c[0] for c in second.calls] == ["memgpt/search"]  # no construction call
    assert all(count <= 600 for purpose, count, _ in first.calls if purpose != "memgpt/search")
    assert info_third.info["memgpt"]["construction"]["reused"] is False  # its own window
    assert third.calls[0][0] != "memgpt/search"
    assert info_second.info["memgpt"]["construction"]["aux_calls"] == len(first.calls) - 1


def test_a_memory_built_for_one_item_never_reaches_the_next() -> None:
    strategy = MemGPT()
    first_item, second_item = _item(0), _item(1)
    remember = json.dumps({"calls": [
        {"name": "core_memory_append", "arguments": {"label": "human", "content": "ZEBRA-17"}},
        {"name": "archival_memory_insert", "arguments": {"content": "ZEBRA-17 archived"}}]})
    prompt_a, _aux, _ctx = _run(first_item, 512, {**GOOD, "core_edit": remember}, strategy)
    assert "ZEBRA-17" in text_of(prompt_a[1])
    prompt_b, aux_b, context_b = _run(second_item, 512, GOOD, strategy)
    assert not any("ZEBRA" in text_of(m) for m in prompt_b)
    assert not any("ZEBRA" in text_of(m) for _p, _c, sent in aux_b.calls for m in sent)
    assert context_b.info["memgpt"]["construction"]["reused"] is False


@pytest.mark.parametrize("malformed", [False, True])
def test_sweep_rows_record_the_calls_held_to_the_budget_and_the_failures(
    pytester: pytest.Pytester, tmp_path: Path, malformed: bool
) -> None:
    replies = {k: v[0] for k, v in MALFORMED.items()} if malformed else GOOD
    rows = graded_sweep(pytester, tmp_path, scripted_responder(kind_of, replies), 4,
                        "--budgets=384,768", "--budgetbench-items=2",
                        "--budgetbench-strategies=memgpt",
                        "--budgetbench-task-options=history_tokens=1200")
    for row in rows:
        purposes = {call["purpose"] for call in row["aux_calls"]}
        assert purposes == {"memgpt/core_edit", "memgpt/summarise", "memgpt/search"}
        assert all(call["input_tokens"] <= row["budget"] for call in row["aux_calls"])
        # Every malformed reply, of every kind, is one failure on its own cell's row.
        assert row["aux_failures"] == (len(row["aux_calls"]) if malformed else 0)
        assert row["strategy_info"]["memgpt"]["construction"]["reused"] is False
