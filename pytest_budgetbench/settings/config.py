"""One frozen settings object: command line > ini (``budgetbench_*``) > environment > default.

Every core option is declared once in ``OPTIONS``, as an :class:`~pytest_budgetbench.options.Option`
like those tasks and strategies declare (:mod:`pytest_budgetbench.options`), and this module
names none of theirs. Each default is stated once, as the default of its field of
:class:`Settings`, and each choice once, as the ``Literal`` type of its field; a choice is
taken in any case (``--budgetbench-report=OFF``). The plugin
registers each option with its ini twin, and :func:`load_settings` validates them all
before any cell is collected. A bad value is a :class:`ConfigError` (a
``pytest.UsageError`` at the command line) that names the value and the expected form.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any, Literal, get_args, get_origin, get_type_hints

from pytest_budgetbench.errors import ConfigError
from pytest_budgetbench.options import (
    Option,
    Parser,
    choice,
    integer,
    is_count,
    keyed,
    name_list,
    non_negative,
    positive_int,
    rate,
    resolve_values,
    seconds,
)
from pytest_budgetbench.settings.task_grammar import (
    DEFINITION_EXAMPLE,
    TaskDefinition,
    parse_named_tasks,
    parse_task_list,
    task_entries,
)
from pytest_budgetbench.sweep.search import (
    BudgetSearch,
    check_grid,
    is_search,
    parse_search,
)
from pytest_budgetbench.sweep.shards import AUTO as AUTO_SHARD
from pytest_budgetbench.sweep.shards import shard_from_environment

TASK_OPTIONS_FLAG = "--budgetbench-task-options"
STRATEGY_OPTIONS_FLAG = "--budgetbench-strategy-options"

BUDGETS_OFF = "off"
"""``--budgets=off``: no sweep, even when the ini sets budgets."""


MAX_BUDGET = 10_000_000
"""The largest budget taken: the longest context windows served today are about 10M
tokens, so a larger number is a typo (an extra digit, a pasted byte count)."""


def parse_budgets(raw: str) -> tuple[int, ...] | BudgetSearch:
    """``N,N,...`` (sorted), ``off`` (none), or ``search:LO..HI``, a budget search
    (:mod:`~pytest_budgetbench.sweep.search`), which :func:`load_settings` turns into its
    grid of budgets and ``Settings.search``."""
    if raw.strip() == BUDGETS_OFF:
        return ()
    if is_search(raw):
        return parse_search(raw, MAX_BUDGET)
    parts = [part.strip() for part in raw.split(",")]
    budgets: list[int] = []
    for part in parts:
        if not is_count(part) or int(part) <= 0:
            raise ConfigError(
                f"--budgets must be positive token counts separated by commas, "
                f"e.g. --budgets=2048,8192, search:LO..HI (the smallest safe budget) or off "
                f"(got {part!r} in {raw!r})"
            )
        if int(part) > MAX_BUDGET:
            raise ConfigError(
                f"--budgets={raw}: {part} tokens is more than any served model takes in one "
                f"prompt; budgets go up to {MAX_BUDGET:,}"
            )
        if int(part) in budgets:
            raise ConfigError(
                f"--budgets={raw}: {part} is given twice; list each budget once"
            )
        budgets.append(int(part))
    return tuple(sorted(budgets))


def _reference(raw: str) -> str:
    from pytest_budgetbench.sweep.cells import split_reference

    name, _budget = split_reference(raw)
    if not name or name.startswith("@") or name.endswith("@"):
        raise ConfigError(
            f"--budgetbench-reference must be strategy@budget, e.g. full_context@8192 "
            f"(got {raw!r})"
        )
    return raw


def parse_key_values(option: str) -> Callable[[str], dict[str, str]]:
    def parse(raw: str) -> dict[str, str]:
        pairs: list[tuple[str, str]] = []
        for part in (p.strip() for p in raw.split(",")):
            key, eq, value = part.partition("=")
            if not part or not eq or not key.strip() or not value.strip():
                raise ConfigError(
                    f"{option} must be KEY=VALUE pairs separated by commas, e.g. "
                    f"{option}=a=1,b=2 (got {part!r} in {raw!r})"
                )
            pairs.append((key.strip(), value.strip()))
        return keyed(option, raw, pairs)

    return parse


def parse_grader_variants(raw: str) -> dict[str, str]:
    """``TASK:VARIANT[,TASK:VARIANT]`` -> {task: variant} (the task checks the variant name)."""
    chosen: list[tuple[str, str]] = []
    for part in (p.strip() for p in raw.split(",")):
        task, colon, variant = part.partition(":")
        if not colon or not task.strip() or not variant.strip():
            raise ConfigError(
                "--budgetbench-grader must be TASK:VARIANT pairs separated by commas, e.g. "
                f"--budgetbench-grader=locomo:first-line (got {part!r} in {raw!r})"
            )
        chosen.append((task.strip(), variant.strip()))
    return keyed("--budgetbench-grader", raw, chosen, named=lambda task: f"task {task!r}")


def parse_shard(raw: str) -> tuple[int, int] | str:
    """``i/n``, or :data:`~pytest_budgetbench.sweep.shards.AUTO`, which :func:`load_settings`
    resolves from the job engine's environment."""
    if raw.lower() == AUTO_SHARD:
        return AUTO_SHARD
    index, slash, count = raw.partition("/")
    if slash and is_count(index) and is_count(count) and 1 <= int(index) <= int(count):
        return int(index), int(count)
    raise ConfigError(
        f"--budgetbench-shard must be i/n with 1 <= i <= n, e.g. --budgetbench-shard=2/4, "
        f"or auto (from a Kubernetes Indexed Job or a SLURM array) (got {raw!r})"
    )


