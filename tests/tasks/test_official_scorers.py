"""Differential tests: each task's default grader against its upstream scorer's own code.

Every benchmark scores at least 60 generated replies (empty, refusals, markdown, labels,
rambles, hedges, multi-line, unicode punctuation, numbers as words, option letters, the gold
inside a long reply) over the gold answers of ``../shared/data``, with the project's
default grader and with the upstream functions loaded from ``../shared/official_scorers``
(see tests/tasks/official_scorers.py), and asserts they agree on every one. Grader variants may
disagree, but never by crediting a hedge more than upstream does.
"""

from __future__ import annotations

import itertools
import json
import re
import string
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy
import pytest

from pytest_budgetbench.model.chat import ChatModel
from pytest_budgetbench.tasks import Item, Task, TaskOptions
from pytest_budgetbench.tasks._fixtures import longmemeval_records, write_json
from pytest_budgetbench.tasks._text import normalize_answer
from pytest_budgetbench.tasks.hotpotqa import HotpotQATask
from pytest_budgetbench.tasks.locomo import LoCoMoTask
from pytest_budgetbench.tasks.longbench_v2 import LongBenchV2Task
from pytest_budgetbench.tasks.longmemeval import QUESTION_TYPES, LongMemEvalTask
from pytest_budgetbench.tasks.needle import NeedleTask
from pytest_budgetbench.tasks.swe_verified import SWEVerifiedTask
from pytest_budgetbench.tasks.tau2_retail import Tau2RetailTask, first_json_object
from tests.fake_openai import FakeOpenAI
from tests.tasks.official_scorers import (
    DATA,
    SCORERS,
    load_upstream,
    missing,
    replies,
    upstream_statements,
)

MIN_CASES = 60
LOCOMO = DATA / "locomo" / "locomo_conv26_conv30.json"
HOTPOTQA = DATA / "hotpotqa" / "hotpot_dev_distractor_first30.json"
LONGBENCH = DATA / "longbench_v2" / "longbench_v2_dev12.json"
TAU2 = DATA / "tau2_bench" / "domains" / "retail"
HAYSTACK = DATA / "ruler_haystack" / "paul_graham_essays"
SWEBENCH = DATA / "swebench_verified" / "swebench_verified_dev50.jsonl"


@dataclass
class Comparison:
    """Project vs upstream on generated cases, for the default grader and each variant."""

    cases: int = 0
    disagreements: list[tuple[str, str, Any, Any]] = field(default_factory=list)
    variant_disagreements: Counter[str] = field(default_factory=Counter)
    hedge_gains: list[tuple[str, str, str]] = field(default_factory=list)
    """(variant, item, reply) where a variant scored a hedge above upstream."""

    def add(
        self, task: Task, variants: dict[str, Task], item: Item, reply: str, official: float,
        *, gains: Callable[[float, float], bool] = lambda score, official: score > official,
    ) -> None:
        """Score one reply with the default grader and every variant against upstream's
        ``official``; ``gains(score, official)`` says when a variant credited too much."""
        self.cases += 1
        ours = task.grade(item, reply).quality
        if ours != official:
            self.disagreements.append((item.item_id, reply, ours, official))
        for name, variant in variants.items():
            score = variant.grade(item, reply).quality
            if score != official:
                self.variant_disagreements[name] += 1
            if gains(score, official):
                self.hedge_gains.append((name, item.item_id, reply))

    def check(self) -> None:
        assert self.cases >= MIN_CASES, f"only {self.cases} generated cases"
        assert not self.disagreements, (
            f"{len(self.disagreements)} of {self.cases} disagree, e.g. {self.disagreements[:3]}")
        assert not self.hedge_gains, f"a variant credits hedges: {self.hedge_gains[:3]}"


def _task(cls: type[Task], path: Path | None, variant: str | None = None,
          **options: Any) -> Task:
    extra = dict(options.pop("extra", {}))
    if variant:
        extra["grader_variants"] = {cls.name: variant}
    return cls(TaskOptions(data_path=path, extra=extra, **options))


def _variants(cls: type[Task], path: Path | None, **options: Any) -> dict[str, Task]:
    return {name: _task(cls, path, name, **dict(options)) for name in cls.grader_variants}


