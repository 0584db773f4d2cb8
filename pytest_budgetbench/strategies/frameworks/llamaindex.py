"""LlamaIndex's token-limited chat memories (llama-index-core 0.14.25), run as shipped.

Three policies, each in two variants (as shipped, and ``_exact``):

- ``llamaindex_memory``: ``llama_index.core.memory.Memory``, the memory LlamaIndex 0.14
  recommends (the others are marked deprecated) and its chat engines' default. A FIFO
  queue: once the queue passes ``chat_history_token_ratio`` of ``token_limit``, its oldest
  messages are flushed (archived; with no memory blocks, gone) in chunks of at least
  ``token_flush_size`` tokens, then more until the queue starts at a user message. It
  never splits a turn: the last user message and all that follows it always stay.
- ``llamaindex_chat_memory_buffer``: ``ChatMemoryBuffer``, the default memory of
  LlamaIndex's agents (``FunctionAgent``, ``AgentWorkflow``). The newest messages whose
  contents, joined by spaces, fit ``token_limit``; the window never starts at an
  assistant or tool message; when even one message is over, the last one alone.
- ``llamaindex_chat_summary_memory``: ``ChatSummaryMemoryBuffer``. The newest messages
  that fit ``token_limit`` (counted one by one) stay verbatim, the window again starting
  at a user message; everything older is summarised by its LLM in ONE call
  (``SUMMARIZE_PROMPT`` as system message, a ``"Transcript so far: ..."`` user message;
  a message without text, such as a bare tool call, is left out of it), and the summary
  comes first as a system message. The summary itself is not counted against
  ``token_limit``. Its LLM is :class:`._llamaindex_bridge.AuxLLM`, a ``CustomLLM`` over
  the runner's auxiliary model (purpose ``llamaindex/summary``): the call is budgeted to
  the cell's budget (one over it raises BudgetExceeded: a budgeted aux violation, which a
  long history at a small budget produces, since LlamaIndex never splits the
  transcript), cached and recorded on the row.

What goes where, as LlamaIndex's ``FunctionAgent`` builds its prompt: the leading system
messages stand in front of the memory (the agent's ``system_prompt``); the memory holds
the conversation up to and including the last user message (the agent puts the user
message into memory before ``get``); what follows that message (the current run's tool
calls and results: the agent's scratchpad) comes after the memory's output, untrimmed.
Tool-call pairs therefore always stay whole: every window starts at a user message.

Budget. ``token_limit`` = the cell's budget less what stands in front of the memory, by
the variant's counter (at least 1): as shipped, LlamaIndex's tokenizer over the system
messages' text joined by spaces, as its ``SimpleChatEngine`` counts its prefix messages
for ``initial_token_count``; ``_exact``, the run's count of the system messages with the
cell's tools and the chat template's fixed tokens (without system messages, the tools and
those tokens: the counter's ``overhead``). LlamaIndex counts nothing else of the prompt:
not the tools, not the chat template's tokens per message, not a tool call's arguments
(``ChatMemoryBuffer`` and the summary buffer count ``str(content)``, "None" for a bare tool
call; ``Memory`` counts ``str(additional_kwargs)``, which holds the calls), not the
scratchpad, not the summary. So neither variant holds the whole prompt to the budget
(``fits_budget = False`` for both, unlike other frameworks' ``_exact``): the ``_exact``
variant shows which violations the counter causes and which the policy's own blind spots.

Counters. As shipped: ``llama_index.core.utils.get_tokenizer()``, tiktoken's
``cl100k_base`` (gpt-3.5-turbo's), read from the copy llama-index-core ships in
``_static/tiktoken_cache``, never downloaded (see
:func:`._llamaindex_bridge.shipped_tokenizer`). ``_exact``: a ``tokenizer_fn`` that
returns a list of ``context.tokens.count_text(text)`` items (LlamaIndex reads only the
length): the run's tokenizer on the same text LlamaIndex counts, template aside. The row's
``estimated_tokens`` is the front count plus LlamaIndex's own count (its own way, by the
variant's tokenizer) of every message after it: the memory's output and the scratchpad.

Options (``--budgetbench-strategy-options=KEY=VALUE``), at LlamaIndex's defaults:
``llamaindex_chat_history_token_ratio`` (0.7) and ``llamaindex_token_flush_size``
(``Memory.from_defaults``' own: 3000, or 70% of ``token_limit`` when 3000 is more) for
``Memory``; ``llamaindex_summarize_prompt`` (LlamaIndex's ``SUMMARIZE_PROMPT``) and
``llamaindex_max_tokens`` (the summarising LLM's reply cap, 256: LlamaIndex's LLM classes
leave it to the model, a sweep needs a bound) for ``ChatSummaryMemoryBuffer``.
``count_initial_tokens`` is not an option: the budget mapping above already takes the
front off ``token_limit``. Images and other non-text parts are refused, not dropped.
"""