def resolve_shard(
    value: tuple[int, int] | str | None, origin: str, environ: Mapping[str, str]
) -> tuple[tuple[int, int] | None, str | None]:
    """The shard and where it came from (``Settings.shard_source``): ``auto`` read from
    the job engine's variables in ``environ``, else the option (its ``origin``) as given."""
    if value is None:
        return None, None
    if value == AUTO_SHARD:
        shard = shard_from_environment(environ)
        return (shard.index, shard.count), shard.source
    assert isinstance(value, tuple)
    return value, origin


MODEL_FREE = "none"
"""``--budgetbench-model=none``: a model-free sweep. Every prompt is built, counted and held
to its budget, and its evidence retention recorded; nothing is sent and no server starts."""


def parse_retention_floors(raw: str) -> dict[str, float]:
    """--budgetbench-min-retention's floors (:func:`parse_floors`)."""
    return parse_floors(raw, "--budgetbench-min-retention")


def parse_answer_floors(raw: str) -> dict[str, float]:
    """--budgetbench-min-answer-kept's floors (:func:`parse_floors`)."""
    return parse_floors(raw, "--budgetbench-min-answer-kept")


def parse_floors(raw: str, flag: str) -> dict[str, float]:
    """A floor gate's value, given by ``flag``: ``R`` (every non-reference strategy@budget)
    and/or ``STRATEGY@BUDGET=R`` entries, comma-separated -> {"": R, "truncation@2048": R,
    ...}; "" is the floor for the rest."""
    from pytest_budgetbench.options import rate

    floors: list[tuple[str, float]] = []
    for part in (p.strip() for p in raw.split(",")):
        key, eq, value = part.rpartition("=")
        strategy, at, budget = key.partition("@")
        well_formed = bool(part) and (not eq or (bool(strategy.strip()) and bool(at)
                                                 and is_count(budget.strip())))
        try:
            floor = rate(value) if well_formed else None
        except ValueError:
            floor = None
        if floor is None:
            raise ConfigError(
                f"{flag} must be a floor R between 0 and 1 for every "
                "non-reference strategy@budget, and/or STRATEGY@BUDGET=R entries, "
                f"comma-separated, e.g. {flag}=0.9,truncation@2048=0.5 "
                f"(got {part!r} in {raw!r})")
        floors.append((f"{strategy.strip()}@{int(budget)}" if eq else "", floor))
    return keyed(flag, raw, floors, named=_floor_named)


def _floor_named(key: str) -> str:
    return repr(key) if key else "the floor of every non-reference strategy@budget"


def cell_floor(floors: Mapping[str, float], strategy: str, budget: int,
               reference: bool) -> float | None:
    """The floor of ``strategy@budget`` among ``floors`` (:func:`parse_floors`), None for
    no floor gate: its own entry, else the floor of every non-reference strategy@budget (a
    reference, e.g. full_context, has a floor only when named)."""
    own = floors.get(f"{strategy}@{budget}")
    return own if own is not None or reference else floors.get("")


def unswept_floor(floors: Mapping[str, float], cells: Iterable[str],
                  flag: str = "--budgetbench-min-retention",
                  where: tuple[str, str] = ("this sweep", "it runs")) -> str | None:
    """Why a floor of ``floors`` cannot judge anything: it names a strategy@budget that is
    not among ``cells``, the ``strategy@budget`` of ``where`` (what has them, and its
    verb); None when each named one is there. Asked before whether any floor applies at
    all, so a mistyped cell is named as one, not taken for a sweep of references."""
    have = sorted(set(cells))
    for key in sorted(floors.keys() - {""} - set(have)):
        shown = f"{', '.join(have[:6])}{', ...' if len(have) > 6 else ''}"
        return (f"{flag}: {key} is not a strategy@budget of {where[0]} ({where[1]} "
                f"{shown or 'none'}); name one {where[1]}")
    return None


def parse_safe_budget_limits(raw: str) -> dict[str, int]:
    """``N`` (every non-reference strategy) and/or ``STRATEGY=N`` entries, comma-separated
    -> {"": N, "rag": N, ...}: the largest safe budget a budget search may find."""
    limits: list[tuple[str, int]] = []
    for part in (p.strip() for p in raw.split(",")):
        key, eq, value = part.rpartition("=")
        if not part or (eq and not key.strip()) or not is_count(value.strip()) \
                or int(value) <= 0:
            raise ConfigError(
                "--budgetbench-max-safe-budget must be a budget N for every non-reference "
                "strategy and/or STRATEGY=N entries, comma-separated, e.g. "
                f"--budgetbench-max-safe-budget=2048,full_context=4096 (got {part!r} in {raw!r})")
        limits.append((key.strip(), int(value)))
    return keyed("--budgetbench-max-safe-budget", raw, limits,
                 named=lambda key: repr(key) if key else "the maximum of every strategy")


