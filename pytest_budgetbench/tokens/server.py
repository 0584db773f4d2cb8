"""The ``server`` counter: the endpoint counts its own prompts, through the route its kind of
server documents for it (one :class:`Dialect` each; the kind is what
:func:`~pytest_budgetbench.model.servers.detect_server` found).

==================  ====================================================================
server              request (response): what is exact
==================  ====================================================================
vLLM                ``POST /tokenize {model, messages, add_generation_prompt, tools,
                    chat_template_kwargs}`` (``{count, max_model_len, tokens}``): all
                    (vllm/entrypoints/serve/tokenize/protocol.py, ``TokenizeChatRequest``)
SGLang              ``POST /v1/tokenize {model, messages, tools, chat_template_kwargs}``
                    (``{tokens, count, max_model_len}``): all (sglang
                    entrypoints/openai/protocol.py, ``TokenizeRequest``; a version whose
                    route takes only ``prompt`` is refused)
TGI                 ``POST /chat_tokenize`` with the chat request, tools included
                    (``{tokenize_response: [{id, text, start, stop}], templated_text}``):
                    all (router/src/server.rs, ``get_chat_tokenize``)
llama.cpp           ``POST /apply-template {messages, tools, chat_template_kwargs}``
``llama-server``    (``{prompt}``), then ``POST /tokenize {content: prompt, add_special:
                    true, parse_special: true}`` (``{tokens}``): all (tools/server/README.md).
                    The template leaves the BOS out where the vocabulary adds one
                    (common/chat.cpp strips it), and the chat path tokenizes the prompt
                    with ``add_special`` and ``parse_special`` on (server-context.cpp,
                    ``tokenize_input_prompts(..., true, true)``): so does this count.
                    Tools need the server's ``--jinja``; without it the line says so.
llama-cpp-python    ``POST /extras/tokenize {model, input}`` (``{tokens}``): the content is
                    the server's count, the template's cost estimated: inexact
==================  ====================================================================

Where the kind is unknown (``openai-compatible``) the counter tries ``/tokenize`` (vLLM's
shape) and ``/extras/tokenize`` in turn on its first count, as before servers were told.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_budgetbench.errors import RequestTimeout, RouteError, TokenizerError
from pytest_budgetbench.messages import (
    Message,
    Tool,
    as_sent,
)
from pytest_budgetbench.tokens.base import ANCHOR, TokenCounter
from pytest_budgetbench.tokens.content import framed_estimate

Post = Callable[[str, dict[str, Any]], Any]
"""POSTs a JSON payload to a route of the server: the decoded answer, or :class:`RouteError`."""


@dataclass(frozen=True)
class Dialect:
    """How one kind of server counts a chat prompt and a text: the requests and where the
    count is in their answers."""

    kind: str
    route: str
    """The prompt's route, as the counter's name shows it."""
    text_route: str
    exact: bool = True
    prompt_extra: Mapping[str, Any] = field(default_factory=dict)
    """Fields a prompt's request carries besides the chat request's own."""

    def count_prompt(self, post: Post, model: str, messages: Sequence[Message],
                     tools: Sequence[Tool] | None, template_kwargs: Mapping[str, Any] | None,
                     count_text: Callable[[str], int]) -> int:
        return _count(post(self.route, chat_request(model, messages, tools, template_kwargs,
                                                    self.prompt_extra)), self.route)

    def count_text(self, post: Post, model: str, text: str) -> int:
        return _count(post(self.text_route, {"model": model, "prompt": text,
                                             "add_special_tokens": False}), self.text_route)

    def explain(self, error: RouteError) -> str | None:
        """What an error of this server means and what to do, where it is known."""
        return None


def chat_request(model: str, messages: Sequence[Message], tools: Sequence[Tool] | None,
                 template_kwargs: Mapping[str, Any] | None,
                 extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The chat request as the sweep sends it, for a route that renders it: the same
    messages, tools and ``chat_template_kwargs`` (the sampling fields change no count)."""
    payload: dict[str, Any] = {"model": model, "messages": as_sent(messages), **(extra or {})}
    if tools:
        payload["tools"] = list(tools)
    if template_kwargs:
        payload["chat_template_kwargs"] = dict(template_kwargs)
    return payload


