"""Token counters: how many tokens a chat prompt costs, as the served model sees it.

The runner counts the whole prompt, chat template included, and enforces the budget.
Strategies may use the same counter to plan, through per-message counts that are cached
by content, but the runner's count of the final prompt is the one that is enforced.

That count is exact either way. Where the counter's template was verified to allow it
(``framing.verify_additivity``, run once per counter on probe prompts), a prompt is
counted as the template's framing for its case plus its messages' cached counts, which
costs no tokenizer call; elsewhere the whole prompt is rendered and tokenized.

Counters by ``--budgetbench-tokenizer``:

- ``gguf:<path>``: llama.cpp with ``vocab_only`` and the GGUF's own chat template. This
  is what the embedded model uses (``auto`` picks it), and it is exact.
- ``hf:<dir or tokenizer.json>``: a transformers tokenizer with its chat template.
- ``server``: the endpoint's ``/tokenize`` route (vLLM style, messages in), or
  llama-cpp-python's ``/extras/tokenize`` (text in; the template cost is estimated).
- ``approx``: four characters a token plus a fixed cost per message. Rows say "approx".

Image content parts cost a declared ``IMAGE_TOKENS`` each in every counter but ``server``.
"""

from __future__ import annotations

import hashlib
import json
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from pytest_budgetbench.canonical import json_sha256
from pytest_budgetbench.errors import RequestTimeout, TokenizerError
from pytest_budgetbench.messages import (
    Message,
    Tool,
    arguments_as_objects,
    as_sent,
    text_of,
    tool_calls_of,
)
from pytest_budgetbench.model.deadline import DeadlineClients
from pytest_budgetbench.model.digests import file_digest
from pytest_budgetbench.tokens.framing import NOT_VERIFIED, Additivity, verify_additivity

# A fixed system message that per-message counts are measured against (see count_message).
_ANCHOR: Message = {"role": "system", "content": "."}

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


def _image_cost(messages: Sequence[Message]) -> int:
    return IMAGE_TOKENS * sum(image_parts(m) for m in messages)


def _text_only(messages: Sequence[Message]) -> list[Message]:
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


_PLAIN_KEYS = frozenset({"role", "content"})


def served_by_llama_cpp(
    messages: Sequence[Message], tools: Sequence[Tool] | None = None
) -> tuple[list[Message], list[Tool] | None]:
    """``messages`` and ``tools`` as llama-cpp-python's server hands them to the chat
    template (:func:`~pytest_budgetbench.messages.as_sent`, the form ChatModel sends).

    The server validates the request with its pydantic model and renders the dump: keys its
    types do not name are dropped (a message's ``name``, a function's ``strict``), the rest
    come in its types' order (a tool's ``name``, ``description``, ``parameters``: a template
    that writes ``tool | tojson`` shows it), and what they refuse is an error. A prompt of
    plain messages without tools comes out as it went in, so only others go through it.
    Without the server extra installed, the prompt is rendered as given.
    """
    sent = as_sent(messages)
    if not tools and all(message.keys() <= _PLAIN_KEYS for message in sent):
        return sent, None
    try:
        from llama_cpp.server.types import CreateChatCompletionRequest
    except ImportError:  # no server extra: no server of this kind to match
        return sent, list(tools) if tools else None
    try:
        request = CreateChatCompletionRequest.model_validate(
            {"messages": sent, "tools": list(tools) if tools else None})
    except ValueError as exc:  # pydantic's ValidationError: the server answers 500
        from pytest_budgetbench.redact import first_line

        raise TokenizerError(
            f"llama-cpp-python's server refuses this prompt ({first_line(exc)}); its "
            "messages and tools must be the chat API's (see messages.check_messages)"
        ) from None
    dumped = request.model_dump(include={"messages", "tools"})
    return dumped["messages"], dumped["tools"]


PROMPT_CACHE_SIZE = 4096
"""Whole-prompt counts kept per counter; the oldest goes first."""

COUNTS_PER_SAVE = 512
"""New counts a counter holds before it writes them to its :class:`CountStore`."""