def off_or_path(raw: str) -> str | None:
    """A path, or ``off`` (None): a file an option writes unless switched off."""
    if not raw:
        raise ValueError("must be a file path or off")
    return None if raw.lower() == "off" else raw


def parse_tokenizer(raw: str) -> str:
    if raw in ("auto", "server", "approx") or raw.startswith(("hf:", "gguf:")):
        if raw in ("hf:", "gguf:"):
            raise ConfigError(f"--budgetbench-tokenizer={raw} needs a path after the colon")
        return raw
    raise ConfigError(
        "--budgetbench-tokenizer must be auto, server, approx, hf:<dir-or-tokenizer.json> "
        f"or gguf:<file.gguf> (got {raw!r})"
    )


def json_object(raw: str) -> dict[str, Any]:
    """A JSON object, e.g. ``{"enable_thinking": false}``."""
    import json

    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ValueError('must be a JSON object, e.g. \'{"enable_thinking": false}\'')
    return value


def endpoint_urls(raw: str) -> tuple[str, ...]:
    """One endpoint URL, or the URLs of several replicas of one model, comma-separated. (A
    repeated flag still overrides, as every flag does: an ini's addopts stays overridable.)"""
    from pytest_budgetbench.redact import redact_url

    urls: list[str] = []
    for part in (part.strip() for part in raw.split(",")):
        if urls and "://" not in part and "?" in urls[-1]:
            urls[-1] += "," + part  # a comma in a query value (?keys=a,b) separates nothing
        elif part:
            urls.append(part)
    for url in urls:
        try:
            parts = urllib.parse.urlsplit(url)
            usable = (parts.scheme in ("http", "https") and bool(parts.hostname)
                      and parts.port != 0)  # .port raises for a port that is no number
        except ValueError:  # a bad port or bracketed host
            usable = False
        if not usable:
            raise ConfigError(
                "--budgetbench-endpoint must be http(s) URLs, comma-separated (one per "
                "replica of the model), e.g. --budgetbench-endpoint=http://localhost:8000/v1 "
                f"(got {redact_url(url)!r})")
        if urls.count(url) > 1:
            raise ConfigError(f"--budgetbench-endpoint lists {redact_url(url)} twice; "
                              "list each replica once")
    return tuple(urls)


def endpoint_fields(urls: tuple[str, ...] | None) -> dict[str, Any]:
    """Settings' ``endpoint`` (the first URL) and ``replicas`` (every URL, when more than
    one) from the URLs :func:`endpoint_urls` read."""
    urls = urls or ()
    return {"endpoint": urls[0] if urls else None,
            "replicas": urls if len(urls) > 1 else ()}


