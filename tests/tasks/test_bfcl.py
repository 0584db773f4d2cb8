"""BFCL multi-turn: the episode runs bfcl's FC protocol, and its grade is bfcl's.

The differential test drives episodes with scripted replies (the ground truth's calls,
one step per call or one step per turn, and perturbed sequences: a call left out, a wrong
argument value, two calls swapped), grades each trajectory with the task, and grades the
same calls with bfcl's ``multi_turn_checker`` directly; the two must agree on every case,
and the ground truth must score 1.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

bfcl_eval = pytest.importorskip(
    "bfcl_eval", reason="bfcl-eval is not installed (pip install "
    "'pytest-budgetbench[bfcl]', then pip install --no-deps bfcl-eval==2026.3.23)")

from pytest_budgetbench.messages import Message, check_messages, check_tool_pairs  # noqa: E402
from pytest_budgetbench.tasks import REGISTRY, Item, TaskOptions  # noqa: E402
from pytest_budgetbench.tasks.bfcl import (  # noqa: E402
    REFUSED_CALL,
    BFCLMultiTurnTask,
    bfcl,
    forget,
    fresh_model_name,
)

Call = tuple[str, dict[str, Any]]
"""A call as a model makes it: the function's name and its keyword arguments."""

DIFFERENTIAL_ENTRIES = {"bfcl_multi_turn_base": 25, "bfcl_multi_turn_long_context": 25,
                        "bfcl_multi_turn_miss_func": 8, "bfcl_multi_turn_miss_param": 8}
"""The entries of each category that the differential test replays (the first ones)."""


def _task(name: str) -> BFCLMultiTurnTask:
    task = REGISTRY.resolve(name)(TaskOptions())
    assert isinstance(task, BFCLMultiTurnTask)
    return task


_ITEMS: dict[str, list[Item]] = {}


def _items(name: str) -> list[Item]:
    if name not in _ITEMS:
        _ITEMS[name] = _task(name).load()
    return _ITEMS[name]


# -- the ground truth as tool calls --------------------------------------------------------
def _method(entry: dict[str, Any], name: str) -> Callable[..., Any]:
    for class_name in entry["involved_classes"]:
        module = importlib.import_module(bfcl().class_modules[class_name])
        method = getattr(getattr(module, class_name), name, None)
        if method is not None:
            return method  # type: ignore[no-any-return]
    raise AssertionError(f"no backend method {name!r} in {entry['involved_classes']}")


def as_call(entry: dict[str, Any], text: str) -> Call:
    """A ground-truth call text (``sort('a.pdf')``, ``cd(folder='x')``) as the keyword
    call a model makes: positional arguments named from the backend method's signature."""
    node = ast.parse(text, mode="eval").body
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name), text
    name = node.func.id
    parameters = [p for p in inspect.signature(_method(entry, name)).parameters if p != "self"]
    arguments = {parameters[i]: ast.literal_eval(arg) for i, arg in enumerate(node.args)}
    arguments.update({kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg})
    return name, arguments


def truth_calls(item: Item) -> list[list[Call]]:
    return [[as_call(item.meta["entry"], text) for text in turn] for turn in item.answer]


# -- a scripted driver ---------------------------------------------------------------------
Script = list[list[list[Call]]]
"""Per turn, per step, the calls of that step (the driver then ends the turn)."""


def run_episode(task: BFCLMultiTurnTask, item: Item, script: Script) -> list[Message]:
    """The trajectory of an episode whose replies make the scripted calls, then end each
    turn with a reply that makes none (as the runner's loop drives an environment)."""
    env = task.environment(item)
    trajectory = env.start()
    replies = iter(_replies(script))
    try:
        while True:
            reply = next(replies, {"role": "assistant", "content": "Done."})
            trajectory.append(reply)
            following = env.respond(reply)
            if following is None:
                return trajectory
            trajectory += following
    finally:
        env.close()


def _replies(script: Script) -> Iterator[Message]:
    for turn, steps in enumerate(script):
        for step, calls in enumerate(steps):
            yield {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{turn}_{step}_{k}", "type": "function",
                 "function": {"name": name, "arguments": json.dumps(arguments)}}
                for k, (name, arguments) in enumerate(calls)]}
        yield {"role": "assistant", "content": "Done."}