class CountStore(Protocol):
    """Token counts by (counter space, key), persisted across processes and runs
    (:class:`pytest_budgetbench.model.cache.CountDatabase`)."""

    def lookup(self, space: str, key: str) -> int | None: ...

    def save(self, space: str, counts: Mapping[str, int]) -> None: ...


def message_key(message: Message) -> str:
    """A stable content key for one message, used by caches."""
    return json_sha256(message)


def _plain_message(message: Message) -> tuple[str, str] | None:
    """``(role, text)`` of a message that holds nothing else (most of them), else None."""
    if len(message) != 2:
        return None
    role, content = message.get("role"), message.get("content")
    if type(role) is str and type(content) is str:
        return role, content
    return None


def prompt_sha256(messages: Sequence[Message], tools: Sequence[Tool] | None = None) -> str:
    """The digest of a prompt as sent: its messages, and its tools when it has any (a
    prompt without tools keeps the digest it always had)."""
    value: object = list(messages) if not tools else {"messages": list(messages),
                                                      "tools": list(tools)}
    return json_sha256(value)


_VERIFIED: dict[tuple[type, Hashable], Additivity] = {}
"""Additivity found per counter class and what its counts depend on (``_counts_like``)."""


class TokenCounter(ABC):
    """Counts tokens of whole chat prompts and of single messages.

    Subclasses implement :meth:`_count_prompt`; this class caches per-message counts so a
    strategy can ask about the same message at every budget without re-tokenizing.
    """

    name: str = "counter"
    exact: bool = True
    verifies_additivity: bool = True
    """Whether to probe this counter's template for additivity (see :meth:`additivity`).
    False where a probe is a network call."""

    def __init__(self) -> None:
        self._message_cache: dict[str, int] = {}
        self._plain_cache: dict[tuple[str, str], int] = {}
        """Counts of messages that are a role and a text only, by (role, text): a strategy
        and the runner count every message of every cell, and a tuple of two strings
        hashes in no time (a string keeps its hash) where :func:`message_key` serialises
        and digests the message; that was a third of a truncation cell's CPU."""
        self._text_cache: dict[str, int] = {}
        self._prompt_cache: dict[str, int] = {}
        self._overhead: int | None = None
        self._additivity: Additivity | None = None
        self._store: CountStore | None = None
        self._unsaved: dict[str, int] = {}

    @property
    def count_space(self) -> str | None:
        """Where this counter's counts live in a persistent :class:`CountStore` (a digest
        of everything they depend on), or None when they are not worth keeping."""
        return None

    def keep_counts_in(self, store: CountStore) -> None:
        """Read counts this counter has not made from ``store`` and add the ones it makes
        (in batches, and at :meth:`save_counts`), so a second sweep over the same data
        tokenizes nothing. Does nothing for a counter without a :attr:`count_space`."""
        if self.count_space is not None:
            self._store = store

    def save_counts(self) -> None:
        """Write the counts made since the last save to the store, in one transaction."""
        if self._store is None or not self._unsaved:
            return
        unsaved, self._unsaved = self._unsaved, {}
        assert self.count_space is not None
        self._store.save(self.count_space, unsaved)

    def _remembered(self, key_of: Callable[[], str], count: Callable[[], int]) -> int:
        """The count stored under ``key_of()``, else ``count()``, queued for the store;
        without a store just ``count()`` (no key is made)."""
        if self._store is None:
            return count()
        space = self.count_space
        assert space is not None
        key = key_of()
        found = self._store.lookup(space, key)
        if found is not None:
            return found
        made = self._unsaved[key] = count()
        if len(self._unsaved) >= COUNTS_PER_SAVE:
            self.save_counts()
        return made

    @abstractmethod
    def _count_prompt(self, messages: Sequence[Message],
                      tools: Sequence[Tool] | None = None) -> int:
        """Tokens of the full chat-formatted prompt, generation prompt included, with
        ``tools`` rendered as the template renders them when given."""

    @abstractmethod
    def _count_text(self, text: str) -> int:
        """Tokens of plain text, with no template and no special tokens."""

    def count_messages(self, messages: Sequence[Message],
                       tools: Sequence[Tool] | None = None) -> int:
        """Tokens of the full prompt exactly as the model receives it, with ``tools`` (the
        tool schemas sent beside it, rendered by the chat template) when given.

        The template's framing plus the messages' cached counts where the probes showed
        that to equal the whole count (:meth:`framing`); otherwise the whole prompt,
        remembered per prompt: a sweep counts the same prompt at every budget it fits (and
        truncation at a large budget sends full_context's prompt). A prompt with tools is
        always counted whole.
        """
        framing = None if tools else self.framing(messages)
        if framing is not None:
            try:
                return framing + sum(self.count_message(m) for m in messages)
            except Exception:  # a message the template cannot render: the whole count says why
                pass
        return self.count_whole(messages, tools)

    def count_whole(self, messages: Sequence[Message],
                    tools: Sequence[Tool] | None = None) -> int:
        """Tokens of the full prompt (with ``tools``), rendered and tokenized as one
        (remembered per prompt)."""
        key = prompt_sha256(messages, tools)
        cached = self._prompt_cache.get(key)
        if cached is None:
            if len(self._prompt_cache) >= PROMPT_CACHE_SIZE:
                self._prompt_cache.pop(next(iter(self._prompt_cache)))
            cached = self._prompt_cache[key] = (
                self._count_prompt(messages, tools) if tools else self._count_prompt(messages))
        return cached

    def count_text(self, text: str) -> int:
        cached = self._text_cache.get(text)
        if cached is None:
            cached = self._remembered(
                lambda: "text:" + hashlib.sha256(text.encode("utf-8")).hexdigest(),
                lambda: self._count_text(text))
            self._text_cache[text] = cached
        return cached

    def count_message(self, message: Message) -> int:
        """Tokens one message adds to a prompt, its template framing included.

        Measured as the difference a message makes after a fixed anchor message, so that
        templates which inject a default system prompt cancel out.
        """
        plain = _plain_message(message)
        if plain is not None and (found := self._plain_cache.get(plain)) is not None:
            return found
        key = message_key(message)
        cached = self._message_cache.get(key)
        if cached is None:
            cached = self._remembered(
                lambda: "message:" + key,
                lambda: self._count_prompt([_ANCHOR, message]) - self._anchor_tokens())
            self._message_cache[key] = cached
        if plain is not None:
            self._plain_cache[plain] = cached
        return cached

    def overhead(self) -> int:
        """Tokens a prompt costs beyond the sum of its messages (e.g. BOS, generation prompt)."""
        if self._overhead is None:
            anchor_alone = self.count_message(_ANCHOR)
            self._overhead = self._anchor_tokens() - anchor_alone
        return self._overhead

    def estimate(self, messages: Sequence[Message]) -> int:
        """Overhead plus the cached per-message counts: cheap, and exact for templates
        that render each message independently (ChatML and most others)."""
        return self.overhead() + sum(self.count_message(m) for m in messages)

    def with_tools(self, tools: Sequence[Tool] | None) -> TokenCounter:
        """This counter as seen by a prompt sent with ``tools``: its :meth:`count_messages`,
        :meth:`count_whole`, :meth:`overhead` and :meth:`estimate` count the tool schemas
        too, so a strategy that plans with it plans for them; all else is this counter's
        (caches, store, name, exactness). Without tools, this counter itself."""
        if not tools:
            return self
        return ToolsCounter(self, tools)

    def additivity(self) -> Additivity:
        """Where this counter's prompts may be counted from their messages, verified on the
        first call by probe prompts (framing.verify_additivity) and kept: for the process
        where :meth:`_counts_like` names what the counts depend on, else for this counter."""
        if self._additivity is None:
            if not self.verifies_additivity:
                self._additivity = NOT_VERIFIED
                return self._additivity
            like = self._counts_like()
            key = None if like is None else (type(self), like)
            found = _VERIFIED.get(key) if key is not None else None
            if found is None:
                found = verify_additivity(self._count_prompt, self.count_message)
                if key is not None:
                    _VERIFIED[key] = found
            self._additivity = found
        return self._additivity

    def _counts_like(self) -> Hashable | None:
        """What this counter's counts depend on beyond its class (a tokenizer file and a
        template), so that counters alike share one verification; None: verify each."""
        return None

    def framing(self, messages: Sequence[Message]) -> int | None:
        """The template's verified framing for this prompt (what it costs beyond its
        messages' counts), or None where it must be counted whole."""
        return self.additivity().framing(messages)

    def prompt_token_ids(self, messages: Sequence[Message],
                         tools: Sequence[Tool] | None = None) -> list[int] | None:
        """The prompt's token ids as the model receives it, where this counter can give
        them (an agent episode's prefix reuse compares them call to call); else None."""
        return None

    def _anchor_tokens(self) -> int:
        key = "__anchor__"
        cached = self._message_cache.get(key)
        if cached is None:
            cached = self._message_cache[key] = self._count_prompt([_ANCHOR])
        return cached


