"""An agent episode, call by call: the budget holds on every call, not once per cell.

An episodic task's environment gives the first messages and the tools; then, at every
model call, the strategy builds the prompt from the trajectory so far, the runner checks
its tool-call pairs and counts it with the tools, the budgeted call
(:func:`~pytest_budgetbench.engine.calls.budgeted_call`) enforces the budget (a call over
budget is a violation that ends the episode, and the row says which call) and sends it,
the loop checks the
reply (one the runner cannot use is the model's error, naming the call, and never enters
the trajectory, where the next prompt would blame the strategy), appends it, and the
environment answers it: tool results, the next user turn, or the end.

One row per episode cell (``CellRow``'s episode fields) and one record in
``episodes.jsonl`` (written first: a row never exists without its trajectory), so that
``regrade`` and the viewer need no model call. Each call's prompt is kept as references
into the trajectory (``{"t": i}``) and the messages the strategy made (``{"m": ...}``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Protocol

from pytest_budgetbench.engine.answers import StepAnswers
from pytest_budgetbench.engine.calls import CallOutcome, CallSite, budgeted_call, fill_outcome
from pytest_budgetbench.engine.evidence import Retention, TrajectoryEvidence, fill_retention
from pytest_budgetbench.errors import EndpointError, MalformedReply, PromptCut
from pytest_budgetbench.messages import Message, Tool, shared_call_id, shared_prefix
from pytest_budgetbench.model.chat import Completion
from pytest_budgetbench.records.episodes import CallRecord, Ended, EpisodeRecord
from pytest_budgetbench.records.rows import CellRow
from pytest_budgetbench.reports.summary import percentile
from pytest_budgetbench.tasks import Environment, ReferenceStep, StepScore
from pytest_budgetbench.tokens.base import TokenCounter, message_key, prompt_sha256

FREE_RUNNING, TEACHER_FORCED = "free-running", "teacher-forced"
"""The row's ``episode_mode`` (``--budgetbench-episodes``)."""


@dataclass
class Episode:
    """The trajectory so far and the calls made."""

    trajectory: list[Message]
    tools: list[Tool]
    calls: list[CallRecord] = field(default_factory=list)
    ended: str = Ended.ERROR
    violation: str = ""
    last_reply: str = ""
    last_prompt: list[Message] = field(default_factory=list)
    strategy_s: float = 0.0
    _previous_ids: list[int] | None = None
    evidence: TrajectoryEvidence = field(default_factory=lambda: TrajectoryEvidence(()))
    """The item's evidence spans the trajectory has shown, counted in each call's prompt."""
    answers: StepAnswers = field(default_factory=StepAnswers)
    """A teacher-forced episode's: whether each step's prompt kept the values its reference
    arguments take from tool results (engine.answers)."""

    def record(self, cell_id: str, run_id: str) -> EpisodeRecord:
        """The episodes.jsonl record of this episode (records.episodes owns the format)."""
        return EpisodeRecord(cell_id=cell_id, run_id=run_id, ended=self.ended,
                             tools=self.tools, trajectory=self.trajectory, calls=self.calls)


def prompt_entries(
    prompt: Sequence[Message], trajectory: Sequence[Message]
) -> list[dict[str, Any]]:
    """The prompt as references into the trajectory where a message is sent as it is
    there, in order (the first match at or after the previous one), else the message."""
    positions: dict[str, list[int]] = {}
    for index, message in enumerate(trajectory):
        positions.setdefault(message_key(message), []).append(index)
    entries: list[dict[str, Any]] = []
    after = -1
    for message in prompt:
        found = next((i for i in positions.get(message_key(message), []) if i > after), None)
        if found is None:
            entries.append({"m": message})
        else:
            entries.append({"t": found})
            after = found
    return entries


class EpisodeCell(Protocol):
    """What the loop asks of the runner for one episode cell: its strategy's prompts and
    its model's replies (the runner's ``EpisodeTurns``)."""

    @property
    def site(self) -> CallSite:
        """The cell and its strategy, as a violation names them (the call is the loop's)."""
        ...

    def prompt(self, trajectory: list[Message],
               tools: list[Tool]) -> tuple[list[Message], float, int]:
        """The strategy's prompt for the trajectory so far and the tools, its seconds, and
        the prompt's count with the tools (the runner's, as for every cell)."""
        ...

    @property
    def estimated_tokens(self) -> int | None:
        """The strategy's own count of the prompt :meth:`prompt` last returned, or None
        (``StrategyContext.estimated_tokens``)."""
        ...

    def send(self, prompt: list[Message], tools: list[Tool], counted: int) -> Completion:
        """The model's reply to a prompt that fits the budget (``counted`` tokens)."""
        ...


