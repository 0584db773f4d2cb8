"""``agent_lookup``: a generated agent episode whose answer sits in an early tool result.

A generator, deterministic from ``TaskOptions.seed``, for trying agent memory strategies
without a benchmark install (and for the project's own tests, with a scripted endpoint).
The user asks the model to look up ``lookups`` records, one ``lookup`` tool call at a
time in a given order, and then to give the code of the *first* record. Each tool result
is about ``history_tokens / lookups`` tokens of filler with the record's code in it, so
the trajectory grows call by call with tool results, as an agent's does, and the needed
fact is in the oldest one: a strategy that masks or drops old tool results loses it; one
that keeps, retrieves or summarises it can answer.

Evidence (:attr:`Item.evidence`): the first record's line as its lookup returns it,
``Record R123: code ABCDEF.``; it enters the trajectory with that tool result, not with the
item's first messages.

Category: ``lookups-<n>``. Grader ``agent-lookup-contains/1``: 1 when the final reply
contains the first record's code (case-insensitive), else 0.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence

from pytest_budgetbench.messages import Message, Tool, text_of, tool_calls_of
from pytest_budgetbench.options import Option, positive_int
from pytest_budgetbench.tasks._text import CHARS_PER_TOKEN
from pytest_budgetbench.tasks.base import (
    HISTORY_TOKENS,
    Environment,
    EpisodicTask,
    Grade,
    Item,
    ReferenceStep,
    StepScore,
    Task,
    same_calls_step,
)
from pytest_budgetbench.tasks.needle import filler_sentence

LOOKUPS = Option("lookups", "records an agent_lookup episode looks up", positive_int, 5,
                 metavar="N")

LOOKUP_TOOL: Tool = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look up one record by its key and return its file.",
        "parameters": {"type": "object",
                       "properties": {"key": {"type": "string", "description": "record key"}},
                       "required": ["key"]},
    },
}
REQUEST = ("Look up these records with the lookup tool, one call at a time, in this "
           "order: {keys}. When you have looked up all of them, tell me the code of "
           "record {first}, and nothing else.")
RECORD = "Record {key}: code {code}."


class LookupEnvironment(Environment):
    """The records of one item; ``lookup`` returns a record's file, the episode ends at the
    first reply without a tool call."""

    def __init__(self, item: Item) -> None:
        self.item = item
        self.tools = [LOOKUP_TOOL]

    def start(self) -> list[Message]:
        return list(self.item.messages)

    def respond(self, reply: Message) -> list[Message] | None:
        calls = tool_calls_of(reply)
        if not calls:
            return None
        return [{"role": "tool", "tool_call_id": call["id"], "content": self._result(call)}
                for call in calls]

    def _result(self, call: dict[str, object]) -> str:
        function = call.get("function")
        assert isinstance(function, dict)
        if function.get("name") != "lookup":
            return f"Error: no tool named {function.get('name')!r}; the tool is lookup."
        try:
            key = str(json.loads(str(function.get("arguments") or "{}")).get("key", ""))
        except (ValueError, AttributeError):
            return "Error: the arguments must be a JSON object with a key."
        files: dict[str, str] = self.item.meta["files"]
        return files.get(key, f"Error: no record {key!r}; the keys are {', '.join(files)}.")


class AgentLookupTask(EpisodicTask):
    name = "agent_lookup"
    grader_version = "agent-lookup-contains/1"
    declared_options = (*Task.declared_options, HISTORY_TOKENS, LOOKUPS)

    def load(self) -> list[Item]:
        return [self._item(index) for index in range(self.options.items or 10)]

    def _item(self, index: int) -> Item:
        rng = random.Random(f"agent_lookup/{self.options.seed}/{index}")
        count = int(self.option("lookups"))
        keys = [f"R{number}" for number in rng.sample(range(100, 1000), count)]
        codes = ["".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(6))
                 for _ in keys]
        per_file = int(self.option("history_tokens")) * CHARS_PER_TOKEN // count
        files = {key: self._file(rng, key, code, per_file) for key, code in zip(keys, codes,
                                                                                 strict=True)}
        request = REQUEST.format(keys=", ".join(keys), first=keys[0])
        return Item(item_id=f"{index:04d}", messages=({"role": "user", "content": request},),
                    answer=codes[0], category=f"lookups-{count}",
                    meta={"files": files, "keys": keys}, tools=(LOOKUP_TOOL,),
                    evidence=(RECORD.format(key=keys[0], code=codes[0]),))

    @staticmethod
    def _file(rng: random.Random, key: str, code: str, chars: int) -> str:
        sentences: list[str] = []
        while sum(len(s) + 1 for s in sentences) < chars:
            sentences.append(filler_sentence(rng))
        sentences.insert(rng.randrange(len(sentences) + 1), RECORD.format(key=key, code=code))
        return " ".join(sentences)

    def environment(self, item: Item) -> Environment:
        return LookupEnvironment(item)

    def reference_steps(self, item: Item) -> list[ReferenceStep]:
        """The scripted policy: each key looked up in the order asked, one call a step,
        then the first record's code as the answer."""
        keys: list[str] = item.meta["keys"]
        lookups = [ReferenceStep({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"ref-{index}", "type": "function",
             "function": {"name": "lookup", "arguments": json.dumps({"key": key})}}]})
            for index, key in enumerate(keys)]
        return [*lookups, ReferenceStep({"role": "assistant", "content": str(item.answer)})]

    def score_step(self, item: Item, steps: Sequence[ReferenceStep], index: int,
                   prediction: Message) -> StepScore:
        """A lookup step as the same call (``same_calls_step``); the answer step as the
        grader grades a final reply: right when it holds the code and calls nothing."""
        if tool_calls_of(steps[index].action):
            return same_calls_step(prediction, steps[index])
        answered = not tool_calls_of(prediction)
        exact = answered and self.grade_trajectory(item, [prediction]).quality == 1.0
        return StepScore(exact, answered, f"{self.grader_version}+same-calls/1")

    def grade_trajectory(self, item: Item, trajectory: Sequence[Message]) -> Grade:
        replies = [m for m in trajectory if m.get("role") == "assistant"]
        final = text_of(replies[-1]) if replies and not tool_calls_of(replies[-1]) else ""
        found = str(item.answer).lower() in final.lower()
        return Grade(1.0 if found else 0.0, item.answer if found else "", self.grader_version,
                     {"gold": item.answer})
