"""The LangChain bridge: a cell's OpenAI-format messages as LangChain messages and back,
without loss, and the runner's auxiliary model as a LangChain chat model.

OpenAI -> LangChain is langchain_core's own ``convert_to_messages``; each message is
stamped with an id that names its position in the cell's history, so that what the
framework returns can be matched to what it was given. LangChain -> OpenAI is its own
``convert_to_openai_messages``, which is not exact (langchain-core 1.8.1):

- an assistant message with tool calls and ``content: None`` comes back with ``""``;
- a list of text parts comes back as one string, the parts joined by newlines;
- a call's ``arguments`` come back re-serialised (``json.dumps`` of the parsed value:
  other spacing, key escapes, ``\\u00e9`` as ``é``), equal as JSON but not as text;
- keys LangChain does not model (e.g. a vendor's ``reasoning_content``) go into
  ``additional_kwargs`` and do not come back.

Each loses tokens or changes them, so :meth:`Bridge.to_openai` returns a message the
framework left as it was as the original dict, and takes from LangChain's converter only
what the framework changed (a cleared tool result, cleared call arguments, a summary it
wrote): an unchanged call's arguments keep their text, a content the framework did not
touch keeps its form. The round trip is the identity (property-tested).

What cannot cross is refused, never dropped: content parts other than text and
``image_url`` (LangChain's OpenAI converter reads only those), and a call whose
``arguments`` are not a JSON object (an ``AIMessage``'s tool calls hold parsed ``args``;
``convert_to_messages`` raises on anything else).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.exceptions import ContextOverflowError, ModelError
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.messages.utils import convert_to_messages, convert_to_openai_messages
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import ConfigDict, Field

from pytest_budgetbench.errors import BudgetExceeded, StrategyError
from pytest_budgetbench.messages import Message
from pytest_budgetbench.strategies.base import AuxiliaryModel
from pytest_budgetbench.strategies.frameworks._policy import refuse_parts

FRAMEWORK = "LangChain"
CARRIED_PARTS = frozenset({"text", "image_url"})
ID_PREFIX = "budgetbench-"
"""A message id ``budgetbench-<position>`` names the message's position in the history."""

LangChainCounter = Callable[[Sequence[BaseMessage]], int]


class Bridge:
    """One cell's history as LangChain messages (:attr:`messages`), and back."""

    def __init__(self, messages: Sequence[Message]) -> None:
        refuse_parts(messages, FRAMEWORK, CARRIED_PARTS)
        for index, message in enumerate(messages):
            _check_arguments(message, index)
        self.originals = [copy.deepcopy(dict(m)) for m in messages]
        converted = convert_to_messages([copy.deepcopy(dict(m)) for m in messages])
        for index, converted_message in enumerate(converted):
            converted_message.id = f"{ID_PREFIX}{index}"
        self.messages: list[BaseMessage] = converted
        self._pristine = [m.model_copy(deep=True) for m in converted]

    def position(self, message: BaseMessage) -> int | None:
        """The message's position in the history, or None for one the framework wrote."""
        ident = message.id or ""
        if not ident.startswith(ID_PREFIX):
            return None
        tail = ident[len(ID_PREFIX):]
        return int(tail) if tail.isdigit() and int(tail) < len(self.originals) else None

    def in_order(self, messages: Sequence[BaseMessage]) -> list[BaseMessage]:
        """``messages`` in their order in the history (trim_messages counts its suffixes
        reversed; a template counts a prompt in order), where every one has a position."""
        positions = [self.position(m) for m in messages]
        if any(p is None for p in positions):
            return list(messages)
        return [m for _, m in sorted(zip(positions, messages, strict=True),
                                     key=lambda pair: pair[0] or 0)]

    def to_openai(self, messages: Sequence[BaseMessage]) -> list[Message]:
        return [self._one(message) for message in messages]

    def _one(self, message: BaseMessage) -> Message:
        back: Message = convert_to_openai_messages(message)
        position = self.position(message)
        if position is None:
            return back
        original, pristine = self.originals[position], self._pristine[position]
        if type(message) is not type(pristine):
            return back
        result = copy.deepcopy(original)
        if message.content != pristine.content:
            result["content"] = back.get("content")
        if isinstance(message, AIMessage):
            assert isinstance(pristine, AIMessage)
            if message.tool_calls != pristine.tool_calls:
                _take_calls(result, back)
        for key in ("name", "tool_call_id"):
            if getattr(message, key, None) != getattr(pristine, key, None):
                result[key] = back.get(key)
        return result