class ToolsCounter(TokenCounter):
    """``counter`` with ``tools`` sent beside every prompt (:meth:`TokenCounter.with_tools`).

    Its prompt counts include the tools; its :meth:`overhead` is the wrapped counter's
    measure taken with them (the anchor prompt counted whole with the tools, less the
    anchor's own count), so :meth:`estimate` carries their cost. Per-message and text
    counts, their caches and store, the name and exactness are the wrapped counter's.
    """

    def __init__(self, counter: TokenCounter, tools: Sequence[Tool]) -> None:
        # No super().__init__(): every cache is the wrapped counter's.
        self._counter = counter
        self.tools: tuple[Tool, ...] = tuple(tools)
        self._tools_overhead: int | None = None

    @property
    def name(self) -> str:
        return self._counter.name

    @name.setter
    def name(self, value: str) -> None:
        self._counter.name = value

    @property
    def exact(self) -> bool:
        return self._counter.exact

    @exact.setter
    def exact(self, value: bool) -> None:
        self._counter.exact = value

    @property
    def count_space(self) -> str | None:
        return self._counter.count_space

    def keep_counts_in(self, store: CountStore) -> None:
        self._counter.keep_counts_in(store)

    def save_counts(self) -> None:
        self._counter.save_counts()

    def with_tools(self, tools: Sequence[Tool] | None) -> TokenCounter:
        return self._counter.with_tools(tools)

    def _given(self, tools: Sequence[Tool] | None) -> Sequence[Tool]:
        return self.tools if tools is None else tools

    def _count_prompt(self, messages: Sequence[Message],
                      tools: Sequence[Tool] | None = None) -> int:
        return self._counter._count_prompt(messages, self._given(tools))

    def prompt_token_ids(self, messages: Sequence[Message],
                         tools: Sequence[Tool] | None = None) -> list[int] | None:
        return self._counter.prompt_token_ids(messages, self._given(tools))

    def _count_text(self, text: str) -> int:
        return self._counter._count_text(text)

    def count_messages(self, messages: Sequence[Message],
                       tools: Sequence[Tool] | None = None) -> int:
        return self._counter.count_messages(messages, self._given(tools))

    def count_whole(self, messages: Sequence[Message],
                    tools: Sequence[Tool] | None = None) -> int:
        return self._counter.count_whole(messages, self._given(tools))

    def count_text(self, text: str) -> int:
        return self._counter.count_text(text)

    def count_message(self, message: Message) -> int:
        return self._counter.count_message(message)

    def overhead(self) -> int:
        if self._tools_overhead is None:
            self._tools_overhead = (self._counter.count_whole([_ANCHOR], self.tools)
                                    - self._counter.count_message(_ANCHOR))
        return self._tools_overhead

    def additivity(self) -> Additivity:
        return self._counter.additivity()

    def framing(self, messages: Sequence[Message]) -> int | None:
        return None  # a prompt with tools is counted whole


