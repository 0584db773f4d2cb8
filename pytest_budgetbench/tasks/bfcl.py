"""``bfcl_multi_turn_*``: BFCL v4 multi-turn, run and graded by the ``bfcl-eval`` package.

The Berkeley Function Calling Leaderboard's multi-turn categories (``multi_turn_base``,
``multi_turn_long_context``, ``multi_turn_miss_func``, ``multi_turn_miss_param``; 200 entries
each) are episodes: a user asks, over several turns, for work done through stateful
backends (a file system, a trading bot, a travel agency, ...); the model calls their
functions as OpenAI tool calls, step by step. Everything bfcl defines is imported from
``bfcl-eval`` (``BFCL_VERSION``), never copied: the entries and ground truth
(``bfcl_eval.utils``), the tool schemas (``convert_to_tool``), the decoding of a step
(``convert_to_function_call``), the backends and their execution
(``execute_multi_turn_func_call``), the step limit, the held-out-function prompt, and the
checker (``multi_turn_checker``).

The episode is bfcl's FC protocol (``BaseHandler.inference_multi_turn_FC`` with the OpenAI
completions handler): no system prompt; the tools are the entry's functions; each turn
appends its user message, then the model takes steps. A step whose reply makes no call, or
whose calls do not decode, ends the turn; otherwise every call is executed and answered by
one ``tool`` message (the backend's result, the call's id). A turn of more than
``MAXIMUM_STEP_LIMIT`` (20) steps is force-quit: the episode ends. A ``miss_func`` holdout
turn adds the held-out functions to the tools and sends bfcl's "I have updated some more
functions" message.

Grader ``bfcl-multi-turn/<BFCL_VERSION>``: eval_runner's ``_evaluate_single_multi_turn_entry``
on the trajectory alone. Turns are the user messages; each turn's steps are its assistant
messages, decoded as at inference (empty or failed decodes are skipped); a turn count
other than the ground truth's is bfcl's ``multi_turn:force_terminated``; otherwise
``multi_turn_checker`` replays the model's calls and the ground truth's on fresh backends
and compares states and results turn by turn. Quality is 1 or 0; ``Grade.detail`` has
bfcl's ``error_type`` and ``error_message``.

Teacher-forced episodes (:meth:`BFCLMultiTurnTask.reference_steps`): the ground truth as
steps, one tool call each (a ground-truth call's positional arguments named from the backend
method's signature), and a text reply that ends each turn. A predicted step is scored by
``multi_turn_checker`` on the teacher-forced prefix that ends with it
(:meth:`BFCLMultiTurnTask.score_step`).

Evidence (:func:`provenance`): the ground truth's argument values that a user turn or an
earlier tool result of its replay showed the model before the call.

Two departures from bfcl, neither reached by a well-formed episode:

- bfcl ``eval()``s each call's text. A call that is not to a backend method and that eval
  would not simply reject by name (a builtin such as ``open``, a name of bfcl's executor,
  a name that is not an identifier), or that has an argument name that is not an
  identifier, is replaced by a call to ``REFUSED_CALL``, which fails as an unknown function
  does in bfcl (``Error during execution: name ... is not defined``), in the episode and
  in grading alike.
- A step whose calls do not decode ends the turn, as in bfcl; bfcl then sends the next
  turn with those calls unanswered, which the chat API rejects, so each is answered here
  by a ``tool`` message saying it could not be decoded (grading ignores tool messages).

Backends are module globals of ``multi_turn_utils``, keyed by a model name and the entry
id: each episode and each grading uses a name of its own and deletes its globals when done,
so no two share state. bfcl-eval is installed without its dependencies (its metadata pins
numpy 1.26 and ~30 provider SDKs; the multi-turn path imports none of them): the ``bfcl``
extra brings the few it imports, then ``BFCL_INSTALL``. Its import makes ``result/``,
``score/`` and ``.file_locks/`` under ``$BFCL_PROJECT_ROOT``, set here to the user's cache
(``$XDG_CACHE_HOME/pytest-budgetbench/bfcl``) unless it is set already.
"""

from __future__ import annotations

