"""What a task is: official files in, items out; predictions in, grades out.

A task never knows about strategies or budgets. It loads items (each a chat history
ending in the user's question), extracts and grades answers with a versioned grader,
and names each item's category for splits.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pytest_budgetbench.errors import ConfigError, Requirement
from pytest_budgetbench.messages import Message, Tool, tool_calls_of
from pytest_budgetbench.options import DataFile, Option, positive_int

if TYPE_CHECKING:
    from pytest_budgetbench.model.backend import ChatBackend

CHUNK_TOKENS = Option(
    "chunk_tokens", "chunk size in tokens when long contexts become messages", positive_int,
    512, flag="chunk-tokens", metavar="TOKENS")
"""Every task has it (``TaskOptions.chunk_tokens``)."""

HISTORY_TOKENS = Option(
    "history_tokens", "target history length in tokens of generated tasks (memory, needle)",
    positive_int, 2000, flag="memory-history", metavar="TOKENS")
"""Shared by the generated tasks: one flag, --budgetbench-memory-history, sets both."""


@dataclass(frozen=True)
class Item:
    """One question with its history. ``messages`` ends with the user's question."""

    item_id: str
    messages: tuple[Message, ...]
    answer: Any
    category: str
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    tools: tuple[Tool, ...] = ()
    """Tools sent with the item's model call (and counted with its prompt): an agent's
    tools when ``messages`` is a trajectory with tool calls; empty for most tasks."""
    evidence: tuple[str, ...] = ()
    """Spans of text the answer needs, each verbatim in the history (an agent's: in the
    trajectory its environment produces). A prompt keeps a span when it holds it verbatim
    as sent, after the strategy; a summary that rewrites it does not keep it. Empty where
    the task declares none (the row's evidence fields are then null)."""

    @property
    def carries_tools(self) -> bool:
        """Whether the item is an agent's: it has tools, tool calls or tool results."""
        return bool(self.tools) or any(
            message.get("role") == "tool" or tool_calls_of(message) for message in self.messages)


@dataclass(frozen=True)
class Grade:
    """A graded prediction. ``quality`` is in [0, 1]; ``extracted`` is what was matched."""

    quality: float
    extracted: str
    grader: str
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GoldAnswers:
    """What an item's grader looks for in a reply, as the grader normalises it: what the
    runner looks for in the evidence, the history and the prompt to say whether a prompt
    kept the answer (the row's ``answer_kept``, :mod:`pytest_budgetbench.engine.answers`).

    A task gives them through :meth:`Task.gold_answers`, for the items whose grader
    matches a gold string in the reply; an abstention, an adversarial or a yes/no question,
    or a judged rubric gives None.
    """

    answers: tuple[str, ...]
    """The gold strings, raw (each normalised with ``normalise`` before it is looked for)."""
    normalise: Callable[[str], str]
    """The grader's normalisation of a text (memory's ``normalise``, SQuAD's
    ``normalize_answer``, LoCoMo's stemmed tokens...); a module-level function, so that
    the runner can cache the texts it normalised."""
    whole_words: bool = True
    """An answer occurs as whole words of the normalised text (the graders that match
    phrases), not as any substring (RULER's ``string_match_all``)."""
    every: bool = False
    """The grader needs every answer (needle's values), not any one (own data's list)."""


@dataclass(frozen=True)
class TaskOptions:
    """What the user configured that a task may use."""

    seed: int = 0
    items: int | None = None
    data_path: Path | None = None
    chunk_tokens: int = 512
    judge: ChatBackend | None = None
    """The LLM judge of LLM-judged tasks (``--budgetbench-judge-endpoint``), or None."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Values of the options the task declares (``Task.declared_options``), by key, parsed; a key
    left out reads as its declared default (:meth:`Task.option`)."""