@dataclass(frozen=True)
class Settings:
    """The validated settings of a run. A field's default is its option's default and a
    choice's ``Literal`` type is its option's choices (:data:`OPTIONS` reads both here)."""

    budgets: tuple[int, ...] = ()
    """The budgets the sweep runs; under a search, the grid it may probe."""
    search: BudgetSearch | None = None
    """``--budgets=search:LO..HI`` (its step from --budgetbench-search-step): each task and
    strategy's smallest safe budget is searched for instead of sweeping ``budgets``."""
    search_step: int = 64
    max_safe_budget: dict[str, int] | None = None
    """The search's gate (:func:`parse_safe_budget_limits`)."""
    strategies: tuple[str, ...] = ("full_context", "truncation", "rag")
    tasks: tuple[str, ...] = ("memory",)
    """Task names (a registered name, ``module:attr`` or a key of ``named_tasks``)."""
    named_tasks: dict[str, TaskDefinition] = field(default_factory=dict)
    """Named task instances, by name: --budgetbench-named-tasks and the definitions inline
    in --budgetbench-tasks."""
    items: int = 10
    seed: int = 0
    endpoint: str | None = None
    """The endpoint's URL; with several replicas, the first (it answers /models and
    /tokenize for the pool)."""
    replicas: tuple[str, ...] = ()
    """Every URL of a model served by several replicas (``endpoint`` first); empty for
    one URL. Filled from --budgetbench-endpoint, which has no flag of its own."""
    model: str | None = None
    vision: Literal["on", "off"] = "off"
    max_tokens: int = 32
    agent_max_tokens: int = 256
    max_calls: int = 100
    temperature: float = 0.0
    api_key_env: str = "OPENAI_API_KEY"
    tokenizer: str = "auto"
    chat_template_kwargs: dict[str, Any] | None = None
    """Sent with every chat request, and with every count the server makes
    (vLLM, SGLang and llama-server render their chat templates with them; a server
    that does not know them ignores them in both)."""
    episodes: Literal["free-running", "teacher-forced"] = "free-running"
    """How agent episodes run (engine.episode): the model's own trajectory, or the
    reference's, one scored step at a time."""
    tool_parser: Literal["auto", "hermes", "none"] = "auto"
    structured_output: Literal["auto", "json_schema", "json_object", "off"] = "auto"
    out: str = "reports"
    audit: Literal["full", "hash", "off"] = "full"
    max_violation_rate: float | None = None
    min_retention: dict[str, float] | None = None
    """Retention floors (:func:`parse_retention_floors`): "" for every non-reference
    strategy@budget, ``strategy@budget`` for one."""
    min_answer_kept: dict[str, float] | None = None
    """Answer-kept floors (:func:`parse_answer_floors`), keyed as the retention floors."""
    timeout: float = 300.0
    strategy_timeout: float = 600.0
    retries: int = 3
    threads: int | None = None
    embedding_model: str = "all-MiniLM-L6-v2"
    embedding_backend: Literal["onnx", "onnx-int8", "torch"] = "onnx"
    """How the embedder runs (the embeddings package reads its choices from here)."""
    judge_endpoint: str | None = None
    judge_model: str | None = None
    repeats: int = 1
    shuffle: Literal["on", "off"] = "off"
    report: Literal["on", "off"] = "on"
    job_summary: str | None = None
    """The file the job summary is appended to at session end (reports.ci): GitHub
    Actions' $GITHUB_STEP_SUMMARY unless given; None (``off``) for none."""
    trend: str | None = None
    """The directory of github-action-benchmark's trend files, written at session end."""
    reference: str | None = None
    resamples: int = 2000
    baseline: str | None = None
    max_regression: float | None = None
    regression_test: Literal["noninferiority", "harm"] = "noninferiority"
    """The regression gate's test (docs/gates.md): non-inferiority passes only a change
    whose interval excludes a drop of more than the margin; harm fails only a shown drop."""
    price_in: float | None = None
    price_out: float | None = None
    cache: Literal["on", "off", "refresh"] | None = None
    cache_path: str | None = None
    resume: str | None = None
    shard: tuple[int, int] | None = None
    """Shard (index from 1, count); ``auto`` is resolved before Settings are made."""
    shard_source: str | None = None
    """Where ``shard`` came from, for run.json: the option, or the job engine's variables
    that ``auto`` read (e.g. ``SLURM array: SLURM_ARRAY_TASK_ID=5 (...)``)."""
    concurrency: int | None = None
    strategy_options: dict[str, str] | None = None
    """--budgetbench-strategy-options as given: each key must be declared by a strategy of
    the sweep, which parses it."""
    task_options: dict[str, str] | None = None
    """--budgetbench-task-options as given, checked the same way against the tasks."""
    aux_models: dict[str, str] | None = None
    grader: dict[str, str] | None = None
    progress: float = 30.0
    data_paths: dict[str, str] = field(default_factory=dict)
    data_flags: tuple[str, ...] = ()
    """The tasks of ``data_paths`` whose path came from the command line: such a flag for
    a task the sweep does not run is a usage error, while an ini or environment value is
    ignored (an ini may list the data of every task a team runs)."""
    task_flags: dict[str, str] = field(default_factory=dict)
    """Declared task options given by their own flag, ini or env (e.g.
    --budgetbench-memory-history is ``history_tokens``), by key, as text. Like a core
    setting, a flag applies to whichever tasks of the sweep declare its key."""
    strategy_flags: dict[str, str] = field(default_factory=dict)
    """The same for strategies (e.g. --budgetbench-rag-chunk is ``rag_chunk``)."""

    @property
    def active(self) -> bool:
        return bool(self.budgets)

    @property
    def model_free(self) -> bool:
        """``--budgetbench-model=none``: prompts are counted and checked, never sent."""
        return self.model == MODEL_FREE

    def retention_floor(self, strategy: str, budget: int, reference: bool) -> float | None:
        """The retention floor of ``strategy@budget`` (:func:`cell_floor`)."""
        return cell_floor(self.min_retention or {}, strategy, budget, reference)

    def answer_kept_floor(self, strategy: str, budget: int, reference: bool) -> float | None:
        """The answer-kept floor of ``strategy@budget`` (:func:`cell_floor`)."""
        return cell_floor(self.min_answer_kept or {}, strategy, budget, reference)

    @property
    def parallel_cells(self) -> int:
        """Cells one process runs at once: --budgetbench-concurrency requests in flight at
        each replica (one by default), so N replicas run N times as many."""
        return (self.concurrency or 1) * max(1, len(self.replicas))

    def raw_task_options(self) -> dict[str, str]:
        """Every task option given, as text: KEY=VALUE pairs win over an option's own flag."""
        return {**self.task_flags, **(self.task_options or {})}

    def raw_strategy_options(self) -> dict[str, str]:
        """Every strategy option given, as text: KEY=VALUE pairs win over an option's own
        flag (as they did when --budgetbench-rag-chunk was a core setting)."""
        return {**self.strategy_flags, **(self.strategy_options or {})}

    @property
    def cache_mode(self) -> str | None:
        """The effective cache mode; None means no cache and no dedup (sampled replies)."""
        if self.cache is not None:
            return self.cache
        return "on" if self.temperature == 0 else None

    @property
    def api_key(self) -> str | None:
        """The key, as a Secret: redacted from every message, ``'***'`` in any repr."""
        from pytest_budgetbench.redact import register_secret

        return register_secret(os.environ.get(self.api_key_env) or None)

    def public(self) -> dict[str, Any]:
        """Settings as recorded in run.json: never includes a secret (keys can hide in an
        endpoint's user info or query string)."""
        from dataclasses import asdict

        from pytest_budgetbench.redact import redact_url

        recorded = asdict(self)
        del recorded["data_flags"]  # where a path came from is not the run's
        for key in ("endpoint", "judge_endpoint"):
            if recorded[key]:
                recorded[key] = redact_url(recorded[key])
        recorded["replicas"] = [redact_url(url) for url in self.replicas]
        if self.aux_models:
            recorded["aux_models"] = {
                name: redact_url(target) for name, target in self.aux_models.items()
            }
        return recorded


