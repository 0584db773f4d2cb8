"""Everything that can be checked before the first cell, checked before it.

A sweep that would fail on its thousandth cell, or after its last, for a reason known at
its start (a missing tokenizer file, a baseline it cannot compare with, a cache it cannot
write) is stopped at the start instead, with one line, and before anything is written.

- :func:`check_settings` needs only the options (and imports the classes they name): the
  plugin runs it in every process at configure time.
- :func:`check_sweep` needs the tasks' data and the cells: the controller runs it before
  it resolves the endpoint and writes run.json.
- :func:`check_context` and :func:`check_tokenizer` need the endpoint: the controller runs
  them once the endpoint is known, before run.json, the second with the loader of the
  counter the wiring makes for it.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_budgetbench.errors import (
    ConfigError,
    DataError,
    MissingDependency,
    NothingToRun,
    Requirement,
    TokenizerError,
    UnsupportedPython,
    first_missing,
)
from pytest_budgetbench.messages import Message
from pytest_budgetbench.reports.gates.verdicts import (
    ANSWER_GATE,
    RETENTION_GATE,
    VIOLATION_GATE,
    gate_specs,
)
from pytest_budgetbench.settings.config import Settings, unswept_floor
from pytest_budgetbench.sweep.cells import Cell, split_reference

if TYPE_CHECKING:
    from pytest_budgetbench.engine.catalog import Catalog
    from pytest_budgetbench.model.endpoint import Endpoint
    from pytest_budgetbench.strategies import Strategy
    from pytest_budgetbench.tasks import Task
    from pytest_budgetbench.tokens.base import TokenCounter


def check_settings(settings: Settings) -> None:
    """Names, options and paths, from the settings alone; a ConfigError names the value."""
    from pytest_budgetbench.engine.declared import check_options
    from pytest_budgetbench.strategies import reference_flags, strategy_classes
    from pytest_budgetbench.tasks import sweep_tasks

    strategies = strategy_classes(settings.strategies)
    tasks = sweep_tasks(settings.tasks, settings.named_tasks)
    check_extras(settings, strategies, tasks)
    check_options(settings, tasks.values(), strategies.values())
    _check_reference(settings, {cls.name for cls in strategies.values()})
    _check_gates_judge_something(settings, reference_flags(strategies))
    _check_grader_variants(settings, tasks)
    _check_data_flags(settings, tasks)
    _check_out_dir(Path(settings.out))
    if settings.cache_mode not in (None, "off") and settings.cache_path:
        _check_writable("--budgetbench-cache-path", Path(settings.cache_path), directory=False)
    if settings.job_summary is not None:  # GitHub's $GITHUB_STEP_SUMMARY, or the user's
        _check_writable("--budgetbench-job-summary", Path(settings.job_summary),
                        directory=False)
    if settings.trend is not None:
        _check_writable("--budgetbench-trend", Path(settings.trend), directory=True)
    _check_embedding_model(settings)
    if settings.endpoint is None and not settings.model_free:
        from pytest_budgetbench.embedded_server import embedded_model

        embedded_model(settings.model)  # --budgetbench-model names an embedded model
    if settings.model_free:
        _check_model_free_strategies(settings, strategies)


def _check_model_free_strategies(settings: Settings,
                                 strategies: Mapping[str, type[Strategy]]) -> None:
    """A model-free sweep runs a strategy that needs an auxiliary model (it declares the
    regime auxiliary-model-assisted) only with one named ``aux``."""
    from pytest_budgetbench.strategies import Regime

    if "aux" in (settings.aux_models or {}):
        return
    needing = [spec for spec, cls in strategies.items() if Regime.AUXILIARY_MODEL in cls.regimes]
    if needing:
        raise ConfigError(
            f"--budgetbench-model=none sends nothing, but {_names(needing)} "
            f"{'calls' if len(needing) == 1 else 'call'} an auxiliary model: leave "
            f"{'it' if len(needing) == 1 else 'them'} out, or name the model "
            "with --budgetbench-aux-models=aux=URL#MODEL")


def _names(specs: Sequence[str]) -> str:
    quoted = [f"'{spec}'" for spec in specs]
    label = "strategy" if len(quoted) == 1 else "strategies"
    return f"{label} {', '.join(quoted)}"


def check_extras(
    settings: Settings, strategies: Mapping[str, type[Strategy]], tasks: Mapping[str, type[Task]]
) -> None:
    """Every optional package the sweep's strategies, tasks, tokenizer, model and gates
    import is installed. What is missing is one MissingDependency, before any cell, that
    names each extra; found without importing anything heavy."""
    from pytest_budgetbench import embeddings, reports

    needs: list[tuple[str, Iterable[Requirement]]] = []
    for spec, strategy in strategies.items():
        needs.append((f"strategy '{spec}'", strategy.requires))
        if strategy.uses_embedder:
            needs.append((f"strategy '{spec}' (its embedder, {settings.embedding_model} on "
                          f"{settings.embedding_backend})", embeddings.requirements(
                              settings.embedding_model, settings.embedding_backend)))
    needs += [(f"task '{name}'", task.requires) for name, task in tasks.items()]
    tokenizer = settings.tokenizer.partition(":")[0]
    if tokenizer in _TOKENIZER_NEEDS:
        needs.append((f"--budgetbench-tokenizer={tokenizer}:", _TOKENIZER_NEEDS[tokenizer]))
    if settings.endpoint is None and not settings.model_free:
        needs.append(("the embedded model (used when no endpoint is given)",
                      _EMBEDDED_NEEDS))
    elif settings.model_free and settings.tokenizer == "auto":
        needs.append(("the embedded model's tokenizer (a model-free sweep counts with it "
                      "under --budgetbench-tokenizer=auto)", _EMBEDDED_NEEDS))
    for flag, value in (("--budgetbench-max-violation-rate", settings.max_violation_rate),
                        ("--budgetbench-min-retention", settings.min_retention),
                        ("--budgetbench-min-answer-kept", settings.min_answer_kept),
                        ("--budgetbench-baseline", settings.baseline)):
        # A budget search judges its floors itself, in pure Python: no extra needed.
        if value is not None and settings.search is None:
            needs.append((f"the gate of {flag}", reports.REQUIREMENTS))
    if settings.trend is not None:  # its series are the report's summary table
        needs.append(("--budgetbench-trend", reports.REQUIREMENTS))
    missing: dict[str, tuple[str, str, str]] = {}  # the first need of each extra
    found_all: list[Requirement] = []
    for purpose, requirements in needs:
        found = first_missing(requirements)
        if found is not None and found.python_unmet():  # no extra can help: say the Python
            raise UnsupportedPython(found, purpose)
        if found is not None:
            missing.setdefault(found.extra, (found.package or found.module, found.extra, purpose))
            found_all.append(found)
    if missing:
        first, *also = missing.values()
        raise MissingDependency(*first, hint=Requirement.hint(found_all), also=also)


_TOKENIZER_NEEDS = {"hf": (Requirement("transformers", "hf"),),
                    "gguf": (Requirement("llama_cpp", "local", "llama-cpp-python"),)}
_EMBEDDED_NEEDS = (Requirement("llama_cpp", "local", "llama-cpp-python"),)


def _check_reference(settings: Settings, strategies: set[str]) -> None:
    if not settings.reference:
        return
    strategy, budget = split_reference(settings.reference)
    if strategy not in strategies and strategy not in settings.strategies:
        raise ConfigError(
            f"--budgetbench-reference={settings.reference} names no strategy of this "
            f"sweep; use one of {', '.join(sorted(strategies))} (strategy@budget)"
        )
    if budget is not None and budget not in settings.budgets:
        raise ConfigError(
            f"--budgetbench-reference={settings.reference}: budget {budget} is not swept "
            f"(--budgets={','.join(map(str, settings.budgets))}); pair against one of them"
        )


def _check_gates_judge_something(settings: Settings, references: Mapping[str, bool]) -> None:
    """A violation-rate or floor gate that no strategy@budget of the sweep falls under
    (every strategy a reference, none given its own floor) would pass having judged
    nothing. (A budget search has no gate items: its floors are what it searches for.)"""
    if settings.search is not None:
        return
    cells = [f"{name}@{budget}" for name in references for budget in settings.budgets]
    for flag, floors in _floors(settings):
        unswept = unswept_floor(floors, cells, flag)
        if unswept:
            raise ConfigError(unswept)
    kinds = {gate.kind for gate in gate_specs(references, settings)}
    names = ", ".join(references)
    if settings.max_violation_rate is not None and VIOLATION_GATE not in kinds:
        raise ConfigError(
            f"--budgetbench-max-violation-rate={settings.max_violation_rate:g} judges "
            f"nothing: every strategy of the sweep ({names}) is a reference, which may go "
            "over budget; add the strategies the gate is for")
    for (flag, floors), kind in zip(_floors(settings), (RETENTION_GATE, ANSWER_GATE),
                                    strict=True):
        if floors and kind not in kinds:
            example = f"{next(iter(references))}@{settings.budgets[-1]}=0.9"
            raise ConfigError(
                f"{flag} judges nothing: every strategy of the sweep ({names}) is a "
                f"reference, which has a floor only when named (e.g. {flag}={example}); name "
                "it or add the strategies to gate")


def _floors(settings: Settings) -> tuple[tuple[str, Mapping[str, float]], ...]:
    """The floor gates' flags and floors (empty where not given): retention, answer kept."""
    return (("--budgetbench-min-retention", settings.min_retention or {}),
            ("--budgetbench-min-answer-kept", settings.min_answer_kept or {}))


