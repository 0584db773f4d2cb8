"""The ``server`` counter: the endpoint's ``/tokenize`` route (vLLM style, messages in), or
llama-cpp-python's ``/extras/tokenize`` (text in; the template cost is estimated)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pytest_budgetbench.errors import RequestTimeout, TokenizerError
from pytest_budgetbench.messages import (
    Message,
    Tool,
    as_sent,
)
from pytest_budgetbench.model.deadline import DeadlineClients
from pytest_budgetbench.tokens.base import TokenCounter
from pytest_budgetbench.tokens.content import framed_estimate


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
