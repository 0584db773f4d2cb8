"""Which server answers at an endpoint, and how large a prompt its context holds: one probe
sequence, cheap GETs first, made once by the controller (``wiring.resolve_endpoint``).

Each server is told by a route only it answers, in the shape its documentation gives:

========================  ==============================================================
server                    recognised by, and its context size
========================  ==============================================================
llama.cpp ``llama-server``  ``GET /props``: ``default_generation_settings.n_ctx`` (a slot's
                          context) and ``chat_template_caps`` (llama.cpp
                          tools/server/README.md, "GET /props")
TGI                       ``GET /info``: ``max_input_tokens`` (``max_input_length`` before
                          TGI 2), ``max_total_tokens`` (router/src/lib.rs, ``Info``)
Ollama                    ``GET /api/version``, then ``POST /api/show {"model"}``:
                          ``parameters`` ``num_ctx``, else a loaded model's
                          ``context_length`` (``GET /api/ps``); ``model_info``
                          ``<arch>.context_length`` bounds it (docs/api.md, "Show Model
                          Information")
SGLang                    ``GET /get_model_info`` (``model_path``, ``is_generation``); the
                          context from ``GET /v1/models`` ``max_model_len`` (SGLang's
                          ``ModelCard``)
vLLM                      ``GET /v1/models``: the model's card ``owned_by: "vllm"``,
                          ``max_model_len``
========================  ==============================================================

Anything else is ``openai-compatible`` (its ``max_model_len`` used where its card has one).
The record (:class:`~pytest_budgetbench.records.run_json.ServerRecord`) goes with the
:class:`~pytest_budgetbench.model.endpoint.Endpoint` to every process, so a worker builds
the same token counter without probing again, and into run.json.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from pytest_budgetbench.errors import RequestTimeout
from pytest_budgetbench.model.deadline import DeadlineClients
from pytest_budgetbench.records.run_json import ServerRecord

LLAMA_SERVER = "llama-server"
TGI = "tgi"
OLLAMA = "ollama"
SGLANG = "sglang"
VLLM = "vllm"
OPENAI_COMPATIBLE = "openai-compatible"


_CONTEXT_HINTS = {
    LLAMA_SERVER: "start llama-server with a larger -c (each of --parallel N slots gets "
                  "1/N of it)",
    TGI: "start TGI with a larger --max-input-tokens",
    OLLAMA: "raise the model's num_ctx (PARAMETER num_ctx in a Modelfile, or the server's "
            "OLLAMA_CONTEXT_LENGTH)",
    SGLANG: "start SGLang with a larger --context-length",
    VLLM: "start vLLM with a larger --max-model-len",
}


def context_hint(kind: str) -> str:
    """How to give a server of ``kind`` a larger context, as one clause."""
    return _CONTEXT_HINTS.get(kind, "give the server a larger context")


def likely_cut(server: Mapping[str, Any]) -> str:
    """The likely cause of a cut prompt at ``server`` (a record of :func:`detect_server`):
    its context size, as far as it says it, and how to raise it."""
    kind, context = str(server.get("kind") or "server"), server.get("context")
    if context:
        return (f"the {kind}'s context size ({context} tokens, {server.get('context_from')}); "
                f"{context_hint(kind)}, or lower --budgets")
    return ("the server's context size, which it does not report (or a proxy that drops "
            f"messages); {context_hint(kind)}")


def server_root(base_url: str) -> str:
    """The server's root: the OpenAI routes' base without its ``/v1`` (the tokenizer and
    info routes of every server here live beside it, not under it)."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


class ServerClient:
    """Requests to a server's own routes, with the endpoint's credential and query, each
    bounded as a whole by ``timeout_s`` (:mod:`~pytest_budgetbench.model.deadline`)."""

    def __init__(self, base_url: str, api_key: str | None, timeout_s: float) -> None:
        import httpx

        from pytest_budgetbench.redact import register_secret, register_url, request_target

        register_url(base_url)
        register_secret(api_key)
        # A query string (https://host/v1?key=K) goes with every request, not into the path.
        bare_url, query = request_target(base_url, api_key)
        self.root = server_root(bare_url)
        self.timeout_s = timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._clients: DeadlineClients[httpx.Client] = DeadlineClients(
            lambda: httpx.Client(base_url=self.root, headers=headers, params=query,
                                 timeout=timeout_s),
            close=httpx.Client.close)

    def post(self, route: str, payload: Mapping[str, Any],
             timeout_s: float | None = None) -> Any:
        """The ``httpx.Response`` to ``POST route``; RequestTimeout when the answer, all of
        it, takes longer than ``timeout_s`` (else the client's)."""
        limit = timeout_s or self.timeout_s
        return self._clients.call(
            lambda client: client.post(route, json=dict(payload), timeout=limit), limit)

    def get(self, route: str) -> Any:
        return self._clients.call(lambda client: client.get(route), self.timeout_s)

    def close(self) -> None:
        self._clients.close()


def detect_server(base_url: str, model: str, api_key: str | None,
                  timeout_s: float = 10.0) -> ServerRecord:
    """What answers at ``base_url`` for ``model``, and its context size, probed as the
    module's table says; a route that fails or answers otherwise is the next one's turn."""
    client = ServerClient(base_url, api_key, timeout_s)
    probed: list[str] = []
    try:
        def fetch(route: str, payload: Mapping[str, Any] | None = None) -> Any:
            return _json_of(client, route, payload, probed)

        for detect in (_llama_server, _tgi, _ollama, _sglang, _openai):
            found = detect(fetch, model)
            if found is not None:
                return {**found, "probed": probed}
    finally:
        client.close()
    raise AssertionError("unreachable: _openai always answers")


