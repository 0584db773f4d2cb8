"""The composition root: endpoint, token counter, chat client, response cache, embedder and
runner, built from :class:`~pytest_budgetbench.settings.config.Settings`.

The plugin's session and ``budgetbench train-router`` both build their parts here, so a
fix to one (the cache key of the embedded server, say) is a fix to both. Everything heavy
(openai, llama.cpp, sentence-transformers, the tokenizers) is imported only when built.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_budgetbench.engine.catalog import Catalog
from pytest_budgetbench.engine.runner import Runner
from pytest_budgetbench.errors import EndpointError, TokenizerError
from pytest_budgetbench.model.chat import ChatBackend
from pytest_budgetbench.model.endpoint import Endpoint
from pytest_budgetbench.records.store import RunStore
from pytest_budgetbench.redact import has_userinfo, redact_url, split_query
from pytest_budgetbench.settings.config import Settings

if TYPE_CHECKING:
    from pytest_budgetbench.cache.database import MergeResult, SharedDatabase
    from pytest_budgetbench.cache.responses import ResponseStore
    from pytest_budgetbench.embedded_server import Launcher
    from pytest_budgetbench.model.chat import ChatModel, RequestSlots
    from pytest_budgetbench.model.replicas import ReplicaPool
    from pytest_budgetbench.model.structured import StructuredOutput
    from pytest_budgetbench.strategies import Embedder
    from pytest_budgetbench.tokens.base import TokenCounter



# -- endpoints -----------------------------------------------------------------------------
def resolve_endpoint(settings: Settings, *, model_flag: str = "--budgetbench-model") -> Endpoint:
    """The endpoint of ``settings.endpoint`` (which must be set), serving ``settings.model``
    or its first listed model; probed, so an unreachable one fails before any cell runs,
    and what server it is found (:func:`~pytest_budgetbench.model.servers.detect_server`:
    the counter for it, and its context size). Several replicas are each probed, and each
    must list that model."""
    from pytest_budgetbench.model.chat import probe_endpoint
    from pytest_budgetbench.model.servers import detect_server

    if settings.endpoint is None:
        raise ValueError("resolve_endpoint needs settings.endpoint; else embedded_launcher")
    served = probe_endpoint(settings.endpoint, settings.api_key)
    model = settings.model or (served[0] if served else None)
    if not model:
        raise EndpointError(
            f"{redact_url(settings.endpoint)} lists no models; pass {model_flag}=NAME"
        )
    for url in settings.replicas[1:]:
        check_replica(url, model, settings.api_key)
    return Endpoint(base_url=settings.endpoint, model=model, replicas=settings.replicas,
                    server=detect_server(settings.endpoint, model, settings.api_key))


def model_free_endpoint(settings: Settings) -> Endpoint:
    """A model-free sweep's endpoint: nothing to send to; with --budgetbench-tokenizer=auto
    its counter is the embedded default model's GGUF (read, never served)."""
    from pytest_budgetbench.model.endpoint import MODEL_FREE_LABEL

    gguf = None
    if settings.tokenizer == "auto":
        from pytest_budgetbench.embedded_server import embedded_gguf_path

        gguf = str(embedded_gguf_path())
    return Endpoint(base_url="", model=MODEL_FREE_LABEL, gguf_path=gguf, sends=False)


def check_replica(url: str, model: str, api_key: str | None) -> None:
    """A replica must be up and serve the pool's model: its replies share the cache's key."""
    from pytest_budgetbench.model.chat import probe_endpoint

    served = probe_endpoint(url, api_key)
    if served and model not in served:
        raise EndpointError(
            f"replica {redact_url(url)} does not serve model {model!r} (it lists "
            f"{', '.join(map(repr, served[:5]))}): every URL of --budgetbench-endpoint must "
            "be a replica of one model"
        )


