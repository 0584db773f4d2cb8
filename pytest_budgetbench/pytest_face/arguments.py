"""The plugin's pytest options: their registration, the settings they give, and the flags
that ``module:attr`` tasks and strategies declare."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from pytest_budgetbench.errors import BudgetBenchError
from pytest_budgetbench.options import Option
from pytest_budgetbench.redact import redact, register_secret, register_url
from pytest_budgetbench.settings.config import Settings, ini_text, load_settings
from pytest_budgetbench.settings.task_grammar import (
    TaskDefinition,
    parse_task_definition,
    split_top_level,
)

if TYPE_CHECKING:
    import pytest


def raw_option(config: pytest.Config, dest: str) -> str:
    """What --budgetbench-<dest> or its ini twin gives, as text, before settings exist."""
    raw = getattr(config.known_args_namespace, f"budgetbench_{dest}", None)
    if raw is None:
        raw = config.getini(f"budgetbench_{dest}") or ""
    return ini_text(raw)


def named_entries(config: pytest.Config, dest: str) -> list[str]:
    """The raw entries --budgetbench-<dest> or its ini twin gives, before settings exist."""
    return split_top_level(raw_option(config, dest))


def task_instances(config: pytest.Config, tasks: list[str]) -> dict[str, TaskDefinition]:
    """The named task instances, whose data flags the registries cannot list; a bad
    definition is left for the settings check to report."""
    found: dict[str, TaskDefinition] = {}
    definitions = [*split_top_level(raw_option(config, "named_tasks")),
                   *(entry for entry in tasks if "=" in entry)]
    for text in definitions:
        try:
            name, definition = parse_task_definition(text, "--budgetbench-tasks")
        except BudgetBenchError:
            continue
        found[name] = definition
    return found


def add_options(parser: pytest.Parser, specs: Sequence[Option]) -> None:
    group = parser.getgroup("budgetbench", "memory strategies under a token budget")
    added = {option.dest for option in group.options}
    for spec in specs:
        if f"budgetbench_{spec.dest}" in added:
            continue
        default = f" (default: {spec.default_text})" if spec.default not in (None, ()) else ""
        env = f" [env {spec.env}]" if spec.env else ""
        group.addoption(
            *spec.flags,
            dest=f"budgetbench_{spec.dest}",
            default=None,
            metavar=spec.metavar or spec.dest.upper(),
            help=f"{spec.help}{default}{env}",
        )
        parser.addini(spec.ini, help=spec.help, type=spec.ini_type, default=spec.ini_default)
    if "budgetbench_only" not in added:
        group.addoption(
            "--budgetbench-only", action="store_true", dest="budgetbench_only", default=False,
            help="run only the sweep: its cells, its gates and tests that use budget_cell",
        )


def settings_of(config: pytest.Config, declared: list[Option] | None) -> Settings:
    """The run's settings from pytest's options and ini, with ``declared`` flags (all the
    registered ones when None); a bad value is a pytest usage error."""
    import pytest

    try:
        if declared is None:
            from pytest_budgetbench.engine.declared import flag_specs

            declared = flag_specs()
        handed = handed_shard(config)
        settings = load_settings(
            lambda dest: handed[0] if handed and dest == "shard"
            else config.getoption(f"budgetbench_{dest}", None),
            lambda ini: config.getini(ini),
            declared,
        )
        if handed:
            settings = replace(settings, shard_source=handed[1])
        register_secrets(settings)
        if settings.active:
            from pytest_budgetbench.engine.preflight import check_settings

            check_settings(settings)
    except BudgetBenchError as exc:
        raise pytest.UsageError(redact(exc)) from None
    return settings


def handed_shard(config: pytest.Config) -> tuple[str, str | None] | None:
    """An xdist worker's shard, ``i/n`` and its source, as its controller resolved it:
    ``--budgetbench-shard=auto`` is read from the environment once, by the controller."""
    from pytest_budgetbench.pytest_face.xdist import worker_state

    index, count, source = (worker_state(config) or {}).get("shard") or (None, None, None)
    return None if index is None else (f"{index}/{count}", source)


def register_secrets(settings: Settings) -> None:
    """Tell the redaction layer every secret this run knows, before any text leaves."""
    register_secret(settings.api_key)
    for url in (settings.endpoint, *settings.replicas, settings.judge_endpoint,
                *(settings.aux_models or {}).values()):
        register_url(url)


def narrow_benchmark_table(config: pytest.Config) -> None:
    """A cell's model call is timed once: spread columns (stddev, IQR, outliers) say
    nothing, so pytest-benchmark's table shows the time and the round count, unless the
    command line chose columns. (pytest-benchmark reads the option after this hook.)"""
    if not hasattr(config.option, "benchmark_columns"):
        return
    if any(str(a).startswith("--benchmark-columns") for a in config.invocation_params.args):
        return
    config.option.benchmark_columns = ["mean", "rounds"]


def declared_flags(config: pytest.Config, parser: pytest.Parser,
                   registered: list[Option]) -> list[Option]:
    """The ``registered`` flags and those of the ``module:attr`` tasks and strategies the
    sweep names and of its named task instances, the latter added to ``parser``."""
    specs = list(registered)
    tasks = named_entries(config, "tasks")
    strategies = named_entries(config, "strategies")
    instances = task_instances(config, tasks)
    if instances or any(":" in name for name in (*tasks, *strategies)):
        from pytest_budgetbench.engine.declared import flag_specs

        specs += flag_specs(tasks, strategies, registered=False, known=specs, named=instances)
        add_options(parser, specs)
    return specs