def bfcl_verdict(item: Item, script: Script) -> tuple[bool, str]:
    """bfcl's own verdict on the scripted calls: the FC decoder on each step, then
    ``multi_turn_checker`` (the turn count always matches here)."""
    b = bfcl()
    decoded = [[b.convert_to_function_call([{n: json.dumps(a)} for n, a in calls])
                for calls in steps if calls] for steps in script]
    entry = item.meta["entry"]
    model = fresh_model_name()
    try:
        result = b.checker(decoded, item.answer, copy.deepcopy(entry),
                           entry["id"].rsplit("_", 1)[0], model)
    finally:
        forget(model)
    return bool(result["valid"]), "" if result["valid"] else str(result["error_type"])


# -- the cases -----------------------------------------------------------------------------
def cases(item: Item, rng: random.Random) -> Iterator[tuple[str, Script]]:
    truth = truth_calls(item)
    yield "truth, a step per call", [[[call] for call in turn] for turn in truth]
    yield "truth, a step per turn", [[turn] if turn else [] for turn in truth]
    turns = [t for t, calls in enumerate(truth) if calls]
    t = rng.choice(turns)
    dropped = copy.deepcopy(truth)
    del dropped[t][rng.randrange(len(dropped[t]))]
    yield "a call left out", [[[call] for call in turn] for turn in dropped]
    with_string = [(t, k) for t in turns for k, (_, args) in enumerate(truth[t])
                   if any(isinstance(v, str) for v in args.values())]
    if with_string:
        t, k = rng.choice(with_string)
        wrong = copy.deepcopy(truth)
        key = next(key for key, v in wrong[t][k][1].items() if isinstance(v, str))
        wrong[t][k][1][key] += "_wrong"
        yield "a wrong argument value", [[[call] for call in turn] for turn in wrong]
    swappable = [t for t in turns if len(truth[t]) > 1 and truth[t][0] != truth[t][-1]]
    if swappable:
        t = rng.choice(swappable)
        swapped = copy.deepcopy(truth)
        swapped[t][0], swapped[t][-1] = swapped[t][-1], swapped[t][0]
        yield "calls in another order", [[[call] for call in turn] for turn in swapped]


@pytest.mark.parametrize("name", DIFFERENTIAL_ENTRIES)
def test_the_grade_is_bfcls_on_the_truth_and_on_perturbed_calls(name: str) -> None:
    task = _task(name)
    rng = random.Random(25)
    compared = disagreements = 0
    kinds: dict[str, set[bool]] = {}
    for item in _items(name)[:DIFFERENTIAL_ENTRIES[name]]:
        for case, script in cases(item, rng):
            trajectory = run_episode(task, item, script)
            grade = task.grade_trajectory(item, trajectory)
            valid, error_type = bfcl_verdict(item, script)
            compared += 1
            kinds.setdefault(case, set()).add(valid)
            if case.startswith("truth"):
                assert grade.quality == 1.0, (item.item_id, case, grade.detail)
            if (grade.quality == 1.0, grade.detail.get("error_type", "")) != (valid, error_type):
                disagreements += 1
                print(item.item_id, case, grade.detail, valid, error_type)
    assert disagreements == 0
    assert compared >= 4 * DIFFERENTIAL_ENTRIES[name]
    # The perturbations are not all harmless: each kind fails somewhere.
    assert all(False in verdicts for case, verdicts in kinds.items()
               if not case.startswith("truth")), kinds


# -- the episode ---------------------------------------------------------------------------
def _base_item(index: int = 0) -> Item:
    return _items("bfcl_multi_turn_base")[index]


def test_items_are_the_first_turn_with_the_entrys_tools() -> None:
    items = _items("bfcl_multi_turn_base")
    assert len(items) == 200 and items[0].item_id == "multi_turn_base_0"
    assert [i.item_id for i in items] == [i.item_id for i in _task("bfcl_multi_turn_base").load()]
    for item in items:
        check_messages(list(item.messages), item.item_id)
        assert [m["role"] for m in item.messages] == ["user"]
        assert item.category == "+".join(item.meta["entry"]["involved_classes"])
        assert len(item.answer) == item.meta["turns"]
    first = items[0]
    assert first.category == "TwitterAPI+GorillaFileSystem"
    env = _task("bfcl_multi_turn_base").environment(first)
    try:
        assert env.start() == list(first.messages)
        assert env.tools == list(first.tools)
        assert {t["function"]["name"] for t in first.tools} >= {"cd", "mkdir", "mv", "post_tweet"}
    finally:
        env.close()