def credential_line(settings: Settings) -> str | None:
    """Which credential the sweep's requests carry, for the line printed at its start (a
    variable's name and a URL without its secrets, never a secret); None without an
    endpoint. The API key wins over a URL's user info (see redact.request_target).
    Replicas that carry the same credential share one part of the line."""
    if not settings.endpoint:
        return None
    urls: dict[str, list[str]] = {}
    for url in settings.replicas or (settings.endpoint,):
        urls.setdefault(_credential_of(url, settings), []).append(redact_url(url))
    return "budgetbench: credential for " + "; for ".join(
        f"{', '.join(names)}: {used}" for used, names in urls.items())


def _credential_of(url: str, settings: Settings) -> str:
    var = f"${settings.api_key_env}"
    if settings.api_key:
        used = f"the API key in {var}, as Bearer"
        if has_userinfo(url):
            used += " (the URL's user info is not sent)"
    elif has_userinfo(url):
        used = f"the URL's user info, as Basic auth ({var} is not set)"
    else:
        used = f"none ({var} is not set)"
    if split_query(url)[1]:
        used += "; the URL's query parameters go with every request"
    return used


def resolve_aux(name: str, target: str, api_key: str | None) -> Endpoint:
    """An auxiliary model, ``URL#MODEL``, or a bare URL whose first listed model is used."""
    from pytest_budgetbench.model.chat import probe_endpoint

    url, _, model = target.partition("#")
    if not model:
        served = probe_endpoint(url, api_key)
        if not served:
            raise EndpointError(
                f"auxiliary model '{name}' at {redact_url(url)} lists no models; "
                f"pass --budgetbench-aux-models={name}=URL#MODEL"
            )
        model = served[0]
    return Endpoint(base_url=url, model=model)


# -- the parts of a runner -----------------------------------------------------------------
def make_counter(choice: str, endpoint: Endpoint, api_key: str | None = None,
                 chat_template_kwargs: Mapping[str, Any] | None = None) -> TokenCounter:
    """The token counter ``--budgetbench-tokenizer=choice`` asks for. ``server`` and, for an
    endpoint, ``auto`` count in the way of the server found there (``endpoint.server``):
    its own route, or for Ollama (``auto`` only) its model's checked GGUF. The template's
    variables (``chat_template_kwargs``) reach only a server's own rendering: another
    counter given them is refused, as its counts would leave them out."""
    from pytest_budgetbench.model.servers import OLLAMA
    from pytest_budgetbench.tokens.approximate import ApproxCounter
    from pytest_budgetbench.tokens.gguf import GGUFCounter
    from pytest_budgetbench.tokens.huggingface import HFCounter
    from pytest_budgetbench.tokens.server import DIALECTS, ServerCounter

    if choice == "approx":
        return ApproxCounter()
    kind = endpoint.server.get("kind")
    rendered_here = choice.startswith(("hf:", "gguf:")) or (
        choice == "auto" and (endpoint.gguf_path or kind == OLLAMA))
    if chat_template_kwargs and rendered_here:
        renders = "the model's GGUF" if choice == "auto" else choice
        raise TokenizerError(
            f"--budgetbench-chat-template-kwargs reach the server's template, and this "
            f"counter ({renders}) renders its own without them, so its counts would not be "
            "the server's: count through the server's own route (auto or server), or drop "
            "them")
    if choice.startswith("hf:"):
        return HFCounter(choice[len("hf:"):])
    if choice.startswith("gguf:"):
        return GGUFCounter(choice[len("gguf:"):])
    if choice == "auto" and endpoint.gguf_path:  # the embedded server's model: it renders
        return GGUFCounter(endpoint.gguf_path, object_arguments=True)  # arguments as objects
    if kind == OLLAMA:
        if choice == "server":
            raise TokenizerError(
                f"Ollama at {redact_url(endpoint.base_url)} has no tokenizer route "
                "(ollama/ollama#3582): pass --budgetbench-tokenizer=auto, which counts with "
                "its model's GGUF, checked against Ollama's own counts")
        return ollama_counter(endpoint, api_key)
    counter = ServerCounter(endpoint.base_url, endpoint.model, api_key,
                            dialect=DIALECTS.get(str(kind)),
                            chat_template_kwargs=chat_template_kwargs)
    if choice == "server":
        return counter
    try:
        counter.count_text("probe")
    except TokenizerError as exc:
        # The counter's message says which routes it tried and what to pass instead.
        raise TokenizerError(
            f"--budgetbench-tokenizer=auto cannot count for {redact_url(endpoint.base_url)}: "
            f"{exc}"
        ) from None
    return counter


