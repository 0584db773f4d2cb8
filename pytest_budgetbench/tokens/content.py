"""What a counter sees of a prompt besides its text: image parts at a declared cost, tools
and tool calls as JSON text, and the estimate of counters that have no chat template."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from pytest_budgetbench.messages import (
    Message,
    Tool,
    text_of,
    tool_calls_of,
)

IMAGE_TOKENS = 256
"""Declared prompt cost of one image content part, for counters that only see text.

The gguf, hf and approx counters tokenize text; an image's real cost depends on the
served vision model (its resolution and patching), which they cannot know. They count
each ``image_url`` / ``image`` / ``input_image`` part as this fixed number of tokens, and
template only the message's text. Only messages whose content is a list with image parts
are affected; the ``server`` counter asks the endpoint, which counts images itself.
"""


_IMAGE_PART_TYPES = frozenset({"image_url", "image", "input_image"})


def image_parts(message: Message) -> int:
    """How many image parts a message's content holds (0 for string content)."""
    content = message.get("content")
    if not isinstance(content, list):
        return 0
    return sum(1 for part in content
               if isinstance(part, dict) and part.get("type") in _IMAGE_PART_TYPES)


def image_cost(messages: Sequence[Message]) -> int:
    return IMAGE_TOKENS * sum(image_parts(m) for m in messages)


def text_only(messages: Sequence[Message]) -> list[Message]:
    """Messages with image parts reduced to their text, for templates that expect strings;
    every other key (``tool_calls``, ``tool_call_id``, ``name``) kept."""
    return [{**m, "content": text_of(m)} if image_parts(m) else m for m in messages]


def tools_text(tools: Sequence[Tool]) -> str:
    """The tools as JSON text: what a counter without the template counts for them."""
    return json.dumps(list(tools), ensure_ascii=False)


def _calls_text(message: Message) -> str:
    """A message's tool calls as JSON text, for counters that estimate ("" for none)."""
    calls = tool_calls_of(message)
    return json.dumps(calls, ensure_ascii=False) if calls else ""


def framed_estimate(messages: Sequence[Message], count_text: Callable[[str], int],
                    tools: Sequence[Tool] | None = None) -> int:
    """Content tokens plus a guessed template cost (4 per message, 3 per prompt), for
    counters that have no chat template to render; a message's tool calls and the
    ``tools`` count as their JSON text."""
    return (3 + sum(4 + count_text(text_of(m) + _calls_text(m)) for m in messages)
            + (count_text(tools_text(tools)) if tools else 0) + image_cost(messages))