class Task(ABC):
    """A benchmark: items in their official format, and their grader."""

    name: ClassVar[str] = ""
    grader_version: ClassVar[str] = ""
    """Recorded in every row, e.g. ``memory-contains/1``: bump it when grading changes."""
    data: ClassVar[DataFile | None] = None
    """The official file the task reads (``--budgetbench-data-<task>=PATH``), or None; the
    plugin builds the flag, its ini twin and ``BUDGETBENCH_DATA_<TASK>`` from it."""
    default_data_path: ClassVar[str | None] = None
    """The data path when no flag gives one (a named instance's ``path=``), relative to the
    directory pytest runs in."""
    declared_options: ClassVar[tuple[Option, ...]] = (CHUNK_TOKENS,)
    """What the task reads besides its data, as ``--budgetbench-task-options=KEY=VALUE``
    (or an option's own flag). Extend, don't replace: ``(*Task.declared_options, Option(...))``."""
    grader_variants: ClassVar[dict[str, str]] = {}
    """Named graders that depart from upstream's, name -> what changes; off by default.

    ``--budgetbench-grader=TASK:VARIANT`` (``TaskOptions.extra["grader_variants"]``) picks
    one; the row's grader id is then ``<grader_version>+<variant>``.
    """
    requires: ClassVar[tuple[Requirement, ...]] = ()
    """Optional packages the task imports (e.g. ``Requirement("nltk", "locomo")``): one
    that is missing stops a sweep that selects the task before any cell, naming the extra."""

    def __init__(self, options: TaskOptions) -> None:
        self.options = options
        self.grader_variant = self._chosen_variant()

    def _chosen_variant(self) -> str | None:
        chosen = (self.options.extra.get("grader_variants") or {}).get(self.name)
        if chosen is None or chosen in self.grader_variants:
            return chosen
        known = ", ".join(sorted(self.grader_variants)) or "none"
        raise ConfigError(f"--budgetbench-grader={self.name}:{chosen}: task {self.name!r} has "
                          f"no grader variant {chosen!r} (known: {known}); drop it to use "
                          "the default, upstream's grader")

    @property
    def grader_id(self) -> str:
        """What rows record as ``grader``: the version, plus the variant when one is chosen."""
        if self.grader_variant is None:
            return self.grader_version
        return f"{self.grader_version}+{self.grader_variant}"

    def option(self, key: str) -> Any:
        """The value of a declared option: as given, or its default."""
        if key in self.options.extra:
            return self.options.extra[key]
        for option in type(self).declared_options:
            if option.key == key:
                return option.default
        raise KeyError(f"task '{self.name}' declares no option '{key}'")

    @abstractmethod
    def load(self) -> list[Item]:
        """All items, in a deterministic order; the runner takes the first N."""

    @abstractmethod
    def grade(self, item: Item, prediction: str) -> Grade:
        """Grade the model's raw reply. An empty or missing answer is always wrong."""

    def gold_answers(self, item: Item) -> GoldAnswers | None:
        """The strings ``item``'s grader looks for in a reply, with its normalisation
        (:class:`GoldAnswers`), or None where it looks for none (the default: the row's
        ``answer_kept`` stays null). Where one occurs in the item's evidence, the runner
        records whether each prompt kept it outside the question."""
        return None

    def export(
        self, item: Item, prediction: str, cell_id: str
    ) -> tuple[str, dict[str, Any]] | None:
        """An upstream-format record of this prediction, as (file name, record), or None.

        The runner appends the record to ``<run_dir>/exports/<file name>``; e.g. LongMemEval
        hypotheses or SWE-bench predictions in the format their official harness reads.
        """
        return None

    def skip_reason(self, endpoint_info: dict[str, Any]) -> str | None:
        """Why this task cannot run on this endpoint (e.g. it needs vision), or None."""
        return None