def ollama_counter(endpoint: Endpoint, api_key: str | None) -> TokenCounter:
    """The counter of a model Ollama serves (:mod:`~pytest_budgetbench.tokens.ollama`): its
    GGUF, checked by probes against Ollama's counts; where the controller checked already
    (``endpoint.server``'s details hold its probes and the file), the same, unprobed."""
    from pytest_budgetbench.tokens.ollama import OllamaCounter, find_gguf, ollama_probe

    details = endpoint.server.get("details") or {}
    checked = details.get("checked")
    path = details.get("gguf") if checked else None
    return OllamaCounter(
        path or find_gguf(endpoint.model, details.get("from")), endpoint.model,
        probe=None if checked else ollama_probe(endpoint.base_url, endpoint.model, api_key),
        capabilities=details.get("capabilities"), checked=checked)


def counted_server(endpoint: Endpoint, counter: TokenCounter) -> Endpoint:
    """``endpoint`` with how ``counter`` counts for its server added to its record (for
    run.json, and for an xdist worker, which then builds the same counter unprobed)."""
    if not endpoint.server:
        return endpoint
    from dataclasses import replace

    from pytest_budgetbench.records.run_json import ServerRecord
    from pytest_budgetbench.tokens.ollama import OllamaCounter

    server: ServerRecord = {**endpoint.server, "counter": counter.name,
                            "exact": counter.exactness}
    if isinstance(counter, OllamaCounter):
        server["details"] = {**server.get("details", {}), "gguf": str(counter.gguf),
                             "checked": counter.checked}
    return replace(endpoint, server=server)


def open_response_store(path: Path, run_id: str, *,
                        this_run_only: bool = False) -> ResponseStore:
    from pytest_budgetbench.cache.responses import ResponseStore

    return ResponseStore(path, run_id=run_id, this_run_only=this_run_only)


def response_store_path(settings: Settings, run_dir: Path) -> Path | None:
    """The response cache's file under --budgetbench-cache, or None when replies are sampled."""
    return None if settings.cache_mode is None else _cache_file(settings, run_dir)


def _cache_file(settings: Settings, run_dir: Path) -> Path:
    """Where the response cache is, or would be: --budgetbench-cache-path, else in
    --budgetbench-out; private to the run directory under --budgetbench-cache=off."""
    from pytest_budgetbench.cache.responses import CACHE_FILE

    if settings.cache_mode == "off":
        return run_dir / CACHE_FILE
    return Path(settings.cache_path or Path(settings.out) / CACHE_FILE)


def session_response_store(settings: Settings, run_dir: Path,
                           run_id: str) -> ResponseStore | None:
    """The response cache of --budgetbench-cache, or None when replies are sampled."""
    path = response_store_path(settings, run_dir)
    if path is None:
        return None
    return open_response_store(path, run_id, this_run_only=settings.cache_mode == "refresh")


def existing_caches(settings: Settings, run_dir: Path) -> list[SharedDatabase]:
    """The cache files this run may read that exist already: replies, token counts and
    vectors (not opened yet)."""
    from pytest_budgetbench.cache.counts import COUNTS_FILE, CountDatabase
    from pytest_budgetbench.cache.responses import ResponseStore
    from pytest_budgetbench.cache.vectors import STORE_FILE, VectorStore

    stores: list[SharedDatabase] = []
    responses = response_store_path(settings, run_dir)
    if responses is not None and responses.exists():
        stores.append(ResponseStore(responses, run_id=run_dir.name))
    counts = derived_store_path(settings, run_dir, COUNTS_FILE)
    if counts.exists():
        stores.append(CountDatabase(counts))
    vectors = derived_store_path(settings, run_dir, STORE_FILE)
    if vectors.exists():
        stores.append(VectorStore(vectors))
    return stores


