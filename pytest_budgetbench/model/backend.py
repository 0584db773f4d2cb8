"""What answers a chat, as every consumer sees it: :class:`ChatBackend`, and the
:class:`Completion` it returns.

The client (:mod:`~pytest_budgetbench.model.chat`), the response cache around it, a pool of
replicas and a test's fake all are one; a task's judge, auxiliary calls and the runner
need no more, so they import this and not the client.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pytest_budgetbench.messages import Message, Tool


@dataclass(frozen=True)
class Completion:
    text: str
    """The reply's text; empty when the reply is only tool calls."""
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_s: float
    """The original call's latency, also when the reply comes from the response cache."""
    cached: bool = False
    tool_calls: tuple[dict[str, Any], ...] = ()
    """The reply's tool calls in the OpenAI format (``{"id", "type": "function",
    "function": {"name", "arguments"}}``), as the server gave them or as the endpoint's
    tool-call parser read them from the text."""
    parsed_tool_calls: int = 0
    """How many of :attr:`tool_calls` the endpoint's tool-call parser read from the reply's
    text (:mod:`~pytest_budgetbench.model.tool_parser`); 0 where the server gave them."""

    @property
    def message(self) -> Message:
        """The reply as the assistant message an agent's trajectory appends."""
        if not self.tool_calls:
            return {"role": "assistant", "content": self.text}
        return {"role": "assistant", "content": self.text or None,
                "tool_calls": [dict(call) for call in self.tool_calls]}


class ChatBackend(Protocol):
    """What answers a chat, as every consumer sees it: the client
    (:class:`~pytest_budgetbench.model.chat.ChatModel`), the response cache around one, a
    test's fake. The runner, auxiliary calls and training need no more."""

    def complete(self, messages: Sequence[Message], *, max_tokens: int,
                 tools: Sequence[Tool] | None = None,
                 response_format: Mapping[str, Any] | None = None) -> Completion:
        """The reply to ``messages``; ``tools`` and ``response_format`` (a JSON schema the
        reply should follow, :mod:`~pytest_budgetbench.model.structured`), when given, are sent
        with the request."""
        ...


class NoModel:
    """The chat of a model-free sweep (``--budgetbench-model=none``): the runner sends a
    cell's prompts nowhere, and a strategy that asks the auxiliary model without one
    named gets this error (a strategy that declares it needs one is refused before any
    cell; this catches one that did not declare it)."""

    def complete(self, messages: Sequence[Message], *, max_tokens: int,
                 tools: Sequence[Tool] | None = None,
                 response_format: Mapping[str, Any] | None = None) -> Completion:
        from pytest_budgetbench.errors import EndpointError

        raise EndpointError(
            "a model-free sweep (--budgetbench-model=none) has no model to answer an "
            "auxiliary call: name one with --budgetbench-aux-models=aux=URL#MODEL, or "
            "leave this strategy out (a strategy that calls it should declare the regime "
            "auxiliary-model-assisted)")