@dataclass
class EpisodeLoop:
    """Plays one episode; the runner supplies the strategy, the counter and the model."""

    environment: Environment
    tokens: TokenCounter
    budget: int
    max_calls: int
    cell: EpisodeCell
    evidence: Sequence[str] = ()
    """The item's evidence spans (engine.evidence): each call records those its trajectory
    has shown and those its prompt keeps."""

    def play(self) -> Episode:
        env = self.environment
        episode = self._begin()
        while True:
            if len(episode.calls) >= self.max_calls:
                episode.ended = Ended.MAX_CALLS
                break
            _call, outcome = self._call(episode, send=True)
            if outcome.completion is None:
                break  # over budget: _call recorded the violation
            completion = outcome.completion
            reply = completion.message
            episode.trajectory.append(reply)
            episode.last_reply = completion.text
            following = env.respond(reply)
            if following is None:
                episode.ended = Ended.DONE
                break
            episode.trajectory.extend(following)
            episode.tools = list(env.tools)
        return episode

    def _begin(self) -> Episode:
        env = self.environment
        return Episode(trajectory=list(env.start()), tools=list(env.tools),
                       evidence=TrajectoryEvidence(self.evidence))

    def _call(self, episode: Episode, *, send: bool) -> tuple[CallRecord, CallOutcome]:
        """One call of the episode: the strategy's prompt for the trajectory so far,
        recorded, then the budgeted call (sent only with ``send``). A prompt over budget
        ends the episode as a violation; a reply is recorded on the call."""
        tools = list(self.environment.tools)
        prompt, seconds, counted = self.cell.prompt(list(episode.trajectory), tools)
        episode.strategy_s += seconds
        episode.last_prompt = prompt
        call = self._record_call(episode, prompt, tools, counted)
        outcome = budgeted_call(
            replace(self.cell.site, call=call.call), prompt, budget=self.budget,
            tokens=self.tokens, counted=counted,
            send=partial(self._reply, call, prompt, tools) if send else None)
        if outcome.violation:
            episode.ended, episode.violation = Ended.VIOLATION, outcome.violation
        elif outcome.completion is not None:
            self._received(call, outcome)
        return call, outcome

    def _record_call(self, episode: Episode, prompt: list[Message], tools: list[Tool],
                     counted: int) -> CallRecord:
        call = CallRecord(
            call=len(episode.calls) + 1, seen=len(episode.trajectory),
            prompt=prompt_entries(prompt, episode.trajectory), tools=len(tools),
            counted_tokens=counted, prompt_sha256=prompt_sha256(prompt, tools),
            estimated_tokens=self.cell.estimated_tokens)
        marks = episode.evidence.at_call(episode.trajectory, prompt)
        if marks is not None:
            call.evidence_total, call.evidence_kept = len(marks), sum(m.kept for m in marks)
            call.evidence = [[mark.span, mark.kept] for mark in marks]
        ids = self.tokens.prompt_token_ids(prompt, tools)
        if ids is not None:
            previous = episode._previous_ids
            call.prefix_tokens = 0 if previous is None else shared_prefix(previous, ids)
            episode._previous_ids = ids
        episode.calls.append(call)
        return call

    def _reply(self, call: CallRecord, prompt: list[Message], tools: list[Tool]) -> Completion:
        """The model's reply to ``call``, checked before it enters the trajectory. Any
        endpoint failure names the call (a malformed reply, a 500, a timeout alike): the
        row's error is then read without episodes.jsonl."""
        try:
            completion = self.cell.send(prompt, tools, call.counted_tokens)
            problem = shared_call_id(completion.tool_calls)
            if problem:  # a backend that does not check (a reply cached before it did)
                raise MalformedReply(f"malformed reply from the model: {problem}")
        except MalformedReply as exc:
            raise MalformedReply(f"{exc}; it answered call {call.call} of the episode") from None
        except PromptCut as exc:
            raise PromptCut(f"{exc}; it answered call {call.call} of the episode",
                            exc.server_tokens) from None
        except EndpointError as exc:
            raise type(exc)(f"{exc}; it failed call {call.call} of the episode") from None
        return completion

    @staticmethod
    def _received(call: CallRecord, outcome: CallOutcome) -> None:
        assert outcome.completion is not None
        call.server_prompt_tokens = outcome.server_prompt_tokens
        call.model_s = outcome.model_s
        call.cached = outcome.cached
        call.output_tokens = outcome.output_tokens
        call.parsed_tool_calls = outcome.completion.parsed_tool_calls


StepScorer = Callable[[int, Message], StepScore]
"""Scores the model's prediction at a reference step (its index): the task's score_step."""


