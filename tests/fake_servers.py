"""The routes of the servers teams run, for :class:`~tests.fake_openai.FakeOpenAI`: set
``fake.server = LlamaServer()`` (or ``TGI()``, ``SGLang()``, ``VLLM()``, ``Ollama(...)``)
and the fake answers that server's own routes, in the request and response shapes its
documentation gives, and reports ``usage.prompt_tokens`` as that server would.

Every kind but Ollama renders a chat with one ChatML-like template (:func:`render`) and
tokenizes it with one toy tokenizer (:func:`toy_tokens`: a special marker ``<|...|>`` is
one token where specials are parsed, a word, a punctuation mark or a run of spaces one
each, and the BOS one more where special tokens are added): so a counter that asks the
server the right way gets exactly the chat's own count, and one that forgets the BOS, the
tools or the template's variables is off. Ollama has no tokenizer route: its
``prompt_tokens`` are what ``count`` says (a GGUF counter's, in the tests).

``CountsWith(counter)`` is a plain OpenAI-compatible endpoint whose ``prompt_tokens`` are
that counter's (a sweep that counts with a local tokenizer against the fake).

Shapes (each server's docs, as cited in ``pytest_budgetbench/model/servers.py`` and
``pytest_budgetbench/tokens/server.py``):

- llama-server: ``GET /props`` ``{default_generation_settings: {n_ctx, params}, total_slots,
  model_path, chat_template, chat_template_caps, build_info}``; ``POST /apply-template
  {messages, tools}`` -> ``{prompt}`` (without ``--jinja``, tools are a 500 whose message
  says "tools param requires --jinja flag"); ``POST /tokenize {content, add_special (false),
  parse_special (true)}`` -> ``{tokens}``; the template leaves the BOS out and
  the chat route adds it.
- TGI: ``GET /info`` ``{model_id, max_input_tokens, max_total_tokens, router, version, ...}``;
  ``POST /chat_tokenize`` (a chat request) -> ``{tokenize_response: [{id, text, start,
  stop}], templated_text}``; ``POST /tokenize {inputs}`` -> ``[{id, text, start, stop}]``.
- SGLang: ``GET /get_model_info`` ``{model_path, tokenizer_path, is_generation}``;
  ``GET /v1/models`` cards with ``owned_by: "sglang"``, ``max_model_len``; ``POST
  /v1/tokenize {model, messages | prompt, tools, chat_template_kwargs, add_special_tokens}``
  -> ``{tokens, count, max_model_len}`` (``messages=False``: a version that takes only
  ``prompt``, which answers messages with a 400 naming ``prompt``).
- vLLM: ``GET /v1/models`` cards with ``owned_by: "vllm"``, ``max_model_len``; ``POST
  /tokenize {model, messages, add_generation_prompt, tools, chat_template_kwargs}`` or
  ``{model, prompt, add_special_tokens}`` -> ``{count, max_model_len, tokens}``.
- Ollama: ``GET /api/version`` ``{version}``; ``POST /api/show {model}`` -> ``{modelfile
  (with its FROM line), parameters (num_ctx when set), template, details, model_info
  (<arch>.context_length), capabilities}``; ``GET /api/ps`` ``{models}``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from pytest_budgetbench.messages import text_of, tool_calls_of

Answer = tuple[int, Any]
"""An HTTP status and the JSON body of an answer."""

_PIECE = re.compile(r"<\|[a-z_]+\|>|\w+|[^\w\s]|\s+")
_PLAIN = re.compile(r"\w+|[^\w\s]|\s+")
_SPECIAL = re.compile(r"<\|[a-z_]+\|>")
BOS = "<|bos|>"


def toy_pieces(text: str, *, parse_special: bool = True) -> list[str]:
    """``text`` cut into the toy tokenizer's pieces (see the module)."""
    pieces: list[str] = []
    for piece in _PIECE.findall(text):
        if _SPECIAL.fullmatch(piece) and not parse_special:
            pieces += _PLAIN.findall(piece)  # as plain text: < | name | >
        else:
            pieces.append(piece)
    return pieces


def toy_tokens(text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]:
    """The toy tokenizer's ids of ``text``: a piece's id is its length, the BOS is 1."""
    ids = [len(piece) + 1 for piece in toy_pieces(text, parse_special=parse_special)]
    return [1, *ids] if add_special else ids


def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
           kwargs: dict[str, Any] | None = None, *, bos: bool = False) -> str:
    """The fake's chat template: ChatML, tools as a system block, tool calls as JSON, and
    ``enable_thinking: false`` as an empty think block after the generation prompt."""
    text = BOS if bos else ""
    if tools:
        text += f"<|im_start|>system\n# Tools\n{json.dumps(tools)}<|im_end|>\n"
    for message in messages:
        calls = tool_calls_of(message)
        called = "".join(f"\n<tool_call>{json.dumps(call['function'])}</tool_call>"
                         for call in calls)
        text += f"<|im_start|>{message['role']}\n{text_of(message)}{called}<|im_end|>\n"
    text += "<|im_start|>assistant\n"
    if (kwargs or {}).get("enable_thinking") is False:
        text += "<think>\n\n</think>\n\n"
    return text


