"""BFCL multi-turn, teacher-forced: the reference steps replay the ground truth, and a
predicted step is scored by bfcl-eval's own ``multi_turn_checker``.

The replay test drives each entry's reference steps through the environment, as the
teacher-forced runner does, and checks every tool result against a direct execution of the
ground-truth call text. The differential test perturbs predictions (another function, a
changed string value, a dropped required argument) and compares ``score_step`` with
``multi_turn_checker`` called here on a prefix built from the raw ground-truth strings.
"""

from __future__ import annotations

import copy
import json
import random
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

bfcl_eval = pytest.importorskip(
    "bfcl_eval", reason="bfcl-eval is not installed (pip install "
    "'pytest-budgetbench[bfcl]', then pip install --no-deps bfcl-eval==2026.3.23)")

from pytest_budgetbench.messages import Message, check_messages  # noqa: E402
from pytest_budgetbench.tasks import Item  # noqa: E402
from pytest_budgetbench.tasks.base import ReferenceStep  # noqa: E402
from pytest_budgetbench.tasks.bfcl import (  # noqa: E402
    BFCL_VERSION,
    BFCLEpisode,
    BFCLMultiTurnTask,
    bfcl,
    forget,
    fresh_model_name,
)
from tests.tasks.test_bfcl import _items, _task, as_call  # noqa: E402

REPLAYED = {"bfcl_multi_turn_base": 200, "bfcl_multi_turn_long_context": 25,
            "bfcl_multi_turn_miss_func": 40, "bfcl_multi_turn_miss_param": 25}
"""The entries of each category (the first ones) whose reference steps are replayed and
scored against themselves."""

PERTURBED = {"bfcl_multi_turn_base": 60, "bfcl_multi_turn_long_context": 15,
             "bfcl_multi_turn_miss_func": 15}
"""The entries of each category (the first ones) whose steps get perturbed predictions."""

CHECKER = f"bfcl-eval multi_turn_checker/{BFCL_VERSION}"


def _positions(item: Item) -> Iterator[tuple[int, int | None]]:
    """(turn, index of the call in the turn's ground truth), or (turn, None) for the text
    reply that ends the turn: the order the steps should come in, derived here from the
    ground truth alone."""
    for turn, calls in enumerate(item.answer):
        yield from ((turn, j) for j in range(len(calls)))
        yield turn, None


def _next_turn(entry: dict[str, Any], turn: int) -> list[Message]:
    """What the environment should send after the text reply that ends ``turn - 1``."""
    if str(turn) in entry.get("missed_function", {}):
        return [{"role": "user", "content": bfcl().more_functions}]
    return [dict(message) for message in entry["question"][turn]]


# -- the reference steps replay the ground truth -------------------------------------------
@pytest.mark.parametrize("name", REPLAYED)
def test_replaying_the_reference_steps_gives_the_ground_truths_results(name: str) -> None:
    task = _task(name)
    replayed = errors = 0
    for item in _items(name)[:REPLAYED[name]]:
        steps = task.reference_steps(item)
        assert steps is not None
        positions = list(_positions(item))
        assert len(steps) == len(positions)
        replayed_here, errors_here = _replay(task, item, steps, positions)
        replayed += replayed_here
        errors += errors_here
    print(f"{name}: {replayed} reference calls replayed, {errors} of them bfcl errors "
          "(in the ground truth's own execution too)")
    assert replayed >= 5 * REPLAYED[name]


