"""What rewriting keeps without an answering model (issue 40): ``answer_kept`` and
``answer_unique`` on hand-made items, each task's gold answers, teacher-forced steps, and a
model-free sweep's rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.engine.answers import AnswerWatch, StepAnswers, argument_values, watch
from pytest_budgetbench.messages import Message
from pytest_budgetbench.records.rows import CellRow
from pytest_budgetbench.tasks import GoldAnswers, Item, TaskOptions
from pytest_budgetbench.tasks._text import normalize_answer
from pytest_budgetbench.tasks.memory import MemoryTask, normalise

pytest_plugins = ["pytester"]

SYSTEM: Message = {"role": "system", "content": "Answer from the conversation."}
FACT: Message = {"role": "user", "content": "Please remember: my dog is called Rex."}
FILLER: Message = {"role": "assistant", "content": "Lovely weather today."}
QUESTION: Message = {"role": "user", "content": "What is my dog called?"}


def item(*history: Message, question: Message = QUESTION, answer: str = "Rex",
         evidence: tuple[str, ...] = ("my dog is called Rex.",)) -> Item:
    return Item("q1", (SYSTEM, *history, question), answer, "fact", evidence=evidence)


def watched(found: Item, *answers: str, every: bool = False,
            whole_words: bool = True) -> AnswerWatch:
    gold = GoldAnswers(answers or (str(found.answer),), normalise, whole_words, every)
    result = watch(gold, found)
    assert result is not None
    return result


def test_a_prompt_that_holds_the_answer_keeps_it_and_one_that_dropped_it_does_not() -> None:
    chat = item(FACT, FILLER)
    found = watched(chat)
    assert found.answers == ("rex",) and found.unique
    assert found.kept([SYSTEM, FACT, FILLER, QUESTION])
    assert not found.kept([SYSTEM, FILLER, QUESTION])  # truncation dropped the fact
    # A summary that restates the fact with the answer keeps it, in other words than the
    # evidence (what retention, verbatim, reads as 0); one that paraphrases it away does not.
    assert found.kept([{"role": "system", "content": "Summary: the user's dog's name is REX!"},
                       QUESTION])
    assert not found.kept([{"role": "system", "content": "Summary: the user has a dog."},
                           QUESTION])
    # Whole words, as the grader matches: "Rexford" does not hold "Rex".
    assert not found.kept([{"role": "user", "content": "I drove to Rexford."}, QUESTION])


def test_an_answer_the_evidence_does_not_hold_has_no_value() -> None:
    """The answer is implied, never stated (or the item declares no evidence, or the task
    gives no gold answers): nothing can say whether a prompt kept it."""
    implied = item({"role": "user", "content": "My dog has the name of a king."},
                   evidence=("My dog has the name of a king.",))
    gold = GoldAnswers(("Rex",), normalise)
    assert watch(gold, implied) is None
    assert watch(gold, item(FACT, evidence=())) is None
    assert watch(None, item(FACT)) is None
    # The answer in the history but outside the evidence is not in the evidence either.
    elsewhere = item(FACT, {"role": "user", "content": "Also: I like cats."},
                     evidence=("Also: I like cats.",))
    assert watch(gold, elsewhere) is None


def test_an_echo_in_the_assistant_reply_makes_the_answer_not_unique() -> None:
    echo: Message = {"role": "assistant", "content": "Noted: your dog is called Rex."}
    found = watched(item(FACT, echo))
    assert not found.unique
    # A prompt that dropped the evidence but kept the echo keeps the answer: what
    # answer_unique false warns of.
    assert found.kept([SYSTEM, echo, QUESTION])
    # A coincidence of a short answer elsewhere in the history, too.
    assert not watched(item(FACT, {"role": "user", "content": "Rex is a town in Idaho."})).unique


def test_the_question_is_cut_out_of_the_prompt_wherever_the_strategy_puts_it() -> None:
    naming: Message = {"role": "user", "content": "Is my dog called Rex or Max?"}
    found = watched(item(FACT, FILLER, question=naming))
    assert found.unique  # the question is not history
    assert not found.kept([SYSTEM, FILLER, naming])
    # A strategy that puts retrieved context and the question in one message: the question
    # is cut out, the context is searched.
    merged: Message = {"role": "user", "content": f"Context: {FACT['content']}\n\n"
                                                  f"{naming['content']}"}
    assert found.kept([SYSTEM, merged])
    assert not found.kept([SYSTEM, {"role": "user", "content": f"Context: none\n\n"
                                                               f"{naming['content']}"}])


def test_several_answers_any_one_or_every_one_as_the_grader_needs() -> None:
    two = item({"role": "user", "content": "Codes: 111 and 222."}, FILLER, answer="",
               evidence=("Codes: 111 and 222.",))
    only_first: list[Message] = [{"role": "user", "content": "Codes: 111."}, QUESTION]
    anyone = watched(two, "111", "222", "333")  # 333 is not in the evidence: not watched
    assert anyone.answers == ("111", "222")
    assert anyone.kept(only_first)
    every = watch(GoldAnswers(("111", "222"), normalise, every=True), two)
    assert every is not None and not every.kept(only_first)
    # Where every answer is needed, one missing from the evidence leaves nothing to watch.
    assert watch(GoldAnswers(("111", "333"), normalise, every=True), two) is None


def test_a_substring_grader_finds_the_answer_inside_a_word() -> None:
    needle = item({"role": "user", "content": "The magic number is:7654321."},
                  answer="7654321", evidence=("The magic number is:7654321.",))
    found = watch(GoldAnswers(("7654321",), str.lower, whole_words=False), needle)
    assert found is not None and found.kept(list(needle.messages))


def test_fill_answer_leaves_the_row_null_without_a_watch() -> None:
    from pytest_budgetbench.engine.answers import fill_answer

    row = CellRow(run_id="r", cell_id="c", task="t", item_id="i", strategy="s", budget=1)
    fill_answer(row, None, [QUESTION])
    assert (row.answer_kept, row.answer_unique) == (None, None)
    fill_answer(row, watched(item(FACT)), [SYSTEM, FACT, QUESTION])
    assert (row.answer_kept, row.answer_unique) == (True, True)


# -- each task's gold answers ---------------------------------------------------------------
def test_memory_watches_its_planted_answer_and_says_its_echo_is_not_unique() -> None:
    task = MemoryTask(TaskOptions(items=5))
    by_category = {i.category: i for i in task.load()}
    assert task.gold_answers(by_category["abstention"]) is None
    fact = by_category["single-session-fact"]
    found = watch(task.gold_answers(fact), fact)
    assert found is not None and not found.unique  # "Noted: your <pet> is called <name>."
    assert found.kept(list(fact.messages)) and not found.kept([fact.messages[-1]])
    update = by_category["knowledge-update"]
    gold = task.gold_answers(update)
    assert gold is not None and gold.answers == (update.answer["answer"],)
    dated = by_category["temporal-reasoning"]
    found = watch(task.gold_answers(dated), dated)
    assert found is not None and found.unique  # the month and day, in the session's date tag


def test_own_data_watches_text_graders_answers_and_not_a_pattern() -> None:
    from pytest_budgetbench.tasks.graders import AnswerGrader

    chat = Item("c1", (FACT, QUESTION), ("Rex", "Rexy"), "pets", evidence=(str(FACT["content"]),))
    gold = AnswerGrader("contains").gold_answers(chat)
    assert gold is not None and gold.answers == ("Rex", "Rexy")
    assert gold.normalise is normalize_answer and not gold.every
    assert AnswerGrader("regex").gold_answers(chat) is None
    assert AnswerGrader("numeric").gold_answers(chat) is None


def test_hotpotqa_watches_a_span_and_not_a_yes_no_answer() -> None:
    from pytest_budgetbench.tasks.hotpotqa import HotpotQATask

    task = HotpotQATask(TaskOptions())
    assert task.gold_answers(Item("h", (QUESTION,), "yes", "comparison")) is None
    gold = task.gold_answers(Item("h", (QUESTION,), "The Beatles", "bridge"))
    assert gold is not None and gold.normalise("The Beatles!") == "beatles"


def test_locomo_needs_every_part_of_a_multi_hop_gold_and_none_of_an_adversarial() -> None:
    pytest.importorskip("nltk")
    from pytest_budgetbench.tasks.locomo import LoCoMoTask

    task = LoCoMoTask(TaskOptions())

    def gold(category: int, answer: str) -> GoldAnswers | None:
        return task.gold_answers(Item("l", (QUESTION,), answer, "x",
                                      meta={"qa_category": category}))

    assert gold(5, "Not mentioned in the conversation") is None
    multi = gold(1, "Sweden, hiking")
    assert multi is not None and multi.every and multi.answers == ("Sweden", "hiking")
    assert multi.normalise("She hikes") == "she hike"  # Porter stems, as the F1 reads
    open_domain = gold(3, "Yes; she likes it")
    assert open_domain is not None and open_domain.answers == ("Yes",)


# -- teacher-forced steps -------------------------------------------------------------------
def tool_call(name: str, **arguments: Any) -> Message:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": name, "arguments": json.dumps(arguments)}}]}


def test_a_step_watches_the_argument_values_its_trajectory_showed_in_tool_results() -> None:
    listing: list[Message] = [
        {"role": "user", "content": "Move my report to the archive."},
        tool_call("ls"),
        {"role": "tool", "tool_call_id": "c1", "content": '["final_report.pdf", "notes"]'}]
    step = tool_call("mv", source="final_report.pdf", destination="archive", force=True)
    assert argument_values(step) == ["final_report.pdf", "archive"]
    answers = StepAnswers()
    # "archive" is the user's, not a tool result's: only the file name is watched.
    assert answers.at_step(step, listing, listing) == (True, True)
    assert answers.at_step(step, listing, listing[:1]) == (False, True)
    echo = [*listing, {"role": "user", "content": "It is final_report.pdf."}]
    assert answers.at_step(step, echo, echo) == (True, False)
    assert answers.at_step(tool_call("pwd"), listing, listing) is None  # no value
    assert answers.at_step(tool_call("cd", folder="temp"), listing, listing) is None
    row = CellRow(run_id="r", cell_id="c", task="t", item_id="i", strategy="s", budget=1)
    answers.fill(row)
    assert (row.answer_kept, row.answer_unique) == (False, False)  # every step's
    StepAnswers().fill(row)
    assert (row.answer_kept, row.answer_unique) == (None, None)


# -- a model-free sweep ---------------------------------------------------------------------
def test_a_model_free_sweep_fills_answer_kept_on_its_rows(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """memory at 8192 and 512: full_context keeps every watched answer, truncation at 512
    drops the early planted facts; abstentions (no answer to find) stay null."""
    from tests.sweeps import rows_of

    result = pytester.runpytest(
        "--budgetbench-model=none", f"--budgetbench-out={tmp_path / 'out'}",
        "-p", "no:cacheprovider", "--budgets=512,8192", "--budgetbench-tokenizer=approx",
        "--budgetbench-strategies=full_context,truncation", "--budgetbench-report=off")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    rows = rows_of(tmp_path)
    by_cell: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        by_cell.setdefault((row["strategy"], row["budget"]), []).append(row)
    for cell_rows in by_cell.values():
        for row in cell_rows:
            abstains = row["category"] == "abstention"
            assert (row["answer_kept"] is None) == abstains
            assert (row["answer_unique"] is None) == abstains
    assert all(r["answer_kept"] for r in by_cell[("full_context", 8192)]
               if r["answer_kept"] is not None)
    truncated = [r["answer_kept"] for r in by_cell[("truncation", 512)]
                 if r["status"] == "ok" and r["answer_kept"] is not None]
    assert truncated and not all(truncated)
    # Unique only where no echo repeats the answer: the date tags of temporal questions.
    assert {r["category"] for r in rows if r["answer_unique"]} == {"temporal-reasoning"}



def test_the_answer_kept_floor_fails_truncation_that_drops_the_planted_facts(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    from tests.sweeps import rows_of

    result = pytester.runpytest(
        "--budgetbench-model=none", f"--budgetbench-out={tmp_path / 'out'}",
        "-p", "no:cacheprovider", "--budgets=512", "--budgetbench-tokenizer=approx",
        "--budgetbench-strategies=full_context,truncation,rag",
        "--budgetbench-min-answer-kept=truncation@512=0.9")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines([
        "FAILED budgetbench::gate[[]answer-kept-floor truncation@512[]]*",
        "*1 failed, * passed*"])
    kept = [r["answer_kept"] for r in rows_of(tmp_path) if r["status"] == "ok"
            and r["strategy"] == "truncation" and r["answer_kept"] is not None]
    result.stdout.fnmatch_lines([
        f"budgetbench gate failed: truncation@512: answer kept {sum(kept) / len(kept):.3f} "
        f"over the {len(kept)} admitted items whose evidence holds their answer is below the "
        "floor 0.900 (lowest: memory/*"])
    assert "gate[answer-kept-floor rag" not in result.stdout.str()  # only the named cell


@pytest.mark.parametrize(("extra", "expected"), [
    (["--budgetbench-min-answer-kept=truncation@4096=0.5"],
     "*--budgetbench-min-answer-kept: truncation@4096 is not a strategy@budget of this sweep "
     "(it runs full_context@2048, rag@2048, truncation@2048); name one it runs"),
    (["--budgetbench-min-answer-kept=0.5", "--budgetbench-tasks=needle_plain:NoAnswers"],
     "*--budgetbench-min-answer-kept: no item of the sweep's tasks (no_answers) has a gold "
     "answer that its evidence holds, so there is no answer kept to gate on *"),
    (["--budgetbench-min-answer-kept=0.5", "--budgetbench-strategies=full_context"],
     "*--budgetbench-min-answer-kept judges nothing: every strategy of the sweep "
     "(full_context) is a reference*"),
])
def test_an_answer_kept_floor_that_judges_nothing_is_one_line_before_any_cell(
    pytester: pytest.Pytester, tmp_path: Path, extra: list[str], expected: str
) -> None:
    pytester.makepyfile(needle_plain="""
        from pytest_budgetbench.tasks.needle import NeedleTask

        class NoAnswers(NeedleTask):
            name = "no_answers"

            def gold_answers(self, item):
                return None
        """)
    pytester.syspathinsert()
    result = pytester.runpytest(
        "--budgetbench-model=none", f"--budgetbench-out={tmp_path / 'out'}",
        "-p", "no:cacheprovider", "--budgets=2048", "--budgetbench-tokenizer=approx", *extra)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([expected])
    assert not list((tmp_path / "out").glob("*/run.json"))


def test_a_teacher_forced_model_free_episode_marks_each_step_and_its_row(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """BFCL's reference steps take file names from earlier tool results (ls, find): each
    such step's call says whether its prompt kept them, and the row whether every one did."""
    from tests.engine.test_episodes import episodes_of
    from tests.sweeps import rows_of

    result = pytester.runpytest(
        "--budgetbench-model=none", f"--budgetbench-out={tmp_path / 'out'}",
        "-p", "no:cacheprovider", "--budgets=16384", "--budgetbench-tokenizer=approx",
        "--budgetbench-episodes=teacher-forced", "--budgetbench-items=2",
        "--budgetbench-tasks=bfcl_multi_turn_long_context",
        "--budgetbench-strategies=full_context", "--budgetbench-report=off")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    episodes = episodes_of(tmp_path)
    watched = 0
    for row in rows_of(tmp_path):
        marks = [(c["answer_kept"], c["answer_unique"]) for c in episodes[row["cell_id"]]["calls"]
                 if c["answer_kept"] is not None]
        watched += len(marks)
        assert row["answer_kept"] == (all(k for k, _ in marks) if marks else None)
        assert row["answer_unique"] == (all(u for _, u in marks) if marks else None)
        assert all(kept for kept, _ in marks)  # full_context drops nothing
    assert watched > 0