def test_a_tool_result_answers_each_call_and_a_reply_without_calls_opens_the_next_turn(
) -> None:
    item = _base_item()
    task = _task("bfcl_multi_turn_base")
    trajectory = run_episode(task, item, [[[("cd", {"folder": "document"}),
                                             ("ls", {})]]])
    check_messages(trajectory, "the episode")
    check_tool_pairs(trajectory, "the episode")
    roles = [m["role"] for m in trajectory]
    assert roles[:6] == ["user", "assistant", "tool", "tool", "assistant", "user"]
    assert json.loads(trajectory[2]["content"]) == {"current_working_directory": "document"}
    assert "final_report.pdf" in trajectory[3]["content"]
    assert trajectory[5] == item.meta["entry"]["question"][1][0]
    assert roles.count("user") == len(item.answer)


def test_two_episodes_of_one_entry_share_no_state() -> None:
    item = _base_item()
    task = _task("bfcl_multi_turn_base")
    first, second = task.environment(item), task.environment(item)
    try:
        first.start()
        second.start()
        made = _step(first, [("cd", {"folder": "document"}), ("mkdir", {"dir_name": "temp"})])
        assert "error" not in made[1]["content"]
        listed = _step(second, [("cd", {"folder": "document"}), ("ls", {})])
        assert "temp" not in listed[1]["content"]
    finally:
        first.close()
        second.close()
    assert not [k for k in bfcl().backend_globals if k.startswith("budgetbench_")]


def _step(env: Any, calls: list[Call]) -> list[Message]:
    reply = next(_replies([[calls]]))
    following = env.respond(reply)
    assert following is not None
    return following


def test_a_turn_of_more_than_twenty_steps_is_force_quit_and_fails() -> None:
    item = _base_item()
    task = _task("bfcl_multi_turn_base")
    endless = [[[("ls", {})]] * 30]
    trajectory = run_episode(task, item, endless)
    steps = [m for m in trajectory if m["role"] == "assistant"]
    assert len(steps) == bfcl().max_steps + 1  # bfcl quits after the 21st step
    assert [m["role"] for m in trajectory].count("user") == 1
    grade = task.grade_trajectory(item, trajectory)
    assert grade.quality == 0.0
    assert grade.detail["error_type"] == "multi_turn:force_terminated"
    assert "(1) does not match the length of the ground truth turns (4)" in \
        grade.detail["error_message"]


def test_grading_needs_only_the_trajectory() -> None:
    item = _base_item()
    task = _task("bfcl_multi_turn_base")
    truth = truth_calls(item)
    trajectory = [*item.messages]
    for turn, calls in enumerate(truth):
        if turn:
            trajectory.append(dict(item.meta["entry"]["question"][turn][0]))
        steps = list(_replies([[calls]]))
        trajectory.append(steps[0])
        trajectory += [{"role": "tool", "content": "(not run)", "tool_call_id": c["id"]}
                       for c in steps[0]["tool_calls"]]
        trajectory.append(steps[1])
    assert task.grade_trajectory(item, trajectory).quality == 1.0
    # A reply that chats, or whose arguments are not JSON, is skipped as bfcl skips it.
    noisy = [*trajectory[:1], {"role": "assistant", "content": "Let me see."},
             {"role": "assistant", "content": None, "tool_calls": [
                 {"id": "x", "type": "function", "function": {"name": "cd", "arguments": "{"}}]},
             *trajectory[1:]]
    assert task.grade_trajectory(item, noisy).quality == 1.0
    short = task.grade_trajectory(item, trajectory[:3])
    assert short.quality == 0.0 and short.detail["error_type"] == "multi_turn:force_terminated"
    empty = [m for m in trajectory if m["role"] == "user"]
    missing = task.grade_trajectory(item, empty)
    assert missing.detail["error_type"] == "multi_turn:empty_turn_model_response"


def test_ground_truth_arguments_survive_the_json_of_tool_calls() -> None:
    """A model sends arguments as JSON text; decoded, they execute as the ground truth."""
    b = bfcl()
    for name in ("bfcl_multi_turn_base", "bfcl_multi_turn_long_context"):
        for item in _items(name)[:40]:
            entry = item.meta["entry"]
            for text in (t for turn in item.answer for t in turn):
                call_name, arguments = as_call(entry, text)
                (decoded,) = b.convert_to_function_call([{call_name: json.dumps(arguments)}])
                again = as_call(entry, decoded)
                assert again == (call_name, arguments), (text, decoded)


