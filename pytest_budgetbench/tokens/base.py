"""The token counter's contract and its caches: how many tokens a chat prompt costs, as the
served model sees it (one module per counter beside this one).

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
- ``server``: the endpoint counts, through its server's own route (``server.py``): vLLM's
  ``/tokenize`` and SGLang's ``/v1/tokenize`` (messages in), TGI's ``/chat_tokenize``,
  llama.cpp llama-server's ``/apply-template`` then ``/tokenize``: exact;
  llama-cpp-python's ``/extras/tokenize`` (text in; the template cost is estimated).
- ``auto``: the embedded model's GGUF; for an endpoint, what its server is
  (:mod:`~pytest_budgetbench.model.servers`): its ``server`` route, or for Ollama, which
  has none, the model's GGUF with its template checked against Ollama's own counts
  (``ollama.py``).
- ``approx``: four characters a token plus a fixed cost per message. Rows say "approx".

Image content parts cost a declared ``IMAGE_TOKENS`` each in every counter but ``server``.
A server's own count of a prompt (``usage.prompt_tokens``) below a counter's by more than
its :meth:`TokenCounter.cut_slack` means the server cut the prompt
(:func:`~pytest_budgetbench.engine.calls.cut_by_server`).
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Protocol

from pytest_budgetbench.canonical import json_sha256
from pytest_budgetbench.messages import (
    Message,
    Tool,
)
from pytest_budgetbench.tokens.content import image_cost
from pytest_budgetbench.tokens.framing import NOT_VERIFIED, Additivity, verify_additivity

ANCHOR: Message = {"role": "system", "content": "."}
"""A fixed system message that per-message counts are measured against (count_message)."""


PROMPT_CACHE_SIZE = 4096
"""Whole-prompt counts kept per counter; the oldest goes first."""


COUNTS_PER_SAVE = 512
"""New counts a counter holds before it writes them to its :class:`CountStore`."""


class CountStore(Protocol):
    """Token counts by (counter space, key), persisted across processes and runs
    (:class:`pytest_budgetbench.cache.counts.CountDatabase`)."""

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

    @property
    def exactness(self) -> str:
        """Which parts of this counter's counts are exact, in words (run.json says it)."""
        return "all exact" if self.exact else "all approximate"

    def cut_slack(self, messages: Sequence[Message], counted: int) -> int:
        """How far below this counter's ``counted`` tokens a server's own count of
        ``messages`` may fall before the server must have cut the prompt: the images' declared
        cost (a text counter cannot know a vision model's), and for an inexact counter half
        its count besides (four characters a token is off by a third on code and JSON; a
        count under half of it is a cut, not a miscount)."""
        return image_cost(messages) + (0 if self.exact else counted // 2)

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
            cached = self._remembered(lambda: "message:" + key,
                                      lambda: self._measure_message(message))
            self._message_cache[key] = cached
        if plain is not None:
            self._plain_cache[plain] = cached
        return cached

    def _measure_message(self, message: Message) -> int:
        """What ``message`` adds to a prompt after the anchor (:meth:`count_message`)."""
        return self._count_prompt([ANCHOR, message]) - self._anchor_tokens()

    def overhead(self) -> int:
        """Tokens a prompt costs beyond the sum of its messages (e.g. BOS, generation prompt)."""
        if self._overhead is None:
            anchor_alone = self.count_message(ANCHOR)
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
            cached = self._message_cache[key] = self._count_prompt([ANCHOR])
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

    @property
    def exactness(self) -> str:
        return self._counter.exactness

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
            self._tools_overhead = (self._counter.count_whole([ANCHOR], self.tools)
                                    - self._counter.count_message(ANCHOR))
        return self._tools_overhead

    def additivity(self) -> Additivity:
        return self._counter.additivity()

    def framing(self, messages: Sequence[Message]) -> int | None:
        return None  # a prompt with tools is counted whole