def _count(body: Any, route: str) -> int:
    """The ``count`` of vLLM's and SGLang's answers."""
    if isinstance(body, dict) and isinstance(body.get("count"), int):
        return int(body["count"])
    raise ValueError(f"no token count in the answer of {route}")


def _tokens(body: Any, key: str | None, route: str) -> int:
    """How many tokens an answer lists: ``body[key]``, or the body itself for no key."""
    tokens = body if key is None else body.get(key) if isinstance(body, dict) else None
    if isinstance(tokens, list):
        return len(tokens)
    raise ValueError(f"no token list in the answer of {route}")


class MessagesTokenize(Dialect):
    """SGLang: vLLM's shape at ``/v1/tokenize``; a version that takes no messages there
    (``prompt`` only) says so, and is refused in one line."""

    def explain(self, error: RouteError) -> str | None:
        if error.status in (400, 422) and "prompt" in error.said:
            return (f"this SGLang's {error.route} takes no chat messages (it answered: "
                    f"{error.said}): upgrade SGLang, or pass --budgetbench-tokenizer=hf:PATH "
                    "(the served model's tokenizer)")
        return None


class ChatTokenize(Dialect):
    """TGI: the chat request templated and tokenized as its chat route does."""

    def count_prompt(self, post: Post, model: str, messages: Sequence[Message],
                     tools: Sequence[Tool] | None, template_kwargs: Mapping[str, Any] | None,
                     count_text: Callable[[str], int]) -> int:
        body = post(self.route, chat_request(model, messages, tools, template_kwargs))
        return _tokens(body, "tokenize_response", self.route)

    def count_text(self, post: Post, model: str, text: str) -> int:
        return _tokens(post(self.text_route, {"inputs": text, "add_special_tokens": False}),
                       None, self.text_route)


class ApplyTemplate(Dialect):
    """llama.cpp's llama-server: the prompt its chat route would evaluate, then its tokens
    as that route tokenizes them (see the module's table)."""

    def count_prompt(self, post: Post, model: str, messages: Sequence[Message],
                     tools: Sequence[Tool] | None, template_kwargs: Mapping[str, Any] | None,
                     count_text: Callable[[str], int]) -> int:
        request = chat_request(model, messages, tools, template_kwargs)
        del request["model"]  # one model per server: the route takes none
        prompt = post("/apply-template", request)
        if not isinstance(prompt, dict) or not isinstance(prompt.get("prompt"), str):
            raise ValueError("no prompt in the answer of /apply-template")
        body = post("/tokenize", {"content": prompt["prompt"], "add_special": True,
                                  "parse_special": True})
        return _tokens(body, "tokens", "/tokenize")

    def count_text(self, post: Post, model: str, text: str) -> int:
        body = post("/tokenize", {"content": text, "add_special": False,
                                  "parse_special": False})
        return _tokens(body, "tokens", "/tokenize")

    def explain(self, error: RouteError) -> str | None:
        if "--jinja" in error.said:
            return ("this llama-server was started without --jinja, so it renders no tools "
                    f"(its {error.route} answered: {error.said}): restart it with --jinja")
        return None


class TextOnly(Dialect):
    """llama-cpp-python's server (and proxies in front of it): text in, so the template's
    cost, the tools' rendering included, is estimated as for ``approx``."""

    def count_prompt(self, post: Post, model: str, messages: Sequence[Message],
                     tools: Sequence[Tool] | None, template_kwargs: Mapping[str, Any] | None,
                     count_text: Callable[[str], int]) -> int:
        return framed_estimate(messages, count_text, tools)

    def count_text(self, post: Post, model: str, text: str) -> int:
        return _tokens(post(self.text_route, {"model": model, "input": text}), "tokens",
                       self.text_route)


VLLM_DIALECT = Dialect("vllm", "/tokenize", "/tokenize",
                       prompt_extra={"add_generation_prompt": True})