def _replay(task: BFCLMultiTurnTask, item: Item, steps: Sequence[ReferenceStep],
            positions: list[tuple[int, int | None]]) -> tuple[int, int]:
    """Replay ``steps`` in the item's environment beside a direct execution of the ground
    truth's call texts; returns (calls replayed, calls whose result is an error)."""
    entry = item.meta["entry"]
    env = task.environment(item)
    direct = BFCLEpisode(entry)
    replayed = errors = 0
    try:
        trajectory = env.start()
        direct.start()
        for k, ((turn, j), step) in enumerate(zip(positions, steps, strict=True)):
            trajectory.append(step.action)
            following = env.respond(step.action)
            last = k == len(steps) - 1
            assert (following is None) == last, (item.item_id, k)
            if j is None:
                assert not step.scored and step.action == {"role": "assistant",
                                                           "content": "Done."}
                assert last or following == _next_turn(entry, turn + 1)
            else:
                text = item.answer[turn][j]
                _check_call_step(entry, env.tools, step, turn, j, text)
                (expected,) = direct._execute([text])
                (call,) = step.action["tool_calls"]
                assert following == [{"role": "tool", "content": expected,
                                      "tool_call_id": call["id"]}], (item.item_id, k, text)
                replayed += 1
                errors += expected.startswith("Error during execution")
            trajectory += following or []
        check_messages(trajectory, item.item_id)
    finally:
        env.close()
        direct.close()
    return replayed, errors


def _check_call_step(entry: dict[str, Any], tools: list[Any], step: ReferenceStep, turn: int,
                     j: int, text: str) -> None:
    """A call step is one tool call, offered to the model then, that decodes (as bfcl's FC
    decoder does) to the ground-truth call."""
    assert step.scored
    (call,) = step.action["tool_calls"]
    assert call["id"] == f"ref-{turn}-{j}" and call["type"] == "function"
    name, arguments = call["function"]["name"], call["function"]["arguments"]
    assert name in {tool["function"]["name"] for tool in tools}
    (decoded,) = bfcl().convert_to_function_call([{name: arguments}])
    assert as_call(entry, decoded) == as_call(entry, text), (decoded, text)


# -- the reference scores itself exact -----------------------------------------------------
@pytest.mark.parametrize("name", REPLAYED)
def test_every_reference_step_is_exact_and_name_correct(name: str) -> None:
    task = _task(name)
    scored = unscored = 0
    for item in _items(name)[:REPLAYED[name]]:
        steps = task.reference_steps(item)
        assert steps is not None
        for k, step in enumerate(steps):
            score = task.score_step(item, steps, k, step.action)
            assert (score.exact, score.name, score.checker) == (True, True, CHECKER), \
                (item.item_id, k)
            scored += step.scored
            unscored += not step.scored
        assert sum(not step.scored for step in steps) == len(item.answer)
    print(f"{name}: {scored} reference steps exact and name-correct "
          f"(and {unscored} unscored end-of-turn replies)")
    if name == "bfcl_multi_turn_base":
        assert REPLAYED[name] >= 15 and scored > 1000
    assert not [k for k in bfcl().backend_globals if k.startswith("budgetbench_")]


def test_a_prediction_that_makes_no_call_or_does_not_decode_is_not_exact() -> None:
    task = _task("bfcl_multi_turn_base")
    item = _items("bfcl_multi_turn_base")[0]
    steps = task.reference_steps(item)
    assert steps is not None
    first = steps[0].action["tool_calls"][0]["function"]["name"]
    text: Message = {"role": "assistant", "content": "I moved it."}
    broken: Message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "x", "type": "function", "function": {"name": first, "arguments": "{"}}]}
    assert _verdicts(task, item, steps, 0, text) == (False, False)
    assert _verdicts(task, item, steps, 0, broken) == (False, True)
    end = len(item.answer[0])  # the text reply that ends the first turn
    assert not steps[end].scored
    assert _verdicts(task, item, steps, end, text) == (True, True)
    assert _verdicts(task, item, steps, end, steps[0].action) == (False, False)
    with pytest.raises(ValueError, match="not this item's reference steps"):
        task.score_step(item, steps[1:], 0, steps[1].action)


def _verdicts(task: BFCLMultiTurnTask, item: Item, steps: Sequence[ReferenceStep], index: int,
              prediction: Message) -> tuple[bool, bool]:
    score = task.score_step(item, steps, index, prediction)
    return score.exact, score.name


# -- perturbed predictions: score_step against multi_turn_checker --------------------------
Perturbation = tuple[str, str, dict[str, Any]]
"""A perturbation's kind, and the function name and arguments of the predicted call."""