def _skip_unless(*paths: Path) -> None:
    reason = missing(*paths)
    if reason:
        pytest.skip(reason)


def _is_hedge(reply: str, gold: str, other: str) -> bool:
    """The generated replies that offer more than one (different) answer."""
    hedges = {"Yes\nNo", "yes or no"}
    for second in (other, "yes", "Not mentioned in the conversation"):
        if normalize_answer(second) != normalize_answer(gold):
            hedges |= {f"{gold}\n{second}", f"{second}\n{gold}", f"{gold} or {second}",
                       f"Maybe {gold}.\nOr perhaps {second}.", f"Answer: {second}\n{gold}"}
    return reply in hedges


def _compare_short_answers(
    task: Task,
    variants: dict[str, Task],
    items: list[Item],
    gold_of: Callable[[Item], str],
    upstream: Callable[[Item, str], float],
) -> Comparison:
    result = Comparison()
    for index, item in enumerate(items):
        gold = gold_of(item)
        other = gold_of(items[(index + 7) % len(items)])
        for reply in replies(gold, other):
            hedge = _is_hedge(reply, gold, other)
            # The rule: a variant never credits a hedge that upstream scores 0.
            result.add(task, variants, item, reply, upstream(item, reply),
                       gains=lambda score, official, hedge=hedge: hedge and official == 0 < score)
    return result


# -- LoCoMo ---------------------------------------------------------------------------------
def _upstream_locomo() -> Callable[[Item, str], float]:
    import regex
    from nltk.stem import PorterStemmer

    namespace = {"regex": regex, "string": string, "np": numpy, "Counter": Counter,
                 "ps": PorterStemmer(), "print": lambda *args, **kwargs: None}
    load_upstream("locomo_evaluation.py",
                  ("normalize_answer", "f1_score", "f1", "eval_question_answering"), namespace)
    load_upstream("locomo_gpt_utils.py", ("get_cat_5_answer",), namespace)

    def score(item: Item, reply: str) -> float:
        category = int(item.meta["qa_category"])
        answer = reply
        if category == 5:
            # gpt_utils.get_gpt_answers, batch size 1: the letter becomes its option's text.
            options = item.meta["options"]
            answer = namespace["get_cat_5_answer"](answer, {"a": options[0], "b": options[1]})
        line = {"category": category, "answer": item.answer, "prediction": answer.strip(),
                "evidence": []}
        scores, _lengths, _recall = namespace["eval_question_answering"]([line])
        return float(scores[0])

    return score


def compare_locomo() -> Comparison:
    task = _task(LoCoMoTask, LOCOMO)
    items = task.load()
    result = _compare_short_answers(task, _variants(LoCoMoTask, LOCOMO), items,
                                    lambda item: str(item.answer), _upstream_locomo())
    # Category 5 offers two options: score their letters and texts too.
    upstream = _upstream_locomo()
    for item in (i for i in items if i.meta["qa_category"] == 5):
        for reply in ("a", "b", "(a)", "(b)", "A", "(B)", " (a) ", "c", "yes", "(a) or (b)",
                      *item.meta["options"]):
            result.cases += 1
            ours, official = task.grade(item, reply).quality, upstream(item, reply)
            if ours != official:
                result.disagreements.append((item.item_id, reply, ours, official))
    return result


def test_locomo_matches_upstream_on_all_five_categories() -> None:
    _skip_unless(LOCOMO, SCORERS / "locomo_evaluation.py", SCORERS / "locomo_gpt_utils.py")
    items = _task(LoCoMoTask, LOCOMO).load()
    assert {int(i.meta["qa_category"]) for i in items} == {1, 2, 3, 4, 5}
    compare_locomo().check()


def test_locomo_stems_every_word_of_the_shared_data_as_nltk() -> None:
    _skip_unless(LOCOMO)
    from nltk.stem import PorterStemmer

    from pytest_budgetbench.tasks._text import porter_stem

    text = LOCOMO.read_text(encoding="utf-8").lower()
    words = set(re.findall(r"[^\W_]+", text)) | set(text.split())
    reference = PorterStemmer()
    differ = [w for w in sorted(words) if porter_stem(w) != reference.stem(w)]
    assert len(words) > 5000
    assert not differ, f"{len(differ)} of {len(words)} words stem differently: {differ[:5]}"