def task_values(cls: type[Any], settings: Settings) -> dict[str, Any]:
    """The parsed values of the options the task class ``cls`` declares, as ``settings``
    give them or at their defaults."""
    return resolve_values(cls, settings.raw_task_options(), TASK_OPTIONS_FLAG)


def strategy_values(cls: type[Any], settings: Settings) -> dict[str, Any]:
    """The same for the strategy class ``cls``."""
    return resolve_values(cls, settings.raw_strategy_options(), STRATEGY_OPTIONS_FLAG)


def _default(name: str) -> Any:
    default = next(f for f in fields(Settings) if f.name == name).default
    return None if default is MISSING else default  # a default_factory's: none given


def _core(name: str, help: str, parse: Parser, **declared: Any) -> Option:
    """A core option: it fills the field ``name`` of Settings, whose default is its own."""
    return Option(name, help, parse, _default(name), **declared)


def literal_values(kind: Any) -> tuple[Any, ...]:
    """The values of a ``Literal`` type, also inside ``Literal[...] | None``."""
    if get_origin(kind) is Literal:
        return get_args(kind)
    return tuple(value for arg in get_args(kind) for value in literal_values(arg))


def _choices_of(name: str) -> Parser:
    """The parser of a choice: the values of the ``Literal`` type of the field ``name``."""
    return choice(*literal_values(get_type_hints(Settings)[name]))


