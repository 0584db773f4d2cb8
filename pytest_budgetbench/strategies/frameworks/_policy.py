"""What every framework policy shares: its two variants, its estimate on the row, and the
parts of a message that a framework cannot carry.

A framework policy is a :class:`FrameworkPolicy`: ``framework`` and ``policy`` name what it
runs, ``exact`` says which counter it trims by. ``exact = False`` is the framework as it
ships (its default counter, e.g. LangChain's ``count_tokens_approximately``): its prompts may
overflow the budget, which the runner records as violations. ``exact = True`` hands the
framework the run's own counter (:meth:`FrameworkPolicy.exact_count`), which counts the
prompt as the model sees it, tools included.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar, TypeVar

from pytest_budgetbench.errors import StrategyError
from pytest_budgetbench.messages import Message
from pytest_budgetbench.strategies.base import Strategy

T = TypeVar("T")

EXACT_COUNTER = "exact"
"""``strategy_info.framework.counter`` of an ``_exact`` variant: the run's own counter."""


class FrameworkPolicy(Strategy):
    """A framework's memory policy behind the strategy interface."""

    framework: ClassVar[str] = ""
    """The framework's package as users know it: ``langchain``, ``inspect_ai``, ..."""
    policy: ClassVar[str] = ""
    """The framework's own name of the policy: ``trim_messages``, ``CompactionTrim``, ..."""
    exact: ClassVar[bool] = False
    """Whether the framework is handed the run's counter (the ``_exact`` variant)."""
    shipped_counter: ClassVar[str] = ""
    """The name of the counter the framework trims by as shipped."""
    sizes_prompt: ClassVar[bool] = True
    """Whether the framework's parameter bounds the whole prompt, so that with the run's
    counter (the ``_exact`` variant) it means to fit the budget. False where the budget is
    a trigger (a middleware's, inspect's threshold) or bounds a part of the prompt
    (LlamaIndex's memory), or the policy falls back to the whole history (OpenHands'
    condenser where no summary call fits)."""
    handles_tools = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # As shipped, the framework's own counter decides what fits, and may be wrong.
        cls.fits_budget = cls.exact and cls.sizes_prompt

    @property
    def counter_name(self) -> str:
        return EXACT_COUNTER if self.exact else self.shipped_counter

    def exact_count(self, messages: Sequence[Message]) -> int:
        """The run's count of ``messages`` as a whole prompt, with the cell's tools: what
        the runner will count, and what an ``_exact`` variant hands the framework."""
        return self.context.tokens.count_messages(messages)

    def record_estimate(self, estimate: int, **notes: Any) -> None:
        """Keep the framework's own count of the prompt it built: the row records it as
        ``estimated_tokens``, and ``strategy_info.framework`` says whose count it is."""
        self.context.estimated_tokens = int(estimate)
        self.context.info["framework"] = {
            "framework": self.framework, "policy": self.policy,
            "counter": self.counter_name, **notes}


def refuse_parts(messages: Iterable[Message], framework: str,
                 carried: frozenset[str] = frozenset({"text"})) -> None:
    """Raise StrategyError naming the first content part of a type the framework cannot
    carry (an image, say), so that nothing is dropped behind the user's back."""
    for index, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if kind not in carried:
                raise StrategyError(
                    f"{framework} cannot carry a '{kind}' content part (message {index}, "
                    f"role {message.get('role')}): its messages take only "
                    f"{', '.join(sorted(carried))} parts; use a task without them")


@contextmanager
def tiktoken_cache(directory: str) -> Iterator[None]:
    """tiktoken reads (and would download into) ``TIKTOKEN_CACHE_DIR``: point it at
    ``directory``, which holds the encoding a framework counts with, for one load, and
    restore the variable as it was (set or not) afterwards."""
    before = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = directory
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TIKTOKEN_CACHE_DIR", None)
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = before


def private_loop(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a framework's coroutine on an event loop of its own: the runner calls ``apply``
    from a worker thread, and ``asyncio.run`` refuses to run inside a running loop."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coroutine)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