def framed_estimate(messages: Sequence[Message], count_text: Callable[[str], int],
                    tools: Sequence[Tool] | None = None) -> int:
    """Content tokens plus a guessed template cost (4 per message, 3 per prompt), for
    counters that have no chat template to render; a message's tool calls and the
    ``tools`` count as their JSON text."""
    return (3 + sum(4 + count_text(text_of(m) + _calls_text(m)) for m in messages)
            + (count_text(tools_text(tools)) if tools else 0) + _image_cost(messages))


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


class GGUFCounter(TokenCounter):
    """llama.cpp's tokenizer with ``vocab_only`` and the GGUF's own chat template.

    The llama.cpp server renders chat prompts the same way (Jinja2 template from the GGUF
    metadata, tokenized with special tokens parsed), so this count matches its
    ``usage.prompt_tokens``.
    """

    exact = True

    def __init__(self, model_path: str | Path, chat_template: str | None = None, *,
                 object_arguments: bool = False) -> None:
        """``chat_template`` renders instead of the GGUF's own (as a server started with
        its own ``--chat-template`` would). ``object_arguments``: tool calls' arguments reach
        the template as objects, as the embedded server (and vLLM) hands them
        (:func:`~pytest_budgetbench.messages.arguments_as_objects`); else as the JSON text
        llama-cpp-python's own server hands it."""
        super().__init__()
        from pytest_budgetbench.errors import require

        require("llama_cpp", "local", "--budgetbench-tokenizer=gguf:")
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        from pytest_budgetbench.model.gguf import vocab_only_llama

        path = Path(model_path)
        if not path.is_file():
            raise TokenizerError(f"GGUF tokenizer file not found: {path}")
        self.name = f"gguf:{path.name}"
        try:
            self._llama = vocab_only_llama(path)
        except ValueError as exc:  # llama.cpp's "Failed to load model from file"
            raise TokenizerError(
                f"{path} is not a GGUF file llama.cpp can read ({exc}); pass the served "
                "model's .gguf"
            ) from None
        template = chat_template or self._llama.metadata.get("tokenizer.chat_template")
        if not template:
            raise TokenizerError(f"{path.name} has no tokenizer.chat_template in its metadata")
        self._identity = (str(path.resolve()), template,
                          *(("object-arguments",) if object_arguments else ()))
        self._object_arguments = object_arguments
        self._path = path.resolve()  # hashed on first use, wherever the cwd is by then
        self._space: str | None = None
        self._last_ids: tuple[str, list[int]] | None = None
        self._formatter = Jinja2ChatFormatter(
            template=template,
            eos_token=self._token_text(self._llama.token_eos()),
            bos_token=self._token_text(self._llama.token_bos()),
            add_generation_prompt=True,
        )

    def _token_text(self, token: int) -> str:
        if token < 0:
            return ""
        return self._llama.detokenize([token], special=True).decode("utf-8", errors="ignore")

    def render(self, messages: Sequence[Message],
               tools: Sequence[Tool] | None = None) -> tuple[str, bool]:
        """The prompt as llama-cpp-python's server renders it (:func:`served_by_llama_cpp`),
        and whether the template added the special tokens itself."""
        sent, sent_tools = served_by_llama_cpp(messages, tools)
        if self._object_arguments:
            sent = arguments_as_objects(sent)
        result = self._formatter(messages=sent, tools=sent_tools)  # type: ignore[arg-type]
        return result.prompt, bool(result.added_special)

    def _count_prompt(self, messages: Sequence[Message],
                      tools: Sequence[Tool] | None = None) -> int:
        return len(self._token_ids(messages, tools)) + _image_cost(messages)

    def prompt_token_ids(self, messages: Sequence[Message],
                         tools: Sequence[Tool] | None = None) -> list[int] | None:
        return None if _image_cost(messages) else self._token_ids(messages, tools)

    def _token_ids(self, messages: Sequence[Message],
                   tools: Sequence[Tool] | None) -> list[int]:
        """The prompt's ids; the last prompt's are kept, because an agent episode asks for
        the ids of the prompt it has just counted (prefix reuse), and rendering and
        tokenizing it again would double the counter's work on every call."""
        key = prompt_sha256(messages, tools)
        if self._last_ids is not None and self._last_ids[0] == key:
            return self._last_ids[1]
        prompt, added_special = self.render(_text_only(messages), tools)
        ids = list(self._llama.tokenize(prompt.encode("utf-8"), add_bos=not added_special,
                                        special=True))
        self._last_ids = (key, ids)
        return ids

    def _count_text(self, text: str) -> int:
        return len(self._llama.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    def _counts_like(self) -> Hashable:
        return self._identity

    @property
    def count_space(self) -> str | None:
        """The GGUF's content and the template: never its path or modification time, so
        counts merged from another machine's cache are read here (and a file rewritten in
        place is a new space). Made on first use; the file is read once per machine
        (:func:`~pytest_budgetbench.model.digests.file_digest`)."""
        if self._space is None:
            blob = json.dumps([file_digest(self._path), *self._identity[1:]])
            self._space = "gguf:" + hashlib.sha256(blob.encode("utf-8")).hexdigest()[:32]
        return self._space


class HFCounter(TokenCounter):
    """A transformers tokenizer loaded from a local directory or a tokenizer.json file."""

    exact = True

    def __init__(self, source: str, chat_template: str | None = None) -> None:
        """``chat_template`` renders instead of the tokenizer's own (a tokenizer.json
        alone has none)."""
        super().__init__()
        from pytest_budgetbench.errors import require

        require("transformers", "hf", "--budgetbench-tokenizer=hf:")
        import transformers

        path = Path(source)
        try:
            self._tok: Any
            if path.is_file():
                self._tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(path))
            else:
                self._tok = transformers.AutoTokenizer.from_pretrained(
                    source, local_files_only=True
                )
        except Exception as exc:  # transformers raises many types for a bad path
            raise TokenizerError(
                f"cannot load tokenizer 'hf:{source}': {exc}. "
                "Pass a local directory with tokenizer files, or a tokenizer.json path."
            ) from exc
        self.name = f"hf:{path.name or source}"
        if chat_template:
            self._tok.chat_template = chat_template
        # Without a chat template we can only count content: say so in every row.
        self.exact = bool(getattr(self._tok, "chat_template", None))

    def _count_prompt(self, messages: Sequence[Message],
                      tools: Sequence[Tool] | None = None) -> int:
        if not self.exact:
            return framed_estimate(messages, self._count_text, tools)
        # Content as text; every other key (tool_calls, tool_call_id, name) as sent.
        ids: Any = self._tok.apply_chat_template(
            [{**m, "content": text_of(m)} if "content" in m else m for m in as_sent(messages)],
            tools=list(tools) if tools else None,
            tokenize=True,
            add_generation_prompt=True,
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return len(ids) + _image_cost(messages)

    def _count_text(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False))