OPTIONS: tuple[Option, ...] = (
    _core("budgets", "token budgets, comma-separated; turns the sweep on (off: no sweep, "
          "even when the ini sets budgets)", parse_budgets, metavar="N,N|off",
          ini_type="args", flag_names=("--budgets",)),
    _core("search_step", "the grid step of --budgets=search:LO..HI in tokens: the search "
          "answers to within it", positive_int, metavar="TOKENS"),
    _core("max_safe_budget", "with --budgets=search:LO..HI, fail a task and strategy whose "
          "smallest safe budget is above N (or none is found); STRATEGY=N for one strategy",
          parse_safe_budget_limits, metavar="N|STRATEGY=N,..."),
    _core("strategies", "strategy names or module:attr, comma-separated", name_list,
          ini_type="args"),
    _core("tasks", "task names, module:attr or NAME=TASK(KEY=VALUE,...) instances, "
          "comma-separated", parse_task_list, ini_type="args"),
    _core("named_tasks", "task instances the sweep may name, NAME=TASK(KEY=VALUE,...), "
          "comma-separated (in the ini: one per line), e.g. " + DEFINITION_EXAMPLE,
          parse_named_tasks, metavar="NAME=TASK(KEY=VALUE,...),...", ini_type="linelist"),
    _core("items", "items per task", positive_int),
    _core("seed", "seed for generated tasks and sampling", integer),
    _core("endpoint", "OpenAI-compatible base URL; several replicas of one model: their "
          "URLs, comma-separated (requests go to the least busy, a failing one is taken "
          "out); default: the embedded llama.cpp server",
          endpoint_urls, env="BUDGETBENCH_ENDPOINT", metavar="URL[,URL...]",
          ini_type="args"),
    _core("model", "model id to request from the endpoint (or an embedded model); none: a "
          "model-free sweep that builds, counts and checks every prompt and records its "
          "evidence retention, sending nothing and starting no server",
          str, env="BUDGETBENCH_MODEL"),
    _core("vision", "the endpoint accepts image content parts: on | off (image tasks are "
          "skipped when off; the embedded SmolLM2 is text-only)", _choices_of("vision")),
    _core("max_tokens", "max output tokens per answer", positive_int),
    _core("agent_max_tokens", "max output tokens per model call in an agent episode "
          "(a tool call needs more than a short answer)", positive_int),
    _core("max_calls", "model calls an agent episode may make before the runner ends it "
          "(a runaway agent); the row says it ended at the cap", positive_int),
    _core("temperature", "sampling temperature", non_negative),
    _core("episodes", "how agent episodes run: free-running (the model's replies drive "
          "them, graded as a whole) | teacher-forced (at each step of the task's reference "
          "trajectory the model predicts the next action, scored against the reference, "
          "and the reference action and its real result follow)", _choices_of("episodes")),
    _core("api_key_env", "name of the environment variable holding the API key", str,
          metavar="VAR"),
    _core("tokenizer", "auto | hf:<dir-or-tokenizer.json> | gguf:<file> | server | approx",
          parse_tokenizer),
    _core("chat_template_kwargs", "variables for the server's chat template, a JSON object "
          "sent with every chat request and every count the server makes (vLLM, SGLang, "
          "llama-server), e.g. '{\"enable_thinking\": false}'", json_object,
          metavar="JSON"),
    _core("tool_parser", "read tool calls from a reply's text when the endpoint returns "
          "none (Hermes <tool_call> blocks, fenced or bare JSON): auto (the embedded "
          "model only) | hermes | none", _choices_of("tool_parser")),
    _core("structured_output", "how an auxiliary call that expects JSON asks the endpoint "
          "for it (a JSON schema as response_format): auto (probe the endpoint once) | "
          "json_schema | json_object | off", _choices_of("structured_output")),
    _core("out", "directory for run records", str, metavar="DIR"),
    _core("audit", "store post-strategy prompts: full | hash | off", _choices_of("audit")),
    _core("max_violation_rate", "fail the session when a non-reference strategy's "
          "violation rate exceeds R", rate, metavar="R"),
    _core("min_retention", "fail the session when a non-reference strategy@budget's mean "
          "evidence retention (admitted prompts) is below R; STRATEGY@BUDGET=R sets one "
          "cell's floor", parse_retention_floors, metavar="R|STRATEGY@BUDGET=R,..."),
    _core("min_answer_kept", "fail the session when a non-reference strategy@budget's share "
          "of admitted prompts that kept the gold answer (over the items whose evidence "
          "holds it) is below R; STRATEGY@BUDGET=R sets one cell's floor",
          parse_answer_floors, metavar="R|STRATEGY@BUDGET=R,..."),
    _core("timeout", "seconds per model request", seconds),
    _core("strategy_timeout", "seconds a strategy's reset() and apply() may take on one "
          "cell, its auxiliary calls included; a strategy over it errors that cell and "
          "the sweep goes on", seconds, metavar="SECONDS"),
    _core("retries", "attempts per model request before the cell errors", positive_int),
    _core("threads", "CPU threads for the embedded server (default: the cores it may use)",
          positive_int),
    _core("judge_endpoint", "OpenAI-compatible base URL of an LLM judge (LongMemEval)",
          str, env="BUDGETBENCH_JUDGE_ENDPOINT", metavar="URL"),
    _core("judge_model", "model id of the LLM judge", str, env="BUDGETBENCH_JUDGE_MODEL"),
    _core("embedding_model", "sentence-transformers model name or local directory for "
          "the run's embedder (retrieval strategies)", str, metavar="NAME_OR_DIR"),
    _core("embedding_backend", "how the embedder runs: onnx (an ONNX export on "
          "onnxruntime, ranks as torch does) | onnx-int8 (int8 weights: faster, "
          "rankings differ on some queries) | torch; each backend's vectors are "
          "cached apart", _choices_of("embedding_backend")),
    _core("repeats", "run each cell K times (repeats are averaged per item in reports)",
          positive_int, metavar="K"),
    _core("shuffle", "randomise cell order with the seed: on | off", _choices_of("shuffle")),
    _core("report", "write summary/paired/categories CSVs, plots and HTML at session "
          "end: on | off", _choices_of("report")),
    _core("job_summary", "append a Markdown job summary at session end (the gates' "
          "verdicts, then the summary and paired tables, the run's id, model and counter), "
          "cut to GitHub's 1 MiB: to FILE, by default GitHub Actions' $GITHUB_STEP_SUMMARY; "
          "off: none", off_or_path, env="GITHUB_STEP_SUMMARY", metavar="FILE|off"),
    _core("trend", "write github-action-benchmark's trend files at session end to DIR: "
          "customBiggerIsBetter.json (quality, evidence retention) and "
          "customSmallerIsBetter.json (violation rate), one series per task x "
          "strategy@budget", str, metavar="DIR"),
    _core("reference", "reference cell for paired deltas, strategy@budget "
          "(default: full_context at the largest budget)", _reference, metavar="STRATEGY@BUDGET"),
    _core("resamples", "bootstrap resamples per interval", positive_int),
    _core("baseline", "a previous run's report.json for the regression gate", str,
          metavar="REPORT_JSON"),
    _core("max_regression", "the quality drop D a strategy@budget may lose against the "
          "baseline (judged by --budgetbench-regression-test); the gate also fails when its "
          "violation rate rose", rate, metavar="D"),
    _core("regression_test", "how the regression gate judges a quality change: "
          "noninferiority (pass only when the interval's lower bound is above -D) | "
          "harm (fail only when the fall exceeds D with the interval below zero)",
          _choices_of("regression_test")),
    _core("price_in", "USD per 1M prompt tokens, for cost columns", non_negative, metavar="USD"),
    _core("price_out", "USD per 1M output tokens, for cost columns", non_negative, metavar="USD"),
    _core("cache", "response cache: on (shared across runs) | refresh (send again, "
          "keep the new replies) | off (this run only); identical prompts are sent "
          "once in every mode (default: on at temperature 0, else no caching)",
          _choices_of("cache")),
    _core("cache_path", "the response cache's SQLite file (default: "
          "<out>/responses.sqlite; a user cache directory works too)", str,
          env="BUDGETBENCH_CACHE_PATH", metavar="FILE"),
    _core("resume", "continue a run: its directory, or 'latest' in --budgetbench-out; "
          "cells recorded ok or violation are kept, errors and missing cells run",
          str, metavar="RUN_DIR|latest"),
    _core("shard", "run shard i of n; items are split, so paired cells stay together "
          "(merge with: budgetbench report DIR DIR ...); auto: i and n from a Kubernetes "
          "Indexed Job (JOB_COMPLETION_INDEX, BUDGETBENCH_SHARD_COUNT), a SLURM array "
          "(SLURM_ARRAY_TASK_*) or BUDGETBENCH_SHARD_INDEX (0-based) and "
          "BUDGETBENCH_SHARD_COUNT", parse_shard, env="BUDGETBENCH_SHARD", metavar="i/n|auto"),
    _core("concurrency", "model requests in flight at once, across xdist workers, at each "
          "replica of the endpoint; without xdist, N x replicas > 1 runs that many cells "
          "concurrently (default: one per process, one per replica)",
          positive_int, metavar="N"),
    _core("strategy_options", "options for the sweep's strategies, KEY=VALUE,KEY=VALUE "
          "(each key must be one a strategy of the sweep declares)",
          parse_key_values("--budgetbench-strategy-options"), metavar="KEY=VALUE,..."),
    _core("task_options", "options for the sweep's tasks, KEY=VALUE,KEY=VALUE (each key "
          "must be one a task of the sweep declares)",
          parse_key_values("--budgetbench-task-options"), metavar="KEY=VALUE,..."),
    _core("aux_models", "named auxiliary models for strategies, NAME=URL or "
          "NAME=URL#MODEL, comma-separated (default: every name uses the sweep's "
          "endpoint)", parse_key_values("--budgetbench-aux-models"),
          metavar="NAME=URL[#MODEL],..."),
    _core("grader", "a grader variant per task instead of upstream's grader, "
          "TASK:VARIANT,... (docs/tasks.md lists each task's variants)",
          parse_grader_variants, metavar="TASK:VARIANT,..."),
    _core("progress", "seconds between progress lines when the terminal is not a tty "
          "(on a tty the line is updated in place); 0 turns progress off",
          non_negative, metavar="SECONDS"),
)
"""The core's options. Tasks and strategies declare their own; the plugin turns those with
a flag into more Options (``section`` set) and passes them to :func:`load_settings`."""


