"""LangChain's memory policies, run as shipped (``pip install 'pytest-budgetbench[langchain]'``:
langchain 1.5.0, langchain-core 1.8.1).

Each policy is LangChain's own code, called as a LangChain app calls it; the bridge
(:mod:`._langchain_messages`) converts the cell's history with LangChain's converters and
back without loss, and routes LangChain's model calls through the runner's auxiliary model.
Each comes as shipped (LangChain's default counter, ``count_tokens_approximately``:
characters / 4 plus 3 a message, blind to the tool schemas) and ``_exact`` (the run's
counter handed to it, the cell's tools included), and records LangChain's count of the
prompt it built (``estimated_tokens``; the shipped counter over the whole prompt, system
messages included).

``langchain_trim_messages`` / ``_exact``: ``langchain_core.messages.trim_messages``.
  Budget -> ``max_tokens``. ``strategy="last"`` and, as its docstring recommends for a
  chat history, ``start_on="human"``, ``include_system=True``, ``allow_partial=False``
  (options ``langchain_start_on``, ``langchain_end_on`` [none], ``langchain_include_system``,
  ``langchain_allow_partial``). ``start_on="human"`` never breaks a tool-call pair (what
  is kept is a suffix that opens on a user turn), but in an agent's episode, when the
  turn in progress (the last user message and every call and result since) does not fit,
  it keeps nothing but the system message: that prompt is sent as LangChain built it, and
  ``strategy_info.framework.answerable`` is false (``langchain_start_on=human,ai`` keeps
  the newest steps instead). ``langchain_start_on=none`` lets the suffix open on a tool
  result whose call was cut: the runner refuses that prompt (a broken pair) as the cell's
  error; nothing here repairs it. Where not even the last message fits (``_exact`` on a
  task whose tool schemas alone exceed the budget: BFCL's 4,792 tokens), LangChain keeps
  no message at all, and that empty prompt is returned as it is (the conformance kit
  takes it where nothing could fit; the runner's counter may not render it).
  ``_exact`` counts each list it is given as what it adds to the prompt (trim_messages
  counts the system message and the rest apart, and the rest reversed), so that the two
  sum to the run's count of the prompt.

``langchain_summarization`` / ``_exact``: ``langchain.agents.middleware.SummarizationMiddleware``,
  its ``before_model`` hook on the agent state (the history after the system messages,
  which an agent holds as its system prompt), the update applied by langgraph's
  ``add_messages``. Budget -> ``trigger=("tokens", budget)``. ``keep`` LangChain's
  default ``("messages", 20)`` (``langchain_summarization_keep``: ``messages:N``,
  ``tokens:N`` or ``fraction:F``, a fraction of the budget), ``trim_tokens_to_summarize``
  its 4000 (``langchain_trim_tokens_to_summarize``, ``none`` to send all), its default
  summary prompt. The summary model is :class:`~._langchain_messages.AuxChatModel`,
  whose context window (``profile.max_input_tokens``) is the budget and whose
  ``max_tokens`` is ``langchain_summary_max_tokens`` (``auto``: a quarter of the budget,
  at most 512). A summary prompt over the budget is what LangChain knows as a context
  overflow: it retries once with the middle of the history cut out; a retry still over
  the budget is the cell's budgeted auxiliary violation (BudgetExceeded), and
  ``strategy_info.framework.summary_overflows`` counts the first tries.

``langchain_clear_tool_uses`` / ``_exact``: ``ContextEditingMiddleware`` with one
  ``ClearToolUsesEdit``, its ``wrap_model_call`` on a model request of the agent state.
  Budget -> the edit's ``trigger`` (it clears when the count exceeds it). Options at
  LangChain's defaults: ``langchain_clear_tool_uses_keep`` (3 newest results),
  ``langchain_clear_at_least`` (0), ``langchain_clear_tool_inputs`` (false),
  ``langchain_exclude_tools`` (none), ``langchain_placeholder`` (``[cleared]``). As
  shipped it counts with ``token_count_method="approximate"`` (the history alone); the
  ``_exact`` variant passes ``token_counter`` (the whole prompt, system and tools).

Only ``langchain_trim_messages_exact`` means to fit the budget: the middlewares' budget is
a trigger, not a size (a summary and 20 kept messages, or cleared results beside the user
turns, may still be over it), so the conformance kit does not hold them to fitting.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, cast

from pytest_budgetbench.errors import Requirement, StrategyError
from pytest_budgetbench.messages import Message, split_ends
from pytest_budgetbench.options import Option, is_count, positive_int
from pytest_budgetbench.strategies.base import Regime
from pytest_budgetbench.strategies.frameworks._policy import FrameworkPolicy

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

    from pytest_budgetbench.strategies.frameworks._langchain_messages import (
        Bridge,
        LangChainCounter,
    )

MESSAGE_TYPES = ("human", "ai", "system", "tool")
CONTEXT_KINDS = ("messages", "tokens", "fraction")


# -- option parsers ------------------------------------------------------------------------
def message_types(raw: str) -> tuple[str, ...] | None:
    """LangChain message types (``human,tool``), or ``none``."""
    if raw.lower() == "none":
        return None
    names = tuple(part.strip().lower() for part in raw.split(",") if part.strip())
    if not names or any(name not in MESSAGE_TYPES for name in names):
        raise ValueError(f"must be none or LangChain message types from "
                         f"{','.join(MESSAGE_TYPES)}, e.g. human,tool")
    return names


def flag(raw: str) -> bool:
    value = raw.lower()
    if value not in ("true", "false", "yes", "no", "1", "0"):
        raise ValueError("must be true or false")
    return value in ("true", "yes", "1")


def context_size(raw: str) -> tuple[str, float | int]:
    """A LangChain ``ContextSize``: ``messages:20``, ``tokens:3000`` or ``fraction:0.3``."""
    kind, _, value = raw.partition(":")
    kind = kind.strip().lower()
    try:
        number: float | int = float(value) if kind == "fraction" else int(value)
    except ValueError:
        number = 0
    if kind not in CONTEXT_KINDS or not (0 < number <= 1 if kind == "fraction" else number > 0):
        raise ValueError("must be messages:N, tokens:N (N > 0) or fraction:F (0 < F <= 1), "
                         "e.g. messages:20")
    return kind, number


def count_or_none(raw: str) -> int | None:
    return None if raw.lower() == "none" else positive_int(raw)


def count_or_zero(raw: str) -> int:
    if not is_count(raw):
        raise ValueError("must be an integer >= 0")
    return int(raw)


def count_or_auto(raw: str) -> int | str:
    return "auto" if raw.lower() == "auto" else positive_int(raw)


def names_or_none(raw: str) -> tuple[str, ...]:
    if raw.lower() == "none":
        return ()
    return tuple(part.strip() for part in raw.split(",") if part.strip())


# -- options ----------------------------------------------------------------------------------
START_ON = Option("langchain_start_on", "trim_messages' start_on: the message types the kept "
                  "history may open on (none: any)", message_types, ("human",))
END_ON = Option("langchain_end_on", "trim_messages' end_on: the message types the history "
                "must end on, checked before trimming (none: any)", message_types, None)
INCLUDE_SYSTEM = Option("langchain_include_system", "trim_messages' include_system: keep "
                        "the system message at index 0", flag, True)
ALLOW_PARTIAL = Option("langchain_allow_partial", "trim_messages' allow_partial: keep the "
                       "newest lines of the oldest message that does not fit", flag, False)
SUMMARIZATION_KEEP = Option(
    "langchain_summarization_keep", "SummarizationMiddleware's keep: messages:N, tokens:N "
    "or fraction:F (of the budget, the summary model's context window)", context_size,
    ("messages", 20))
TRIM_TOKENS_TO_SUMMARIZE = Option(
    "langchain_trim_tokens_to_summarize", "SummarizationMiddleware's trim_tokens_to_summarize: "
    "the history tokens one summary call reads (none: all)", count_or_none, 4000)
SUMMARY_MAX_TOKENS = Option(
    "langchain_summary_max_tokens", "max_tokens of the summary model (the auxiliary model "
    "as a LangChain chat model); auto: a quarter of the budget, at most 512",
    count_or_auto, "auto")
CLEAR_KEEP = Option("langchain_clear_tool_uses_keep", "ClearToolUsesEdit's keep: the newest "
                    "tool results never cleared", count_or_zero, 3)
CLEAR_AT_LEAST = Option("langchain_clear_at_least", "ClearToolUsesEdit's clear_at_least: "
                        "tokens to reclaim before it stops clearing (0: clear all it may)",
                        count_or_zero, 0)
CLEAR_TOOL_INPUTS = Option("langchain_clear_tool_inputs", "ClearToolUsesEdit's "
                           "clear_tool_inputs: also empty the cleared calls' arguments",
                           flag, False)
EXCLUDE_TOOLS = Option("langchain_exclude_tools", "ClearToolUsesEdit's exclude_tools: tool "
                       "names whose results are never cleared (none)", names_or_none, ())
PLACEHOLDER = Option("langchain_placeholder", "ClearToolUsesEdit's placeholder for a cleared "
                     "result", str, "[cleared]")

CORE = Requirement("langchain_core", "langchain", "langchain-core")
AGENTS = Requirement("langchain", "langchain", "langchain")
SUMMARY_MAX = 512


class LangChainPolicy(FrameworkPolicy):
    """The bridge around one LangChain policy: convert, run :meth:`run`, convert back,
    record LangChain's estimate; a runner's error raised through LangChain re-raised."""

    framework = "langchain"
    shipped_counter = "count_tokens_approximately"
    requires: ClassVar[tuple[Requirement, ...]] = (CORE,)
    def option(self, option: Option) -> Any:
        return self.context.options.get(option.key, option.default)

    def apply(self, messages: Sequence[Message], budget: int) -> list[Message]:
        from langsmith.run_helpers import tracing_context

        from pytest_budgetbench.strategies.frameworks._langchain_messages import (
            Bridge,
            runner_error,
        )

        bridge = Bridge(messages)
        head = len(split_ends(messages)[0])
        try:
            # No LangSmith trace leaves the run, whatever LANGSMITH_TRACING says: a
            # summary prompt is the item's data, and the runner is the only client.
            with tracing_context(enabled=False):
                kept, estimate, notes = self.run(bridge, head, budget)
        except Exception as exc:
            cause = runner_error(exc)
            if cause is not None:
                raise cause from None
            raise
        prompt = bridge.to_openai(kept)
        self.record_estimate(estimate, **notes)
        return prompt

    def run(self, bridge: Bridge, head: int, budget: int
            ) -> tuple[list[BaseMessage], int, dict[str, Any]]:
        """LangChain's prompt for the history, its count of it, notes for the row."""
        raise NotImplementedError

    # -- the counters --------------------------------------------------------------------
    def _exact(self, bridge: Bridge, messages: Sequence[BaseMessage]) -> int:
        return self.exact_count(bridge.to_openai(bridge.in_order(messages))) if messages else 0

    def whole_counter(self, bridge: Bridge, head: Sequence[BaseMessage]) -> LangChainCounter:
        """The run's count of the prompt ``messages`` make after the system messages
        (``head``), which a middleware never sees: an agent holds them apart."""
        return lambda messages: self._exact(bridge, [*head, *messages])

    def shipped_estimate(self, prompt: Sequence[BaseMessage]) -> int:
        from langchain_core.messages.utils import count_tokens_approximately

        return count_tokens_approximately(prompt)