from __future__ import annotations

import functools
import importlib
from abc import abstractmethod
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from pytest_budgetbench.errors import Requirement
from pytest_budgetbench.messages import Message, split_ends, text_of
from pytest_budgetbench.options import Option, positive_int, rate, text
from pytest_budgetbench.strategies.base import Regime
from pytest_budgetbench.strategies.frameworks._policy import FrameworkPolicy, refuse_parts

BRIDGE = "pytest_budgetbench.strategies.frameworks._llamaindex_bridge"
Counted = tuple[list[Any], Callable[[Sequence[Any]], int]]
"""LlamaIndex's output (``ChatMessage``s) and its own count of a list of messages."""


def bridge() -> ModuleType:
    """:mod:`._llamaindex_bridge`, which imports llama_index, on first use."""
    return importlib.import_module(BRIDGE)


def flush_size(raw: str) -> int | None:
    """A positive token count, or ``default`` (None): ``Memory.from_defaults``' own."""
    return None if raw.lower() == "default" else positive_int(raw)


CHAT_HISTORY_TOKEN_RATIO = Option(
    "llamaindex_chat_history_token_ratio",
    "Memory's chat_history_token_ratio: the share of token_limit its chat history may fill",
    rate, 0.7)
TOKEN_FLUSH_SIZE = Option(
    "llamaindex_token_flush_size",
    "Memory's token_flush_size: tokens flushed at a time; 'default' is from_defaults' "
    "(3000, or 0.7 x token_limit when 3000 is more)", flush_size, None,
    metavar="TOKENS|default")
SUMMARIZE_PROMPT = Option(
    "llamaindex_summarize_prompt",
    "ChatSummaryMemoryBuffer's summarize_prompt (unset: LlamaIndex's SUMMARIZE_PROMPT)",
    text, None)
MAX_TOKENS = Option(
    "llamaindex_max_tokens",
    "max_tokens of the LLM ChatSummaryMemoryBuffer summarises with (its reply cap)",
    positive_int, 256)


def split_turn(messages: Sequence[Message]) -> tuple[list[Message], list[Message],
                                                    list[Message]]:
    """(leading system messages, what the memory holds: up to and including the last
    user message, the scratchpad: what follows it)."""
    head, _history, _query = split_ends(messages)
    rest = list(messages[len(head):])
    last_user = max((i for i, m in enumerate(rest) if m.get("role") == "user"), default=-1)
    return head, rest[:last_user + 1], rest[last_user + 1:]


