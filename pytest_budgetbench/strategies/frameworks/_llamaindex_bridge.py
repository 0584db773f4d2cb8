"""LlamaIndex's side of the ``llamaindex_*`` strategies: message conversion, the thin LLM
its summary buffer calls, its default tokenizer loaded offline, and one run of each memory.

Imported only when such a strategy runs (:mod:`.llamaindex` imports it lazily), so that a
sweep without llama-index-core installed never imports it, and so that
``import pytest_budgetbench`` stays light.

Messages. An OpenAI message becomes a ``ChatMessage`` the way llama-index 0.14 builds one
from the OpenAI API: the text in ``TextBlock``s (one per text part), each tool call a
``ToolCallBlock`` (its arguments kept as the JSON text they came in), and every other key
of the message (``tool_calls``, ``tool_call_id``, ``name``) in ``additional_kwargs``, as
``llama_index.llms.openai``'s ``from_openai_message_dict`` puts them (its FunctionAgent
reads a tool result's ``tool_call_id`` there). :func:`from_llama` reverses it:
``from_llama(to_llama(m)) == m`` for any text-only message, a content list of one text
part aside (it comes back as a string; :func:`restore` gives back the original message).
Parts other than text are refused before conversion (``refuse_parts``).
"""

from __future__ import annotations

import copy
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import llama_index.core
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    CompletionResponse,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
    TextBlock,
    ToolCallBlock,
)
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.llms.custom import CustomLLM
from llama_index.core.memory import ChatMemoryBuffer, ChatSummaryMemoryBuffer, Memory
from llama_index.core.memory.memory import DEFAULT_FLUSH_SIZE
from llama_index.core.utils import get_tokenizer

from pytest_budgetbench.canonical import canonical_json
from pytest_budgetbench.errors import StrategyError
from pytest_budgetbench.messages import Message
from pytest_budgetbench.strategies.base import AuxiliaryModel
from pytest_budgetbench.strategies.frameworks._policy import private_loop, tiktoken_cache

Tokenizer = Callable[[str], list[Any]]

SUMMARY_PURPOSE = "llamaindex/summary"
SHIPPED_CACHE = os.path.join(os.path.dirname(llama_index.core.utils.__file__),
                             "_static", "tiktoken_cache")
"""The tiktoken encodings llama-index-core ships (cl100k_base, o200k_base), which
``get_tokenizer`` reads when ``TIKTOKEN_CACHE_DIR`` is unset."""
_TOKENIZER_LOCK = threading.Lock()


# -- messages ----------------------------------------------------------------------------
def to_llama(message: Message) -> ChatMessage:
    """``message`` as LlamaIndex's ``ChatMessage`` (see the module docstring)."""
    role = message.get("role")
    if role not in MessageRole._value2member_map_:
        raise StrategyError(f"llama_index has no message role {role!r}: its roles are "
                            f"{', '.join(r.value for r in MessageRole)}")
    content = message.get("content")
    parts = [content] if isinstance(content, str) else [
        part["text"] for part in content or ()]
    blocks: list[Any] = [TextBlock(text=text) for text in parts]
    blocks += [ToolCallBlock(tool_call_id=call["id"], tool_name=call["function"]["name"],
                             tool_kwargs=call["function"]["arguments"])
               for call in message.get("tool_calls") or ()]
    extra = {key: copy.deepcopy(value) for key, value in message.items()
             if key not in ("role", "content")}
    return ChatMessage(role=MessageRole(role), blocks=blocks, additional_kwargs=extra)