class TrimMessages(LangChainPolicy):
    """``trim_messages``: the newest messages that fit ``max_tokens``."""

    name = "langchain_trim_messages"
    policy = "trim_messages"
    declared_options = (START_ON, END_ON, INCLUDE_SYSTEM, ALLOW_PARTIAL)

    def run(self, bridge: Bridge, head: int, budget: int
            ) -> tuple[list[BaseMessage], int, dict[str, Any]]:
        from langchain_core.messages import SystemMessage, trim_messages
        from langchain_core.messages.utils import count_tokens_approximately

        history = bridge.messages
        include_system = bool(self.option(INCLUDE_SYSTEM))
        system = history[0] if include_system and history and isinstance(
            history[0], SystemMessage) else None
        counter: LangChainCounter = (self._added_counter(bridge, system) if self.exact
                                     else count_tokens_approximately)
        kept = trim_messages(
            history, max_tokens=budget, token_counter=counter, strategy="last",
            start_on=self.option(START_ON), end_on=self.option(END_ON),
            include_system=include_system, allow_partial=bool(self.option(ALLOW_PARTIAL)))
        last = len(history) - 1
        return kept, counter(kept), {
            "max_tokens": budget, "kept": len(kept), "dropped": len(history) - len(kept),
            "answerable": len(history) <= head
            or (bool(kept) and bridge.position(kept[-1]) == last)}

    def _added_counter(self, bridge: Bridge, system: BaseMessage | None) -> LangChainCounter:
        """What ``messages`` add to the prompt: trim_messages counts the system message
        alone, then the rest against what it left; counted apart, the prompt's framing and
        tools would be counted twice."""
        def count(messages: Sequence[BaseMessage]) -> int:
            if system is None or any(m is system for m in messages):
                return self._exact(bridge, messages)
            return self._exact(bridge, [system, *messages]) - self._exact(bridge, [system])
        return count