# -- coverage on the shared data (docs/reports.md, Answer kept) -----------------------------
SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"


@pytest.mark.parametrize(("task", "path", "categories", "expected"), [
    ("locomo", "locomo/locomo_conv26_conv30.json",
     ("multi-hop", "temporal", "open-domain", "single-hop"), (233, 70, 40)),
    ("longmemeval", "longmemeval/longmemeval_oracle_subset60.json", None, (60, 22, 9)),
])
def test_the_answer_is_in_the_evidence_of_a_third_of_the_shared_questions(
    task: str, path: str, categories: tuple[str, ...] | None, expected: tuple[int, int, int]
) -> None:
    """The coverage the docs give: (items, answer in the evidence, unique to it) of LoCoMo's
    category 1-4 questions and LongMemEval's oracle records."""
    if not (SHARED / path).is_file():
        pytest.skip(f"shared data not present: {SHARED / path}")
    if task == "locomo":
        pytest.importorskip("nltk")
    from pytest_budgetbench.tasks import REGISTRY

    loaded = REGISTRY.resolve(task)(TaskOptions(data_path=SHARED / path))
    items = [i for i in loaded.load() if categories is None or i.category in categories]
    found = [watch(loaded.gold_answers(i), i) for i in items]
    assert (len(items), sum(w is not None for w in found),
            sum(w is not None and w.unique for w in found)) == expected