# -- HotpotQA -------------------------------------------------------------------------------
def compare_hotpotqa() -> Comparison:
    namespace: dict[str, Any] = {"re": re, "string": string, "Counter": Counter}
    load_upstream("hotpot_evaluate_v1.py",
                  ("normalize_answer", "f1_score", "exact_match_score"), namespace)
    task = _task(HotpotQATask, HOTPOTQA)
    items = task.load()

    def upstream(item: Item, reply: str) -> float:
        return float(namespace["f1_score"](reply, str(item.answer))[0])

    result = _compare_short_answers(task, _variants(HotpotQATask, HOTPOTQA), items,
                                    lambda item: str(item.answer), upstream)
    for item in items:  # exact match, recorded in Grade.detail
        for reply in replies(str(item.answer), "Paris")[3:]:
            ours = task.grade(item, reply).detail["em"]
            official = float(namespace["exact_match_score"](reply, str(item.answer)))
            result.cases += 1
            if ours != official:
                result.disagreements.append((item.item_id, f"EM {reply}", ours, official))
    return result


def test_hotpotqa_matches_upstream() -> None:
    _skip_unless(HOTPOTQA, SCORERS / "hotpot_evaluate_v1.py")
    compare_hotpotqa().check()


# -- LongBench v2 ---------------------------------------------------------------------------
def _letter_replies(gold: str) -> list[str]:
    wrong = "A" if gold != "A" else "C"
    out: list[str] = []
    for letter in "ABCD":
        out += [f"The correct answer is ({letter})", f"The correct answer is {letter}",
                f"**The correct answer is ({letter})**", f"The correct answer is **{letter}**.",
                f"the correct answer is ({letter.lower()})", f"({letter})", letter]
    return [
        *out, "The correct answer is Because the text says so", f"The correct answer is "
        f"Because the text says so, so The correct answer is {gold}",
        f"The correct answer is ({wrong}) or The correct answer is ({gold})",
        f"The correct answer is {wrong}. Wait, The correct answer is ({gold})",
        f"After reading the whole document carefully... The correct answer is ({gold}).",
        "The correct answer is (E)", f"The correct answer is （{gold}）",
    ]


def compare_longbench_v2() -> Comparison:
    namespace: dict[str, Any] = {"re": re}
    load_upstream("longbench_v2_pred.py", ("extract_answer",), namespace)
    task = _task(LongBenchV2Task, LONGBENCH)
    guarded = _variants(LongBenchV2Task, LONGBENCH)
    result = Comparison()
    for item in task.load():
        gold = str(item.answer)
        # Upstream's pred.py leaves an exactly empty output out of the accuracy: no score.
        cases = [r for r in (*_letter_replies(gold), *replies(gold, "B")) if r != ""]
        for reply in cases:
            # The guard is only ever stricter: a score above upstream's is a gain.
            result.add(task, guarded, item, reply,
                       float(namespace["extract_answer"](reply) == gold))
    return result


def test_longbench_v2_matches_upstream() -> None:
    _skip_unless(LONGBENCH, SCORERS / "longbench_v2_pred.py")
    compare_longbench_v2().check()


# -- LongMemEval ----------------------------------------------------------------------------
LABELS = ("Yes.", "no", " YES ", "Yes, the response is correct.", "No.", "", "nope",
          "The answer is yes", "I'd say no", "yes\n", "Noyes", "N")


def _longmemeval_records() -> list[dict[str, Any]]:
    """The fixture's records under every question type, with and without ``_abs``."""
    records = []
    for base in longmemeval_records():
        for qtype in QUESTION_TYPES:
            for abstention in (False, True):
                qid = base["question_id"].removesuffix("_abs") + f"-{qtype}"
                records.append({**base, "question_id": qid + ("_abs" if abstention else ""),
                                "question_type": qtype})
    return records