class TrimMessagesExact(TrimMessages):
    name = "langchain_trim_messages_exact"
    exact = True


class Summarization(LangChainPolicy):
    """``SummarizationMiddleware``: older history replaced by the summary model's summary."""

    name = "langchain_summarization"
    policy = "SummarizationMiddleware"
    regimes = frozenset({Regime.AUXILIARY_MODEL, Regime.RESET_PER_ITEM})
    requires = (CORE, AGENTS)
    sizes_prompt = False
    declared_options = (SUMMARIZATION_KEEP, TRIM_TOKENS_TO_SUMMARIZE, SUMMARY_MAX_TOKENS)

    def run(self, bridge: Bridge, head: int, budget: int
            ) -> tuple[list[BaseMessage], int, dict[str, Any]]:
        from langchain.agents.middleware import SummarizationMiddleware
        from langchain_core.messages.utils import count_tokens_approximately
        from langgraph.graph.message import add_messages

        from pytest_budgetbench.strategies.frameworks._langchain_messages import AuxChatModel

        if self.context.aux is None:
            raise StrategyError(f"{self.name} needs the runner's auxiliary model (context.aux)")
        system, state = bridge.messages[:head], bridge.messages[head:]
        chosen = self.option(SUMMARY_MAX_TOKENS)
        model = AuxChatModel(aux=self.context.aux, profile={"max_input_tokens": budget},
                             max_tokens=min(SUMMARY_MAX, max(1, budget // 4))
                             if chosen == "auto" else int(chosen))
        # As shipped: LangChain's default (which it tunes to the model, here chars / 4).
        counter = (self.whole_counter(bridge, system) if self.exact
                   else count_tokens_approximately)
        middleware = SummarizationMiddleware(
            model, trigger=("tokens", budget), keep=self.option(SUMMARIZATION_KEEP),
            trim_tokens_to_summarize=self.option(TRIM_TOKENS_TO_SUMMARIZE),
            token_counter=cast(Any, counter))
        update = middleware.before_model(cast(Any, {"messages": state}), cast(Any, None))
        kept: list[BaseMessage] = (state if update is None else list(
            cast(Any, add_messages(cast(Any, state), update["messages"]))))
        estimate = (middleware.token_counter(kept) if self.exact
                    else self.shipped_estimate([*system, *kept]))
        return [*system, *kept], estimate, {
            "trigger": budget, "summarized": update is not None,
            "summary_overflows": len(model.overflows), "kept": len(kept)}


class SummarizationExact(Summarization):
    name = "langchain_summarization_exact"
    exact = True


class ClearToolUses(LangChainPolicy):
    """``ContextEditingMiddleware(edits=[ClearToolUsesEdit(...)])``: older tool results
    replaced by a placeholder once the prompt is over the trigger."""

    name = "langchain_clear_tool_uses"
    policy = "ClearToolUsesEdit"
    requires = (CORE, AGENTS)
    sizes_prompt = False
    declared_options = (CLEAR_KEEP, CLEAR_AT_LEAST, CLEAR_TOOL_INPUTS, EXCLUDE_TOOLS,
                        PLACEHOLDER)

    def run(self, bridge: Bridge, head: int, budget: int
            ) -> tuple[list[BaseMessage], int, dict[str, Any]]:
        from langchain.agents.middleware import ClearToolUsesEdit, ContextEditingMiddleware
        from langchain.agents.middleware.types import ModelRequest, ModelResponse
        from langchain_core.messages import AIMessage

        from pytest_budgetbench.strategies.frameworks._langchain_messages import (
            AuxChatModel,
            tool_results,
        )

        system, state = bridge.messages[:head], bridge.messages[head:]
        edit = ClearToolUsesEdit(
            trigger=budget, clear_at_least=int(self.option(CLEAR_AT_LEAST)),
            keep=int(self.option(CLEAR_KEEP)),
            clear_tool_inputs=bool(self.option(CLEAR_TOOL_INPUTS)),
            exclude_tools=tuple(self.option(EXCLUDE_TOOLS)),
            placeholder=str(self.option(PLACEHOLDER)))
        counter = self.whole_counter(bridge, system) if self.exact else None
        middleware = ContextEditingMiddleware(edits=[edit], token_counter=counter)
        request = ModelRequest(model=AuxChatModel(aux=None, max_tokens=1),
                               messages=cast(Any, state),
                               tools=[dict(t) for t in self.context.tools],
                               state=cast(Any, {"messages": state}))
        sent: list[list[BaseMessage]] = []

        def handler(request: ModelRequest[None]) -> ModelResponse[Any]:
            sent.append(list(request.messages))  # what the model would be sent
            return ModelResponse(result=[AIMessage(content="")])

        middleware.wrap_model_call(request, handler)
        (kept,) = sent
        estimate = counter(kept) if counter else self.shipped_estimate([*system, *kept])
        cleared = sum(1 for m in kept if (m.response_metadata.get("context_editing") or {})
                      .get("cleared"))
        return [*system, *kept], estimate, {"trigger": budget, "cleared": cleared,
                                            "tool_results": tool_results(kept)}


class ClearToolUsesExact(ClearToolUses):
    name = "langchain_clear_tool_uses_exact"
    exact = True
