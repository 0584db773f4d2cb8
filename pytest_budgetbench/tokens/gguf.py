"""The ``gguf:<path>`` counter: llama.cpp's tokenizer with ``vocab_only`` and the GGUF's own
chat template, rendered as llama-cpp-python's server renders it (exact)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Hashable, Sequence
from pathlib import Path

from pytest_budgetbench.errors import TokenizerError
from pytest_budgetbench.messages import (
    Message,
    Tool,
    arguments_as_objects,
    as_sent,
    tool_calls_of,
)
from pytest_budgetbench.model.digests import file_digest
from pytest_budgetbench.tokens.base import TokenCounter, prompt_sha256
from pytest_budgetbench.tokens.content import image_cost, text_only

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
        return len(self._token_ids(messages, tools)) + image_cost(messages)

    def prompt_token_ids(self, messages: Sequence[Message],
                         tools: Sequence[Tool] | None = None) -> list[int] | None:
        return None if image_cost(messages) else self._token_ids(messages, tools)

    def _token_ids(self, messages: Sequence[Message],
                   tools: Sequence[Tool] | None) -> list[int]:
        """The prompt's ids; the last prompt's are kept, because an agent episode asks for
        the ids of the prompt it has just counted (prefix reuse), and rendering and
        tokenizing it again would double the counter's work on every call."""
        key = prompt_sha256(messages, tools)
        if self._last_ids is not None and self._last_ids[0] == key:
            return self._last_ids[1]
        prompt, added_special = self.render(text_only(messages), tools)
        ids = list(self._llama.tokenize(prompt.encode("utf-8"), add_bos=not added_special,
                                        special=True))
        self._last_ids = (key, ids)
        return ids

    def _count_text(self, text: str) -> int:
        return len(self._llama.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    def cut_slack(self, messages: Sequence[Message], counted: int) -> int:
        """Besides the images: with tool calls' arguments rendered as the JSON text
        llama-cpp-python's server hands its template, a server that parses them renders
        them its own way (llama-server: 2 tokens fewer a call, measured on the default
        model), so their tokens are this count's known slack; none with ``object_arguments``,
        as such a server renders them."""
        slack = super().cut_slack(messages, counted)
        if self._object_arguments:
            return slack
        return slack + sum(self.count_text(str(call.get("function", {}).get("arguments", "")))
                           for message in messages for call in tool_calls_of(message))

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