def test_a_call_that_eval_would_run_outside_the_backends_is_refused(tmp_path: Path) -> None:
    item = _base_item()
    task = _task("bfcl_multi_turn_base")
    env = task.environment(item)
    env.start()
    written = tmp_path / "x.txt"
    try:
        refused = _step(env, [("open", {"file": str(written), "mode": "w"}),
                              ("cd", {"folder": "document"}),
                              ("cd", {"folder=__import__('os').getcwd(),x": 1}),
                              ("no_such_function", {})])
    finally:
        env.close()
    assert not written.exists()
    texts = [m["content"] for m in refused]
    assert texts[0] == texts[2] == f"Error during execution: name '{REFUSED_CALL}' is not defined"
    assert json.loads(texts[1]) == {"current_working_directory": "document"}
    assert texts[3] == "Error during execution: name 'no_such_function' is not defined"


def test_a_held_out_function_arrives_with_bfcls_prompt() -> None:
    item = _items("bfcl_multi_turn_miss_func")[0]
    entry = item.meta["entry"]
    (turn, held), = entry["missed_function"].items()
    held_names = {f["name"] for f in held}
    assert not held_names & {t["function"]["name"] for t in item.tools}
    task = _task("bfcl_multi_turn_miss_func")
    env = task.environment(item)
    try:
        messages = env.start()
        for _ in range(int(turn)):
            messages = env.respond({"role": "assistant", "content": "Done."}) or []
    finally:
        env.close()
    assert messages == [{"role": "user", "content": bfcl().more_functions}]
    assert held_names <= {t["function"]["name"] for t in env.tools}


def test_long_context_episodes_run_bfcls_long_context_backends() -> None:
    def listing(name: str) -> str:
        env = _task(name).environment(_items(name)[0])
        env.start()
        try:
            return str(_step(env, [("cd", {"folder": "document"}), ("ls", {})])[1]["content"])
        finally:
            env.close()

    base, long = listing("bfcl_multi_turn_base"), listing("bfcl_multi_turn_long_context")
    assert "final_report.pdf" in base and "final_report.pdf" in long
    assert len(long) > 4 * len(base)


# -- evidence: argument provenance ---------------------------------------------------------
def _shown(trajectory: list[Message]) -> list[str]:
    """The texts the model is shown: user turns and tool results."""
    return [str(m["content"]) for m in trajectory if m["role"] in ("user", "tool")]


def test_evidence_is_the_truths_argument_values_shown_before_the_call() -> None:
    items = _items("bfcl_multi_turn_base")
    # multi_turn_base_4: ls(a=True), then sort(file_name='report.txt'): the file name
    # reaches the model only in the listing.
    listed = items[4]
    users = " ".join(str(m["content"]) for turn in listed.meta["entry"]["question"]
                     for m in turn)
    assert "report.txt" in listed.evidence and "report.txt" not in users
    # multi_turn_base_0: 'final_report.pdf' is typed by the user in the very turn whose
    # mv(source='final_report.pdf', ...) needs it; that counts (the prompt must keep it).
    first = items[0]
    assert first.item_id == "multi_turn_base_0"
    assert "'final_report.pdf'" in first.messages[0]["content"]
    assert set(first.evidence) == {"document", "temp", "final_report.pdf", "budget analysis",
                                   "previous_report.pdf"}
    # multi_turn_base_2: cd(folder='documents') after "Go into document folder": never
    # shown, so not evidence; nor is a value under 3 characters such as cd(folder='..').
    assert "documents" not in items[2].evidence
    assert all(len(span) >= 3 for item in items for span in item.evidence)
    assert sum(bool(item.evidence) for item in items) > 190


@pytest.mark.parametrize("name", DIFFERENTIAL_ENTRIES)
def test_every_span_is_in_a_user_turn_or_tool_result_of_the_truths_episode(
        name: str) -> None:
    task = _task(name)
    for item in _items(name)[:DIFFERENTIAL_ENTRIES[name]]:
        shown = _shown(run_episode(task, item, [[[call] for call in turn]
                                                for turn in truth_calls(item)]))
        assert len(set(item.evidence)) == len(item.evidence)
        for span in item.evidence:
            assert any(span in text for text in shown), (item.item_id, span)


def test_evidence_is_deterministic() -> None:
    name = "bfcl_multi_turn_long_context"
    again = _task(name).load()
    assert [i.evidence for i in again] == [i.evidence for i in _items(name)]