class ServerCounter(TokenCounter):
    """Asks the endpoint to count, on the first tokenizer route it answers:

    - ``/tokenize``, vLLM's (messages in, ``count`` out): exact, chat template included;
    - ``/extras/tokenize``, llama-cpp-python's server and proxies in front of it (text
      in, ``tokens`` out): the content is counted by the server and the template's cost
      is estimated as for ``approx``, so rows say ``tokenizer_exact=false``.

    A llama.cpp server's own ``/tokenize`` takes ``content`` and renders no template; it
    is recognised and the error suggests ``gguf:`` (the served file counts exactly).
    """

    name = "server:/tokenize"
    exact = True
    verifies_additivity = False  # a thousand probe requests would cost more than they save
    ROUTES: tuple[str, ...] = ("/tokenize", "/extras/tokenize")
    TIMEOUT_S = 30.0
    """The longest one count may take, answer included
    (see :mod:`~pytest_budgetbench.model.deadline`)."""

    def __init__(
        self, base_url: str, model: str, api_key: str | None = None, route: str | None = None
    ) -> None:
        super().__init__()
        import httpx

        from pytest_budgetbench.redact import register_secret, register_url, request_target

        register_url(base_url)
        register_secret(api_key)
        # A query string (https://host/v1?key=K) goes with every request, not into the path.
        bare_url, query = request_target(base_url, api_key)
        root = bare_url.rstrip("/")
        root = root[: -len("/v1")] if root.endswith("/v1") else root
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._clients: DeadlineClients[httpx.Client] = DeadlineClients(
            lambda: httpx.Client(base_url=root, headers=headers, params=query,
                                 timeout=self.TIMEOUT_S),
            close=httpx.Client.close)
        self._model = model
        self._route: str | None = None
        if route is not None:
            self._use(route)

    @property
    def route(self) -> str | None:
        """The route in use; None until the first count found one."""
        return self._route

    def _use(self, route: str) -> None:
        if route not in self.ROUTES:
            raise TokenizerError(f"unknown tokenizer route {route!r}; one of {self.ROUTES}")
        self._route = route
        self.name = f"server:{route}"
        self.exact = route == "/tokenize"

    def _discover(self) -> None:
        """Try each route with a one-word text; keep the first that answers with a count."""
        import httpx

        tried: list[str] = []
        llama_cpp = False
        for route in self.ROUTES:
            try:
                payload = self._text_payload(route, "probe")
                response = self._send(route, payload)
                if response.status_code == 200:
                    body = response.json()
                    if self._read_count(route, body) is not None:
                        self._use(route)
                        return
                    llama_cpp |= route == "/tokenize" and "tokens" in body
                tried.append(f"{route}: HTTP {response.status_code}")
            except (httpx.HTTPError, ValueError, RequestTimeout) as exc:  # unreachable, not JSON
                tried.append(f"{route}: {type(exc).__name__}")
        hint = (
            "it answers like a llama.cpp server, which renders no chat template there: pass "
            "--budgetbench-tokenizer=gguf:<the served .gguf file> for exact counts"
            if llama_cpp else
            "use --budgetbench-tokenizer=hf:PATH (exact) or approx for this endpoint"
        )
        raise TokenizerError(f"no tokenizer route answered ({'; '.join(tried)}); {hint}")

    def _send(self, route: str, payload: dict[str, Any]) -> Any:
        """POST ``payload`` to ``route``; RequestTimeout when the answer, all of it, takes
        longer than :attr:`TIMEOUT_S`."""
        return self._clients.call(lambda client: client.post(route, json=payload),
                                  self.TIMEOUT_S)

    def _text_payload(self, route: str, text: str) -> dict[str, Any]:
        if route == "/extras/tokenize":
            return {"model": self._model, "input": text}
        return {"model": self._model, "prompt": text, "add_special_tokens": False}

    @staticmethod
    def _read_count(route: str, body: Any) -> int | None:
        if not isinstance(body, dict):
            return None
        if route == "/tokenize":
            return int(body["count"]) if "count" in body else None
        tokens = body.get("tokens")
        return len(tokens) if isinstance(tokens, list) else None

    def _post(self, payload: dict[str, Any]) -> int:
        import httpx

        if self._route is None:
            self._discover()
        route = self._route
        assert route is not None
        try:
            response = self._send(route, payload)
            response.raise_for_status()
            count = self._read_count(route, response.json())
            if count is None:
                raise ValueError(f"no token count in the answer of {route}")
            return count
        except (httpx.HTTPError, ValueError, KeyError, TypeError, RequestTimeout) as exc:
            # HTTP errors keep their status (a 401 is not "no route"); the rest is an
            # answer without a count.
            from pytest_budgetbench.redact import first_line, redact

            # "from None": httpx's own text holds the full URL, credentials included.
            raise TokenizerError(redact(
                f"the endpoint's {route} route failed ({type(exc).__name__}: "
                f"{first_line(exc)}); "
                "use --budgetbench-tokenizer=hf:PATH or approx for this endpoint"
            )) from None

    def _count_prompt(self, messages: Sequence[Message],
                      tools: Sequence[Tool] | None = None) -> int:
        if self._route is None:
            self._discover()
        if self._route == "/extras/tokenize":
            # Text in: the template's cost, the tools' rendering included, is estimated.
            return framed_estimate(messages, self._count_text, tools)
        payload: dict[str, Any] = {"model": self._model, "messages": as_sent(messages),
                                   "add_generation_prompt": True}
        if tools:
            payload["tools"] = list(tools)
        return self._post(payload)

    def _count_text(self, text: str) -> int:
        if self._route is None:
            self._discover()
        assert self._route is not None
        return self._post(self._text_payload(self._route, text))