def _check_grader_variants(settings: Settings, tasks: Mapping[str, type[Task]]) -> None:
    names = {cls.name or spec: cls for spec, cls in tasks.items()}
    for task, variant in (settings.grader or {}).items():
        if task not in names:
            raise ConfigError(
                f"--budgetbench-grader={task}:{variant}: task '{task}' is not in this sweep "
                f"(--budgetbench-tasks={','.join(settings.tasks)})"
            )
        known = names[task].grader_variants
        if variant not in known:
            raise ConfigError(
                f"--budgetbench-grader={task}:{variant}: task '{task}' has no grader variant "
                f"'{variant}' (known: {', '.join(sorted(known)) or 'none'})"
            )


def _check_data_flags(settings: Settings, tasks: Mapping[str, type[Task]]) -> None:
    """A data flag for a task the sweep does not run is a typo or a forgotten task; an ini
    or environment value for one is not (a pytest.ini may list every task's data, and the
    command line run a few), so it is ignored."""
    swept = {cls.name or spec for spec, cls in tasks.items()}
    for task in sorted(set(settings.data_flags) - swept):
        raise ConfigError(
            f"--budgetbench-data-{task} is given but task '{task}' is not in this sweep "
            f"(--budgetbench-tasks={','.join(settings.tasks)}); add it, or drop the flag"
        )