def perturbations(entry: dict[str, Any], name: str, arguments: dict[str, Any],
                  rng: random.Random) -> Iterator[Perturbation]:
    """Another function of the entry's (with the reference's values for the parameters it
    shares), one string value changed, one required argument dropped; each where it can."""
    functions = {f["name"]: f for f in entry["function"]}
    others = sorted(set(functions) - {name})
    other = rng.choice(others)
    shared = functions[other]["parameters"].get("properties", {})
    yield "wrong function", other, {k: v for k, v in arguments.items() if k in shared}
    strings = [k for k, v in arguments.items() if isinstance(v, str)]
    if strings:
        key = rng.choice(strings)
        yield "wrong value", name, {**arguments, key: arguments[key] + "_x"}
    schema = functions.get(name) or next(f for turn in entry.get("missed_function", {}).values()
                                         for f in turn if f["name"] == name)
    required = [k for k in schema["parameters"].get("required", []) if k in arguments]
    if required:
        key = rng.choice(required)
        yield "missing argument", name, {k: v for k, v in arguments.items() if k != key}


def bfcl_accepts(item: Item, turn: int, j: int, name: str, arguments: dict[str, Any]) -> bool:
    """bfcl's own verdict, built from the raw ground-truth strings: the earlier turns' calls
    (a turn a step), this turn's calls before ``j`` (a step) and the predicted call decoded
    by bfcl's FC decoder (a step), against the ground truth through call ``j``."""
    b = bfcl()
    truth: list[list[str]] = item.answer
    model: list[list[list[str]]] = []
    for calls in truth[:turn]:
        model.append([list(calls)] if calls else [])
    predicted = b.convert_to_function_call([{name: json.dumps(arguments)}])
    model.append([list(truth[turn][:j]), predicted] if j else [predicted])
    expected = [list(calls) for calls in truth[:turn]] + [list(truth[turn][:j + 1])]
    entry = item.meta["entry"]
    model_name = fresh_model_name()
    try:
        result = b.checker(model, expected, copy.deepcopy(entry),
                           entry["id"].rsplit("_", 1)[0], model_name)
    finally:
        forget(model_name)
    return bool(result["valid"])


def _prediction(name: str, arguments: dict[str, Any]) -> Message:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": "p", "type": "function",
         "function": {"name": name, "arguments": json.dumps(arguments)}}]}


@pytest.mark.parametrize("name", PERTURBED)
def test_perturbed_steps_score_as_bfcls_checker_judges_them(name: str) -> None:
    task = _task(name)
    rng = random.Random(7)
    counts: Counter[str] = Counter()
    for item in _items(name)[:PERTURBED[name]]:
        steps = task.reference_steps(item)
        assert steps is not None
        for k, (turn, j) in enumerate(_positions(item)):
            if j is None:
                continue
            counts["steps"] += 1
            call_name, arguments = as_call(item.meta["entry"], item.answer[turn][j])
            for kind, other, changed in perturbations(item.meta["entry"], call_name, arguments,
                                                      rng):
                score = task.score_step(item, steps, k, _prediction(other, changed))
                accepted = bfcl_accepts(item, turn, j, other, changed)
                counts[kind] += 1
                counts[f"{kind}: agree"] += score.exact == accepted
                counts[f"{kind}: accepted by bfcl"] += accepted
                assert score.exact == accepted, (item.item_id, k, kind, other, changed)
                assert score.name == (kind != "wrong function"), (item.item_id, k, kind)
                assert score.checker == CHECKER
    print(f"{name}: {dict(sorted(counts.items()))}")
    for kind in ("wrong function", "wrong value", "missing argument"):
        assert counts[kind] >= counts["steps"] // 3, (kind, counts)
        # bfcl accepts a perturbation only where it leaves the same state and results.
        assert counts[f"{kind}: accepted by bfcl"] <= counts[kind] // 5, (kind, counts)
    assert not [k for k in bfcl().backend_globals if k.startswith("budgetbench_")]