class Environment(ABC):
    """One episode of an agentic task: the world the model acts in, fresh per episode.

    The runner drives it::

        trajectory = env.start()
        while True:
            prompt = strategy.apply(trajectory, budget)   # counted and enforced, every call
            reply = model(prompt, tools=env.tools)        # an assistant message
            trajectory.append(reply)
            following = env.respond(reply)
            if following is None: break                   # the episode is over
            trajectory += following

    ``respond`` executes the reply's tool calls and returns one ``tool`` message per call
    (in call order, each with its ``tool_call_id``), or, when the reply makes no call, the
    next user turn; None ends the episode. An environment keeps its own caps (BFCL's 20
    steps a turn); the runner's ``--budgetbench-max-calls`` ends a runaway episode too.
    """

    tools: list[Tool]
    """The tools the model may call, sent with every request; ``respond`` may change them
    between calls (a tool that appears at a later turn)."""

    @abstractmethod
    def start(self) -> list[Message]:
        """The first messages: a system prompt if any, and the first user turn."""

    @abstractmethod
    def respond(self, reply: Message) -> list[Message] | None:
        """The messages that follow the model's reply, or None when the episode is over."""

    def close(self) -> None:  # noqa: B027 - optional hook, most environments hold nothing
        """Release what the episode holds; called once, however the episode ended."""


@dataclass(frozen=True)
class ReferenceStep:
    """One step of an episode's reference trajectory, for teacher-forced episodes: the
    assistant message the reference makes there (tool calls, or a text reply). The runner
    appends it to the trajectory, and the environment answers it, whatever the model
    predicted; ``scored`` steps are scored against the model's prediction."""

    action: Message
    scored: bool = True


@dataclass(frozen=True)
class StepScore:
    """A predicted step against the reference step: ``exact`` by the task's checker (the
    same action, or for BFCL the same state and results), ``name`` on the functions alone
    (the same names in the same order; a text reply where the reference replies in text)."""

    exact: bool
    name: bool
    checker: str
    """Which checker scored it (versioned, as a grader id is)."""


def call_names(message: Message) -> list[str]:
    """The names of a message's tool calls, in order."""
    return [str(call.get("function", {}).get("name", "")) for call in tool_calls_of(message)]


def call_arguments(message: Message) -> list[Any]:
    """Each tool call's arguments, parsed from their JSON (the text itself where it does
    not parse: such a call matches only a call with the same text)."""
    import json

    parsed = []
    for call in tool_calls_of(message):
        raw = call.get("function", {}).get("arguments")
        try:
            parsed.append(json.loads(raw) if isinstance(raw, str) else raw)
        except ValueError:
            parsed.append(raw)
    return parsed


def same_calls_step(prediction: Message, reference: ReferenceStep) -> StepScore:
    """The default step checker: the same function names in order (``name``), and the same
    arguments too, compared as parsed JSON (``exact``); a text reference is matched by any
    reply without tool calls."""
    names = call_names(prediction) == call_names(reference.action)
    exact = names and call_arguments(prediction) == call_arguments(reference.action)
    return StepScore(exact, names, "same-calls/1")


class EpisodicTask(Task):
    """A task whose items are episodes: the model calls tools across many calls, and the
    grade is of the whole trajectory (the calls it made, the state they left).

    ``Item.messages`` holds the episode's first messages (what :meth:`Environment.start`
    gives), for reports and for counting; :meth:`environment` makes the live episode.
    Grading reads only the trajectory, so ``budgetbench regrade`` needs no model call.
    """

    @abstractmethod
    def environment(self, item: Item) -> Environment:
        """A fresh episode of ``item``."""

    @abstractmethod
    def grade_trajectory(self, item: Item, trajectory: Sequence[Message]) -> Grade:
        """Grade a finished (or ended) episode from its trajectory: every message, the
        first ones, the model's replies, the tool results and the later user turns."""

    def reference_steps(self, item: Item) -> Sequence[ReferenceStep] | None:
        """The item's reference trajectory as the assistant's steps, for teacher-forced
        episodes (``--budgetbench-episodes=teacher-forced``); None where the task has none
        (the mode is then refused before any cell)."""
        return None

    def score_step(self, item: Item, steps: Sequence[ReferenceStep], index: int,
                   prediction: Message) -> StepScore:
        """Score the model's ``prediction`` at reference step ``index`` of ``steps`` (the
        steps before it are the reference's, in the trajectory the model saw)."""
        return same_calls_step(prediction, steps[index])

    def grade(self, item: Item, prediction: str) -> Grade:
        raise TypeError(
            f"task '{self.name}' is episodic: it grades a trajectory "
            "(grade_trajectory), not one reply"
        )
