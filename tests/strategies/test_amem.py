"""amem: scripted well-formed and malformed replies for both prompt kinds (note, evolve),
calls held to the construction window and recorded on the row, memory reused across
budgets but never across items, and the prompts pinned to the ``a-mem`` package's."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench import embeddings
from pytest_budgetbench.messages import Message, text_of
from pytest_budgetbench.strategies import load_strategy
from pytest_budgetbench.strategies._memory_system import json_values
from pytest_budgetbench.strategies.amem import (
    EVOLUTION_PROMPT,
    EVOLUTION_SCHEMA,
    EVOLVE_REPLY_TOKENS,
    JSON_SYSTEM,
    MEMORIES,  # noqa: F401 - cleared around each test by fresh_memories (conftest.py)
    MEMORY_HEADER,
    NOTE_PROMPT,
    NOTE_REPLY_TOKENS,
    NOTE_SCHEMA,
    AMem,
    Evolution,
    Memory,
    Note,
    parse_evolution,
    parse_note,
)
from pytest_budgetbench.strategies.base import Regime, StrategyContext
from pytest_budgetbench.strategies.rag import STORE
from pytest_budgetbench.testing import HashingEmbedder, check_strategy
from pytest_budgetbench.tokens.approximate import ApproxCounter
from tests.strategy_helpers import (
    ScriptedAux,
    graded_sweep,
    longest_allowed,
    memory_items,
    run_with_aux,
    scripted_responder,
)

pytestmark = pytest.mark.usefixtures("fresh_memories")

Replies = dict[str, str]
"""A scripted reply by prompt kind: note, evolve."""

GOOD: Replies = {
    "note": '```json\n{"keywords": ["garden", "plans"], "context": "The user plans a '
            'garden.", "tags": ["home", "hobby"]}\n```',
    # As a small model copies the package's template: Python's True, a trailing comma.
    "evolve": 'Here you go: {"should_evolve": True, "actions": ["strengthen", '
              '"update_neighbor"], "suggested_connections": ["memory_id:0"], '
              '"tags_to_update": ["linked"], "new_context_neighborhood": ["Revisited."], '
              '"new_tags_neighborhood": [["revisited"]],}',
}
MALFORMED: dict[str, list[str]] = {
    "note": ["Keywords: garden, plans.", '{"keywords": "garden", "context": "x", "tags": []}',
             '{"context": "A garden.", "tags": ["home"]}'],
    "evolve": ["I think they are related.", '{"should_evolve": "yes"}',
               '{"should_evolve": true, "actions": ["merge"]}',
               '{"should_evolve": true, "actions": ["strengthen"], '
               '"suggested_connections": "0", "tags_to_update": ["x"]}'],
}
EVOLVE_OPENING = EVOLUTION_PROMPT.split("\n", 1)[0]


def kind_of(messages: Sequence[Message]) -> str:
    if text_of(messages[0]) != JSON_SYSTEM:
        return "answer"
    last = text_of(messages[-1])
    if last.startswith(NOTE_PROMPT):
        return "note"
    if last.startswith(EVOLVE_OPENING):
        return "evolve"
    return "answer"


@pytest.fixture(scope="module")
def chromadb_loaded() -> None:
    """chromadb imported before pytester's snapshot of the modules: its restore would make
    the next in-process run import the native extension a second time."""
    STORE.client()


def _run(messages: list[Message], budget: int, replies: Replies = GOOD,
         strategy: AMem | None = None, **options: Any
         ) -> tuple[list[Message], ScriptedAux, StrategyContext]:
    return run_with_aux(strategy or AMem(), messages, budget,
                        lambda sent: replies[kind_of(sent)], options)


def _item(index: int = 0, history_tokens: int = 2000) -> list[Message]:
    return list(memory_items(index + 1, history_tokens)[index].messages)


def _aux_text(aux: ScriptedAux) -> str:
    return "\n".join(text_of(m) for _p, _c, sent in aux.calls for m in sent)


def test_is_a_registered_persistent_auxiliary_strategy() -> None:
    assert isinstance(load_strategy("amem"), AMem)
    assert AMem.regimes == {Regime.AUXILIARY_MODEL, Regime.PERSISTENT_STATEFUL}


def test_conforms() -> None:
    check_strategy(AMem, max_examples=40)


def test_prompts_are_the_a_mem_packages_own() -> None:
    """Pinned to the installed package's source, read with ast: importing it would import
    litellm, which fetches a price list from the network."""
    spec = importlib.util.find_spec("agentic_memory")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("a-mem is not installed (pip install 'pytest-budgetbench[test]')")
    source = Path(next(iter(spec.submodule_search_locations)), "memory_system.py")
    texts = {inspect.cleandoc(node.value) for node in ast.walk(ast.parse(source.read_text()))
             if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    assert NOTE_PROMPT in texts and EVOLUTION_PROMPT in texts
    assert "agentic_memory.memory_system" not in sys.modules


def test_sends_a_prompt_that_fits_unchanged_without_calls() -> None:
    messages = _item(history_tokens=300)
    prompt, aux, context = _run(messages, 10_000)
    assert prompt == messages and aux.calls == [] and context.aux_failures == 0


def test_notes_are_analysed_evolved_linked_and_retrieved_within_budget() -> None:
    messages = _item()
    budget = 1024
    prompt, aux, context = _run(messages, budget)
    info = context.info["amem"]
    construction, query = info["construction"], info["query"]
    notes = construction["notes"]
    assert notes >= 3
    # One analysis per note and one evolution per note after the first, in note order.
    assert aux.purposes() == ["amem/note"] + ["amem/note", "amem/evolve"] * (notes - 1)
    assert all(count <= budget for _purpose, count, _prompt in aux.calls)
    assert ApproxCounter().count_messages(prompt) <= budget
    assert prompt[0] == messages[0] and prompt[-1] == messages[-1]
    memory = text_of(prompt[1])
    assert memory.startswith(MEMORY_HEADER)
    assert "context: The user plans a garden." in memory and "keywords: garden, plans" in memory
    assert "tags: linked" in memory  # strengthen set the new notes' tags
    assert info["window"] == budget and construction["reused"] is False
    assert construction["aux_calls"] == len(aux.calls) and construction["aux_failures"] == 0
    assert construction["evolutions"] == notes - 1 and construction["links"] == notes - 1
    assert construction["neighbour_updates"] >= 1
    assert construction["input_tokens"] == sum(c[1] for c in aux.calls)
    assert query["aux_calls"] == 0 and query["hits"] == min(3, notes) and query["shown"]
    assert context.aux_failures == 0


def test_each_prompt_is_the_packages_prompt_over_the_note_and_its_neighbours() -> None:
    _prompt, aux, _context = _run(_item(), 1024)
    note_prompt = text_of(aux.calls[0][2][-1])
    assert note_prompt.startswith(NOTE_PROMPT + "\n")
    assert "Could you give me ideas for a garden" in note_prompt  # the first note's turns
    evolve_prompt = text_of(aux.calls[2][2][-1])
    assert "memory_id:0\tmemory content: user: [" in evolve_prompt
    assert "The number of neighbors is 1." in evolve_prompt
    assert "keywords: ['garden', 'plans']" in evolve_prompt  # the package's rendering


def test_small_windows_cut_the_notes_and_skip_an_evolution_prompt_that_cannot_fit() -> None:
    budget = 400  # the evolution prompt alone is larger than this
    prompt, aux, context = _run(_item(), budget)
    construction = context.info["amem"]["construction"]
    assert set(aux.purposes()) == {"amem/note"} and len(aux.calls) == construction["notes"]
    assert all(count <= budget for _purpose, count, _prompt in aux.calls)
    assert construction["unfit_calls"] == construction["notes"] - 1
    assert construction["aux_failures"] == 0 and context.aux_failures == 0
    assert ApproxCounter().count_messages(prompt) <= budget


@pytest.mark.parametrize(("kind", "reply"),
                         [(k, r) for k, replies in MALFORMED.items() for r in replies])
def test_a_malformed_reply_is_one_failure_per_call_and_the_cell_goes_on(
    kind: str, reply: str
) -> None:
    budget = 1024
    prompt, aux, context = _run(_item(), budget, {**GOOD, kind: reply})
    calls_of_kind = [c for c in aux.calls if kind_of(c[2]) == kind]
    assert calls_of_kind and context.aux_failures == len(calls_of_kind)
    assert context.info["amem"]["construction"]["aux_failures"] == len(calls_of_kind)
    assert ApproxCounter().count_messages(prompt) <= budget
    assert prompt[-1]["content"].startswith("What is my")
    assert set(aux.purposes()) == {"amem/note", "amem/evolve"}  # construction went on
    if "A garden." in reply:  # its usable fields were kept
        assert "context: A garden." in text_of(prompt[1])


def test_lenient_json_repairs_what_a_copied_template_breaks_and_only_on_request() -> None:
    reply = 'Sure: {"should_evolve": True, "tags": ["a", None],}'
    assert list(json_values(reply)) == []
    assert list(json_values(reply, lenient=True)) == [{"should_evolve": True, "tags": ["a", None]}]


def test_parsing_tolerates_fences_prose_python_literals_and_id_labels() -> None:
    assert parse_note('```\n{"keywords": ["a"], "context": " c ", "tags": []}\n```') == (
        {"keywords": ["a"], "context": "c", "tags": []}, True)
    assert parse_note('{"keywords": ["a", 3]}') == ({}, False)
    evolution, well_formed = parse_evolution(
        '{"should_evolve": True, "actions": ["strengthen"], "suggested_connections": '
        '["memory_id:2", 3], "tags_to_update": ["t"],}')
    assert well_formed and evolution == Evolution(True, True, ("2", "3"), ("t",))
    assert parse_evolution('{"should_evolve": False}') == (Evolution(False), True)
    assert parse_evolution('{"actions": []}') == (None, False)
    _evolution, well_formed = parse_evolution(
        '{"should_evolve": true, "actions": ["update_neighbor"], '
        '"new_context_neighborhood": ["c", 5], "new_tags_neighborhood": [["t"]]}')
    assert not well_formed


def test_links_to_notes_not_shown_are_rejected() -> None:
    reply = json.dumps({"should_evolve": True, "actions": ["strengthen"],
                        "suggested_connections": ["0", "99"], "tags_to_update": []})
    _prompt, _aux, context = _run(_item(), 1024, {**GOOD, "evolve": reply})
    construction = context.info["amem"]["construction"]
    assert construction["links"] >= 1 and construction["rejected_links"] >= 1
    assert context.aux_failures == 0  # a rejected link is the model's choice, not a failure


def test_retrieval_adds_the_notes_linked_to_the_hits_both_ways() -> None:
    strategy = AMem()
    strategy.reset(StrategyContext(tokens=ApproxCounter(), embedder_factory=HashingEmbedder))
    memory = Memory(window=1024, notes=[
        Note("0", [], "my parrot is called Rufus", links=["2"]),
        Note("1", [], "we talked about tea and biscuits"),
        Note("2", [], "the weather in Lisbon was warm"),
        Note("3", [], "a lesson on the piano", links=["0"]),
    ])
    strategy._vectors(memory, memory.notes)
    hits, neighbours = strategy.retrieve(memory, "what is my parrot called", 1)
    assert [n.id for n in hits] == ["0"] and [n.id for n in neighbours] == ["2"]
    hits, neighbours = strategy.retrieve(memory, "how warm was the weather in Lisbon", 1)
    assert [n.id for n in hits] == ["2"] and [n.id for n in neighbours] == ["0"]  # incoming
    hits, neighbours = strategy.retrieve(memory, "what is my parrot called", 3)
    assert hits[0].id == "0" and len(hits) == 3 and len(neighbours) <= 1
    assert {n.id for n in [*hits, *neighbours]} >= {"0", "2", "3"}


def test_memory_is_reused_across_budgets_at_or_above_the_window_only() -> None:
    messages = _item()
    _p, first, info_first = _run(messages, 1100, amem_window=900)
    _p, second, info_second = _run(messages, 1500, amem_window=900)
    _p, third, info_third = _run(messages, 800, amem_window=900)
    assert info_first.info["amem"]["construction"]["reused"] is False
    assert info_second.info["amem"]["construction"]["reused"] is True
    assert second.calls == []  # no construction call, and none at query time
    assert all(count <= 900 for _purpose, count, _prompt in first.calls)
    assert info_third.info["amem"]["construction"]["reused"] is False  # its own window
    assert third.calls and all(count <= 800 for _purpose, count, _prompt in third.calls)
    assert info_second.info["amem"]["construction"]["aux_calls"] == len(first.calls)


def test_a_memory_built_for_one_item_never_reaches_the_next() -> None:
    strategy = AMem()
    remember = json.dumps({"keywords": ["ZEBRA-17"], "context": "ZEBRA-17 context",
                           "tags": ["ZEBRA-17"]})
    prompt_a, _aux, _ctx = _run(_item(0), 1024, {**GOOD, "note": remember}, strategy)
    assert "ZEBRA-17" in text_of(prompt_a[1])
    prompt_b, aux_b, context_b = _run(_item(1), 1024, GOOD, strategy)
    assert not any("ZEBRA" in text_of(m) for m in prompt_b)
    assert "ZEBRA" not in _aux_text(aux_b)
    assert context_b.info["amem"]["construction"]["reused"] is False


@pytest.mark.parametrize("malformed", [False, True])
def test_sweep_rows_record_the_calls_held_to_the_budget_and_the_failures(
    chromadb_loaded: None, pytester: pytest.Pytester, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, malformed: bool
) -> None:
    # The hashing embedder stands in for MiniLM, whose loading would dominate the test.
    monkeypatch.setattr(embeddings, "make_embedder", lambda *_a, **_k: HashingEmbedder())
    replies = {k: v[0] for k, v in MALFORMED.items()} if malformed else GOOD
    rows = graded_sweep(pytester, tmp_path, scripted_responder(kind_of, replies), 4,
                        "--budgets=800,1200", "--budgetbench-items=2",
                        "--budgetbench-strategies=amem",
                        "--budgetbench-strategy-options=amem_window=800",
                        "--budgetbench-task-options=history_tokens=1600")
    for row in rows:
        assert all(call["input_tokens"] <= 800 for call in row["aux_calls"])
    for item in {row["item_id"] for row in rows}:
        built, reused = sorted((r for r in rows if r["item_id"] == item),
                               key=lambda r: r["strategy_info"]["amem"]["construction"]["reused"])
        assert built["strategy_info"]["amem"]["construction"]["reused"] is False
        assert reused["strategy_info"]["amem"]["construction"]["reused"] is True
        assert {call["purpose"] for call in built["aux_calls"]} == {"amem/note", "amem/evolve"}
        assert reused["aux_calls"] == [] and reused["aux_failures"] == 0
        # Every malformed reply, of both kinds, is one failure on the building cell's row.
        assert built["aux_failures"] == (len(built["aux_calls"]) if malformed else 0)



@pytest.mark.parametrize(("schema", "limit"), [(NOTE_SCHEMA, NOTE_REPLY_TOKENS),
                                               (EVOLUTION_SCHEMA, EVOLVE_REPLY_TOKENS)])
def test_a_reply_at_every_bound_of_a_schema_fits_the_calls_token_limit(
        schema: Any, limit: int) -> None:
    """A constrained model cannot ramble a reply past its token limit (which cuts it into a
    malformed one): the longest reply its schema allows, at ~4 characters a token, fits."""
    longest = json.dumps(longest_allowed(dict(schema.schema)))
    assert len(longest) / 4 <= limit
