"""The ``approx`` counter: four characters a token plus a fixed cost per message, labelled
approximate."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

from pytest_budgetbench.messages import (
    Message,
    Tool,
)
from pytest_budgetbench.tokens.base import TokenCounter
from pytest_budgetbench.tokens.content import framed_estimate


class ApproxCounter(TokenCounter):
    """Four characters a token, plus four tokens per message: labelled approximate."""

    name = "approx-chars/4"
    exact = False

    def _count_text(self, text: str) -> int:
        return math.ceil(len(text) / 4)

    def _count_prompt(self, messages: Sequence[Message],
                      tools: Sequence[Tool] | None = None) -> int:
        return framed_estimate(messages, self._count_text, tools)

    def _counts_like(self) -> Hashable:
        return "chars/4"