def ini_text(raw: Any) -> str:
    """A TOML list (``[512, 2048]``) or a spaced ini line as the comma-separated text the
    command line takes."""
    if isinstance(raw, (list, tuple)):
        parts = (str(part).strip().strip(",").strip() for part in raw)
        return ",".join(part for part in parts if part)
    return str(raw)


def check_margin(test: str, margin: float | None, margin_flag: str, test_flag: str) -> None:
    """A non-inferiority margin of 0 is never met (no run of any size excludes every
    drop), so it is refused before any cell runs rather than failing every gate."""
    if test == "noninferiority" and margin == 0:
        raise ConfigError(
            f"{margin_flag}=0 under the non-inferiority test can never pass: no run excludes "
            f"every drop; give the margin of quality you accept losing, e.g. {margin_flag}=0.05, "
            f"or use {test_flag}=harm to fail only on a shown drop")


def load_settings(
    get_option: Callable[[str], Any],
    get_ini: Callable[[str], Any],
    declared: Sequence[Option] = (),
) -> Settings:
    """Build Settings from pytest's option and ini lookups, validating every value.

    ``declared`` are the flags of options tasks and strategies declare; their values are
    validated here too, and land in ``data_paths``, ``task_options`` or ``strategy_options``.
    """
    values: dict[str, Any] = {}
    sections: dict[str, dict[str, str]] = {"data": {}, "task": {}, "strategy": {}}
    data_flags: list[str] = []
    for spec in (*OPTIONS, *declared):
        raw = get_option(spec.dest)
        if raw is not None and spec.section == "data":
            data_flags.append(spec.key)
        if raw is None:
            raw = get_ini(spec.ini) or None
        if raw is None and spec.env:
            raw = os.environ.get(spec.env) or None
        value = spec.default if raw is None else spec.read(ini_text(raw), spec.flags[0])
        if not spec.section:
            values[spec.dest] = value
        elif raw is not None:
            sections[spec.section][spec.key] = ini_text(raw).strip()
    # No sweep, no shard: an ini's `auto` must not stop `pytest tests/test_x.py` outside a job.
    values["shard"], values["shard_source"] = resolve_shard(
        values["shard"] if values["budgets"] else None, _shard_origin(get_option, get_ini),
        os.environ)
    values.update(endpoint_fields(values["endpoint"]))
    if isinstance(values["budgets"], BudgetSearch):
        values["search"] = replace(values["budgets"], step=values["search_step"])
        check_grid(values["search"], "--budgetbench-search-step")
        values["budgets"] = values["search"].grid
        if values["model"] is None and values["endpoint"] is None:
            values["model"] = MODEL_FREE  # a search is model-free unless a model is named
    values["tasks"], inline = task_entries(values["tasks"])
    # A name defined both inline and in --budgetbench-named-tasks is one key given twice.
    values["named_tasks"] = keyed(
        "--budgetbench-tasks with --budgetbench-named-tasks", None,
        [*(values["named_tasks"] or {}).items(), *inline.items()],
        named=lambda name: f"task {name!r}")
    settings = Settings(**values, data_paths=sections["data"], data_flags=tuple(data_flags),
                        task_flags=sections["task"], strategy_flags=sections["strategy"])
    if (settings.baseline is None) != (settings.max_regression is None):
        raise ConfigError(
            "--budgetbench-baseline and --budgetbench-max-regression go together: "
            "pass both, e.g. --budgetbench-baseline=old/report.json "
            "--budgetbench-max-regression=0.05"
        )
    check_margin(settings.regression_test, settings.max_regression,
                 "--budgetbench-max-regression", "--budgetbench-regression-test")
    if settings.model_free:
        check_model_free(settings)
    check_search(settings)
    if settings.judge_endpoint and not settings.judge_model:
        raise ConfigError(
            "--budgetbench-judge-endpoint needs --budgetbench-judge-model=NAME "
            f"(endpoint given: {settings.judge_endpoint})"
        )
    return settings


