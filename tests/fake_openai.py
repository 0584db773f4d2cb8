"""A fake OpenAI-compatible chat server on loopback, for tests.

It answers memory-task questions by reading the prompt the way a perfect reader would
("What is my dog called?" -> the name stated in the prompt, else "unknown"), so a
strategy that drops the evidence scores lower, and it reports ``usage.prompt_tokens``
with the approximate counter, so tests can check the runner's count against it.

Faults are scripted per request: ``server.faults = ["500", "429", "timeout", "malformed",
"none", "null", "drop"]`` makes the next requests fail in that order (``""`` answers one
as usual: ``["", "500"]`` fails the second). For a fault-injection run,
``server.inject(rate, kinds, seed)`` makes each request fail with probability ``rate``
instead, with a kind drawn from ``kinds``. ``latency_s`` delays every answer, ``hold``
(an Event) keeps every answer back until it is set, and
``max_in_flight`` records the most requests it was ever serving at once.

``"drip"`` is a whole reply, padded to ``drip_bytes``, sent one byte every ``drip_s``
seconds: no single read ever waits long, yet the reply takes minutes. Every answer of a
route in ``drip_routes`` (e.g. ``{"/models", "/tokenize"}``) drips the same way.

``"duplicate_ids"`` is a 200 whose reply makes two tool calls that share one id: the
responder's first call twice, or, for a reply without calls, two to the request's first
tool (a request without tools gets its reply as it is). ``"malformed"`` is a 200 whose
body is not JSON: ``server.inject(1.0, ("malformed",))`` makes a replica that always
answers so.

``"429:<value>"`` is a 429 whose ``Retry-After`` is ``<value>`` (``inf``, ``3600``, an
HTTP date, garbage), and ``"401echo"`` a 401 whose body echoes the request's
``Authorization`` header back, as some servers do. ``queries`` holds each request's query
string, so tests can check that an endpoint's ``?key=…`` reaches the server, and
``authorizations`` each request's ``Authorization`` header ("" when none).

A request with a ``response_format`` of a type in ``response_formats`` (both
``json_schema`` and ``json_object`` by default, as vLLM and llama.cpp take them) is
answered by the responder as any other; with ``constrained = True`` as constrained
decoding would: the responder's reply when it is JSON, else the least value of the
request's schema (:func:`least_instance`). Another type is refused with
``reject_status`` (400; llama-cpp-python's server answers ``json_schema`` with a 500);
so ``response_formats = {"json_object"}`` with ``reject_status = 500`` is
llama-cpp-python, and ``set()`` a server that takes none.

A responder returns the reply's text, or a dict of the assistant message's fields
(``{"content": None, "tool_calls": [...]}``) for a reply with tool calls. Usage counts a
request's ``tools`` too.

``server`` makes it one of the servers teams run (:mod:`tests.fake_servers`): it answers
that server's own routes and counts ``usage.prompt_tokens`` as it does. ``cut_at = N``
makes it cut every prompt to its last message where it counts more than N tokens, and
report N, as a server with a context of N that truncates silently does (Ollama reports
the count after cutting).
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

from pytest_budgetbench.messages import text_of, tool_calls_of
from pytest_budgetbench.tokens.approximate import ApproxCounter
from tests.fake_servers import FakeServer

Responder = Callable[[list[dict[str, Any]]], "str | dict[str, Any]"]
"""The reply to a prompt: its text, or an assistant message's fields (``{"content": None,
"tool_calls": [...]}``) for a reply that calls tools."""
T = TypeVar("T")


def returning_within(limit_s: float, call: Callable[[], T]) -> T:
    """``call()``'s value or exception, failing the test when it is still running after
    ``limit_s`` seconds: a guard against a hang (a dripping reply), not a timing assertion."""
    outcome: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:  # re-raised in the test's thread
            outcome.append((False, exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit_s)
    assert not thread.is_alive(), f"still waiting after {limit_s:g} s"
    ok, value = outcome[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def reading_responder(messages: list[dict[str, Any]]) -> str:
    question = text_of(messages[-1])
    history = " ".join(text_of(m) for m in messages[:-1])
    asked = re.search(r"What is my (\w+) called", question)
    if asked:
        found = re.findall(rf"my {asked.group(1)} is called (\w+)", history)
        return found[-1] if found else "unknown"
    if "Which city do I live in" in question:
        found = re.findall(r"now I live in (\w+)", history)
        found = found or re.findall(r"I live in (\w+)", history)
        return found[-1] if found else "unknown"
    return "unknown"


def agent_responder(messages: list[dict[str, Any]]) -> str | dict[str, Any]:
    """A scripted agent for the ``agent_lookup`` task that acts on what the prompt still
    holds: it looks up the records in the order the request gives, going on after the
    last call it can see, then answers the first record's code from the tool results it
    can see ("unknown" when a strategy dropped or masked it). A summarising request (an
    auxiliary call) gets the record lines it can see."""
    visible = " ".join(text_of(m) for m in messages)
    if "summar" in text_of(messages[-1]).lower():
        return " ".join(re.findall(r"Record R\d+: code [A-Z]+\.", visible)) or "nothing"
    request = next((text_of(m) for m in messages
                    if m.get("role") == "user" and "lookup tool" in text_of(m)), "")
    order = re.search(r"in this order: ([R\d, ]+)\.", request)
    if order is None:
        return "unknown"
    keys = order.group(1).split(", ")
    called = [json.loads(call["function"]["arguments"]).get("key")
              for message in messages for call in tool_calls_of(message)]
    position = keys.index(called[-1]) + 1 if called and called[-1] in keys else 0
    if position < len(keys):
        key = keys[position]
        return {"content": None, "tool_calls": [{
            "id": f"call_{position}_{key}", "type": "function",
            "function": {"name": "lookup", "arguments": json.dumps({"key": key})}}]}
    found = re.findall(rf"Record {keys[0]}: code ([A-Z]+)", visible)
    return found[-1] if found else "unknown"


def least_instance(schema: dict[str, Any]) -> Any:
    """The smallest value that fits ``schema`` (the subset the harness's schemas use)."""
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    if "anyOf" in schema:
        return least_instance(schema["anyOf"][0])
    kind = schema.get("type")
    if kind == "object":
        properties = schema.get("properties", {})
        return {key: least_instance(properties.get(key, {}))
                for key in schema.get("required", [])}
    if kind == "array":
        return [least_instance(schema.get("items", {}))
                for _ in range(schema.get("minItems", 0))]
    return {"string": "x" * schema.get("minLength", 0), "integer": 0, "number": 0,
            "boolean": True, "null": None}.get(str(kind))


def schema_of(response_format: dict[str, Any]) -> dict[str, Any]:
    """The JSON schema a ``response_format`` carries, in either form."""
    if response_format.get("type") == "json_schema":
        return dict(response_format.get("json_schema", {}).get("schema", {}))
    return dict(response_format.get("schema", {}))


class FakeOpenAI:
    def __init__(self, responder: Responder = reading_responder, model: str = "fake-model",
                 port: int = 0):
        self.responder = responder
        self.model = model
        self.faults: list[str] = []
        self.requests: list[dict[str, Any]] = []
        self.queries: list[str] = []
        self.authorizations: list[str] = []
        self.timeout_s = 3.0
        self.latency_s = 0.0
        self.hold: threading.Event | None = None
        """When set to an Event, every chat request waits for it before it is answered."""
        self.injected: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.drip_s = 1.0
        self.drip_bytes = 600
        self.drip_routes: set[str] = set()
        self.response_formats: set[str] = {"json_schema", "json_object"}
        """The ``response_format`` types it takes; another is refused with ``reject_status``."""
        self.reject_status = 400
        self.constrained = False
        self._kind: FakeServer | None = None
        self.cut_at: int | None = None
        """Prompts over this many tokens are cut to their last message, usage says this."""
        self.tokenize_routes: set[str] = set()
        """Tokenizer routes it serves: "vllm" (/tokenize, messages in, count out),
        "extras" (llama-cpp-python's /extras/tokenize, text in, tokens out), "llama.cpp"
        (/tokenize, content in, tokens out). None by default."""
        self._random: random.Random | None = None
        self._rate = 0.0
        self._kinds: tuple[str, ...] = ()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def server(self) -> FakeServer | None:
        """One kind of server's own routes and counts (:mod:`tests.fake_servers`)."""
        return self._kind

    @server.setter
    def server(self, server: FakeServer | None) -> None:
        if server is not None:
            server.model = self.model
        self._kind = server

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> FakeOpenAI:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def inject(self, rate: float, kinds: tuple[str, ...], seed: int = 0) -> None:
        self._random, self._rate, self._kinds = random.Random(seed), rate, kinds

    def next_fault(self) -> str | None:
        with self._lock:
            if self.faults:
                fault: str | None = self.faults.pop(0)
            elif self._random is not None and self._random.random() < self._rate:
                fault = self._random.choice(self._kinds)
            else:
                fault = None
            if fault:
                self.injected.append(fault)
            return fault

    def _enter(self) -> None:
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def _leave(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None):
                if status == 200 and self.path.split("?")[0].rstrip("/").endswith(
                        tuple(fake.drip_routes)):
                    self._drip(body)
                    return
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

            def _drip(self, body: bytes) -> None:
                """A 200 whose body comes one byte at a time, until the client hangs up."""
                body = body.ljust(fake.drip_bytes)  # JSON allows trailing whitespace
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    for index in range(len(body)):
                        self.wfile.write(body[index:index + 1])
                        self.wfile.flush()
                        time.sleep(fake.drip_s)
                except OSError:  # the client gave up: that is the point
                    self.close_connection = True

            def _route(self) -> str:
                parts = urllib.parse.urlsplit(self.path)
                fake.queries.append(parts.query)
                fake.authorizations.append(self.headers.get("Authorization", ""))
                return parts.path.rstrip("/")

            def _answer_as_server(self, answer: tuple[int, Any] | None) -> bool:
                if answer is None:
                    return False
                status, body = answer
                self._send(status, json.dumps(body).encode())
                return True

            def do_GET(self) -> None:
                route = self._route()
                if fake.server is not None and self._answer_as_server(
                        fake.server.get(route)):
                    return
                if route.endswith("/models"):
                    body = {"object": "list", "data": [{"id": fake.model, "object": "model"}]}
                    self._send(200, json.dumps(body).encode())
                else:
                    self._send(404, b'{"error": "not found"}')

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                payload = json.loads(self.rfile.read(length) or b"{}")
                route = self._route()
                if fake.server is not None and self._answer_as_server(
                        fake.server.post(route, payload)):
                    return
                if self._tokenize(route, payload):
                    return
                if not route.endswith("/chat/completions"):
                    self._send(404, b'{"error": "not found"}')
                    return
                fake.requests.append(payload)
                wanted = payload.get("response_format")
                if wanted and wanted.get("type") not in fake.response_formats:
                    self._send(fake.reject_status, json.dumps({"detail": [{
                        "msg": f"unknown response_format type {wanted.get('type')!r}"}]
                    }).encode())
                    return
                fake._enter()
                try:
                    self._answer(payload)
                finally:
                    fake._leave()

            def _tokenize(self, path: str, payload: dict[str, Any]) -> bool:
                counter = ApproxCounter()
                routes = fake.tokenize_routes
                if path == "/tokenize" and "vllm" in routes and "model" in payload:
                    count = (counter.count_messages(payload["messages"], payload.get("tools"))
                             if "messages" in payload else counter.count_text(payload["prompt"]))
                    self._send(200, json.dumps({"count": count}).encode())
                elif path == "/tokenize" and "llama.cpp" in routes:
                    # Like llama.cpp's server: no "content", no tokens (and still 200).
                    text = payload.get("content", "")
                    tokens = list(range(counter.count_text(text))) if text else []
                    self._send(200, json.dumps({"tokens": tokens}).encode())
                elif path == "/extras/tokenize" and "extras" in routes:
                    tokens = list(range(counter.count_text(payload["input"])))
                    self._send(200, json.dumps({"tokens": tokens}).encode())
                else:
                    return False
                return True

            def _answer(self, payload: dict[str, Any]) -> None:
                fault = fake.next_fault()
                if fake.latency_s:
                    time.sleep(fake.latency_s)
                if fake.hold is not None:
                    fake.hold.wait(timeout=120)  # bounded: a test that forgets still ends
                if fault == "500":
                    self._send(500, b'{"error": {"message": "injected"}}')
                elif fault == "429":
                    self._send(429, b'{"error": {"message": "slow down"}}', {"Retry-After": "0"})
                elif fault and fault.startswith("429:"):
                    self._send(429, b'{"error": {"message": "slow down"}}',
                               {"Retry-After": fault[len("429:"):]})
                elif fault == "401echo":
                    echoed = self.headers.get("Authorization", "")
                    body = {"error": {"message": f"invalid credentials: {echoed}",
                                      "headers": {"authorization": echoed}}}
                    self._send(401, json.dumps(body).encode())
                elif fault == "timeout":
                    time.sleep(fake.timeout_s)
                    self._send(200, self._completion(payload))
                elif fault == "drip":
                    self._drip(self._completion(payload))
                elif fault == "malformed":
                    self._send(200, b'{"choices": [ {"mess')
                elif fault == "none":
                    self._send(200, json.dumps({"id": "x", "object": "chat.completion",
                                                "created": 0, "model": fake.model,
                                                "choices": []}).encode())
                elif fault == "duplicate_ids":
                    self._send(200, self._duplicate_ids(payload))
                elif fault == "null":
                    body = json.loads(self._completion(payload))
                    body["choices"][0]["message"]["content"] = None
                    self._send(200, json.dumps(body).encode())
                elif fault == "drop":
                    self.close_connection = True
                    self.wfile.flush()
                    self.connection.shutdown(2)
                else:
                    self._send(200, self._completion(payload))

            def _duplicate_ids(self, payload: dict[str, Any]) -> bytes:
                body = json.loads(self._completion(payload))
                message = body["choices"][0]["message"]
                calls = message.get("tool_calls") or [
                    {"id": "call_dup", "type": "function",
                     "function": {"name": tool["function"]["name"], "arguments": "{}"}}
                    for tool in payload.get("tools", [])[:1]]
                if calls:
                    message["content"] = None
                    message["tool_calls"] = [calls[0], dict(calls[0])]
                return json.dumps(body).encode()

            @staticmethod
            def _constrained(reply: str, schema: dict[str, Any]) -> str:
                try:
                    json.loads(reply)
                except ValueError:
                    return json.dumps(least_instance(schema))
                return reply

            def _completion(self, payload: dict[str, Any]) -> bytes:
                messages = payload["messages"]
                prompt_tokens = (fake.server.prompt_tokens(payload) if fake.server is not None
                                 else ApproxCounter().count_messages(messages,
                                                                     payload.get("tools")))
                if fake.cut_at is not None and prompt_tokens > fake.cut_at:
                    messages, prompt_tokens = messages[-1:], fake.cut_at
                reply = fake.responder(messages)
                if (fake.constrained and payload.get("response_format")
                        and isinstance(reply, str)):
                    reply = self._constrained(reply, schema_of(payload["response_format"]))
                message = {"role": "assistant",
                           **(reply if isinstance(reply, dict) else {"content": reply})}
                return json.dumps({
                    "id": "chatcmpl-fake", "object": "chat.completion", "created": 0,
                    "model": fake.model,
                    "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
                    "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 3,
                              "total_tokens": prompt_tokens + 3},
                }).encode()

        return Handler