Fetch = Callable[..., Any]
"""``fetch(route)`` GETs, ``fetch(route, payload)`` POSTs: the JSON answer, or None."""


def _json_of(client: ServerClient, route: str, payload: Mapping[str, Any] | None,
             probed: list[str]) -> Any:
    import httpx

    verb = "GET" if payload is None else "POST"
    try:
        response = client.get(route) if payload is None else client.post(route, payload)
    except (httpx.HTTPError, RequestTimeout) as exc:
        probed.append(f"{verb} {route}: {type(exc).__name__}")
        return None
    probed.append(f"{verb} {route}: HTTP {response.status_code}")
    if response.status_code != 200:
        return None
    try:
        return response.json()
    except ValueError:
        return None


def _positive(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and value > 0 else None


def _llama_server(fetch: Fetch, model: str) -> ServerRecord | None:
    props = fetch("/props")
    if not isinstance(props, dict) or not isinstance(
            props.get("default_generation_settings"), dict):
        return None
    caps = props.get("chat_template_caps")
    details: dict[str, Any] = {"build_info": props.get("build_info"),
                               "total_slots": props.get("total_slots")}
    if isinstance(caps, dict):
        details["chat_template_caps"] = caps
    return {"kind": LLAMA_SERVER,
            "context": _positive(props["default_generation_settings"].get("n_ctx")),
            "context_from": "GET /props default_generation_settings.n_ctx",
            "details": details}


def _tgi(fetch: Fetch, model: str) -> ServerRecord | None:
    info = fetch("/info")
    if not isinstance(info, dict) or "max_total_tokens" not in info:
        return None
    key = "max_input_tokens" if "max_input_tokens" in info else "max_input_length"
    return {"kind": TGI, "context": _positive(info.get(key)),
            "context_from": f"GET /info {key}",
            "details": {"version": info.get("version"), "model_id": info.get("model_id"),
                        "max_total_tokens": info.get("max_total_tokens")}}


def _ollama(fetch: Fetch, model: str) -> ServerRecord | None:
    version = fetch("/api/version")
    if not isinstance(version, dict) or set(version) != {"version"}:
        return None
    show = fetch("/api/show", {"model": model})
    show = show if isinstance(show, dict) else {}
    details: dict[str, Any] = {"version": version["version"],
                               "from": modelfile_from(str(show.get("modelfile") or "")),
                               # None: a version before capabilities, which may take tools
                               "capabilities": show.get("capabilities")}
    trained = _trained_context(show.get("model_info"))
    if trained is not None:
        details["context_length"] = trained
    context = _num_ctx(str(show.get("parameters") or ""))
    source = "POST /api/show parameters num_ctx"
    if context is None:
        context, source = _loaded_context(fetch("/api/ps"), model), "GET /api/ps context_length"
    if context is None and trained is not None:
        # Unset num_ctx: the server's default (OLLAMA_CONTEXT_LENGTH) applies, which no route
        # tells; the model's own limit still bounds it.
        context, source = trained, "POST /api/show model_info context_length (num_ctx unset)"
    return {"kind": OLLAMA, "context": context, "context_from": source if context else "",
            "details": details}


def modelfile_from(modelfile: str) -> str | None:
    """The ``FROM`` of a Modelfile as ``ollama show`` writes it: the model's blob path."""
    found = re.search(r"^FROM\s+(.+?)\s*$", modelfile, re.MULTILINE)
    return found.group(1) if found else None


def _num_ctx(parameters: str) -> int | None:
    found = re.search(r"^num_ctx\s+(\d+)\s*$", parameters, re.MULTILINE)
    return int(found.group(1)) if found else None


def _trained_context(model_info: Any) -> int | None:
    if not isinstance(model_info, dict):
        return None
    arch = model_info.get("general.architecture")
    return _positive(model_info.get(f"{arch}.context_length"))


def _loaded_context(running: Any, model: str) -> int | None:
    models = running.get("models") if isinstance(running, dict) else None
    for entry in models if isinstance(models, list) else []:
        if isinstance(entry, dict) and model in (entry.get("name"), entry.get("model")):
            return _positive(entry.get("context_length"))
    return None


def _sglang(fetch: Fetch, model: str) -> ServerRecord | None:
    info = fetch("/get_model_info")
    if not isinstance(info, dict) or "model_path" not in info or "is_generation" not in info:
        return None
    card = _model_card(fetch, model)
    return {"kind": SGLANG, "context": _positive(card.get("max_model_len")),
            "context_from": "GET /v1/models max_model_len",
            "details": {"model_path": info.get("model_path")}}


def _openai(fetch: Fetch, model: str) -> ServerRecord:
    card = _model_card(fetch, model)
    context = _positive(card.get("max_model_len"))
    return {"kind": VLLM if card.get("owned_by") == "vllm" else OPENAI_COMPATIBLE,
            "context": context,
            "context_from": "GET /v1/models max_model_len" if context else "",
            "details": {}}


def _model_card(fetch: Fetch, model: str) -> dict[str, Any]:
    listed = fetch("/v1/models")
    data = listed.get("data") if isinstance(listed, dict) else None
    cards = [card for card in data if isinstance(card, dict)] if isinstance(data, list) else []
    return next((card for card in cards if card.get("id") == model), cards[0] if cards else {})