def check_caches(settings: Settings, run_dir: Path) -> None:
    """Before the first cell: a cache file this run would read that cannot be used (not a
    database, damaged, another program's) is one CacheError naming it and how to reset it."""
    for store in existing_caches(settings, run_dir):
        store.check()


def cache_rejections(settings: Settings, run_dir: Path, since: float) -> list[str]:
    """One line per cache file in which entries were rejected (failed their checksum, or had
    none) since ``since``: each was a miss, made again, never used."""
    from pytest_budgetbench.cache.database import REJECTED
    from pytest_budgetbench.errors import CacheError

    lines = []
    for store in existing_caches(settings, run_dir):
        try:
            rejected = store.rejected_since(since)
        except CacheError as exc:
            lines.append(str(exc))
            continue
        if rejected:
            counts = "; ".join(f"{count} {'entry' if count == 1 else 'entries'} "
                               f"{REJECTED.get(reason, reason)}"
                               for reason, count in sorted(rejected.items()))
            lines.append(f"{store.label} {store.path}: {counts}; each was treated as a miss "
                         "and made again")
    return lines


def make_chat(settings: Settings, endpoint: Endpoint, *,
              response_store: ResponseStore | None, slots_dir: Path,
              launcher: Launcher | None = None) -> ChatBackend:
    """The endpoint's client, behind the request slots and the response cache. The cache
    keys on ``endpoint.identity``: the embedded server's model and flags, not its port;
    several replicas' model, not the replica that answers. An endpoint without a URL yet
    (the embedded server) gets it from ``launcher`` on its first request that the cache
    cannot answer."""
    from pytest_budgetbench.model.chat import RequestSlots

    chat: ChatModel | ReplicaPool
    if endpoint.replicas:
        chat = replica_pool(settings, endpoint, slots_dir)
    else:
        slots = None
        if settings.concurrency is not None:
            slots = RequestSlots(slots_dir, settings.concurrency)
        url: str | Callable[[], str] = endpoint.base_url
        if not url:
            if launcher is None:
                raise ValueError(f"endpoint {endpoint.model!r} has no URL yet and no launcher")
            url = launcher.url
        chat = chat_model(settings, endpoint, url, slots)
    if response_store is None:
        return chat
    from pytest_budgetbench.cache.responses import CachingChatModel

    return CachingChatModel(chat, response_store, endpoint=endpoint.identity)


def chat_model(settings: Settings, endpoint: Endpoint, url: str | Callable[[], str],
               slots: RequestSlots | None = None) -> ChatModel:
    """The client of one URL of ``endpoint``, as ``settings`` ask for it."""
    from pytest_budgetbench.model.chat import ChatModel
    from pytest_budgetbench.model.tool_parser import parser_for

    return ChatModel(
        url,
        endpoint.model,
        api_key=settings.api_key,
        timeout=settings.timeout,
        attempts=settings.retries,
        temperature=settings.temperature,
        seed=settings.seed,
        slots=slots,
        tool_parser=parser_for(settings.tool_parser, endpoint.embedded),
        chat_template_kwargs=settings.chat_template_kwargs,
    )