import ast
import builtins
import copy
import functools
import json
import os
import uuid
from collections.abc import Sequence
from importlib import metadata
from types import SimpleNamespace
from typing import Any, ClassVar

from pytest_budgetbench.cache.userdirs import user_cache
from pytest_budgetbench.errors import ConfigError, Requirement, check_installed
from pytest_budgetbench.messages import Message, Tool, text_of, tool_calls_of
from pytest_budgetbench.tasks.base import (
    Environment,
    EpisodicTask,
    Grade,
    Item,
    ReferenceStep,
    StepScore,
    call_names,
)

BFCL_VERSION = "2026.3.23"
BFCL_INSTALL = f"pip install --no-deps bfcl-eval=={BFCL_VERSION}"
REQUIRES = (
    Requirement("bfcl_eval", "bfcl", "bfcl-eval", BFCL_INSTALL),
    Requirement("tree_sitter", "bfcl", "tree-sitter"),
    Requirement("tree_sitter_java", "bfcl", "tree-sitter-java"),
    Requirement("tree_sitter_javascript", "bfcl", "tree-sitter-javascript"),
    Requirement("mpmath", "bfcl"),
    Requirement("tenacity", "bfcl"),
    Requirement("filelock", "bfcl"),
)
"""What the multi-turn path imports (measured: nothing else outside the standard library)."""

REFUSED_CALL = "budgetbench_refused_unsafe_call"
"""The call that stands in for one bfcl must not eval(); eval reports it not defined."""

STEP_CHECKER = f"bfcl-eval multi_turn_checker/{BFCL_VERSION}"
"""The checker id of teacher-forced step scores (:meth:`BFCLMultiTurnTask.score_step`)."""

END_OF_TURN = "Done."
"""The text of the reference's reply that ends a turn (a reply without calls ends it)."""

UNDECODED = "Error: the tool calls of this reply could not be decoded, so none was executed."
"""The tool result that answers each call of a step that did not decode."""


@functools.cache
def bfcl() -> SimpleNamespace:
    """The pieces of bfcl-eval the task uses, imported once (about 0.15 s)."""
    check_installed(REQUIRES, "the BFCL multi-turn tasks")
    installed = metadata.version("bfcl-eval")
    if installed != BFCL_VERSION:
        raise ConfigError(
            f"the BFCL tasks grade with bfcl-eval {BFCL_VERSION} (installed: {installed}): "
            f"{BFCL_INSTALL}"
        )
    os.environ.setdefault("BFCL_PROJECT_ROOT", str(user_cache("bfcl")))
    from bfcl_eval import utils
    from bfcl_eval.constants import default_prompts, enums, type_mappings
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker, multi_turn_utils
    from bfcl_eval.model_handler import utils as handler_utils

    execute = multi_turn_utils.execute_multi_turn_func_call
    return SimpleNamespace(
        load_dataset_entry=utils.load_dataset_entry,
        load_ground_truth_entry=utils.load_ground_truth_entry,
        convert_to_tool=handler_utils.convert_to_tool,
        convert_to_function_call=handler_utils.convert_to_function_call,
        gorilla_to_openapi=type_mappings.GORILLA_TO_OPENAPI,
        openai_style=enums.ModelStyle.OPENAI_COMPLETIONS,
        max_steps=default_prompts.MAXIMUM_STEP_LIMIT,
        more_functions=default_prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC,
        class_modules=CLASS_FILE_PATH_MAPPING,
        execute=execute,
        is_empty=multi_turn_utils.is_empty_execute_response,
        checker=multi_turn_checker.multi_turn_checker,
        backend_globals=vars(multi_turn_utils),
        # What eval() in the executor would reach by name, besides a backend's methods.
        reachable=frozenset(dir(builtins)) | frozenset(vars(multi_turn_utils))
        | frozenset(execute.__code__.co_varnames),
    )


def openai_tools(functions: list[dict[str, Any]]) -> list[Tool]:
    """bfcl's function docs as the OpenAI completions handler sends them."""
    b = bfcl()
    tools: list[Tool] = b.convert_to_tool(functions, b.gorilla_to_openapi, b.openai_style)
    return tools