class FakeServer:
    """One kind of server's own routes. ``context`` is the context size its info route
    reports (None: it reports none)."""

    def __init__(self, context: int | None = 8192) -> None:
        self.context = context
        self.model = "fake-model"  # FakeOpenAI sets its own
        self.posts: list[tuple[str, dict[str, Any]]] = []
        """Each POST to one of its routes: (route, payload)."""

    def get(self, route: str) -> Answer | None:
        """The answer to ``GET route``; None: not one of its routes."""
        return None

    def post(self, route: str, payload: dict[str, Any]) -> Answer | None:
        return None

    def prompt_tokens(self, payload: dict[str, Any]) -> int:
        """``usage.prompt_tokens`` of a chat request, as this server counts it."""
        return len(toy_tokens(render(payload["messages"], payload.get("tools"),
                                     payload.get("chat_template_kwargs"))))

    def card(self, owned_by: str) -> dict[str, Any]:
        return {"object": "list", "data": [{
            "id": self.model, "object": "model", "created": 0, "owned_by": owned_by,
            "root": self.model, "max_model_len": self.context}]}


class CountsWith(FakeServer):
    """A plain OpenAI-compatible endpoint whose ``usage.prompt_tokens`` are ``counter``'s
    (a sweep that counts exactly with a local tokenizer against the fake)."""

    def __init__(self, counter: Any) -> None:
        super().__init__(None)
        self.counter = counter

    def prompt_tokens(self, payload: dict[str, Any]) -> int:
        return int(self.counter.count_messages(payload["messages"], payload.get("tools")))


class LlamaServer(FakeServer):
    """llama.cpp's llama-server; ``jinja=False`` is one started without ``--jinja``."""

    def __init__(self, context: int | None = 8192, *, jinja: bool = True) -> None:
        super().__init__(context)
        self.jinja = jinja

    def get(self, route: str) -> Answer | None:
        if route != "/props":
            return None
        return 200, {"default_generation_settings": {"n_ctx": self.context,
                                                     "params": {"n_predict": -1}},
                     "total_slots": 1, "model_path": "/models/fake.gguf",
                     "chat_template": "{{ chatml }}",
                     "chat_template_caps": {"supports_tools": True,
                                           "supports_tool_calls": True},
                     "build_info": "b0-fake", "is_sleeping": False}

    def post(self, route: str, payload: dict[str, Any]) -> Answer | None:
        if route == "/apply-template":
            self.posts.append((route, payload))
            if payload.get("tools") and not self.jinja:
                return 500, {"error": {"code": 500, "type": "server_error",
                                       "message": "tools param requires --jinja flag"}}
            last = payload["messages"][-1] if payload["messages"] else {}
            if last.get("role") == "assistant" and last.get("tool_calls"):
                # A prompt that ends in an assistant message is one to continue (prefill);
                # one with tool calls cannot be (server-common.cpp, oaicompat_chat_params_parse).
                return 400, {"error": {"code": 400, "type": "invalid_request_error",
                                       "message": "Cannot continue an assistant message that "
                                                  "contains tool calls."}}
            return 200, {"prompt": render(payload["messages"], payload.get("tools"),
                                          payload.get("chat_template_kwargs"))}
        if route == "/tokenize":
            self.posts.append((route, payload))
            return 200, {"tokens": toy_tokens(
                payload.get("content", ""), add_special=payload.get("add_special", False),
                parse_special=payload.get("parse_special", True))}
        return None

    def prompt_tokens(self, payload: dict[str, Any]) -> int:
        # The chat route tokenizes the rendered prompt with add_special and parse_special.
        return len(toy_tokens(render(payload["messages"], payload.get("tools"),
                                     payload.get("chat_template_kwargs")), add_special=True))


class TGI(FakeServer):
    """Hugging Face's text-generation-inference."""

    def get(self, route: str) -> Answer | None:
        if route != "/info":
            return None
        return 200, {"model_id": self.model, "model_sha": None, "model_pipeline_tag": None,
                     "model_dtype": "torch.float16", "model_device_type": "cpu",
                     "max_concurrent_requests": 128, "max_best_of": 2,
                     "max_stop_sequences": 4, "max_input_tokens": self.context,
                     "max_total_tokens": (self.context or 0) + 512, "validation_workers": 2,
                     "max_client_batch_size": 4, "router": "text-generation-router",
                     "version": "3.0.1", "sha": None, "docker_label": None}

    def post(self, route: str, payload: dict[str, Any]) -> Answer | None:
        if route == "/chat_tokenize":
            self.posts.append((route, payload))
            text = render(payload["messages"], payload.get("tools"),
                          payload.get("chat_template_kwargs"), bos=True)
            return 200, {"tokenize_response": _simple_tokens(text), "templated_text": text}
        if route == "/tokenize":
            self.posts.append((route, payload))
            return 200, _simple_tokens(payload["inputs"])
        return None

    def prompt_tokens(self, payload: dict[str, Any]) -> int:
        return len(toy_tokens(render(payload["messages"], payload.get("tools"),
                                     payload.get("chat_template_kwargs"), bos=True)))


