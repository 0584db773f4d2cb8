"""The OpenHands SDK's condensers (``openhands-sdk`` 1.58.2, Python 3.12 or newer), run as
shipped: ``openhands_llm_summarizing`` (and ``_exact``) and ``openhands_no_op``.

The SDK ships three condensers: ``LLMSummarizingCondenser`` (what an OpenHands agent uses
unless told otherwise), ``NoOpCondenser`` (condensation off: the other kind its settings
offer) and ``PipelineCondenser`` (a chain of others). None but the summariser has a size
limit, and no condenser forgets without a summary, so the non-LLM policy measured is
``NoOpCondenser``: what a team that turns condensation off sends.

The history crosses to OpenHands events and back with the SDK's own conversions
(:mod:`._openhands_events`, which says what cannot cross); the condenser works on a
``View`` of them, as in an agent's loop.

``openhands_llm_summarizing``: the budget maps to ``LLMSummarizingCondenser.max_tokens``.
Past it (its *token* reason: a hard requirement) the condenser forgets the oldest events
after ``keep_first`` until the rest counts at most half of ``max_tokens``, and its LLM
summarises what it forgot into one user message in their place; past ``max_size`` events
(240; its *event* reason, a soft one) it keeps the newest ``max_size // 2``. It counts with
the agent LLM's ``get_token_count``. As shipped that is litellm's ``token_counter`` for the
agent's model, which for a model litellm does not know (every model served here) is
tiktoken's ``cl100k_base`` over the messages and the tools its ``SystemPromptEvent`` lists
(the cell's, as OpenHands ``ClientTool`` s, with the ``summary`` and ``security_risk``
fields it adds to each). ``_exact`` hands it the run's counter through the agent LLM (the
cell's tools as the run counts them) over the messages OpenHands builds to count: its
``events_to_messages`` joins consecutive user turns (a summary and the user turn beside
it), which this bridge sends apart, so its count can fall a few tokens short of the run's.

- The policy is replayed as an agent lives it: the condenser runs at every point of the
  history where the model would be called (after a user turn, or after a step's tool
  results), each condensation kept as an event, so a summary covers about half a budget
  of events and the previous summary, not the whole history at once (one call could not
  read that within the budget). Within an episode the state carries over from call to
  call while each trajectory extends the last; ``reset`` forgets it.
- At each call the unit the model answers (the last user turn, or the last call with its
  results) is kept out of the condenser's view and sent after it, as the contract of a
  strategy wants: ``max_tokens`` is the budget less what that unit adds to the prompt, by
  the variant's counter. A condensation that leaves the view over it is followed by
  another, at most ``MAX_ROUNDS`` a call.
- The summariser is a thin ``openhands.sdk.llm.LLM`` whose completions are the runner's
  auxiliary model (purpose ``openhands-summary``), its prompt OpenHands' own (the
  ``summarizing_system.j2`` instructions, ~500 tokens, and each forgotten event as the SDK
  prints it, 500 characters at most). Its context window is the cell's budget, a prompt
  counted as the project's own summarisers count theirs (``context.tokens``, the cell's
  tools included though the call is sent none): a prompt over it raises
  ``LLMContextWindowExceedError`` without a call, and the condenser does what it does
  then (a hard context reset that summarises every event, each cut shorter at each of
  ``hard_context_reset_max_retries`` tries). A reply is at most
  ``openhands_max_output_tokens`` (0: a quarter of the budget).
- Where the condenser gives up (``NoCondensationAvailableException``: no call fits, or
  too little to forget), the view goes as it stands, OpenHands' documented fallback, and
  ``strategy_info.framework.gave_up`` says why; the runner records the violation. The view
  then only grows, and so does what it would forget, so the replay skips the calls between
  a give-up and the last one (each would give up again, at a cost that grows with the
  history: the SDK copies every event to count it). Below about 1,500 tokens (the memory
  task at 1,024) no summary call fits: even the ``_exact`` variant then sends more than
  the budget, and the conformance kit does not hold it to fitting.
- What the auxiliary model raises (BudgetExceeded for a call over budget, where its
  budget is not the cell's; an EndpointError) is raised once the condenser returns: it
  would take it for a failed call of its LLM and retry (no call is made after it).

Options (OpenHands' parameters under their own names, at its defaults):
``openhands_max_size`` (240), ``openhands_keep_first`` (2), ``openhands_minimum_progress``
(0.1), ``openhands_hard_context_reset_max_retries`` (5),
``openhands_hard_context_reset_context_scaling`` (0.8); the SDK's ``default_condenser``
(what its default agent builds) uses max_size 80 and keep_first 4.

``openhands_no_op``: ``NoOpCondenser`` takes no budget; the prompt is the whole history.
Both record OpenHands' count of the prompt they return (``estimated_tokens``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_budgetbench.errors import Requirement, StrategyError
from pytest_budgetbench.messages import Message, exchanges, split_ends
from pytest_budgetbench.options import Option, integer, positive_int
from pytest_budgetbench.strategies.base import Regime, StrategyContext
from pytest_budgetbench.strategies.frameworks._openhands_events import (
    chat_dict,
    import_sdk,
    originals_of,
    to_events,
    to_messages,
)
from pytest_budgetbench.strategies.frameworks._policy import FrameworkPolicy

REQUIRES = (Requirement("openhands", "openhands", "openhands-sdk", python=(3, 12)),)
AGENT_MODEL = "openai/budgetbench"
"""The agent LLM's model name: one litellm does not know, as a served model is."""
SHIPPED_COUNTER = "litellm-token_counter (tiktoken cl100k_base)"
SUMMARY_PURPOSE = "openhands-summary"
MAX_ROUNDS = 8
"""Condensations at most in one call of the model (each one summary call)."""