def replica_pool(settings: Settings, endpoint: Endpoint, slots_dir: Path) -> ReplicaPool:
    """One client per replica of ``endpoint``, each with its own bound: with
    --budgetbench-concurrency, that many request slots per replica, shared by the xdist
    workers; without, one request at a time per replica from each process. Replicas
    taken out and back are kept in the run's ``replicas.jsonl``."""
    from pytest_budgetbench.model.replicas import ReplicaPool
    from pytest_budgetbench.records import replicas
    from pytest_budgetbench.records.replicas import ReplicaEvent
    from pytest_budgetbench.sweep.workers import worker_id

    events = RunStore(slots_dir.parent).replicas_path  # the slots live in the run's directory

    worker = worker_id()

    def record(event: ReplicaEvent) -> None:
        replicas.append_event(events, event, worker=worker, when=time.time())

    return ReplicaPool(
        [chat_model(settings, endpoint, url) for url in endpoint.replicas],
        per_replica=settings.concurrency or 1,
        slots_dir=slots_dir if settings.concurrency is not None else None,
        on_event=record,
        first=int("".join(filter(str.isdigit, worker or "")) or 0),  # gw3: workers start apart
    )


def replica_lines(run_dir: Path, since: float = 0.0) -> list[str]:
    """One line per replica taken out since ``since`` (this session: a resumed run's
    file holds earlier ones): how often, and its last failure."""
    from pytest_budgetbench.records.replicas import ReplicaEvent, read_events

    outs: dict[str, list[ReplicaEvent]] = {}
    for event in read_events(RunStore(run_dir).replicas_path):
        if event["event"] == "out" and float(event.get("time") or 0) >= since:
            outs.setdefault(str(event.get("replica")), []).append(event)
    return [f"replica {replica} was taken out {len(events)} time(s) and its requests sent "
            f"to the others; the last failure: {events[-1].get('error')}"
            for replica, events in outs.items()]


def structured_output(settings: Settings, endpoint: Endpoint, chat: ChatBackend,
                      response_store: ResponseStore | None) -> StructuredOutput:
    """How ``endpoint`` takes a JSON schema (--budgetbench-structured-output): probed
    through ``chat`` on first use under auto, the form kept in the response cache.

    Several replicas are probed through the first alone, not the pool: a form a server
    fails on (llama-cpp-python answers one with a 500) says nothing of its health, and
    the pool would take every replica out for it."""
    from pytest_budgetbench.model.structured import StructuredOutput

    probe_chat = chat_model(settings, endpoint, endpoint.replicas[0]) if endpoint.replicas \
        else chat
    return StructuredOutput(settings.structured_output, probe_chat,
                            identity=endpoint.identity, model=endpoint.model,
                            memo=response_store)


def embedding_store_path(settings: Settings, run_dir: Path) -> Path:
    """The persistent embedding cache, ``embeddings.sqlite`` (see :func:`derived_store_path`)."""
    from pytest_budgetbench.embeddings import STORE_FILE

    return derived_store_path(settings, run_dir, STORE_FILE)


def derived_store_path(settings: Settings, run_dir: Path, file_name: str) -> Path:
    """A persistent cache of values derived from content alone (vectors, token counts):
    ``file_name`` beside the response cache; with --budgetbench-cache=off private to the
    run directory, as the replies are. Such a value is a function of its key, so sampled
    runs (no response cache) and refresh runs share the file too: nothing in it goes stale."""
    return _cache_file(settings, run_dir).with_name(file_name)


def embedder_factory(settings: Settings, store_path: Path | None) -> Callable[[], Embedder]:
    """The run's embedder (``settings.embedding_model`` on ``settings.embedding_backend``,
    vectors kept in ``store_path``), made when a strategy first asks for it; its model
    loads only on the first vector that neither memory nor the store holds."""

    def factory() -> Embedder:
        from pytest_budgetbench.embeddings import make_embedder

        return make_embedder(settings.embedding_model, backend=settings.embedding_backend,
                             store_path=store_path)

    return factory


