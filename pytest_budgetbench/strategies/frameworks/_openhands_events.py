"""OpenAI chat messages <-> OpenHands SDK events, both ways, without loss.

The OpenHands side is the SDK's own (``openhands-sdk`` 1.58.2): a message becomes the
event an OpenHands agent would have logged for it, and events become messages through
the SDK's ``LLMConvertibleEvent.events_to_messages`` and ``Message.to_chat_dict`` (its
Chat Completions serialiser), as the agent sends them.

=====================================  ==================================================
OpenAI message                         OpenHands event
=====================================  ==================================================
``system`` (first, string content)     ``SystemPromptEvent``, the cell's tools on it as
                                       ``ClientTool`` s (tools a client runs)
other ``system``                       ``MessageEvent`` of a ``system`` ``Message``
``user``                               ``MessageEvent(source="user")``
``assistant`` without ``tool_calls``   ``MessageEvent(source="agent")``
``assistant`` with N ``tool_calls``    N ``ActionEvent`` sharing one ``llm_response_id``,
                                       the content as the first one's ``thought``, each
                                       call's id, name and JSON arguments verbatim in its
                                       ``tool_call`` (``action=None``: not executed here)
``tool``                               ``ObservationEvent`` of a ``ClientToolObservation``
                                       (a tool run outside the SDK), its ``tool_call_id``
                                       and ``action_id`` those of its call
=====================================  ==================================================

Event ids are the message's position (``m3``, and ``m3.1`` for a second call of message
3), so a trajectory converted again at a later call of an episode gives the same ids, and
what a condenser forgot by id stays forgotten.

Back, each message's events are converted on their own: ``events_to_messages`` joins two
consecutive user messages into one, which would not give the history back. What the SDK
has no field for is taken from the original message (by event id): content given as a
list of text parts rather than a string, ``content: None`` (the SDK drops an empty
content beside tool calls), and keys such as a user's ``name``; the ``name`` the SDK
adds to a tool result is left out where the original had none. A message the SDK made
(a condenser's summary) has no original and is sent as the SDK serialises it.

What cannot cross: the tools of a history without a system message (no
``SystemPromptEvent`` to list them: OpenHands' counter then leaves them out), content
parts other than text (an image, a file: OpenHands would
carry an image's URL but drop its ``detail``) and the ``developer`` role (OpenHands'
messages have none) are refused with a StrategyError that names them; a tool result
longer than 50,000 characters is cut in its middle by the SDK's serialiser, as OpenHands
sends it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_budgetbench.errors import StrategyError
from pytest_budgetbench.messages import Message, Tool, tool_calls_of
from pytest_budgetbench.strategies.frameworks._policy import refuse_parts

FRAMEWORK = "openhands"
OFFLINE_ENVIRONMENT = {"OPENHANDS_SUPPRESS_BANNER": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
"""Set before the SDK is first imported: no banner on stderr, and litellm reads the model
cost map it ships instead of fetching it (this machine has no network)."""


def import_sdk() -> Any:
    """``openhands.sdk``, imported offline and quiet: litellm (which the SDK imports)
    neither fetches its cost map nor downloads a Hugging Face tokenizer for a model whose
    name it knows; the SDK leaves the root logger alone (its ``LOG_AUTO_CONFIG`` would
    set it to INFO with a rich handler of its own) and says nothing, unless the
    user has set a level for its logger (its give-ups are on the row)."""
    os.environ.update(OFFLINE_ENVIRONMENT)
    os.environ.setdefault("LOG_AUTO_CONFIG", "false")
    import litellm
    import openhands.sdk as sdk

    litellm.disable_hf_tokenizer_download = True
    litellm.telemetry = False
    quiet = logging.getLogger("openhands")
    if quiet.level == logging.NOTSET:
        quiet.setLevel(logging.CRITICAL)
    return sdk


def _texts(message: Message, index: int) -> list[Any]:
    from openhands.sdk.llm import TextContent

    content = message.get("content")
    if content is None:
        return []
    if isinstance(content, str):
        return [TextContent(text=content)]
    return [TextContent(text=part["text"]) for part in content]


def client_tools(tools: Sequence[Tool]) -> list[Any]:
    """The cell's tools as OpenHands ``ClientTool`` s (tools a client runs, declared by
    their JSON schema): what its ``SystemPromptEvent`` lists, and its counter counts with
    the fields it adds to each (``summary``, ``security_risk``)."""
    from openhands.sdk.tool.client_tool import ClientTool, ClientToolSpec

    made = []
    for tool in tools:
        function = tool.get("function", {})
        try:
            made.append(ClientTool.from_spec(ClientToolSpec(
                name=function.get("name"), description=function.get("description", ""),
                parameters=function.get("parameters") or {"type": "object", "properties": {}})))
        except ValueError as exc:  # pydantic's, or a name registered with another schema
            raise StrategyError(f"{FRAMEWORK} cannot declare the tool "
                                f"{function.get('name')!r}: {exc}") from None
    return made


def to_events(messages: Sequence[Message], tools: Sequence[Tool] = ()) -> list[Any]:
    """The OpenHands events of ``messages`` (see the module's table), ``tools`` on the
    ``SystemPromptEvent`` where there is one."""
    from openhands.sdk.event import (
        ActionEvent,
        MessageEvent,
        ObservationEvent,
        SystemPromptEvent,
    )
    from openhands.sdk.llm import Message as SdkMessage
    from openhands.sdk.llm import MessageToolCall
    from openhands.sdk.tool.client_tool import ClientToolObservation

    refuse_parts(messages, FRAMEWORK)
    events: list[Any] = []
    calls: dict[str, tuple[str, str]] = {}  # call id -> (action event id, tool name)
    for index, message in enumerate(messages):
        role, event_id = message.get("role"), f"m{index}"
        texts = _texts(message, index)
        if role == "system" and index == 0 and isinstance(message.get("content"), str):
            events.append(SystemPromptEvent(id=event_id, system_prompt=texts[0],
                                            tools=client_tools(tools)))
        elif role in ("system", "user") or (role == "assistant" and not tool_calls_of(message)):
            source = {"system": "environment", "user": "user"}.get(str(role), "agent")
            events.append(MessageEvent(id=event_id, source=source,
                                       llm_message=SdkMessage(role=role, content=texts)))
        elif role == "assistant":
            for number, call in enumerate(tool_calls_of(message)):
                function = call.get("function", {})
                action_id = event_id if number == 0 else f"{event_id}.{number}"
                calls[str(call.get("id"))] = (action_id, str(function.get("name")))
                events.append(ActionEvent(
                    id=action_id, thought=texts if number == 0 else [], action=None,
                    tool_name=str(function.get("name")), tool_call_id=str(call.get("id")),
                    tool_call=MessageToolCall(
                        id=str(call.get("id")), name=str(function.get("name")),
                        arguments=str(function.get("arguments")), origin="completion"),
                    llm_response_id=event_id))
        elif role == "tool":
            action_id, name = calls.get(str(message.get("tool_call_id")), ("", ""))
            events.append(ObservationEvent(
                id=event_id, observation=ClientToolObservation(content=texts),
                tool_name=name, tool_call_id=str(message.get("tool_call_id")),
                action_id=action_id))
        else:
            raise StrategyError(
                f"{FRAMEWORK} cannot carry a '{role}' message (message {index}): OpenHands' "
                "messages are system, user, assistant or tool; use a task without them")
    return events


def message_groups(events: Sequence[Any]) -> list[list[Any]]:
    """``events`` by the message each makes: the actions of one LLM response together
    (as ``events_to_messages`` batches them), every other event alone."""
    from openhands.sdk.event import ActionEvent

    groups: list[list[Any]] = []
    for event in events:
        previous = groups[-1][-1] if groups else None
        if (isinstance(event, ActionEvent) and isinstance(previous, ActionEvent)
                and previous.llm_response_id == event.llm_response_id):
            groups[-1].append(event)
        else:
            groups.append([event])
    return groups


def chat_dict(message: Any) -> Message:
    """One SDK ``Message`` as the SDK serialises it for Chat Completions (text as one
    string), without the tool result's ``name`` the OpenAI format does not have."""
    chat: dict[str, Any] = message.to_chat_dict(
        cache_enabled=False, vision_enabled=False, function_calling_enabled=False,
        force_string_serializer=True, send_reasoning_content=False)
    if chat.get("role") == "tool":
        chat.pop("name", None)
    if chat.get("tool_calls") and "content" not in chat:
        chat["content"] = None
    return chat


def _restored(chat: Message, message: Any, original: Message | None) -> Message:
    """``chat`` with what the SDK has no field for taken back from ``original``."""
    if original is None:
        return chat
    if isinstance(original.get("content"), list):
        chat["content"] = [{"type": "text", "text": part.text} for part in message.content]
    elif original.get("tool_calls") and not (chat.get("content") or "").strip():
        chat["content"] = original.get("content")  # None, "" or blank: the SDK drops it
    for key, value in original.items():
        chat.setdefault(key, value)
    return chat


def to_messages(events: Sequence[Any], originals: Mapping[str, Message]) -> list[Message]:
    """The OpenAI messages of ``events``, each message's events through the SDK's
    ``events_to_messages``; ``originals`` maps an event id to the message it came from."""
    from openhands.sdk.event import LLMConvertibleEvent

    out: list[Message] = []
    for group in message_groups(events):
        (message,) = LLMConvertibleEvent.events_to_messages(group)
        out.append(_restored(chat_dict(message), message, originals.get(group[0].id)))
    return out


def originals_of(messages: Sequence[Message]) -> dict[str, Message]:
    """Each message under the id of its (first) event, as :func:`to_events` numbers them."""
    return {f"m{index}": message for index, message in enumerate(messages)}