def compare_longmemeval(tmp_path: Path) -> Comparison:
    namespace: dict[str, Any] = {}
    load_upstream("longmemeval_evaluate_qa.py", ("get_anscheck_prompt",), namespace)
    labels = itertools.cycle(LABELS)
    server = FakeOpenAI(lambda messages: next(labels)).start()
    result = Comparison()
    try:
        judge = ChatModel(server.base_url, "gpt-4o-2024-08-06", temperature=0.0, attempts=1)
        data = write_json(tmp_path / "longmemeval_oracle.json", _longmemeval_records())
        task = _task(LongMemEvalTask, data, judge=judge)
        for item in task.load():
            question, answer = item.meta["question"], str(item.answer)
            for reply in replies(answer, "something else")[:16]:
                before = len(server.requests)
                ours = task.grade(item, reply)
                result.cases += 1
                if not reply.strip():
                    if ours.quality != 0.0 or len(server.requests) != before:
                        result.disagreements.append((item.item_id, reply, ours.quality, 0.0))
                    continue
                sent = server.requests[-1]
                upstream = {"prompt": namespace["get_anscheck_prompt"](
                    item.meta["question_type"], question, answer, reply,
                    abstention="_abs" in item.item_id), "metric_model": judge.model}
                upstream_statements("longmemeval_evaluate_qa.py", ("kwargs",), upstream)
                settings = upstream["kwargs"]
                label_text = ours.detail["label"]
                completion = SimpleNamespace(choices=[SimpleNamespace(
                    message=SimpleNamespace(content=label_text))])
                label_ns: dict[str, Any] = {"completion": completion}
                upstream_statements("longmemeval_evaluate_qa.py", ("eval_response", "label"),
                                    label_ns)
                same = (sent["messages"] == settings["messages"]
                        and sent["model"] == settings["model"]
                        and sent["temperature"] == settings["temperature"]
                        and sent["max_tokens"] == settings["max_tokens"]
                        and sent.get("n", 1) == settings["n"]
                        and ours.quality == float(label_ns["label"]))
                if not same:
                    result.disagreements.append((item.item_id, reply, ours.quality,
                                                 label_ns["label"]))
    finally:
        server.stop()
    return result


def test_longmemeval_judge_prompts_settings_and_labels_match_upstream(tmp_path: Path) -> None:
    _skip_unless(SCORERS / "longmemeval_evaluate_qa.py")
    compare_longmemeval(tmp_path).check()


# -- tau2 retail ----------------------------------------------------------------------------
def _tau2_replies(action: dict[str, Any]) -> list[str]:
    name, args = action["name"], dict(action["arguments"])
    first = next(iter(args), None)
    fewer = {k: v for k, v in args.items() if k != first}
    changed = {**args, **({first: f" {str(args[first]).upper()} "} if first else {})}
    typed = {k: (int(v) if isinstance(v, str) and v.isdigit() else v) for k, v in args.items()}
    call = {"name": name, "arguments": args}
    return [
        json.dumps(call), f"```json\n{json.dumps(call, indent=2)}\n```",
        f"I will do that now: {json.dumps(call)} and then wait.",
        json.dumps({"name": name, "arguments": {**args, "foo": 1}}),
        json.dumps({"name": name, "arguments": fewer}),
        json.dumps({"name": name, "arguments": {}}),
        json.dumps({"name": name, "arguments": changed}),
        json.dumps({"name": name, "arguments": typed}),
        json.dumps({"name": name, "arguments": json.dumps(args)}),
        json.dumps({"name": name, "arguments": dict(reversed(list(args.items())))}),
        json.dumps({"name": name.upper(), "arguments": args}),
        json.dumps({"name": f" {name}", "arguments": args}),
        json.dumps({"name": "transfer_to_human_agents", "arguments": {"summary": "help"}}),
        json.dumps({"name": name, "arguments": None}),
        "", "I need to look up the user first.", "{not json}",
    ]


