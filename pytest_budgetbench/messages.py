"""Chat messages in the OpenAI format, and the checks the runner applies to them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

Message = dict[str, Any]
"""One chat message: ``{"role": "system"|"user"|"assistant"|"tool", "content": ...}``.

``content`` is a string, or a list of content parts (``{"type": "text", "text": ...}``,
``{"type": "image_url", ...}``) as the OpenAI chat API accepts.
"""

ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})


def text_of(message: Message) -> str:
    """The text of a message, joining text parts; image parts contribute nothing."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if part.get("type") == "text")


def check_messages(value: object, produced_by: str) -> list[Message]:
    """Return ``value`` as a message list, or raise TypeError naming who produced it."""
    if not isinstance(value, list):
        raise TypeError(
            f"{produced_by} must return a list of chat messages "
            f"(got {value!r:.80} that is a {type(value).__name__})"
        )
    for index, message in enumerate(value):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise TypeError(
                f"{produced_by} returned an invalid message at index {index}: "
                f"each must be a dict with 'role' in {sorted(ROLES)} (got {message!r:.80})"
            )
        content = message.get("content")
        if not isinstance(content, (str, list)):
            raise TypeError(
                f"{produced_by} returned message {index} without string or list 'content' "
                f"(got {type(content).__name__})"
            )
        if isinstance(content, list):
            _check_parts(content, index, produced_by)
    _check_json(value, produced_by)
    return value


def _check_parts(parts: list[Any], index: int, produced_by: str) -> None:
    """Content parts as the chat API takes them: dicts with a ``type``, text parts with a
    string ``text``."""
    for position, part in enumerate(parts):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise TypeError(
                f"{produced_by} returned message {index} with content part {position} that is "
                f"not a {{'type': ...}} dict (got {part!r:.80} that is a {type(part).__name__})"
            )
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise TypeError(
                f"{produced_by} returned message {index} with text part {position} whose "
                f"'text' is not a string (got {type(part.get('text')).__name__})"
            )


def _check_json(messages: list[Message], produced_by: str) -> None:
    """The prompt must travel as JSON, to the model and into the record."""
    try:
        json.dumps(messages, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{produced_by} returned messages that JSON cannot hold: {exc}"
        ) from None


def split_ends(messages: Sequence[Message]) -> tuple[list[Message], list[Message], list[Message]]:
    """Split a prompt into (leading system messages, history, final user query).

    Every strategy keeps the system prompt and the final user query; what it chooses
    among is the history between them.
    """
    head_end = 0
    while head_end < len(messages) and messages[head_end].get("role") in ("system", "developer"):
        head_end += 1
    tail_start = len(messages)
    if tail_start > head_end and messages[-1].get("role") == "user":
        tail_start -= 1
    head = list(messages[:head_end])
    return head, list(messages[head_end:tail_start]), list(messages[tail_start:])