def make_runner(
    settings: Settings,
    catalog: Catalog,
    endpoint: Endpoint,
    store: RunStore,
    run_id: str,
    *,
    response_store: ResponseStore | None,
    aux_endpoints: Mapping[str, Endpoint] | None = None,
    tokens: TokenCounter | None = None,
    launcher: Launcher | None = None,
) -> Runner:
    """The runner of ``settings`` on ``endpoint``, writing into ``store``; ``tokens`` is a
    counter already loaded for them (else one is made); ``launcher`` starts the embedded
    server on the first reply the response cache does not hold."""
    slots_dir = store.slots_dir
    tokens = tokens or make_counter(settings.tokenizer, endpoint, settings.api_key,
                                    settings.chat_template_kwargs)
    if tokens.count_space is not None:  # a slow exact counter: a second sweep reuses counts
        from pytest_budgetbench.cache.counts import COUNTS_FILE, CountDatabase

        tokens.keep_counts_in(
            CountDatabase(derived_store_path(settings, store.run_dir, COUNTS_FILE)))

    def chat(target: Endpoint, launcher: Launcher | None = None) -> ChatBackend:
        return make_chat(settings, target, response_store=response_store, slots_dir=slots_dir,
                         launcher=launcher)

    aux_endpoints = dict(aux_endpoints or {})
    aux_chats = {name: chat(target) for name, target in aux_endpoints.items()}
    structured = {name: structured_output(settings, target, aux_chats[name], response_store)
                  for name, target in aux_endpoints.items()}
    if endpoint.sends:
        main_chat = chat(endpoint, launcher)
        structured["aux"] = structured_output(settings, endpoint, main_chat, response_store)
    else:  # model-free: a strategy's auxiliary calls go to the model named aux, if any
        from pytest_budgetbench.model.backend import NoModel

        main_chat = aux_chats.pop("aux") if "aux" in aux_chats else NoModel()
    return Runner(
        settings,
        catalog,
        endpoint,
        store,
        run_id,
        tokens=tokens,
        chat=main_chat,
        embedder_factory=embedder_factory(settings,
                                          embedding_store_path(settings, store.run_dir)),
        aux_chats=aux_chats,
        structured=structured,
    )


# -- caches that travel ----------------------------------------------------------------------
def caches_at(location: Path) -> list[SharedDatabase]:
    """The three caches of ``location`` (not opened; their files may not exist): a directory
    holds ``responses.sqlite``, ``counts.sqlite`` and ``embeddings.sqlite`` (an
    --budgetbench-out directory, the run directory of --budgetbench-cache=off, a merged
    copy); a file, or a path ending in ``.sqlite``, is a --budgetbench-cache-path file,
    with the other two beside it."""
    from pytest_budgetbench.cache.counts import COUNTS_FILE, CountDatabase
    from pytest_budgetbench.cache.responses import CACHE_FILE, ResponseStore
    from pytest_budgetbench.cache.vectors import STORE_FILE, VectorStore

    is_file = location.is_file() or (location.suffix == ".sqlite" and not location.is_dir())
    responses = location if is_file else location / CACHE_FILE
    return [ResponseStore(responses, run_id="merge"),
            CountDatabase(responses.with_name(COUNTS_FILE)),
            VectorStore(responses.with_name(STORE_FILE))]


def merge_caches(sources: list[Path], into: Path) -> list[MergeResult]:
    """Merge the caches of each of ``sources`` into those of ``into`` (see caches_at), as
    :meth:`~pytest_budgetbench.cache.database.SharedDatabase.merge_from` does, one file at a time:
    a union of checked entries; claims in flight and the rejected log stay behind. Every
    source file is checked before anything is written (a CacheError names a bad one), and
    only read: it may lie on a read-only volume or belong to another user."""
    from pytest_budgetbench.errors import ConfigError

    targets = {type(store): store for store in caches_at(into)}
    for target in targets.values():
        target.merge_target = True
    pairs = [(store, targets[type(store)]) for source in sources
             for store in caches_at(source) if store.path.is_file()]
    for store, target in pairs:
        store.read_only = True
        if store.path.resolve() == target.path.resolve():
            raise ConfigError(f"{store.path} is both a source and the destination of the "
                              "merge: pass another --into")
        for checked in (store, target):
            if checked.path.is_file():
                checked.check()
    try:
        return [target.merge_from(store) for store, target in pairs]
    finally:
        for store in (*targets.values(), *(store for store, _ in pairs)):
            store.close()