@dataclass
class TeacherForcedLoop(EpisodeLoop):
    """Plays an episode teacher-forced: at each scored step of the reference trajectory the
    strategy builds the prompt from the reference trajectory so far, the runner counts and
    enforces it (a call over budget ends the episode, as in a free-running one), the model
    predicts the next action and ``score`` scores it; then the reference action, not the
    prediction, enters the trajectory, and the environment answers it with its real result.
    Unscored steps (a turn's end) go straight into the trajectory. With ``score`` None (a
    model-free sweep) nothing is sent: each step's prompt is counted, checked and its
    evidence counted. The reference is finite, so --budgetbench-max-calls does not cap it."""

    steps: Sequence[ReferenceStep] = ()
    score: StepScorer | None = None
    checker: str = ""
    """The step checker's id, of the last step scored (the row's grader)."""

    def play(self) -> Episode:
        env = self.environment
        episode = self._begin()
        for index, step in enumerate(self.steps):
            if step.scored and not self._predict(episode, index):
                return episode  # over budget: the violation ends it
            episode.trajectory.append(dict(step.action))
            following = env.respond(dict(step.action))
            if following is None:
                break
            episode.trajectory.extend(following)
            episode.tools = list(env.tools)
        episode.ended = Ended.DONE
        return episode

    def _predict(self, episode: Episode, index: int) -> bool:
        """One scored step's call; False when its prompt was over budget."""
        call, outcome = self._call(episode, send=self.score is not None)
        call.step = index + 1
        # Over budget too: the prompt that would have been sent, as for its evidence.
        mark = episode.answers.at_step(self.steps[index].action, episode.trajectory,
                                       episode.last_prompt)
        if mark is not None:
            call.answer_kept, call.answer_unique = mark
        if outcome.violation:
            return False
        if outcome.completion is not None and self.score is not None:
            call.predicted = outcome.completion.message
            scored = self.score(index, call.predicted)
            call.exact, call.name_ok, self.checker = scored.exact, scored.name, scored.checker
            episode.last_reply = outcome.completion.text
        return True


def fill_teacher_forced(row: CellRow, episode: Episode, checker: str) -> None:
    """A teacher-forced episode's row, after :func:`fill_row`: its steps and their scores
    (quality is the exact step accuracy, over the steps predicted; none in a model-free
    sweep or over budget), its evidence summed over its steps' prompts, and whether they
    kept the values the reference's arguments take from tool results (every step's)."""
    calls = episode.calls
    row.episode_mode = TEACHER_FORCED
    row.steps = len(calls)
    scored = [call for call in calls if call.exact is not None]
    if scored:
        row.steps_exact = sum(1 for call in scored if call.exact)
        row.steps_name = sum(1 for call in scored if call.name_ok)
        if not episode.violation:
            row.quality = round(row.steps_exact / len(scored), 4)
            row.name_accuracy = round(row.steps_name / len(scored), 4)
            row.grader = checker
    shown = [call for call in calls if call.evidence_total]
    fill_retention(row, Retention(sum(c.evidence_total or 0 for c in shown),
                                  sum(c.evidence_kept or 0 for c in shown)) if shown else None)
    episode.answers.fill(row)


def fill_row(row: CellRow, episode: Episode) -> None:
    """The episode's numbers on its row: per-call counts, the call that violated, its
    real cost (every call's prompt and output tokens) and how much of each prompt the
    previous one's prefix covered; its status and what the model did as for every cell
    (:func:`~pytest_budgetbench.engine.calls.fill_outcome`)."""
    calls = episode.calls
    counted = [call.counted_tokens for call in calls]
    row.calls = len(calls)
    row.ended = episode.ended
    row.call_tokens = counted
    sent = [call for call in calls if call.cached is not None]
    if counted:
        row.counted_tokens = max(counted)
        row.estimated_tokens = calls[counted.index(max(counted))].estimated_tokens
        row.max_call_tokens = max(counted)
        row.p95_call_tokens = percentile(counted, 0.95)
        row.utilisation = round(max(counted) / row.budget, 4)
        row.prompt_sha256 = calls[-1].prompt_sha256
    row.sum_call_tokens = sum(call.counted_tokens for call in sent)
    row.violated_call = calls[-1].call if episode.ended == Ended.VIOLATION else None
    row.output_tokens = sum(call.output_tokens or 0 for call in sent)
    row.total_tokens = sum((call.server_prompt_tokens or call.counted_tokens)
                           + (call.output_tokens or 0) for call in sent)
    with_prefix = [call for call in calls[1:] if call.prefix_tokens is not None]
    if with_prefix:
        row.prefix_reuse = round(sum(c.prefix_tokens or 0 for c in with_prefix)
                                 / sum(c.counted_tokens for c in with_prefix), 4)
    row.strategy_s = round(episode.strategy_s, 6)
    row.prediction = episode.last_reply
    last = calls[-1] if calls else None
    fill_retention(row, None if last is None or last.evidence_total is None
                   else Retention(last.evidence_total, last.evidence_kept or 0))
    row.episode_mode = FREE_RUNNING
    fill_outcome(row, calls, episode.violation)