def compare_tau2_retail() -> Comparison:
    namespace: dict[str, Any] = {}
    load_upstream("tau2_tasks.py", ("Action.compare_with_tool_call",), namespace)
    compare = namespace["compare_with_tool_call"]
    task = _task(Tau2RetailTask, TAU2)
    variants = _variants(Tau2RetailTask, TAU2)
    result = Comparison()
    for item in task.load():
        action = SimpleNamespace(**item.answer)
        for reply in _tau2_replies(item.answer):
            # The reply protocol is the project's (one JSON call); the comparison is tau2's.
            call = first_json_object(reply)
            official = 0.0
            if call is not None and isinstance(call.get("name"), str):
                arguments = call.get("arguments")
                if isinstance(arguments, str):
                    arguments = first_json_object(arguments)
                tool_call = SimpleNamespace(name=call["name"],
                                            arguments=arguments if isinstance(arguments, dict)
                                            else {})
                official = float(compare(action, tool_call))
            result.add(task, variants, item, reply, official)
    return result


def test_tau2_first_action_matches_tau2_comparison() -> None:
    _skip_unless(TAU2 / "tasks.json", SCORERS / "tau2_tasks.py")
    compare_tau2_retail().check()


# -- needle (RULER) -------------------------------------------------------------------------
def compare_needle() -> Comparison:
    namespace: dict[str, Any] = {}
    load_upstream("ruler_constants.py", ("string_match_all",), namespace)
    task = _task(NeedleTask, HAYSTACK, items=15, extra={"history_tokens": 300})
    result = Comparison()
    for item in task.load():
        golds = [str(v) for v in item.answer]
        key = item.meta["key"]
        for reply in (
            "", "  ", " ".join(golds), ", ".join(reversed(golds)), golds[0],
            f"The special magic numbers for {key} are: {', '.join(golds)}.",
            f"**{golds[-1]}**", "\n".join(golds), "I don't know.", golds[0][:-1],
            f"{''.join(golds)}", f"numbers: {golds[0]}-{golds[-1]}", "1234567",
            *replies(golds[0], "7654321")[:8],
        ):
            official = namespace["string_match_all"]([reply], [golds])
            ours = task.grade(item, reply).quality
            result.cases += 1
            if round(ours * 100, 2) != official:
                result.disagreements.append((item.item_id, reply, ours, official))
    return result


def test_needle_matches_ruler_string_match_all() -> None:
    _skip_unless(HAYSTACK, SCORERS / "ruler_constants.py")
    compare_needle().check()


# -- SWE-bench export -----------------------------------------------------------------------
def compare_swe_export() -> Comparison:
    namespace: dict[str, Any] = {"re": re}
    load_upstream("swebench_inference_utils.py", ("extract_diff",), namespace)
    load_upstream("swebench_constants.py", ("KEY_INSTANCE_ID", "KEY_MODEL", "KEY_PREDICTION"),
                  namespace)
    keys = {namespace["KEY_INSTANCE_ID"], namespace["KEY_MODEL"], namespace["KEY_PREDICTION"]}
    task = _task(SWEVerifiedTask, SWEBENCH)
    result = Comparison()
    for item in task.load():
        gold = str(item.answer)
        for reply in (
            gold, f"```diff\n{gold}```", f"```patch\n{gold}```", f"Fix:\n```\n{gold}```\nDone.",
            f"<patch>\n{gold}</patch>", f"<diff>{gold}</diff>", f"Here it is.\n{gold}",
            f"```python\nprint(1)\n```\n```diff\n{gold}```", f"```diff\n{gold}```\n```diff\nx\n```",
            f"{gold}</s>trailing", "", "I cannot produce a patch.", "```\nno diff here\n```",
        ):
            _name, record = task.export(item, reply, f"swe_verified-{item.item_id}-rag-2048")
            result.cases += 1
            upstream_patch = namespace["extract_diff"](reply)
            grade = task.grade(item, reply)
            agreed = (set(record) == keys
                      and record[namespace["KEY_INSTANCE_ID"]] == item.item_id
                      and record[namespace["KEY_PREDICTION"]] == upstream_patch
                      and grade.extracted in ("", upstream_patch))
            if not agreed:
                result.disagreements.append((item.item_id, reply[:60], record, upstream_patch))
    return result


def test_swe_export_is_what_swebench_inference_writes() -> None:
    _skip_unless(SWEBENCH, SCORERS / "swebench_inference_utils.py",
                 SCORERS / "swebench_constants.py")
    compare_swe_export().check()
