"""One frozen settings object: command line > ini (``budgetbench_*``) > environment > default.

Every core option is declared once in ``OPTIONS``; tasks and strategies declare their own
(:mod:`pytest_budgetbench.options`), and this module names none of them. The plugin
registers each option with its ini twin, and :func:`load_settings` validates them all
before any cell is collected. A bad value is a :class:`ConfigError` (a
``pytest.UsageError`` at the command line) that names the value and the expected form.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pytest_budgetbench.errors import ConfigError
from pytest_budgetbench.task_grammar import (
    DEFINITION_EXAMPLE,
    TaskDefinition,
    parse_named_tasks,
    parse_task_list,
    task_entries,
)


def _is_count(text: str) -> bool:
    """ASCII digits only: str.isdigit() also accepts '²', which int() rejects."""
    return text.isascii() and text.isdigit()


def _name_list(option: str) -> Callable[[str], tuple[str, ...]]:
    def parse(raw: str) -> tuple[str, ...]:
        names = tuple(part.strip() for part in raw.split(",") if part.strip())
        if not names:
            raise ConfigError(f"{option} must name at least one entry, e.g. {option}=a,b (got '')")
        return names

    return parse


BUDGETS_OFF = "off"
"""``--budgets=off``: no sweep, even when the ini sets budgets."""


MAX_BUDGET = 10_000_000
"""The largest budget taken: the longest context windows served today are about 10M
tokens, so a larger number is a typo (an extra digit, a pasted byte count)."""


def parse_budgets(raw: str) -> tuple[int, ...]:
    if raw.strip() == BUDGETS_OFF:
        return ()
    parts = [part.strip() for part in raw.split(",")]
    budgets: list[int] = []
    for part in parts:
        if not _is_count(part) or int(part) <= 0:
            raise ConfigError(
                f"--budgets must be positive token counts separated by commas, "
                f"e.g. --budgets=2048,8192, or off (got {part!r} in {raw!r})"
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


def _positive_int(option: str) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        if not _is_count(str(raw).strip()) or int(raw) <= 0:
            raise ConfigError(f"{option} must be a positive integer (got {raw!r})")
        return int(raw)

    return parse


def _int(option: str) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"{option} must be an integer (got {raw!r})") from None

    return parse


def _rate(option: str) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not 0.0 <= value <= 1.0:
            raise ConfigError(f"{option} must be a rate between 0 and 1, e.g. 0.05 (got {raw!r})")
        return value

    return parse


def _non_negative_float(option: str) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not value >= 0:  # also rejects nan
            raise ConfigError(f"{option} must be a number >= 0 (got {raw!r})")
        return value

    return parse


def _positive_float(option: str) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            value = 0.0
        if not 0 < value < math.inf:  # also rejects nan
            raise ConfigError(f"{option} must be a number of seconds > 0, e.g. 30 (got {raw!r})")
        return value

    return parse


def _choice(option: str, choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        if raw not in choices:
            raise ConfigError(f"{option} must be one of {'|'.join(choices)} (got {raw!r})")
        return raw

    return parse


def _reference(raw: str) -> str:
    from pytest_budgetbench.cells import split_reference

    name, _budget = split_reference(raw)
    if not name or name.startswith("@") or name.endswith("@"):
        raise ConfigError(
            f"--budgetbench-reference must be strategy@budget, e.g. full_context@8192 "
            f"(got {raw!r})"
        )
    return raw


def _embedding_backend(raw: str) -> str:
    # The embeddings package owns the list; it is imported only when a value is given.
    from pytest_budgetbench.embeddings import check_backend

    return check_backend(raw)


def parse_key_values(option: str) -> Callable[[str], dict[str, str]]:
    def parse(raw: str) -> dict[str, str]:
        pairs: dict[str, str] = {}
        for part in (p.strip() for p in raw.split(",")):
            key, eq, value = part.partition("=")
            if not part or not eq or not key.strip() or not value.strip():
                raise ConfigError(
                    f"{option} must be KEY=VALUE pairs separated by commas, e.g. "
                    f"{option}=a=1,b=2 (got {part!r} in {raw!r})"
                )
            pairs[key.strip()] = value.strip()
        return pairs

    return parse


def parse_grader_variants(raw: str) -> dict[str, str]:
    """``TASK:VARIANT[,TASK:VARIANT]`` -> {task: variant} (the task checks the variant name)."""
    chosen: dict[str, str] = {}
    for part in (p.strip() for p in raw.split(",")):
        task, colon, variant = part.partition(":")
        if not colon or not task.strip() or not variant.strip():
            raise ConfigError(
                "--budgetbench-grader must be TASK:VARIANT pairs separated by commas, e.g. "
                f"--budgetbench-grader=locomo:first-line (got {part!r} in {raw!r})"
            )
        chosen[task.strip()] = variant.strip()
    return chosen


def parse_shard(raw: str) -> tuple[int, int]:
    index, slash, count = raw.partition("/")
    if slash and _is_count(index) and _is_count(count) and 1 <= int(index) <= int(count):
        return int(index), int(count)
    raise ConfigError(
        f"--budgetbench-shard must be i/n with 1 <= i <= n, e.g. --budgetbench-shard=2/4 "
        f"(got {raw!r})"
    )


def parse_tokenizer(raw: str) -> str:
    if raw in ("auto", "server", "approx") or raw.startswith(("hf:", "gguf:")):
        if raw in ("hf:", "gguf:"):
            raise ConfigError(f"--budgetbench-tokenizer={raw} needs a path after the colon")
        return raw
    raise ConfigError(
        "--budgetbench-tokenizer must be auto, server, approx, hf:<dir-or-tokenizer.json> "
        f"or gguf:<file.gguf> (got {raw!r})"
    )


@dataclass(frozen=True)
class OptionSpec:
    dest: str
    help: str
    parse: Callable[[str], Any]
    default: Any = None
    env: str | None = None
    metavar: str | None = None
    section: str = ""
    """Where a declared option's value goes: "data" (``Settings.data_paths``), "task"
    (``Settings.task_flags``) or "strategy" (``Settings.strategy_flags``); "" for a core
    option, a field of Settings."""
    key: str = ""
    """The declared option's key (for "data": the task's name)."""
    ini_type: Literal["string", "args", "linelist"] = "string"
    """pytest's ini type; "args" also takes a TOML list (``budgetbench_budgets = [512, 2048]``),
    "linelist" one entry per line (or a TOML list)."""

    @property
    def default_text(self) -> str:
        """The default as a user would type it: ``full_context,truncation,rag``."""
        if isinstance(self.default, tuple):
            return ",".join(str(part) for part in self.default)
        return str(self.default)

    @property
    def ini_default(self) -> str | list[str]:
        return "" if self.ini_type == "string" else []

    @property
    def flag(self) -> str:
        if self.dest == "budgets":
            return "--budgets"
        if self.dest.startswith("data_"):
            # Named after the task exactly: --budgetbench-data-longbench_v2.
            return "--budgetbench-data-" + self.dest[len("data_"):]
        return "--budgetbench-" + self.dest.replace("_", "-")

    @property
    def flags(self) -> tuple[str, ...]:
        """The flag, and its all-dashes spelling where that differs."""
        dashed = "--budgetbench-" + self.dest.replace("_", "-")
        return (self.flag,) if self.flag in (dashed, "--budgets") else (self.flag, dashed)

    @property
    def ini(self) -> str:
        return "budgetbench_" + self.dest


OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec("budgets", "token budgets, comma-separated; turns the sweep on (off: no sweep, "
               "even when the ini sets budgets)", parse_budgets, (), metavar="N,N|off",
               ini_type="args"),
    OptionSpec("strategies", "strategy names or module:attr, comma-separated",
               _name_list("--budgetbench-strategies"), ("full_context", "truncation", "rag"),
               ini_type="args"),
    OptionSpec("tasks", "task names, module:attr or NAME=TASK(KEY=VALUE,...) instances, "
               "comma-separated", parse_task_list, ("memory",), ini_type="args"),
    OptionSpec("named_tasks", "task instances the sweep may name, NAME=TASK(KEY=VALUE,...), "
               "comma-separated (in the ini: one per line), e.g. " + DEFINITION_EXAMPLE,
               parse_named_tasks, None, metavar="NAME=TASK(KEY=VALUE,...),...",
               ini_type="linelist"),
    OptionSpec("items", "items per task", _positive_int("--budgetbench-items"), 10),
    OptionSpec("seed", "seed for generated tasks and sampling", _int("--budgetbench-seed"), 0),
    OptionSpec("endpoint", "OpenAI-compatible base URL; default: the embedded llama.cpp server",
               str, None, env="BUDGETBENCH_ENDPOINT", metavar="URL"),
    OptionSpec("model", "model id to request from the endpoint", str, None,
               env="BUDGETBENCH_MODEL"),
    OptionSpec("vision", "the endpoint accepts image content parts: on | off (image tasks are "
               "skipped when off; the embedded SmolLM2 is text-only)",
               _choice("--budgetbench-vision", ("on", "off")), "off"),
    OptionSpec("max_tokens", "max output tokens per answer",
               _positive_int("--budgetbench-max-tokens"), 32),
    OptionSpec("temperature", "sampling temperature",
               _non_negative_float("--budgetbench-temperature"), 0.0),
    OptionSpec("api_key_env", "name of the environment variable holding the API key", str,
               "OPENAI_API_KEY", metavar="VAR"),
    OptionSpec("tokenizer", "auto | hf:<dir-or-tokenizer.json> | gguf:<file> | server | approx",
               parse_tokenizer, "auto"),
    OptionSpec("out", "directory for run records", str, "reports", metavar="DIR"),
    OptionSpec("audit", "store post-strategy prompts: full | hash | off",
               _choice("--budgetbench-audit", ("full", "hash", "off")), "full"),
    OptionSpec("max_violation_rate", "fail the session when a non-reference strategy's "
               "violation rate exceeds R", _rate("--budgetbench-max-violation-rate"), None,
               metavar="R"),
    OptionSpec("timeout", "seconds per model request",
               _positive_float("--budgetbench-timeout"), 300.0),
    OptionSpec("strategy_timeout", "seconds a strategy's reset() and apply() may take on one "
               "cell, its auxiliary calls included; a strategy over it errors that cell and "
               "the sweep goes on", _positive_float("--budgetbench-strategy-timeout"), 600.0,
               metavar="SECONDS"),
    OptionSpec("retries", "attempts per model request before the cell errors",
               _positive_int("--budgetbench-retries"), 3),
    OptionSpec("threads", "CPU threads for the embedded server (default: the cores it may use)",
               _positive_int("--budgetbench-threads"), None),
    OptionSpec("judge_endpoint", "OpenAI-compatible base URL of an LLM judge (LongMemEval)",
               str, None, env="BUDGETBENCH_JUDGE_ENDPOINT", metavar="URL"),
    OptionSpec("judge_model", "model id of the LLM judge", str, None,
               env="BUDGETBENCH_JUDGE_MODEL"),
    OptionSpec("embedding_model", "sentence-transformers model name or local directory for "
               "the run's embedder (retrieval strategies)", str, "all-MiniLM-L6-v2",
               metavar="NAME_OR_DIR"),
    OptionSpec("embedding_backend", "how the embedder runs: onnx (an ONNX export on "
               "onnxruntime, ranks as torch does) | onnx-int8 (int8 weights: faster, "
               "rankings differ on some queries) | torch; each backend's vectors are "
               "cached apart", _embedding_backend, "onnx", metavar="onnx|onnx-int8|torch"),
    OptionSpec("repeats", "run each cell K times (repeats are averaged per item in reports)",
               _positive_int("--budgetbench-repeats"), 1, metavar="K"),
    OptionSpec("shuffle", "randomise cell order with the seed: on | off",
               _choice("--budgetbench-shuffle", ("on", "off")), "off"),
    OptionSpec("report", "write summary/paired/categories CSVs, plots and HTML at session "
               "end: on | off", _choice("--budgetbench-report", ("on", "off")), "on"),
    OptionSpec("reference", "reference cell for paired deltas, strategy@budget "
               "(default: full_context at the largest budget)", _reference, None,
               metavar="STRATEGY@BUDGET"),
    OptionSpec("resamples", "bootstrap resamples per interval",
               _positive_int("--budgetbench-resamples"), 2000),
    OptionSpec("baseline", "a previous run's report.json for the regression gate", str, None,
               metavar="REPORT_JSON"),
    OptionSpec("max_regression", "fail when a strategy@budget's paired quality against the "
               "baseline falls by more than D (interval excluding 0), or its violation rate "
               "rose", _rate("--budgetbench-max-regression"), None, metavar="D"),
    OptionSpec("price_in", "USD per 1M prompt tokens, for cost columns",
               _non_negative_float("--budgetbench-price-in"), None, metavar="USD"),
    OptionSpec("price_out", "USD per 1M output tokens, for cost columns",
               _non_negative_float("--budgetbench-price-out"), None, metavar="USD"),
    OptionSpec("cache", "response cache: on (shared across runs) | refresh (send again, "
               "keep the new replies) | off (this run only); identical prompts are sent "
               "once in every mode (default: on at temperature 0, else no caching)",
               _choice("--budgetbench-cache", ("on", "off", "refresh")), None),
    OptionSpec("cache_path", "the response cache's SQLite file (default: "
               "<out>/responses.sqlite; a user cache directory works too)", str, None,
               env="BUDGETBENCH_CACHE_PATH", metavar="FILE"),
    OptionSpec("resume", "continue a run: its directory, or 'latest' in --budgetbench-out; "
               "cells recorded ok or violation are kept, errors and missing cells run",
               str, None, metavar="RUN_DIR|latest"),
    OptionSpec("shard", "run shard i of n; items are split, so paired cells stay together "
               "(merge with: budgetbench report DIR DIR ...)", parse_shard, None,
               metavar="i/n"),
    OptionSpec("concurrency", "model requests in flight at once, across xdist workers; "
               "without xdist, N>1 runs N cells concurrently (default: one per process)",
               _positive_int("--budgetbench-concurrency"), None, metavar="N"),
    OptionSpec("strategy_options", "options for the sweep's strategies, KEY=VALUE,KEY=VALUE "
               "(each key must be one a strategy of the sweep declares)",
               parse_key_values("--budgetbench-strategy-options"), None,
               metavar="KEY=VALUE,..."),
    OptionSpec("task_options", "options for the sweep's tasks, KEY=VALUE,KEY=VALUE (each key "
               "must be one a task of the sweep declares)",
               parse_key_values("--budgetbench-task-options"), None,
               metavar="KEY=VALUE,..."),
    OptionSpec("aux_models", "named auxiliary models for strategies, NAME=URL or "
               "NAME=URL#MODEL, comma-separated (default: every name uses the sweep's "
               "endpoint)", parse_key_values("--budgetbench-aux-models"), None,
               metavar="NAME=URL[#MODEL],..."),
    OptionSpec("grader", "a grader variant per task instead of upstream's grader, "
               "TASK:VARIANT,... (docs/tasks.md lists each task's variants)",
               parse_grader_variants, None, metavar="TASK:VARIANT,..."),
    OptionSpec("progress", "seconds between progress lines when the terminal is not a tty "
               "(on a tty the line is updated in place); 0 turns progress off",
               _non_negative_float("--budgetbench-progress"), 30.0, metavar="SECONDS"),
)
"""The core's options. Tasks and strategies declare their own (``options.Option``); the
plugin turns those into more OptionSpecs (``section`` set) and passes them to
:func:`load_settings`."""


@dataclass(frozen=True)
class Settings:
    budgets: tuple[int, ...] = ()
    strategies: tuple[str, ...] = ("full_context", "truncation", "rag")
    tasks: tuple[str, ...] = ("memory",)
    """Task names (a registered name, ``module:attr`` or a key of ``named_tasks``)."""
    named_tasks: dict[str, TaskDefinition] = field(default_factory=dict)
    """Named task instances, by name: --budgetbench-named-tasks and the definitions inline
    in --budgetbench-tasks."""
    items: int = 10
    seed: int = 0
    endpoint: str | None = None
    model: str | None = None
    vision: str = "off"
    max_tokens: int = 32
    temperature: float = 0.0
    api_key_env: str = "OPENAI_API_KEY"
    tokenizer: str = "auto"
    out: str = "reports"
    audit: str = "full"
    max_violation_rate: float | None = None
    timeout: float = 300.0
    strategy_timeout: float = 600.0
    retries: int = 3
    threads: int | None = None
    embedding_model: str = "all-MiniLM-L6-v2"
    embedding_backend: str = "onnx"
    judge_endpoint: str | None = None
    judge_model: str | None = None
    repeats: int = 1
    shuffle: str = "off"
    report: str = "on"
    reference: str | None = None
    resamples: int = 2000
    baseline: str | None = None
    max_regression: float | None = None
    price_in: float | None = None
    price_out: float | None = None
    cache: str | None = None
    cache_path: str | None = None
    resume: str | None = None
    shard: tuple[int, int] | None = None
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
        if self.aux_models:
            recorded["aux_models"] = {
                name: redact_url(target) for name, target in self.aux_models.items()
            }
        return recorded


def ini_text(raw: Any) -> str:
    """A TOML list (``[512, 2048]``) or a spaced ini line as the comma-separated text the
    command line takes."""
    if isinstance(raw, (list, tuple)):
        parts = (str(part).strip().strip(",").strip() for part in raw)
        return ",".join(part for part in parts if part)
    return str(raw)


def load_settings(
    get_option: Callable[[str], Any],
    get_ini: Callable[[str], Any],
    declared: Sequence[OptionSpec] = (),
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
        value = spec.default if raw is None else spec.parse(ini_text(raw))
        if not spec.section:
            values[spec.dest] = value
        elif raw is not None:
            sections[spec.section][spec.key] = ini_text(raw).strip()
    values["tasks"], inline = task_entries(values["tasks"])
    values["named_tasks"] = {**(values["named_tasks"] or {}), **inline}
    settings = Settings(**values, data_paths=sections["data"], data_flags=tuple(data_flags),
                        task_flags=sections["task"], strategy_flags=sections["strategy"])
    if (settings.baseline is None) != (settings.max_regression is None):
        raise ConfigError(
            "--budgetbench-baseline and --budgetbench-max-regression go together: "
            "pass both, e.g. --budgetbench-baseline=old/report.json "
            "--budgetbench-max-regression=0.05"
        )
    if settings.judge_endpoint and not settings.judge_model:
        raise ConfigError(
            "--budgetbench-judge-endpoint needs --budgetbench-judge-model=NAME "
            f"(endpoint given: {settings.judge_endpoint})"
        )
    return settings
