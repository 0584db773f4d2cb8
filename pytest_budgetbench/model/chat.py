"""The model endpoint: an OpenAI-compatible client with bounded retries, and the embedded
llama.cpp server used when no endpoint is given.

An endpoint failure is an :class:`EndpointError`: it is never turned into an answer.
"""

from __future__ import annotations

import contextlib
import datetime
import email.utils
import fcntl
import functools
import json
import math
import os
import random
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_budgetbench.errors import (
    EndpointError,
    EndpointUnavailable,
    MalformedReply,
    RequestRejected,
    RequestTimeout,
)
from pytest_budgetbench.messages import Message, Tool, as_sent, shared_call_id
from pytest_budgetbench.model.backend import ChatBackend as ChatBackend
from pytest_budgetbench.model.backend import Completion as Completion
from pytest_budgetbench.model.deadline import DeadlineClients
from pytest_budgetbench.model.tool_parser import ToolParser, parse_tool_calls
from pytest_budgetbench.redact import (
    first_line,
    redact,
    redact_url,
    register_secret,
    register_url,
    request_target,
)

REPLY_NEUTRAL_FLAGS = frozenset({"n_ctx", "OMP_WAIT_POLICY"})
"""Recorded server flags that change no reply, so the response cache's key leaves them out:
the context only has to hold the prompt, and how idle threads wait is not arithmetic."""


MAX_BACKOFF_S = 60.0
"""The longest wait between attempts, whatever the server's Retry-After asks for."""


def retry_after_seconds(header: str | None, now: float | None = None) -> float | None:
    """The wait a ``Retry-After`` header asks for, in seconds: delta-seconds or an HTTP
    date. None when absent or unreadable (the normal backoff applies); ``inf`` for a value
    too large to represent (``inf``, ``1e400``); never negative."""
    if header is None:
        return None
    text = str(header).strip()
    seconds: float | None
    try:
        seconds = float(text)
    except ValueError:
        seconds = _http_date_delay(text, time.time() if now is None else now)
    if seconds is None or math.isnan(seconds):
        return None
    return max(0.0, seconds)


def _http_date_delay(text: str, now: float) -> float | None:
    try:
        when = email.utils.parsedate_to_datetime(text)
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.UTC)
        return when.timestamp() - now
    except (TypeError, ValueError, OverflowError, IndexError):
        return None


def _retry_after(exc: Exception) -> tuple[float | None, str | None]:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    header = headers.get("retry-after") if headers is not None else None
    return retry_after_seconds(header), header