def _open_rate(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 < value < 1.0:  # also rejects nan
        raise ValueError("must be a number between 0 and 1, both excluded, e.g. 0.5")
    return value


def _count(raw: str) -> int:
    value = integer(raw)
    if value < 0:
        raise ValueError("must be an integer >= 0")
    return value


OPTIONS = (
    Option("openhands_max_size", "events in the view past which OpenHands' "
           "LLMSummarizingCondenser condenses (max_size)", positive_int, 240),
    Option("openhands_keep_first", "first events the condenser never forgets (keep_first)",
           _count, 2),
    Option("openhands_minimum_progress", "least share of the view a condensation must "
           "forget (minimum_progress)", _open_rate, 0.1),
    Option("openhands_hard_context_reset_max_retries", "summary attempts of a hard "
           "context reset (hard_context_reset_max_retries)", positive_int, 5),
    Option("openhands_hard_context_reset_context_scaling", "how much shorter each event "
           "is cut at each retry (hard_context_reset_context_scaling)", _open_rate, 0.8),
    Option("openhands_max_output_tokens", "most tokens of an OpenHands summary (its LLM's "
           "max_output_tokens); 0: a quarter of the budget", _count, 0),
)


@functools.cache
def _llm_class() -> type:
    """A thin ``openhands.sdk.llm.LLM``: completions from the runner's auxiliary model and,
    in an ``_exact`` variant, token counts from the run's counter (see :class:`_Bridge`)."""
    from openhands.sdk.llm import LLM
    from pydantic import PrivateAttr

    class BudgetbenchLLM(LLM):
        _bridge: Any = PrivateAttr(default=None)

        def uses_responses_api(self) -> bool:
            return False

        def completion(self, messages: list[Any], *args: Any, **kwargs: Any) -> Any:
            return self._bridge.complete(messages)

        async def acompletion(self, messages: list[Any], *args: Any, **kwargs: Any) -> Any:
            return self._bridge.complete(messages)

        def get_token_count(self, messages: list[Any], *args: Any, **kwargs: Any) -> int:
            if self._bridge.exact:
                return self._bridge.exact_count([chat_dict(m) for m in messages])
            return int(super().get_token_count(messages, *args, **kwargs))

    return BudgetbenchLLM


@dataclass
class _Bridge:
    """What the thin LLM asks of the strategy: its counter and its auxiliary model."""

    policy: OpenHandsPolicy
    budget: int
    exact: bool
    calls: int = 0
    failure: Exception | None = None
    """What the auxiliary model raised (a call over budget, the endpoint failing): the
    condenser takes any exception of its LLM for a failed call and retries, so the
    strategy raises it once the condenser returns, and no call is made after it."""

    def exact_count(self, messages: Sequence[Message]) -> int:
        return self.policy.exact_count(messages)

    def complete(self, messages: list[Any]) -> Any:
        from litellm.types.utils import ModelResponse
        from openhands.sdk.llm import LLMResponse, MetricsSnapshot, TextContent
        from openhands.sdk.llm import Message as SdkMessage
        from openhands.sdk.llm.exceptions import LLMContextWindowExceedError

        context = self.policy.context
        if self.failure is not None:
            raise LLMContextWindowExceedError(str(self.failure))
        prompt = [chat_dict(message) for message in messages]
        counted = context.tokens.count_messages(prompt)  # as the project's summarisers do
        if counted > self.budget:
            raise LLMContextWindowExceedError(
                f"summary prompt of {counted} tokens over the budget {self.budget}")
        limit = context.options.get("openhands_max_output_tokens") or self.budget // 4
        try:
            if context.aux is None:
                raise StrategyError(f"'{self.policy.name}' needs the runner's auxiliary "
                                    "model (context.aux)")
            reply = context.aux.complete(prompt, max_tokens=max(1, limit),
                                         purpose=SUMMARY_PURPOSE)
        except Exception as exc:  # BudgetExceeded, EndpointError: the runner's to judge
            self.failure = exc
            raise LLMContextWindowExceedError(str(exc)) from exc
        self.calls += 1
        return LLMResponse(
            message=SdkMessage(role="assistant", content=[TextContent(text=reply)]),
            metrics=MetricsSnapshot(model_name=AGENT_MODEL),
            raw_response=ModelResponse(id=f"budgetbench-summary-{self.calls}"))


def _llm(bridge: _Bridge, usage: str) -> Any:
    llm = _llm_class()(model=AGENT_MODEL, usage_id=usage)
    llm._bridge = bridge
    return llm


class OpenHandsPolicy(FrameworkPolicy):
    """What the OpenHands condensers share: conversion, the agent LLM, the estimate."""

    framework = "openhands"
    shipped_counter = SHIPPED_COUNTER
    requires = REQUIRES

    def reset(self, context: StrategyContext) -> None:
        super().reset(context)
        self._episode: _Episode | None = None

    def _agent_llm(self, budget: int) -> Any:
        return _llm(_Bridge(self, budget, self.exact), "agent")

    def _finish(self, events: list[Any], messages: Sequence[Message], agent: Any,
                **notes: Any) -> list[Message]:
        from openhands.sdk.context.condenser.utils import get_total_token_count

        self.record_estimate(get_total_token_count(events, agent), **notes)
        return to_messages(events, originals_of(messages))


class OpenHandsNoOp(OpenHandsPolicy):
    """``NoOpCondenser``: condensation off, the whole history sent."""

    name = "openhands_no_op"
    policy = "NoOpCondenser"

    def apply(self, messages: Sequence[Message], budget: int) -> list[Message]:
        import_sdk()
        from openhands.sdk.context.condenser import NoOpCondenser
        from openhands.sdk.context.view import View

        agent = self._agent_llm(budget)
        events = to_events(messages, self.context.tools)
        view = NoOpCondenser().condense(View.from_events(events), agent_llm=agent)
        return self._finish(view.events, messages, agent)


@dataclass
class _Episode:
    """The condensations of one episode, each after how many of its events it was made."""

    budget: int
    seen: list[Message] = field(default_factory=list)
    condensations: list[tuple[int, Any]] = field(default_factory=list)
    gave_up: str = ""

    def log(self, events: Sequence[Any]) -> list[Any]:
        """``events`` with the condensations in place: an agent's event log."""
        made = sorted(self.condensations, key=lambda pair: pair[0])
        log: list[Any] = []
        for index, event in enumerate([*events, None]):
            log += [condensation for at, condensation in made if at == index]
            if event is not None:
                log.append(event)
        return log


def call_points(messages: Sequence[Message]) -> list[int]:
    """Where the model is called in ``messages`` (after a user turn or a step's last tool
    result, where an assistant message follows), and at its end."""
    points = [end for end in range(1, len(messages))
              if messages[end - 1].get("role") in ("user", "tool")
              and messages[end].get("role") == "assistant"]
    return [*points, len(messages)]


def _answered(messages: Sequence[Message]) -> int:
    """How many of the last messages are the unit the model answers now."""
    head, _history, _query = split_ends(messages)
    units = exchanges(messages[len(head):])
    return len(units[-1]) if units else 0


class OpenHandsLLMSummarizing(OpenHandsPolicy):
    """``LLMSummarizingCondenser``, its ``max_tokens`` the budget (see the module)."""

    name = "openhands_llm_summarizing"
    policy = "LLMSummarizingCondenser"
    regimes = frozenset({Regime.AUXILIARY_MODEL, Regime.RESET_PER_ITEM})
    declared_options = OPTIONS
    # Even with the run's counter it falls back to the uncondensed view where no summary
    # call of OpenHands' fits the budget (see the module).
    sizes_prompt = False

    def apply(self, messages: Sequence[Message], budget: int) -> list[Message]:
        import_sdk()
        messages = list(messages)
        events = to_events(messages, self.context.tools)
        ends = _event_ends(messages)
        episode = self._episode
        if (episode is None or episode.budget != budget
                or messages[:len(episode.seen)] != episode.seen):
            episode = self._episode = _Episode(budget)
        summariser = _Bridge(self, budget, self.exact)
        agent, condenser = self._agent_llm(budget), self._condenser(summariser)
        for point in call_points(messages):
            if point < len(messages) and (point <= len(episode.seen) or episode.gave_up):
                continue  # replayed at an earlier call, or given up on: see _condense
            held = point - _answered(messages[:point])
            view = self._condense(condenser, agent, episode, events[:ends[held]],
                                  events[ends[held]:ends[point]])
            if summariser.failure is not None:
                self._episode = None
                raise summariser.failure
        episode.seen = messages
        notes: dict[str, Any] = {"condensations": len(episode.condensations)}
        if episode.gave_up:
            notes["gave_up"] = episode.gave_up
        return self._finish([*view.events, *events[ends[held]:]], messages, agent, **notes)

    def _condenser(self, summariser: _Bridge) -> Any:
        from openhands.sdk.context.condenser import LLMSummarizingCondenser

        options = self.context.options
        try:
            return LLMSummarizingCondenser(
                llm=_llm(summariser, "condenser"),
                max_size=options.get("openhands_max_size", 240),
                keep_first=options.get("openhands_keep_first", 2),
                minimum_progress=options.get("openhands_minimum_progress", 0.1),
                hard_context_reset_max_retries=options.get(
                    "openhands_hard_context_reset_max_retries", 5),
                hard_context_reset_context_scaling=options.get(
                    "openhands_hard_context_reset_context_scaling", 0.8))
        except ValueError as exc:  # pydantic's: keep_first must be < max_size // 2 - 1
            raise StrategyError(f"OpenHands' LLMSummarizingCondenser refuses the options "
                                f"given: {exc}") from None

    def _condense(self, condenser: Any, agent: Any, episode: _Episode,
                  history: Sequence[Any], answered: Sequence[Any]) -> Any:
        """The view OpenHands sends before ``answered`` at one call, condensed as an
        agent's loop condenses it: a condensation is logged and the view made again."""
        from openhands.sdk.context.condenser import NoCondensationAvailableException
        from openhands.sdk.context.condenser.utils import get_total_token_count
        from openhands.sdk.context.view import View

        view = View.from_events(episode.log(history))
        for _round in range(MAX_ROUNDS):
            adds = (get_total_token_count([*view.events, *answered], agent)
                    - get_total_token_count(view.events, agent))
            sized = condenser.model_copy(update={"max_tokens": max(1, episode.budget - adds)})
            try:
                result = sized.condense(view, agent_llm=agent)
            except NoCondensationAvailableException as exc:
                episode.gave_up = str(exc)
                return view
            episode.gave_up = ""
            if isinstance(result, View):
                return result
            episode.condensations.append((len(history), result))
            view = View.from_events(episode.log(history))
        return view


class OpenHandsLLMSummarizingExact(OpenHandsLLMSummarizing):
    """``LLMSummarizingCondenser`` counting with the run's counter."""

    name = "openhands_llm_summarizing_exact"
    exact = True



def _event_ends(messages: Sequence[Message]) -> list[int]:
    """``ends[i]``: how many events the first ``i`` messages make (one per tool call of
    an assistant message, one per other message)."""
    ends = [0]
    for message in messages:
        calls = message.get("tool_calls") if message.get("role") == "assistant" else None
        ends.append(ends[-1] + (len(calls) if calls else 1))
    return ends