def _check_out_dir(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(
            f"--budgetbench-out={out} is a file, not a directory; pass a directory for the "
            "run records"
        )
    _check_writable("--budgetbench-out", out, directory=True)


def _check_writable(flag: str, path: Path, *, directory: bool) -> None:
    """``path`` (a directory, or a file) could be written: the nearest existing directory
    at or above it takes a file. Tried with an unnamed temporary file, which leaves
    nothing behind (os.access says yes to root everywhere, /proc included)."""
    ancestor = path if directory else path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir() or not _takes_a_file(ancestor):
        raise ConfigError(
            f"{flag}={path}: cannot be written ({ancestor} is not a writable directory); "
            "pass a path you can write"
        )


def _takes_a_file(directory: Path) -> bool:
    try:
        with tempfile.TemporaryFile(dir=directory):
            return True
    except OSError:
        return False


def _check_embedding_model(settings: Settings) -> None:
    from pytest_budgetbench.embeddings import DEFAULT_MODEL, resolve_model_path

    if settings.embedding_model != DEFAULT_MODEL:
        resolve_model_path(settings.embedding_model)  # ConfigError naming the model


def check_sweep(settings: Settings, catalog: Catalog, cells: list[Cell]) -> None:
    """The data every task reads, the cells, and the baseline, before anything runs.

    ``cells`` is the sweep's cell list (reading it loads every task's items, which raises
    a DataError or ConfigError naming the file)."""
    for task in catalog.names:
        catalog.items(task)
    _check_evidence(catalog)
    _check_tool_strategies(settings, catalog)
    check_not_empty(settings, cells)
    _check_baseline(settings, cells)
    _check_retention_floors(settings, catalog, cells)
    _check_episode_mode(settings, catalog)


def _check_retention_floors(settings: Settings, catalog: Catalog, cells: list[Cell]) -> None:
    """A retention floor judges evidence, an answer-kept floor the gold answers the evidence
    holds: an entry for a strategy@budget the sweep does not run, or a sweep whose items
    have none, would be a gate over nothing."""
    swept = [f"{cell.strategy_label}@{cell.budget}" for cell in cells]
    for flag, floors in _floors(settings):
        unswept = unswept_floor(floors, swept, flag)
        if unswept:
            raise ConfigError(unswept)
    tasks = ", ".join(catalog.names)
    if settings.min_retention and not any(
            item.evidence for name in catalog.names for item in catalog.items(name)):
        raise ConfigError(
            f"--budgetbench-min-retention: no item of the sweep's tasks ({tasks}) declares "
            "evidence, so there is no retention to gate on; declare evidence "
            "(docs/reports.md, Evidence retention) or drop the floor")
    if settings.min_answer_kept and not any(
            catalog.answers(name, index) is not None
            for name in catalog.names for index in range(len(catalog.items(name)))):
        raise ConfigError(
            f"--budgetbench-min-answer-kept: no item of the sweep's tasks ({tasks}) has a "
            "gold answer that its evidence holds, so there is no answer kept to gate on "
            "(docs/reports.md, Answer kept); drop the floor or gate on a task that has")


def _check_episode_mode(settings: Settings, catalog: Catalog) -> None:
    """Teacher-forced episodes need a task with a reference trajectory; a model-free sweep
    plays agent episodes only teacher-forced (the model's replies drive a free-running one)."""
    from pytest_budgetbench.tasks import EpisodicTask

    episodic = {name: task for name in catalog.names
                if isinstance(task := catalog.task(name), EpisodicTask)}
    teacher_forced = settings.episodes == "teacher-forced"
    if teacher_forced and not episodic:
        raise ConfigError(
            "--budgetbench-episodes=teacher-forced runs agent episodes, and no task of the "
            f"sweep ({', '.join(catalog.names)}) is one: add an agent task (agent_lookup, "
            "bfcl_multi_turn_*), or drop the option")
    for name, task in episodic.items():
        has_reference = type(task).reference_steps is not EpisodicTask.reference_steps
        if teacher_forced and not has_reference:
            raise ConfigError(
                f"--budgetbench-episodes=teacher-forced: task '{name}' has no reference "
                "trajectory to force (its reference_steps gives none); run it free-running, "
                "or give it reference steps")
        if settings.model_free and not teacher_forced:
            raise ConfigError(
                f"--budgetbench-model=none cannot run task '{name}' free-running: its agent "
                "episodes are driven by the model's replies; pass "
                "--budgetbench-episodes=teacher-forced to count each step of its reference "
                "trajectory, or give a model")


def _check_evidence(catalog: Catalog) -> None:
    """Each item's evidence is verbatim text of its history (engine.evidence's test): a
    span that is not could never be kept, and every cell of the item would report it lost.
    An agent's items are exempt: their evidence arrives in the environment's tool results."""
    from pytest_budgetbench.engine.evidence import missing_evidence
    from pytest_budgetbench.tasks import EpisodicTask

    for name in catalog.names:
        if isinstance(catalog.task(name), EpisodicTask):
            continue
        for item in catalog.items(name):
            span = missing_evidence(item.evidence, item.messages) if item.evidence else None
            if span is not None:
                raise DataError(
                    f"task '{name}' item {item.item_id} declares evidence {_cut(span)} that "
                    "is not in its history: fix the item's evidence (it must be verbatim "
                    "text of a message)"
                )


def _cut(span: str, limit: int = 60) -> str:
    """A span on one short line, quoted as JSON quotes it."""
    short = span if len(span) <= limit else span[: limit - 3] + "..."
    return json.dumps(short, ensure_ascii=False)


def _check_tool_strategies(settings: Settings, catalog: Catalog) -> None:
    """A task whose items are an agent's (episodes, or tool calls in own data) runs only
    with strategies that keep tool-call pairs whole: the others are refused here, in one
    line, rather than on every cell."""
    from pytest_budgetbench.strategies import strategy_classes, tool_refusal
    from pytest_budgetbench.tasks import EpisodicTask

    agentic = [name for name in catalog.names
               if isinstance(catalog.task(name), EpisodicTask)
               or any(item.carries_tools for item in catalog.items(name))]
    if not agentic:
        return
    for cls in strategy_classes(settings.strategies).values():
        refusal = tool_refusal(cls)
        if refusal is not None:
            raise ConfigError(f"{refusal} (task '{agentic[0]}' is an agent's: its items "
                              "carry tool calls)")


def check_not_empty(settings: Settings, cells: list[Cell]) -> None:
    """An empty shard is NothingToRun (exit 0, one line); an empty sweep is an error."""
    if cells:
        return
    if settings.shard is not None:
        index, count = settings.shard
        raise NothingToRun(
            f"budgetbench: shard {index}/{count} holds no item (the sweep has fewer items "
            "than shards); nothing to run"
        )
    raise ConfigError("the sweep holds no cell: its tasks loaded no item")


def _check_baseline(settings: Settings, cells: list[Cell]) -> None:
    if settings.baseline is None:
        return
    from pytest_budgetbench.reports import check_baseline_comparable
    from pytest_budgetbench.reports.report_json import (
        BaselineError,
        cell_records,
        read_report_json,
    )

    path = Path(settings.baseline)
    try:  # read once, here; the gate reads it again only at the end of the sweep
        baseline = cell_records(read_report_json(path)).keys()
    except (BaselineError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"--budgetbench-baseline={path}: {exc}; pass a previous run's report/report.json"
        ) from None
    planned = {(c.task, c.strategy_label, c.budget) for c in cells}
    reasons = check_baseline_comparable(baseline, planned, source=path)
    if reasons:
        raise ConfigError(f"--budgetbench-baseline={path}: {reasons[0]}")


def check_context(settings: Settings, endpoint: Endpoint) -> None:
    """A server whose context holds fewer tokens than the sweep's largest budget would cut
    or refuse the prompts that budget allows: one line naming both, and how to raise it."""
    from pytest_budgetbench.model.servers import context_hint

    server = endpoint.server
    context = server.get("context")
    if not settings.budgets or context is None or context >= max(settings.budgets):
        return
    kind = server.get("kind", "server")
    raise ConfigError(
        f"the {kind} at {endpoint.label} holds {context} tokens of context "
        f"({server.get('context_from')}), below the sweep's largest budget "
        f"{max(settings.budgets)}: its prompts would be cut or refused; "
        f"{context_hint(str(kind))}, or lower --budgets")


_PROBE_TOOL = {"type": "function", "function": {
    "name": "probe", "description": "A probe.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}


def check_tokenizer(settings: Settings, load: Callable[[], TokenCounter], *,
                    tools: bool = False) -> TokenCounter:
    """Load the sweep's token counter (``load``: the counter ``--budgetbench-tokenizer``
    asks for, for the resolved endpoint) and count once (``tools``: a sweep that sends
    tools, once with a tool too), so a missing file, a route the endpoint lacks, or a
    server that takes no tools is one line now rather than an error in every cell.
    Returns the counter, for this process's runner to count with."""
    probe: list[Message] = [{"role": "user", "content": "probe"}]
    try:
        counter = load()
        counter.count_messages(probe)
        if tools:
            counter.count_messages(probe, [_PROBE_TOOL])
    except TokenizerError as exc:
        raise ConfigError(f"--budgetbench-tokenizer={settings.tokenizer}: {exc}") from None
    return counter


def sends_tools(catalog: Catalog) -> bool:
    """Whether the sweep sends tool schemas: an agent's episodes, or items with tools."""
    from pytest_budgetbench.tasks import EpisodicTask

    return any(isinstance(catalog.task(name), EpisodicTask)
               or any(item.tools for item in catalog.items(name)) for name in catalog.names)