class LlamaIndexPolicy(FrameworkPolicy):
    """One of LlamaIndex's memories behind the strategy interface (module docstring)."""

    framework = "llama_index"
    shipped_counter = "tiktoken cl100k_base"
    requires = (Requirement("llama_index.core", "llamaindex", "llama-index-core"),)
    sizes_prompt = False  # it bounds only the memory it holds, even with the run's tokenizer

    def apply(self, messages: Sequence[Message], budget: int) -> list[Message]:
        li = bridge()
        refuse_parts(messages, self.framework)
        head, remembered, scratchpad = split_turn(messages)
        if self.exact:
            tokenizer = li.length_tokenizer(self.context.tokens.count_text)
            # With no system message, the template's fixed tokens and the tools alone (a
            # template may not render an empty prompt).
            front = self.exact_count(head) if head else self.context.tokens.overhead()
            counter = f"{self.context.tokens.name} (the run's, on LlamaIndex's text)"
        else:
            tokenizer = li.shipped_tokenizer()
            front = len(tokenizer(" ".join(text_of(m) for m in head)))
            counter = li.tokenizer_name(tokenizer)
        token_limit = max(1, budget - front)
        tokenizer = li.remembering(tokenizer)
        returned, count = self.remember(li, [li.to_llama(m) for m in remembered],
                                        token_limit, tokenizer, budget)
        self.record_estimate(
            front + count([*returned, *(li.to_llama(m) for m in scratchpad)]),
            token_limit=token_limit, tokenizer=counter,
            remembered=len(remembered), returned=len(returned))
        return [*head, *li.restore(returned, remembered), *scratchpad]

    @abstractmethod
    def remember(self, li: ModuleType, history: list[Any], token_limit: int,
                 tokenizer: Callable[[str], list[Any]], budget: int) -> Counted:
        """LlamaIndex's memory over ``history`` (``ChatMessage``s): what its ``get``
        returns, and how it counts messages."""

    def option(self, option: Option) -> Any:
        return self.context.options.get(option.key, option.default)


class LlamaIndexChatMemoryBuffer(LlamaIndexPolicy):
    """``ChatMemoryBuffer``: the newest messages that fit, by their joined text."""

    name = "llamaindex_chat_memory_buffer"
    policy = "ChatMemoryBuffer"

    def remember(self, li: ModuleType, history: list[Any], token_limit: int,
                 tokenizer: Callable[[str], list[Any]], budget: int) -> Counted:
        kept = li.chat_memory_buffer(history, token_limit, tokenizer)
        return kept, functools.partial(li.joined_count, tokenizer)


class LlamaIndexChatMemoryBufferExact(LlamaIndexChatMemoryBuffer):
    """``ChatMemoryBuffer`` counting with the run's tokenizer."""

    name = "llamaindex_chat_memory_buffer_exact"
    exact = True


class LlamaIndexMemory(LlamaIndexPolicy):
    """``Memory``: a FIFO queue flushed in chunks, whole turns kept."""

    name = "llamaindex_memory"
    policy = "Memory"
    declared_options = (CHAT_HISTORY_TOKEN_RATIO, TOKEN_FLUSH_SIZE)

    def remember(self, li: ModuleType, history: list[Any], token_limit: int,
                 tokenizer: Callable[[str], list[Any]], budget: int) -> Counted:
        kept, built = li.memory(history, token_limit, tokenizer,
                                self.option(CHAT_HISTORY_TOKEN_RATIO),
                                self.option(TOKEN_FLUSH_SIZE))
        return kept, functools.partial(li.memory_count, built)


class LlamaIndexMemoryExact(LlamaIndexMemory):
    """``Memory`` counting with the run's tokenizer."""

    name = "llamaindex_memory_exact"
    exact = True


class LlamaIndexChatSummaryMemory(LlamaIndexPolicy):
    """``ChatSummaryMemoryBuffer``: the newest messages verbatim, a summary of the rest
    written by the runner's auxiliary model."""

    name = "llamaindex_chat_summary_memory"
    policy = "ChatSummaryMemoryBuffer"
    regimes = frozenset({Regime.AUXILIARY_MODEL, Regime.RESET_PER_ITEM})
    declared_options = (SUMMARIZE_PROMPT, MAX_TOKENS)

    def remember(self, li: ModuleType, history: list[Any], token_limit: int,
                 tokenizer: Callable[[str], list[Any]], budget: int) -> Counted:
        if self.context.aux is None:
            raise RuntimeError(f"{self.name} needs the runner's auxiliary model "
                               "(context.aux) to summarise with")
        llm = li.AuxLLM(self.context.aux, context_window=budget,
                        max_tokens=self.option(MAX_TOKENS))
        kept = li.chat_summary_memory_buffer(history, token_limit, tokenizer, llm,
                                             self.option(SUMMARIZE_PROMPT))
        return kept, functools.partial(li.per_message_count, tokenizer)


class LlamaIndexChatSummaryMemoryExact(LlamaIndexChatSummaryMemory):
    """``ChatSummaryMemoryBuffer`` counting with the run's tokenizer."""

    name = "llamaindex_chat_summary_memory_exact"
    exact = True