def check_search(settings: Settings) -> None:
    """A budget search needs a floor to search for, one for every strategy, and no option
    that only a list of budgets means; its gate needs a search."""
    search = settings.search
    if search is None:
        if settings.max_safe_budget:
            raise ConfigError(
                "--budgetbench-max-safe-budget gates the smallest safe budget a search finds: "
                "pass --budgets=search:LO..HI with it, e.g. --budgets=search:512..16384")
        return
    flag = f"--budgets={search.text}"
    floors = (("--budgetbench-min-retention", settings.min_retention or {}),
              ("--budgetbench-min-answer-kept", settings.min_answer_kept or {}))
    if not any(floor for _flag, floor in floors) and settings.max_violation_rate is None:
        raise ConfigError(
            f"{flag} searches for the smallest budget that meets your floors, and none is "
            "given: pass --budgetbench-min-retention=R, --budgetbench-min-answer-kept=R "
            "and/or --budgetbench-max-violation-rate=R, e.g. 0.9 and 0.05")
    for option, floor in floors:
        named = sorted(floor.keys() - {""})
        if named:
            raise ConfigError(
                f"{flag}: {option}={named[0]}=... names one budget, and a search tries "
                f"many; give one floor for every strategy, e.g. {option}=0.9")
    for given, option, why in (
            (settings.baseline, "--budgetbench-baseline", "compares fixed budgets"),
            (settings.shard, "--budgetbench-shard", "splits the items a probe needs whole"),
            (settings.trend, "--budgetbench-trend", "charts fixed budgets across commits")):
        if given is not None:
            raise ConfigError(f"{flag} cannot run with {option}, which {why}; run it with "
                              "--budgets=N,N, or search without it")


def check_model_free(settings: Settings) -> None:
    """A model-free sweep sends nothing and starts no server: an endpoint to send to, or a
    counter that asks a server, contradicts it."""
    from pytest_budgetbench.redact import redact_url

    if settings.endpoint:
        raise ConfigError(
            f"--budgetbench-model={MODEL_FREE} sends nothing, but --budgetbench-endpoint="
            f"{redact_url(settings.endpoint)} is given (or BUDGETBENCH_ENDPOINT): drop the "
            "endpoint, and count with your model's tokenizer, --budgetbench-tokenizer="
            "hf:DIR or gguf:FILE")
    if settings.tokenizer == "server":
        raise ConfigError(
            f"--budgetbench-model={MODEL_FREE} starts no server, so --budgetbench-tokenizer="
            "server has none to ask: count with gguf:FILE or hf:DIR (exact), auto (the "
            "embedded model's GGUF) or approx")


def _shard_origin(get_option: Callable[[str], Any], get_ini: Callable[[str], Any]) -> str:
    """Which of its places gave --budgetbench-shard (its flag, ini, then env win in turn)."""
    if get_option("shard") is not None:
        return "--budgetbench-shard"
    return "ini budgetbench_shard" if get_ini("budgetbench_shard") else "env BUDGETBENCH_SHARD"