@functools.cache
def backend_methods(classes: tuple[str, ...]) -> frozenset[str]:
    """The names the executor maps to the backends' methods (their public methods)."""
    import importlib
    import inspect

    names: set[str] = set()
    for class_name in classes:
        cls = getattr(importlib.import_module(bfcl().class_modules[class_name]), class_name)
        names |= {name for name, _ in inspect.getmembers(cls(), predicate=inspect.ismethod)
                  if not name.startswith("_")}
    return frozenset(names)


@functools.cache
def method_parameters(classes: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """Each backend method's parameter names, in order: what names a ground-truth call's
    positional arguments (``sort('a.pdf')``), as eval() binds them in bfcl's executor."""
    import importlib
    import inspect

    parameters: dict[str, tuple[str, ...]] = {}
    for class_name in classes:
        cls = getattr(importlib.import_module(bfcl().class_modules[class_name]), class_name)
        for name, method in inspect.getmembers(cls(), predicate=inspect.ismethod):
            if not name.startswith("_"):
                parameters[name] = tuple(inspect.signature(method).parameters)
    return parameters


def ground_truth_call(text: str, parameters: dict[str, tuple[str, ...]]
                      ) -> tuple[str, dict[str, Any]]:
    """A ground-truth call text (``cd(folder='x')``, ``sort('a.pdf')``) as the name and
    keyword arguments of the tool call a model would make: literal values, positional
    arguments named by ``parameters`` (:func:`method_parameters`)."""
    node = ast.parse(text, mode="eval").body
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        raise ValueError(f"not a ground-truth call: {text!r}")
    name = node.func.id
    names = parameters.get(name, ())
    if len(node.args) > len(names):
        raise ValueError(f"{text!r}: more positional arguments than {name} takes")
    arguments = {names[i]: ast.literal_eval(arg) for i, arg in enumerate(node.args)}
    for keyword in node.keywords:
        if keyword.arg is None:
            raise ValueError(f"{text!r}: ** arguments are not a ground-truth call's")
        arguments[keyword.arg] = ast.literal_eval(keyword.value)
    return name, arguments


def reference_layout(truth: list[list[str]]) -> list[tuple[int, int | None]]:
    """Where each reference step comes from: (turn, index of its call in the turn's ground
    truth), or (turn, None) for the text reply that ends the turn. One list for
    :meth:`BFCLMultiTurnTask.reference_steps` and :meth:`~BFCLMultiTurnTask.score_step`,
    so the two cannot disagree on what step ``index`` is."""
    return [(turn, j) for turn, calls in enumerate(truth)
            for j in [*range(len(calls)), None]]


def teacher_forced_prefix(truth: list[list[str]], turn: int, index: int,
                          predicted: list[str]) -> tuple[list[list[list[str]]], list[list[str]]]:
    """The model result and ground truth that ``multi_turn_checker`` judges a predicted
    step by: the earlier turns' ground truth (a turn as one step; no step for an empty
    turn), then this turn's ground-truth calls before the step (one step, if any) and the
    predicted calls (one step); against the ground truth up to and including the step."""
    model: list[list[list[str]]] = [[calls] if calls else [] for calls in truth[:turn]]
    before = truth[turn][:index]
    model.append([before, predicted] if before else [predicted])
    return model, [*truth[:turn], truth[turn][:index + 1]]


def decode_step(message: Message, methods: frozenset[str]) -> list[str] | None:
    """The step's calls as bfcl's FC decoder gives them (``name(key=value, ...)`` texts),
    unsafe ones replaced by :data:`REFUSED_CALL`; None when bfcl's decoder fails or finds
    no call (the turn ends; grading skips the step)."""
    b = bfcl()
    calls = tool_calls_of(message)
    if not calls:
        # The OpenAI handler decodes the reply's text then, and a text never decodes
        # (a character has no .items()) or decodes to nothing (an empty text).
        return None
    try:
        decoded: list[str] = b.convert_to_function_call(
            [{call["function"]["name"]: call["function"]["arguments"]} for call in calls])
    except Exception:  # bfcl ends the turn on any decoding error
        return None
    if b.is_empty(decoded):
        return None
    return [REFUSED_CALL + "()" if _unsafe(call, methods, b.reachable) else text
            for call, text in zip(calls, decoded, strict=True)]


def _unsafe(call: dict[str, Any], methods: frozenset[str], reachable: frozenset[str]) -> bool:
    """Whether eval() of the decoded call could run something other than a backend method
    or fail on an unknown name."""
    name = call["function"]["name"]
    arguments = json.loads(call["function"]["arguments"])  # it decoded, so it parses
    if not all(key.isidentifier() for key in arguments):
        return True
    if name in methods:
        return False
    return not name.isidentifier() or name in reachable


def forget(model_name: str) -> None:
    """Delete the backends bfcl keeps in its module globals for ``model_name``."""
    backends = bfcl().backend_globals
    for key in [k for k in backends if k.startswith(model_name + "_")]:
        del backends[key]


def check(model_result: list[list[list[str]]], truth: list[list[str]],
          entry: dict[str, Any]) -> dict[str, Any]:
    """bfcl's ``multi_turn_checker`` verdict on ``model_result`` (decoded calls by turn and
    step) against ``truth``, on a copy of ``entry`` and backends of their own."""
    model = fresh_model_name()
    try:
        result: dict[str, Any] = bfcl().checker(model_result, truth, copy.deepcopy(entry),
                                                entry["id"].rsplit("_", 1)[0], model)
    finally:
        forget(model)
    return result


def fresh_model_name() -> str:
    """A model name no other episode or grading uses (so no backend is shared)."""
    return f"budgetbench_{uuid.uuid4().hex}"


class BFCLEpisode(Environment):
    """One live BFCL multi-turn entry, as bfcl's FC inference runs it."""

    def __init__(self, entry: dict[str, Any]) -> None:
        self._entry = copy.deepcopy(entry)
        self._functions: list[dict[str, Any]] = list(self._entry["function"])
        self.tools = openai_tools(self._functions)
        self._methods = backend_methods(tuple(self._entry["involved_classes"]))
        self._model = fresh_model_name()
        self._turn = 0
        self._steps = 0

    def start(self) -> list[Message]:
        self._execute([])  # bfcl makes the backends before the first query
        return self._turn_messages(0)

    def respond(self, reply: Message) -> list[Message] | None:
        calls = tool_calls_of(reply)
        decoded = decode_step(reply, self._methods)
        if decoded is None:
            undecoded = [{"role": "tool", "content": UNDECODED, "tool_call_id": call["id"]}
                         for call in calls]
            following = self._next_turn()
            return None if following is None else undecoded + following
        results = self._execute(decoded)
        self._steps += 1
        if self._steps > bfcl().max_steps:
            return None  # bfcl force-quits: the whole entry fails
        return [{"role": "tool", "content": result, "tool_call_id": call["id"]}
                for result, call in zip(results, calls, strict=True)]

    def close(self) -> None:
        forget(self._model)

    def _next_turn(self) -> list[Message] | None:
        self._turn += 1
        self._steps = 0
        if self._turn >= len(self._entry["question"]):
            return None
        return self._turn_messages(self._turn)

    def _turn_messages(self, turn: int) -> list[Message]:
        held_out = self._entry.get("missed_function", {}).get(str(turn))
        if held_out is None:
            return [dict(message) for message in self._entry["question"][turn]]
        self._functions.extend(held_out)
        self.tools = openai_tools(self._functions)
        return [{"role": "user", "content": bfcl().more_functions}]

    def _execute(self, calls: list[str]) -> list[str]:
        entry = self._entry
        results, _ = bfcl().execute(
            calls, entry.get("initial_config", {}), entry["involved_classes"], self._model,
            entry["id"], long_context=_long_context(entry["id"]), is_evaL_run=False)
        return list(results)


def provenance(entry: dict[str, Any], truth: list[list[str]]) -> tuple[str, ...]:
    """The entry's evidence: each ground-truth argument value that the model was shown
    before the call, verbatim, in a user turn or a tool result.

    The ground truth is replayed turn by turn on a fresh :class:`BFCLEpisode` (bfcl's own
    execution, so each result is the text the model sees as a ``tool`` message); a value
    counts when a user message up to and including the call's own turn, or the result of
    an earlier call, holds it. Values are the arguments' strings and numbers (as text; the
    items of lists and the values of dicts too), skipping booleans, None and texts under 3
    characters. In the order first needed, without repeats."""
    episode = BFCLEpisode(entry)
    shown: list[str] = []
    spans: dict[str, None] = {}
    try:
        episode.start()
        for turn, calls in enumerate(truth):
            shown += [text_of(message) for message in episode._turn_messages(turn)]
            for call in calls:
                for value in _argument_values(call):
                    if value not in spans and any(value in text for text in shown):
                        spans[value] = None
                shown += episode._execute([call])
    finally:
        episode.close()
    return tuple(spans)


def _argument_values(call: str) -> list[str]:
    """A ground-truth call's argument values as text (see :func:`provenance`)."""
    try:
        node = ast.parse(call, mode="eval").body
        assert isinstance(node, ast.Call)
        values = [ast.literal_eval(arg) for arg in [*node.args, *(k.value for k in node.keywords)]]
    except (SyntaxError, ValueError, AssertionError):
        return []
    texts: list[str] = []
    while values:
        value = values.pop(0)
        if isinstance(value, (list, tuple, set)):
            values[:0] = list(value)
        elif isinstance(value, dict):
            values[:0] = list(value.values())
        elif (isinstance(value, (str, int, float)) and not isinstance(value, bool)
              and len(text := str(value)) >= 3):
            texts.append(text)
    return texts


def _long_context(entry_id: str) -> bool:
    """bfcl's rule: long-context backends for these categories."""
    category = entry_id.rsplit("_", 1)[0]
    return "long_context" in category or "composite" in category


def turns_of(trajectory: Sequence[Message]) -> list[list[Message]]:
    """The model's steps (its assistant messages), by turn; each user message opens one."""
    turns: list[list[Message]] = []
    for message in trajectory:
        if message.get("role") == "user":
            turns.append([])
        elif message.get("role") == "assistant" and turns:
            turns[-1].append(message)
    return turns


class BFCLMultiTurnTask(EpisodicTask):
    """A BFCL v4 multi-turn category; subclasses name it."""

    bfcl_category: ClassVar[str] = ""
    grader_version = f"bfcl-multi-turn/{BFCL_VERSION}"
    requires = REQUIRES

    def load(self) -> list[Item]:
        b = bfcl()
        entries = b.load_dataset_entry(self.bfcl_category)
        truths = {truth["id"]: truth["ground_truth"]
                  for truth in b.load_ground_truth_entry(self.bfcl_category)}
        return [self._item(entry, truths[entry["id"]]) for entry in entries]

    def _item(self, entry: dict[str, Any], truth: list[list[str]]) -> Item:
        return Item(
            item_id=str(entry["id"]),
            messages=tuple(dict(message) for message in entry["question"][0]),
            answer=truth,
            category="+".join(entry["involved_classes"]),
            meta={"entry": entry, "turns": len(entry["question"])},
            tools=tuple(openai_tools(entry["function"])),
            evidence=provenance(entry, truth),
        )

    def environment(self, item: Item) -> Environment:
        return BFCLEpisode(item.meta["entry"])

    def grade_trajectory(self, item: Item, trajectory: Sequence[Message]) -> Grade:
        entry: dict[str, Any] = item.meta["entry"]
        truth: list[list[str]] = item.answer
        turns = turns_of(trajectory)
        if len(turns) != len(truth):
            return self._invalid("", "multi_turn:force_terminated", (
                "Model was force-terminated during inference phase. The length of the model "
                f"result turns ({len(turns)}) does not match the length of the ground truth "
                f"turns ({len(truth)})."))
        methods = backend_methods(tuple(entry["involved_classes"]))
        decoded = [[calls for step in turn if (calls := decode_step(step, methods)) is not None]
                   for turn in turns]
        extracted = json.dumps(decoded, ensure_ascii=False)
        result = check(decoded, truth, entry)
        if result["valid"]:
            return Grade(1.0, extracted, self.grader_id, {})
        return self._invalid(extracted, str(result.get("error_type")),
                             str(result.get("error_message")))

    def reference_steps(self, item: Item) -> Sequence[ReferenceStep]:
        """The ground truth as steps (:func:`reference_layout`): each call alone in a step,
        as one OpenAI tool call whose JSON arguments bfcl's decoder turns back into the
        same call; then a text reply, unscored, that ends the turn (the environment answers
        it with the next turn, bfcl's held-out-function message included). A turn with no
        ground truth (a ``miss_func`` or ``miss_param`` turn) is that reply alone."""
        truth: list[list[str]] = item.answer
        parameters = method_parameters(tuple(item.meta["entry"]["involved_classes"]))
        steps: list[ReferenceStep] = []
        for turn, index in reference_layout(truth):
            if index is None:
                steps.append(ReferenceStep({"role": "assistant", "content": END_OF_TURN},
                                           scored=False))
                continue
            name, arguments = ground_truth_call(truth[turn][index], parameters)
            steps.append(ReferenceStep({"role": "assistant", "content": None, "tool_calls": [
                {"id": f"ref-{turn}-{index}", "type": "function",
                 "function": {"name": name, "arguments": json.dumps(arguments)}}]}))
        return steps

    def score_step(self, item: Item, steps: Sequence[ReferenceStep], index: int,
                   prediction: Message) -> StepScore:
        """Score a predicted step with bfcl-eval's own checker.

        *exact*: ``multi_turn_checker`` accepts the teacher-forced prefix that ends with the
        prediction (:func:`teacher_forced_prefix`): the calls the reference made before the
        step and the prediction's calls, decoded as at grading (:func:`decode_step`), against
        the ground truth up to and including the step. That is the criterion bfcl grades a
        whole entry by (the backends' states after both, and the ground truth's execution
        results among the model's), applied to the prefix; so a call that differs from the
        reference's text but leaves the same state and results (an equivalent argument
        spelling, or a result the model already got earlier) counts as right, as it would
        in bfcl. A prediction that does not decode or makes no call is not exact.

        *name*: the prediction's tool-call names are the reference step's. A text
        reference (never scored by the runner) is matched, both ways, by a reply without
        tool calls."""
        reference = steps[index].action
        if not tool_calls_of(reference):
            silent = not tool_calls_of(prediction)
            return StepScore(silent, silent, STEP_CHECKER)
        names = call_names(prediction) == call_names(reference)
        return StepScore(self._prefix_accepted(item, len(steps), index, prediction), names,
                         STEP_CHECKER)

    def _prefix_accepted(self, item: Item, count: int, index: int, prediction: Message) -> bool:
        """Whether ``multi_turn_checker`` accepts the prediction at step ``index``."""
        entry: dict[str, Any] = item.meta["entry"]
        truth: list[list[str]] = item.answer
        layout = reference_layout(truth)
        turn, position = layout[index]
        if count != len(layout) or position is None:
            raise ValueError(f"{item.item_id}: the steps are not this item's reference steps")
        decoded = decode_step(prediction, backend_methods(tuple(entry["involved_classes"])))
        if decoded is None:
            return False
        model_result, truth_prefix = teacher_forced_prefix(truth, turn, position, decoded)
        return bool(check(model_result, truth_prefix, entry)["valid"])

    def _invalid(self, extracted: str, error_type: str, message: str) -> Grade:
        return Grade(0.0, extracted, self.grader_id,
                     {"error_type": error_type, "error_message": message})


class BFCLMultiTurnBase(BFCLMultiTurnTask):
    name = "bfcl_multi_turn_base"
    bfcl_category = "multi_turn_base"


class BFCLMultiTurnLongContext(BFCLMultiTurnTask):
    name = "bfcl_multi_turn_long_context"
    bfcl_category = "multi_turn_long_context"


class BFCLMultiTurnMissFunc(BFCLMultiTurnTask):
    name = "bfcl_multi_turn_miss_func"
    bfcl_category = "multi_turn_miss_func"


class BFCLMultiTurnMissParam(BFCLMultiTurnTask):
    name = "bfcl_multi_turn_miss_param"
    bfcl_category = "multi_turn_miss_param"