def from_llama(message: ChatMessage) -> Message:
    """The OpenAI message ``message`` stands for: text blocks as its content (None when it
    has none, a list of text parts when several), tool calls from its ``ToolCallBlock``s,
    and the other keys from ``additional_kwargs``."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in message.blocks:
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ToolCallBlock):
            arguments = block.tool_kwargs
            calls.append({"id": block.tool_call_id, "type": "function", "function": {
                "name": block.tool_name,
                "arguments": arguments if isinstance(arguments, str) else
                canonical_json(arguments)}})
        else:
            raise StrategyError(f"llama_index returned a {block.block_type!r} block in a "
                                f"{message.role.value} message, which this bridge cannot "
                                "carry back (it carries text and tool calls)")
    out: Message = {"role": message.role.value, "content": (
        None if not texts else texts[0] if len(texts) == 1 else
        [{"type": "text", "text": text} for text in texts])}
    if calls:
        out["tool_calls"] = calls
    for key, value in message.additional_kwargs.items():
        if key != "tool_calls":
            out.setdefault(key, copy.deepcopy(value))
    return out


def restore(returned: Sequence[ChatMessage], given: Sequence[Message]) -> list[Message]:
    """``returned`` as OpenAI messages, each one that stands for a message of ``given``
    as that very message (a one-part content list stays a list)."""
    originals = {canonical_json(from_llama(to_llama(m))): m for m in given}
    back = [from_llama(m) for m in returned]
    return [originals.get(canonical_json(m), m) for m in back]


# -- the tokenizer -------------------------------------------------------------------------
def shipped_tokenizer() -> Tokenizer:
    """What LlamaIndex counts with by default: ``get_tokenizer()``, tiktoken's encoding of
    gpt-3.5-turbo (cl100k_base) unless the process set a global tokenizer. The encoding
    is read from the cache llama-index-core ships, never downloaded: LlamaIndex points
    tiktoken there only when ``TIKTOKEN_CACHE_DIR`` is unset, and tiktoken downloads into
    a set directory that lacks it; the first call here points it there either way (the
    file is the same encoding, checked by tiktoken against its hash)."""
    if llama_index.core.global_tokenizer is None:
        with _TOKENIZER_LOCK, tiktoken_cache(SHIPPED_CACHE):
            get_tokenizer()
    return get_tokenizer()


def tokenizer_name(tokenizer: Tokenizer) -> str:
    """``tiktoken cl100k_base`` for LlamaIndex's default, else the callable's name."""
    encoding = getattr(getattr(tokenizer, "func", None), "__self__", None)
    name = getattr(encoding, "name", None)
    return f"tiktoken {name}" if name else getattr(tokenizer, "__qualname__", repr(tokenizer))


def remembering(tokenizer: Tokenizer) -> Tokenizer:
    """``tokenizer`` remembering what it returned for each text, for one ``apply``:
    ``Memory`` re-tokenizes its whole queue after every flush, the buffers every suffix
    they try. The counts are the same; only the repeated work goes."""
    seen: dict[str, list[Any]] = {}

    def tokenize(text: str) -> list[Any]:
        found = seen.get(text)
        if found is None:
            found = seen[text] = tokenizer(text)
        return found

    return tokenize


def length_tokenizer(count: Callable[[str], int]) -> Tokenizer:
    """A ``tokenizer_fn`` whose list has ``count(text)`` items: LlamaIndex reads only the
    length of what its tokenizer returns."""
    return lambda text: [0] * count(text)


# -- the thin LLM --------------------------------------------------------------------------
class AuxLLM(CustomLLM):
    """A LlamaIndex LLM that answers through the runner's auxiliary model: its calls are
    budgeted to the cell's budget, cached and recorded on the row (purpose
    ``llamaindex/summary``). ``context_window`` is the cell's budget; ``max_tokens`` caps
    each reply."""

    context_window: int
    max_tokens: int
    _aux: AuxiliaryModel = PrivateAttr()

    def __init__(self, aux: AuxiliaryModel, **data: Any) -> None:
        super().__init__(**data)
        self._aux = aux

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(context_window=self.context_window, num_output=self.max_tokens,
                           is_chat_model=True, model_name="budgetbench-aux")

    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        reply = self._aux.complete([from_llama(m) for m in messages],
                                   max_tokens=self.max_tokens, purpose=SUMMARY_PURPOSE)
        return ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=reply))

    def complete(self, prompt: str, formatted: bool = False,
                 **kwargs: Any) -> CompletionResponse:
        answer = self.chat([ChatMessage(role=MessageRole.USER, content=prompt)])
        return CompletionResponse(text=answer.message.content or "")

    def stream_complete(self, prompt: str, formatted: bool = False,
                        **kwargs: Any) -> CompletionResponseGen:
        yield self.complete(prompt, formatted)


# -- the memories ----------------------------------------------------------------------------
def chat_memory_buffer(history: list[ChatMessage], token_limit: int,
                       tokenizer: Tokenizer) -> list[ChatMessage]:
    """``ChatMemoryBuffer.get()`` over ``history``."""
    return ChatMemoryBuffer.from_defaults(chat_history=history, token_limit=token_limit,
                                          tokenizer_fn=tokenizer).get()


def joined_count(tokenizer: Tokenizer, messages: Sequence[ChatMessage]) -> int:
    """How ``ChatMemoryBuffer`` counts messages: their contents joined by spaces."""
    return len(tokenizer(" ".join(str(m.content) for m in messages))) if messages else 0


def chat_summary_memory_buffer(
    history: list[ChatMessage], token_limit: int, tokenizer: Tokenizer, llm: AuxLLM,
    summarize_prompt: str | None,
) -> list[ChatMessage]:
    """``ChatSummaryMemoryBuffer.get()`` over ``history``: its newest messages that fit,
    after a summary of the others written by ``llm``."""
    return ChatSummaryMemoryBuffer.from_defaults(
        chat_history=history, llm=llm, token_limit=token_limit, tokenizer_fn=tokenizer,
        summarize_prompt=summarize_prompt).get()


def per_message_count(tokenizer: Tokenizer, messages: Sequence[ChatMessage]) -> int:
    """How ``ChatSummaryMemoryBuffer`` counts: each message's content on its own."""
    return sum(len(tokenizer(str(m.content))) for m in messages)


def memory(history: list[ChatMessage], token_limit: int, tokenizer: Tokenizer,
           ratio: float, flush: int | None) -> tuple[list[ChatMessage], Memory]:
    """``Memory`` (from_defaults, its default in-memory SQLite store; ``flush`` None:
    from_defaults' own ``token_flush_size``) after
    ``aput_messages(history)``, as an agent's finalize step puts a run's messages:
    ``aget()``, and the memory (whose ``_estimate_token_count`` is its counter)."""
    from sqlalchemy.ext.asyncio import create_async_engine

    async def run() -> tuple[list[ChatMessage], Memory]:
        engine = create_async_engine("sqlite+aiosqlite:///:memory:")
        try:
            built = Memory.from_defaults(
                token_limit=token_limit, tokenizer_fn=tokenizer, async_engine=engine,
                chat_history_token_ratio=ratio,
                token_flush_size=DEFAULT_FLUSH_SIZE if flush is None else flush)
            if history:
                await built.aput_messages(history)
            return await built.aget(), built
        finally:
            await engine.dispose()

    return private_loop(run())


def memory_count(built: Memory, messages: Sequence[ChatMessage]) -> int:
    """How ``Memory`` counts: its per-message estimate (text blocks, additional_kwargs)."""
    return sum(built._estimate_token_count(m) for m in messages)
