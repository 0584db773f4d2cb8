"""The counter for Ollama, which has no tokenizer route (ollama/ollama#3582): the served
model's own GGUF, counted with llama.cpp's tokenizer and the GGUF's chat template, where
that template was shown to count as Ollama's own does.

Ollama renders a chat with its model's template (a Go template, or a renderer of its own),
which no route returns rendered; what it does return is the count of a prompt, in a
reply's ``usage.prompt_tokens``. So the check renders probe conversations both ways and
compares the counts: the GGUF's template with the GGUF's tokenizer here, Ollama's through
one-token replies of its OpenAI-compatible route, the one the sweep sends to (a system and
a user message; a multi-turn chat; with the ``tools`` capability, a request with a tool, and
one whose history holds a tool call and its result). Every plain probe must agree, or the
counter is refused in one line; tool probes that disagree leave prompts with tools
uncountable (one line when one is counted), prompts without them exact.

The GGUF is the ``FROM`` blob of ``POST /api/show``'s modelfile where that path is on this
machine, else the model layer of its manifest, ``manifests/<host>/<namespace>/<model>/<tag>``
under ``$OLLAMA_MODELS`` (default ``~/.ollama/models``), whose digest names the blob
``blobs/sha256-<hex>`` (Ollama's docs/api.md and its models directory's layout). Tool
calls reach the template with their arguments as objects, as Ollama parses them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_budgetbench.errors import TokenizerError
from pytest_budgetbench.messages import Message, Tool
from pytest_budgetbench.tokens.gguf import GGUFCounter

MODELS_ENV = "OLLAMA_MODELS"
MODEL_LAYER = "application/vnd.ollama.image.model"
DEFAULT_HOST, DEFAULT_NAMESPACE, DEFAULT_TAG = "registry.ollama.ai", "library", "latest"

_TOOL: Tool = {"type": "function", "function": {
    "name": "lookup", "description": "Look up a record by its key.",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}},
                   "required": ["key"]}}}
_ASK: Message = {"role": "user", "content": "Look up record R1 and tell me its code."}
_CALLED: list[Message] = [_ASK, {"role": "assistant", "content": "", "tool_calls": [{
    "id": "call_1", "type": "function",
    "function": {"name": "lookup", "arguments": "{\"key\": \"R1\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "Record R1: code ABC."}]
PROBES: tuple[tuple[str, list[Message], list[Tool] | None], ...] = (
    ("system and user", [{"role": "system", "content": "You are terse."},
                         {"role": "user", "content": "Name one colour."}], None),
    ("multi-turn", [{"role": "user", "content": "Hi."},
                    {"role": "assistant", "content": "Hello."},
                    {"role": "user", "content": "Name one colour."}], None),
    ("a tool", [_ASK], [_TOOL]),
    ("a tool call and its result", _CALLED, [_TOOL]),
)
"""The probe conversations: a name, the messages, the tools (None: a plain probe)."""

Probe = Callable[[Sequence[Message], Sequence[Tool] | None], "int | None"]
"""Ollama's count of a prompt with tools (:func:`ollama_probe`); None where it gave none."""


def models_dir() -> Path:
    """Ollama's models directory on this machine: ``$OLLAMA_MODELS``, else its default."""
    configured = os.environ.get(MODELS_ENV)
    return Path(configured).expanduser() if configured else Path.home() / ".ollama" / "models"


def manifest_path(models: Path, name: str) -> Path:
    """The manifest of model ``name`` (``[host/][namespace/]model[:tag]``) under ``models``."""
    *prefix, last = name.split("/")
    model, _, tag = last.partition(":")
    host, namespace = DEFAULT_HOST, DEFAULT_NAMESPACE
    if len(prefix) == 1:
        namespace = prefix[0]
    elif prefix:
        host, namespace = prefix[0], "/".join(prefix[1:])
    return models / "manifests" / host / namespace / model / (tag or DEFAULT_TAG)