def _take_calls(result: Message, back: Message) -> None:
    """The framework changed some of a message's calls: each unchanged call keeps its
    original text, a changed one is LangChain's."""
    originals = {c.get("id"): c for c in result.get("tool_calls") or []}
    calls = []
    for call in back.get("tool_calls") or []:
        before = originals.get(call.get("id"))
        same = (before is not None
                and before["function"]["name"] == call["function"]["name"]
                and json.loads(before["function"]["arguments"] or "{}")
                == json.loads(call["function"]["arguments"]))
        calls.append(copy.deepcopy(before) if same else call)
    if calls:
        result["tool_calls"] = calls
    else:
        result.pop("tool_calls", None)


def _check_arguments(message: Message, index: int) -> None:
    """Refuse a call whose arguments LangChain cannot hold (not a JSON object)."""
    for call in message.get("tool_calls") or []:
        raw = call.get("function", {}).get("arguments")
        try:
            parsed = json.loads(raw, strict=False) if isinstance(raw, str) else raw
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise StrategyError(
                f"{FRAMEWORK} cannot carry tool call {call.get('id')!r} of message {index}: "
                f"its arguments are not a JSON object (got {raw!r:.60}); an AIMessage "
                "holds parsed arguments, so they would be lost")


# -- the auxiliary model as a LangChain chat model ------------------------------------------
class AuxChatModel(BaseChatModel):
    """A thin LangChain chat model over the runner's auxiliary model (``context.aux``):
    every call the framework makes is the runner's, budgeted to the cell's budget, cached
    and recorded on the row. Its ``profile`` gives the budget as its context window."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    aux: Any
    max_tokens: int
    purpose: str = "summary"
    overflows: list[str] = Field(default_factory=list)
    """The violations LangChain was told of as a context overflow, in order."""

    @property
    def _llm_type(self) -> str:
        return "budgetbench-aux"

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None,
                  **kwargs: Any) -> ChatResult:
        aux: AuxiliaryModel = self.aux
        prompt: list[Message] = convert_to_openai_messages(messages)
        try:
            text = aux.complete(prompt, max_tokens=self.max_tokens, purpose=self.purpose)
        except BudgetExceeded as exc:
            # To LangChain, the model's context window overflowed: its summariser then
            # retries once with less history. The runner's exception is the cause.
            self.overflows.append(str(exc))
            raise ContextOverflowError(str(exc)) from exc
        except Exception as exc:
            # Any other failure as LangChain's base ModelError, which its retries
            # (with_retry, three attempts) do not repeat: the runner recorded the call.
            raise ModelError(f"{type(exc).__name__}: {exc}") from exc
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=text))])


def runner_error(exc: BaseException) -> BaseException | None:
    """The runner's own exception behind a LangChain error raised by :class:`AuxChatModel`
    (a BudgetExceeded, an endpoint's error), or None when the framework itself failed."""
    seen: BaseException | None = exc
    while seen is not None:
        # Only AuxChatModel raises these two exact types with a cause.
        if type(seen) in (ContextOverflowError, ModelError) and seen.__cause__ is not None:
            return seen.__cause__
        seen = seen.__cause__ or seen.__context__
    return None


def tool_results(messages: Sequence[BaseMessage]) -> int:
    """How many tool results ``messages`` hold (for the row's notes)."""
    return sum(isinstance(m, ToolMessage) for m in messages)