SGLANG_DIALECT = MessagesTokenize("sglang", "/v1/tokenize", "/v1/tokenize")
TGI_DIALECT = ChatTokenize("tgi", "/chat_tokenize", "/tokenize")
LLAMA_SERVER_DIALECT = ApplyTemplate("llama-server", "/apply-template+/tokenize", "/tokenize")
EXTRAS_DIALECT = TextOnly("llama-cpp-python", "/extras/tokenize", "/extras/tokenize",
                          exact=False)

DIALECTS: dict[str, Dialect] = {d.kind: d for d in (
    VLLM_DIALECT, SGLANG_DIALECT, TGI_DIALECT, LLAMA_SERVER_DIALECT, EXTRAS_DIALECT)}
"""The dialect of each kind of server (:mod:`~pytest_budgetbench.model.servers`' kinds)."""

_BY_ROUTE = {"/tokenize": VLLM_DIALECT, "/extras/tokenize": EXTRAS_DIALECT}
"""The routes tried, in turn, where the server's kind is unknown."""


class ServerCounter(TokenCounter):
    """Asks the endpoint to count, in its server's :class:`Dialect` (see the module's
    table). Without one, it tries the routes of :data:`ROUTES` on its first count and
    keeps the first that answers with a count: vLLM's ``/tokenize`` (exact), or
    llama-cpp-python's ``/extras/tokenize`` (inexact). A llama.cpp server's own
    ``/tokenize`` answers that probe with tokens and no count: recognised, it counts as
    llama-server where ``/apply-template`` answers too, else the error says what to pass."""

    name = "server:/tokenize"
    exact = True
    verifies_additivity = False  # a thousand probe requests would cost more than they save
    ROUTES: tuple[str, ...] = tuple(_BY_ROUTE)
    TIMEOUT_S = 30.0
    """The longest one count may take, answer included
    (see :mod:`~pytest_budgetbench.model.deadline`)."""

    def __init__(
        self, base_url: str, model: str, api_key: str | None = None, route: str | None = None,
        *, dialect: Dialect | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        """``route`` (``/tokenize`` or ``/extras/tokenize``) or ``dialect`` skip the probe;
        ``chat_template_kwargs`` go with every prompt, as with the sweep's requests."""
        super().__init__()
        from pytest_budgetbench.model.servers import ServerClient

        self._base_url = base_url
        self._client = ServerClient(base_url, api_key, self.TIMEOUT_S)
        self._model = model
        self._template_kwargs = dict(chat_template_kwargs or {})
        self._dialect: Dialect | None = None
        if route is not None:
            if route not in _BY_ROUTE:
                raise TokenizerError(f"unknown tokenizer route {route!r}; one of {self.ROUTES}")
            dialect = _BY_ROUTE[route]
        if dialect is not None:
            self._use(dialect)

    @property
    def route(self) -> str | None:
        """The route in use; None until the first count found one."""
        return None if self._dialect is None else self._dialect.route

    @property
    def dialect(self) -> Dialect | None:
        return self._dialect

    @property
    def exactness(self) -> str:
        dialect = self._dialect
        if dialect is None or dialect.exact:
            return super().exactness
        return (f"the content exact (the server's {dialect.route}); the chat template's "
                "cost estimated")

    def _use(self, dialect: Dialect) -> None:
        self._dialect = dialect
        self.name = f"server:{dialect.route}"
        self.exact = dialect.exact

    def _discover(self) -> Dialect:
        """Try each route with a one-word text; keep the first that answers with a count."""
        import httpx

        tried: list[str] = []
        llama_cpp = False
        for route, dialect in _BY_ROUTE.items():
            try:
                self._use(dialect)
                dialect.count_text(self._post, self._model, "probe")
                return dialect
            except RouteError as exc:
                tried.append(f"{route}: HTTP {exc.status}")
            except ValueError:  # an answer without a count
                tried.append(f"{route}: HTTP 200 without a count")
                llama_cpp |= route == "/tokenize"
            except (httpx.HTTPError, RequestTimeout) as exc:  # unreachable
                tried.append(f"{route}: {type(exc).__name__}")
        if llama_cpp and self._renders_templates():
            self._use(LLAMA_SERVER_DIALECT)
            return LLAMA_SERVER_DIALECT
        self._dialect = None
        hint = (
            "it answers like a llama.cpp server, which renders no chat template there: pass "
            "--budgetbench-tokenizer=gguf:<the served .gguf file> for exact counts"
            if llama_cpp else
            "use --budgetbench-tokenizer=hf:PATH (exact) or approx for this endpoint"
        )
        raise TokenizerError(f"no tokenizer route answered ({'; '.join(tried)}); {hint}")

    def _renders_templates(self) -> bool:
        """Whether a server whose ``/tokenize`` answered as llama.cpp's also answers
        ``/apply-template`` (a llama-server that hides ``/props``, the embedded one)."""
        import httpx

        try:
            LLAMA_SERVER_DIALECT.count_prompt(self._post, self._model,
                                              [{"role": "user", "content": "probe"}], None,
                                              None, self._count_text)
        except (RouteError, ValueError, httpx.HTTPError, RequestTimeout):
            return False
        return True

    def _post(self, route: str, payload: dict[str, Any]) -> Any:
        response = self._client.post(route, payload, self.TIMEOUT_S)
        if response.status_code != 200:
            raise RouteError(route, response.status_code, _said(response))
        return response.json()

    def _counted(self, count: Callable[[Dialect], int]) -> int:
        """``count(dialect)``; any failure is one TokenizerError naming the route."""
        import httpx

        dialect = self._dialect or self._discover()
        try:
            return count(dialect)
        except (RouteError, httpx.HTTPError, ValueError, KeyError, TypeError,
                RequestTimeout) as exc:
            from pytest_budgetbench.redact import first_line, redact, redact_url

            explained = dialect.explain(exc) if isinstance(exc, RouteError) else None
            # "from None": httpx's own text holds the full URL, credentials included.
            raise TokenizerError(redact(
                f"{dialect.kind} at {redact_url(self._base_url)}: {explained}" if explained
                else f"the endpoint's {dialect.route} route failed ({type(exc).__name__}: "
                     f"{first_line(exc)}); use --budgetbench-tokenizer=hf:PATH or approx "
                     "for this endpoint"
            )) from None

    def _measure_message(self, message: Message) -> int:
        """A message's count for a strategy's planning (the enforced count is the whole
        prompt's). An assistant message that calls tools is measured with a user turn after
        it: llama-server takes a prompt that ends in an assistant message as one to continue,
        and refuses to continue one with tool calls ("Cannot continue an assistant message
        that contains tool calls"), so the anchor-and-message probe would fail there."""
        if message.get("role") != "assistant" or not message.get("tool_calls"):
            return super()._measure_message(message)
        after: Message = {"role": "user", "content": "."}
        return (self._count_prompt([ANCHOR, message, after])
                - self._count_prompt([ANCHOR, after]))

    def _count_prompt(self, messages: Sequence[Message],
                      tools: Sequence[Tool] | None = None) -> int:
        return self._counted(lambda dialect: dialect.count_prompt(
            self._post, self._model, messages, tools, self._template_kwargs, self._count_text))

    def _count_text(self, text: str) -> int:
        return self._counted(lambda dialect: dialect.count_text(self._post, self._model, text))


def _said(response: Any) -> str:
    """The message of an error answer (``{"error": {"message"}}``, ``{"error": "..."}``,
    FastAPI's ``{"detail"}``, or ``{"message"}``), on one line; "" where there is none."""
    from pytest_budgetbench.redact import first_line

    try:
        body = response.json()
    except ValueError:
        return first_line(response.text[:200]) if response.text else ""
    if isinstance(body, dict):
        found = body.get("error", body.get("detail", body.get("message", "")))
        if isinstance(found, dict):
            found = found.get("message", "")
        return first_line(str(found)[:300])
    return ""