class RequestSlots:
    """At most ``limit`` requests in flight, across threads and processes: a slot is an
    exclusive ``flock`` on one of ``limit`` files, so a killed holder frees its slot."""

    def __init__(self, directory: Path, limit: int, poll_s: float = 0.01) -> None:
        self.paths = [directory / f"slot-{index}.lock" for index in range(limit)]
        self.poll_s = poll_s
        directory.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        fd = self._acquire()
        try:
            yield
        finally:
            self.release(fd)

    def _acquire(self) -> int:
        while True:
            fd = self.try_take()
            if fd is not None:
                return fd
            time.sleep(self.poll_s)

    def try_take(self) -> int | None:
        """A free slot, held until :meth:`release`; None when every slot is held."""
        for path in self.paths:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return fd
        return None

    @staticmethod
    def release(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


class ChatModel:
    """Chat completions through the ``openai`` client, retried with backoff and jitter.

    ``timeout`` bounds each request as a whole, from the first byte sent to the last byte
    of the reply (a reply that drips in, or never ends, times out like a silent server).
    429s, 5xx, timeouts and dropped connections are retried up to ``attempts`` times,
    honouring ``Retry-After`` up to the request timeout and ``max_backoff_s``; a server
    that asks for a longer wait ends the call. After that the call raises EndpointError;
    a malformed reply, at once, :class:`~pytest_budgetbench.errors.MalformedReply` (a pool
    of replicas asks another). Every message is redacted (no key, no URL credentials).

    A query string in ``base_url`` (``https://host/v1?key=K``) is sent with every request
    as a default query parameter, never as part of a route's path. With an API key, the
    URL's user info is not sent (:func:`~pytest_budgetbench.redact.request_target`).

    ``base_url`` may be a callable instead (a launcher's ``url``): it is called on the first
    request, once, so a server that starts on demand starts only when a reply is needed;
    :attr:`base_url` is empty until then.
    """

    def __init__(
        self,
        base_url: str | Callable[[], str],
        model: str,
        *,
        api_key: str | None = None,
        timeout: float = 300.0,
        attempts: int = 3,
        temperature: float = 0.0,
        seed: int | None = 0,
        backoff_s: float = 0.5,
        slots: RequestSlots | None = None,
        max_backoff_s: float = MAX_BACKOFF_S,
        tool_parser: ToolParser = "none",
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        import openai

        self._find_url = base_url if callable(base_url) else None
        self.base_url = "" if callable(base_url) else base_url
        register_url(self.base_url)
        self._api_key = register_secret(api_key)
        self.model = model
        self.timeout = timeout
        self.max_backoff_s = max_backoff_s
        self.temperature = temperature
        self.seed = seed
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.slots = slots
        self.tool_parser: ToolParser = tool_parser
        """``hermes``: a reply to a request with tools that has no ``tool_calls`` has its
        calls read from its text (:mod:`~pytest_budgetbench.model.tool_parser`)."""
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        """Sent with every request (``--budgetbench-chat-template-kwargs``): the template's
        variables, as vLLM, SGLang and llama-server take them."""
        self._url_lock = threading.Lock()
        self._clients: DeadlineClients[Any] = DeadlineClients(self._new_client,
                                                              close=_close_client)
        if self._find_url is None:
            self._clients.give_back(self._new_client())
        self._retryable: tuple[type[Exception], ...] = (
            RequestTimeout,  # the whole request's deadline passed
            openai.APIConnectionError,  # includes APITimeoutError
            openai.RateLimitError,
            openai.InternalServerError,
        )
        self._api_error: type[Exception] = openai.APIError
        self._rejected: tuple[type[Exception], ...] = (openai.BadRequestError,
                                                       openai.UnprocessableEntityError)
        # The client's own post, not chat.completions.create: create() walks every message
        # through its TypedDict transform, about 10 ms per request on a 3K-token chat,
        # which was most of the harness's time per cell. The JSON sent is the same.
        from openai.types.chat import ChatCompletion

        self._completion_type = ChatCompletion

    def _url(self) -> str:
        """The endpoint's URL; for a callable ``base_url`` its first call (which may start
        a server, and raises EndpointError when that fails) gives it, once."""
        with self._url_lock:
            if self._find_url is not None and not self.base_url:
                self.base_url = self._find_url()
                register_url(self.base_url)
            return self.base_url

    def _new_client(self) -> Any:
        """An openai client: one per request in flight (see :mod:`~pytest_budgetbench.
        deadline`), each reused by later requests unless its request ran out of time."""
        import openai

        # Our own retry loop owns backoff, so the client's is off. Its timeout bounds each
        # read and write; the request as a whole is bounded by DeadlineClients.
        bare_url, query = request_target(self._url(), self._api_key)
        return openai.OpenAI(
            base_url=bare_url, api_key=self._api_key or "not-needed",
            timeout=self.timeout, max_retries=0, default_query=query or None,
            http_client=http_client_type()(timeout=self.timeout, verify=shared_ssl_context()),
        )

    def complete(self, messages: Sequence[Message], *, max_tokens: int,
                 tools: Sequence[Tool] | None = None,
                 response_format: Mapping[str, Any] | None = None) -> Completion:
        self._url()  # a server started on demand starts here, outside the request's deadline
        body: dict[str, Any] = {"model": self.model, "messages": as_sent(messages),
                                "max_tokens": max_tokens, "temperature": self.temperature,
                                "seed": self.seed}
        if tools:
            body["tools"] = list(tools)
        if response_format:
            body["response_format"] = dict(response_format)
        if self.chat_template_kwargs:
            body["chat_template_kwargs"] = self.chat_template_kwargs

        def post(client: Any) -> Any:
            return client.post("/chat/completions", cast_to=self._completion_type, body=body)

        for attempt in range(1, self.attempts + 1):
            try:
                with self.slots.hold() if self.slots else contextlib.nullcontext():
                    started = time.perf_counter()
                    # The timeout bounds the whole request: a reply that drips in, or never
                    # ends, is a timeout like a server that never answers.
                    response = self._clients.call(post, self.timeout)
                    latency_s = time.perf_counter() - started
            except self._retryable as exc:
                if attempt == self.attempts:
                    raise EndpointUnavailable(self._describe_failure(exc, attempt)) from None
                time.sleep(self._delay(attempt, exc))
                continue
            # "from None": the chained exception's text is the server's, unredacted.
            except self._rejected as exc:
                raise RequestRejected(self._describe_failure(exc, attempt)) from None
            except self._api_error as exc:
                raise EndpointError(self._describe_failure(exc, attempt)) from None
            except ValueError as exc:  # undecodable body
                raise MalformedReply(self._malformed(str(exc))) from None
            return self._parse(response, latency_s, tools)
        raise AssertionError("unreachable")

    @property
    def longest_wait_s(self) -> float:
        """No wait between attempts is longer than a request may take, nor than the cap."""
        return max(0.0, min(self.timeout, self.max_backoff_s))

    def _delay(self, attempt: int, exc: Exception) -> float:
        """Seconds to wait before the next attempt; raises EndpointError when the server
        asks for a wait longer than :attr:`longest_wait_s` (ending the call beats sleeping
        an hour)."""
        cap = self.longest_wait_s
        hinted, header = _retry_after(exc)
        if hinted is not None:
            if hinted > cap:
                raise EndpointUnavailable(redact(
                    f"model endpoint {redact_url(self.base_url)} asked to retry after "
                    f"{header!r} s (Retry-After) on attempt {attempt}, longer than the "
                    f"longest wait allowed ({cap:g} s: the smaller of --budgetbench-timeout "
                    f"and {self.max_backoff_s:g} s); gave up"
                )) from None
            return hinted
        return min(cap, self.backoff_s * (2 ** (attempt - 1)) * (0.5 + random.random()))

    def _describe_failure(self, exc: Exception, attempt: int) -> str:
        reason = f"{type(exc).__name__}: {first_line(exc)}"
        if isinstance(exc, RequestTimeout):
            reason += " (--budgetbench-timeout bounds the whole request, reply included)"
        return redact(
            f"model endpoint {redact_url(self.base_url)} failed after {attempt} attempt(s): "
            f"{reason}"
        )

    def _malformed(self, what: str) -> str:
        return redact(f"malformed reply from {redact_url(self.base_url)}: {first_line(what)}")

    @property
    def params(self) -> dict[str, Any]:
        """The generation parameters that shape a reply (a response cache keys on them);
        the template's variables where given (without them, the key is what it was)."""
        params: dict[str, Any] = {"temperature": self.temperature, "seed": self.seed}
        if self.chat_template_kwargs:
            params["chat_template_kwargs"] = self.chat_template_kwargs
        return params

    def _parse(self, response: Any, latency_s: float,
               tools: Sequence[Tool] | None = None) -> Completion:
        choices = getattr(response, "choices", None)
        if not choices or getattr(choices[0], "message", None) is None:
            raise MalformedReply(self._malformed("no choices/message"))
        message = choices[0].message
        calls = tuple(_call_dict(call) for call in (getattr(message, "tool_calls", None) or ()))
        text = message.content
        if text is None and calls:
            text = ""
        if not isinstance(text, str):
            raise MalformedReply(self._malformed("message has no content"))
        problem = shared_call_id(calls)
        if problem:  # checked as received: in a trajectory, it would read as a broken pair
            raise MalformedReply(self._malformed(problem))
        parsed = 0
        if tools and not calls and self.tool_parser == "hermes":
            reply = parse_tool_calls(text, tools)
            text, calls, parsed = reply.text, reply.tool_calls, len(reply.tool_calls)
        usage = getattr(response, "usage", None)
        return Completion(
            text=text,
            prompt_tokens=getattr(usage, "prompt_tokens", None),
            completion_tokens=getattr(usage, "completion_tokens", None),
            latency_s=latency_s,
            tool_calls=calls,
            parsed_tool_calls=parsed,
        )


def _call_dict(call: Any) -> dict[str, Any]:
    """One tool call of a reply as plain JSON data, the shape a trajectory keeps."""
    function = getattr(call, "function", None)
    return {"id": str(getattr(call, "id", "") or ""), "type": "function",
            "function": {"name": str(getattr(function, "name", "") or ""),
                         "arguments": arguments_text(getattr(function, "arguments", None))}}


def arguments_text(arguments: Any) -> str:
    """A call's arguments as JSON text, as the OpenAI format has them. Some servers send
    an object instead of its text; ``str()`` of it would be a Python repr, which no step
    checker or strategy reads as the JSON it is."""
    if arguments is None:
        return ""
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, ensure_ascii=False)


def _close_client(client: Any) -> None:
    client.close()


@functools.cache
def shared_ssl_context() -> Any:
    """The TLS context every model client of this process shares, made as the HTTP library
    under openai makes its default one (its CA bundle, ``SSL_CERT_FILE``): making one
    reads the CA bundle, some 30 ms of CPU, and a sweep makes a client per request in
    flight (64 for 4 replicas at --budgetbench-concurrency=16), all as its first cells
    start. A context serves many connections, in any thread. ``True`` (each client makes
    its own, as before) where that library cannot make one (httpx before 0.28)."""
    client = next(c for c in http_client_type().__mro__ if c.__name__ == "Client")
    library = sys.modules[client.__module__.partition(".")[0]]
    make = getattr(library, "create_ssl_context", None)
    return make() if make is not None else True


def http_client_type() -> type[Any]:
    """openai's default HTTP client (its timeouts, limits and redirects), closed when it
    is dropped, as openai closes the one it makes itself."""
    import openai

    # Keyed by the class: a pytester run in-process imports openai afresh, and openai
    # checks its client's class.
    return _closing(openai.DefaultHttpxClient)


@functools.cache
def _closing(client_type: type[Any]) -> type[Any]:
    class ClosingHttpClient(client_type):
        def __del__(self) -> None:
            with contextlib.suppress(Exception):  # at interpreter exit, say
                if not self.is_closed:
                    self.close()

    return ClosingHttpClient


def probe_endpoint(base_url: str, api_key: str | None, timeout: float = 10.0) -> list[str]:
    """The model ids an endpoint serves; raises EndpointError (one redacted line) when it
    cannot be reached. A query string in ``base_url`` is sent as query parameters."""
    import httpx

    register_url(base_url)
    register_secret(api_key)
    bare_url, query = request_target(base_url, api_key)
    url = bare_url.rstrip("/") + "/models"
    clients = DeadlineClients(lambda: httpx.Client(timeout=timeout), close=httpx.Client.close)
    try:
        response = clients.call(lambda client: client.get(
            url, headers=_auth_headers(api_key), params=query or None), timeout)
        response.raise_for_status()
        return [str(entry["id"]) for entry in response.json().get("data", [])]
    except httpx.HTTPStatusError as exc:
        status = exc.response.status_code
        reason = f"HTTP {status} {exc.response.reason_phrase} from {redact_url(url)}"
    except Exception as exc:  # any failure to list models means the endpoint is unusable
        reason = f"{type(exc).__name__}: {first_line(exc)}"
    finally:
        clients.close()
    raise EndpointError(redact(
        f"model endpoint {redact_url(base_url)} is not usable ({reason}); "
        "check --budgetbench-endpoint / BUDGETBENCH_ENDPOINT and that the server is up"
    ))


def _auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