def manifest_blob(models: Path, name: str) -> Path | None:
    """The model layer's blob that the manifest of ``name`` names; None without one."""
    try:
        manifest = json.loads(manifest_path(models, name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for layer in manifest.get("layers", []) if isinstance(manifest, dict) else []:
        if isinstance(layer, dict) and layer.get("mediaType") == MODEL_LAYER:
            blob = models / "blobs" / str(layer.get("digest", "")).replace(":", "-")
            return blob if blob.is_file() else None
    return None


def find_gguf(model: str, served_from: str | None) -> Path:
    """The GGUF Ollama serves ``model`` from (``served_from``: its modelfile's ``FROM``);
    a TokenizerError saying what to pass where it is not on this machine."""
    if served_from and Path(served_from).is_file():
        return Path(served_from)
    models = models_dir()
    blob = manifest_blob(models, model)
    if blob is not None:
        return blob
    where = f" from {served_from}" if served_from else ""
    raise TokenizerError(
        f"Ollama serves {model!r}{where}, which is not on this machine, and no manifest under "
        f"{models} names it: set {MODELS_ENV}=DIR (that server's models folder, mounted "
        "here), or pass --budgetbench-tokenizer=gguf:PATH (a copy of the model's file; its "
        "own template is then not checked against Ollama's) or approx")


class OllamaCounter(GGUFCounter):
    """The GGUF counter of a model Ollama serves, its template checked against Ollama's
    counts (see the module). ``checked`` are the probes another process ran already (the
    controller's, handed to an xdist worker): given, none is sent again."""

    def __init__(self, gguf: str | Path, model: str, *,
                 probe: Probe | None = None, capabilities: Sequence[str] | None = None,
                 checked: Sequence[Mapping[str, Any]] | None = None) -> None:
        """``probe(messages, tools)`` is Ollama's count of a prompt (:func:`ollama_probe`);
        ``capabilities`` are the model's, as ``/api/show`` lists them (None: a version that
        lists none, whose tools are probed all the same)."""
        super().__init__(gguf, object_arguments=True)
        self.name = f"ollama:{model}"
        self._model = model
        self.gguf = Path(gguf)
        self._tools_refusal: str | None = None  # the probes count with tools: none yet
        with_tools = capabilities is None or "tools" in capabilities
        self.checked: list[dict[str, Any]] = (
            [dict(entry) for entry in checked] if checked is not None
            else self._check(probe, with_tools))
        plain = [entry for entry in self.checked if not entry["tools"]]
        differing = [entry for entry in plain if entry["ollama"] != entry["gguf"]]
        if differing:
            raise TokenizerError(
                f"Ollama's template for {model!r} counts otherwise than its GGUF's chat "
                f"template ({_compared(differing[0])}), so no count made here would be "
                "exact: pass --budgetbench-tokenizer=approx, or serve the GGUF with "
                "llama-server, whose own routes count exactly")
        tools = [entry for entry in self.checked if entry["tools"]]
        self._tools_refusal = (
            f"Ollama says {model!r} takes no tools (its /api/show capabilities)"
            if not tools else next((
                f"Ollama's template renders tools for {model!r} otherwise than its GGUF's "
                f"chat template ({_compared(entry)}): prompts with tools cannot be counted "
                "exactly here; count with --budgetbench-tokenizer=approx, or serve the GGUF "
                "with llama-server" for entry in tools if entry["ollama"] != entry["gguf"]),
                None))

    def _check(self, probe: Probe | None, with_tools: bool) -> list[dict[str, Any]]:
        if probe is None:
            raise ValueError("OllamaCounter needs probe= or checked=")
        return [{"probe": name, "tools": bool(tools), "ollama": probe(messages, tools),
                 "gguf": self._rendered(name, messages, tools)}
                for name, messages, tools in PROBES if with_tools or not tools]

    def _rendered(self, name: str, messages: list[Message], tools: list[Tool] | None) -> int:
        """The GGUF's count of a probe; a template that cannot render it is one line."""
        try:
            return self.count_whole(messages, tools)
        except Exception as exc:  # jinja's errors, or the template's own raise_exception
            from pytest_budgetbench.redact import first_line

            raise TokenizerError(
                f"the chat template of {self.gguf.name} (Ollama's {self._model!r}) cannot "
                f"render the probe '{name}' ({type(exc).__name__}: {first_line(exc)}): pass "
                "--budgetbench-tokenizer=approx") from None

    @property
    def exactness(self) -> str:
        names = ", ".join(entry["probe"] for entry in self.checked
                          if entry["ollama"] == entry["gguf"])
        tools = ("; prompts with tools are refused" if self._tools_refusal
                 else "; tools included")
        return (f"the tokenizer exact (the model's GGUF, {self.gguf.name}); its chat template "
                f"matched Ollama's counts on the probes ({names}){tools}")

    def _count_prompt(self, messages: Sequence[Message],
                      tools: Sequence[Tool] | None = None) -> int:
        if tools and self._tools_refusal:
            raise TokenizerError(self._tools_refusal)
        return super()._count_prompt(messages, tools)

    def prompt_token_ids(self, messages: Sequence[Message],
                         tools: Sequence[Tool] | None = None) -> list[int] | None:
        return None if tools and self._tools_refusal else super().prompt_token_ids(
            messages, tools)


def _compared(entry: Mapping[str, Any]) -> str:
    ollama = ("gave no count" if entry["ollama"] is None
              else f"counted {entry['ollama']} prompt tokens")
    return f"probe '{entry['probe']}': Ollama {ollama}, the GGUF {entry['gguf']}"


def ollama_probe(base_url: str, model: str, api_key: str | None,
                 timeout_s: float = 120.0) -> Probe:
    """Ollama's count of a prompt: a one-token reply's ``usage.prompt_tokens`` from its
    OpenAI-compatible route (``POST /v1/chat/completions``), the route the sweep uses."""
    from pytest_budgetbench.model.servers import ServerClient

    client = ServerClient(base_url, api_key, timeout_s)

    def probe(messages: Sequence[Message], tools: Sequence[Tool] | None) -> int | None:
        from pytest_budgetbench.tokens.server import chat_request

        payload = {**chat_request(model, messages, tools, None), "max_tokens": 1,
                   "temperature": 0, "stream": False}
        try:
            response = client.post("/v1/chat/completions", payload)
            body = response.json() if response.status_code == 200 else None
        except Exception as exc:  # unreachable, no JSON: nothing to compare with
            raise TokenizerError(f"Ollama did not answer a probe of {model!r} "
                                 f"({type(exc).__name__}): its counts cannot be checked"
                                 ) from None
        usage = body.get("usage") if isinstance(body, dict) else None
        count = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        return int(count) if isinstance(count, int) else None

    return probe