def _simple_tokens(text: str) -> list[dict[str, Any]]:
    """TGI's ``SimpleToken`` list of ``text``."""
    tokens, start = [], 0
    for piece in toy_pieces(text):
        tokens.append({"id": len(piece) + 1, "text": piece, "start": start,
                       "stop": start + len(piece)})
        start += len(piece)
    return tokens


class SGLang(FakeServer):
    """SGLang; ``messages=False`` is a version whose ``/v1/tokenize`` takes only a prompt."""

    def __init__(self, context: int | None = 8192, *, messages: bool = True) -> None:
        super().__init__(context)
        self.messages = messages

    def get(self, route: str) -> Answer | None:
        if route == "/get_model_info":
            return 200, {"model_path": f"/models/{self.model}", "tokenizer_path": "/models",
                         "is_generation": True, "preferred_sampling_params": None}
        if route == "/v1/models":
            return 200, self.card("sglang")
        return None

    def post(self, route: str, payload: dict[str, Any]) -> Answer | None:
        if route != "/v1/tokenize":
            return None
        self.posts.append((route, payload))
        if "messages" in payload and not self.messages:
            return 400, {"object": "error", "type": "BadRequestError", "param": None,
                         "code": 400, "message": "1 validation error for TokenizeRequest "
                                                 "prompt: Field required"}
        return 200, _counted(self, payload)


def _counted(server: FakeServer, payload: dict[str, Any]) -> dict[str, Any]:
    """vLLM's and SGLang's tokenize answer."""
    if "messages" in payload:
        ids = toy_tokens(render(payload["messages"], payload.get("tools"),
                                payload.get("chat_template_kwargs")))
    else:
        ids = toy_tokens(payload["prompt"], add_special=payload.get("add_special_tokens", True))
    return {"tokens": ids, "count": len(ids), "max_model_len": server.context}


class VLLM(FakeServer):
    """vLLM's OpenAI-compatible server."""

    def get(self, route: str) -> Answer | None:
        return (200, self.card("vllm")) if route == "/v1/models" else None

    def post(self, route: str, payload: dict[str, Any]) -> Answer | None:
        if route != "/tokenize":
            return None
        self.posts.append((route, payload))
        return 200, _counted(self, payload)


class Ollama(FakeServer):
    """Ollama: no tokenizer route; ``count(messages, tools)`` is its prompt count,
    ``served_from`` its modelfile's FROM, ``num_ctx`` the model's parameter (None: unset),
    ``trained`` the GGUF's context length."""

    def __init__(self, count: Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], int],
                 *, served_from: str, num_ctx: int | None = 4096, trained: int = 8192,
                 capabilities: tuple[str, ...] = ("completion", "tools")) -> None:
        super().__init__(num_ctx)
        self.count = count
        self.served_from = served_from
        self.trained = trained
        self.capabilities = list(capabilities)
        self.chats = 0
        """Chat requests answered (the counter's probes among them)."""

    def get(self, route: str) -> Answer | None:
        if route == "/api/version":
            return 200, {"version": "0.6.2"}
        if route == "/api/ps":
            return 200, {"models": []}
        return None

    def post(self, route: str, payload: dict[str, Any]) -> Answer | None:
        if route != "/api/show":
            return None
        self.posts.append((route, payload))
        parameters = 'stop                           "<|im_end|>"'
        if self.context is not None:
            parameters = f"num_ctx                        {self.context}\n{parameters}"
        return 200, {
            "modelfile": ('# Modelfile generated by "ollama show"\n'
                          f"FROM {self.served_from}\n"
                          'TEMPLATE """{{ .Prompt }}"""\n'),
            "parameters": parameters, "template": "{{ .Prompt }}",
            "details": {"parent_model": "", "format": "gguf", "family": "llama",
                        "families": ["llama"], "parameter_size": "135M",
                        "quantization_level": "Q8_0"},
            "model_info": {"general.architecture": "llama",
                           "llama.context_length": self.trained},
            "capabilities": self.capabilities}

    def prompt_tokens(self, payload: dict[str, Any]) -> int:
        self.chats += 1
        return self.count(payload["messages"], payload.get("tools"))
