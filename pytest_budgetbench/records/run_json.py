"""run.json: a run's settings and definition, written and read here.

The controller writes it once the sweep's checks have passed, before the first cell (a
directory that has it is a run: ``--budgetbench-resume=latest`` looks for it); a resume
writes it again with the time it went on; ``regrade`` copies it into its new run with
where the rows came from. A report copies each run's into report.json (``runs``) as it
is, and a resume, a report of several runs and ``budgetbench diff`` compare their
definitions (:mod:`~pytest_budgetbench.records.definition`).

The record is the JSON object itself, typed by :class:`RunInfo`, never rebuilt from
fields: a run.json of another version holds keys this one does not write, which a resume
and a regrade carry over and a report shows as they are. What a reader uses it takes
through the accessors here, which check the type of what they find (a run.json may be old
or hand-edited).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypedDict, cast

from pytest_budgetbench.errors import RecordError

RUN_FILE = "run.json"

Regraded = TypedDict("Regraded", {"from": str, "time": float,
                                  "grader_variants": dict[str, str]})
"""Where a regraded run's rows came from (``from`` is a keyword: the functional form)."""


class ServerRecord(TypedDict, total=False):
    """What answers at the endpoint, as the controller's probe found it
    (:func:`~pytest_budgetbench.model.servers.detect_server`), and how the sweep counts for
    it (the session adds ``counter`` and ``exact``)."""

    kind: str
    """llama-server, tgi, ollama, sglang, vllm or openai-compatible."""
    probed: list[str]
    """Each request of the probe and its answer, in order (``GET /props: HTTP 404``)."""
    context: int | None
    """The tokens one prompt may take, as the server says; None where it does not."""
    context_from: str
    """Where ``context`` was read (``GET /props default_generation_settings.n_ctx``)."""
    details: dict[str, Any]
    """What else the probe read that the counter uses or a reader may want (a llama-server's
    template capabilities, an Ollama model's blob and capabilities)."""
    counter: str
    """The token counter the sweep counts with, as rows name it."""
    exact: str
    """Which parts of its counts are exact, in words."""


class RunInfo(TypedDict, total=False):
    """run.json's object: the keys this version writes, in the order it writes them."""

    run_id: str
    settings: dict[str, Any]
    """The run's option values (``Settings.public()``: no secret)."""
    endpoint: str
    """The endpoint as rows show it (redacted)."""
    model: str | None
    server_flags: dict[str, Any]
    started: float
    """When the run first started (``time.time()``); a resume keeps it."""
    definition: dict[str, Any]
    """What defines the run's cells (:mod:`~pytest_budgetbench.records.definition`)."""
    resumed: list[float]
    """When each resume went on."""
    regraded: Regraded
    server: ServerRecord
    """The endpoint's server and how the sweep counted for it (none for the embedded
    model, a model-free sweep, or a run.json of an earlier version)."""


def write(path: Path, info: RunInfo) -> None:
    """Write run.json (redacted; the directory is made), replacing the one there."""
    from pytest_budgetbench.redact import redact_obj

    text = json.dumps(redact_obj(info), indent=2, default=str) + "\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as exc:
        raise RecordError(f"cannot write {path}: {exc}") from None


def read(path: Path) -> RunInfo | None:
    """run.json as written, or None when there is none (or it holds no JSON object).
    Raises ValueError when it is not JSON, OSError when it cannot be read."""
    if not path.is_file():
        return None
    info = json.loads(path.read_text(encoding="utf-8"))
    return cast(RunInfo, info) if isinstance(info, dict) else None


def read_run(path: Path) -> RunInfo | None:
    """:func:`read` for a run directory, or for the run of a file in it (its cells.jsonl),
    as :meth:`RunStore.of <pytest_budgetbench.records.store.RunStore.of>` takes them."""
    return read((path.parent if path.is_file() else path) / RUN_FILE)


def resumed(earlier: RunInfo, when: float) -> RunInfo:
    """The run.json of a run that goes on at ``when``: the earlier one, which keeps when
    the run started and what defines it, with the time added to ``resumed``."""
    times = earlier.get("resumed")
    return {**earlier, "resumed": [*(times if isinstance(times, list) else []), when]}


def regraded(info: RunInfo, source: Path, when: float, variants: dict[str, str]) -> RunInfo:
    """The run.json of a regraded copy of a run: the run's, and where its rows came from."""
    return {**info, "regraded": {"from": str(source), "time": when,
                                 "grader_variants": variants}}


def started(info: RunInfo) -> float | None:
    """When the run first started; None where run.json does not say (or says it oddly)."""
    try:
        return float(info["started"])
    except (KeyError, TypeError, ValueError):
        return None


def definition_of(info: RunInfo) -> dict[str, Any] | None:
    """The run's definition block; None for a run.json of a version before it."""
    block = info.get("definition")
    return block if isinstance(block, dict) else None


def settings_of(info: RunInfo) -> dict[str, Any]:
    """The run's recorded option values (none where run.json has none)."""
    settings = info.get("settings")
    return settings if isinstance(settings, dict) else {}


def server_of(info: RunInfo) -> ServerRecord | None:
    """The run's server block; None where run.json has none."""
    block = info.get("server")
    return block if isinstance(block, dict) else None
