"""What a CI job shows of a run, built and written here only.

- **The job summary**: Markdown appended to GitHub Actions' ``$GITHUB_STEP_SUMMARY`` (or to
  any file, which a GitLab job keeps as an artifact): every gate's verdict first, then the
  summary and paired tables of the computed report, the run's id, model and counter. Long
  tables are folded into ``<details>``, and the whole is cut to GitHub's 1 MiB with a line
  saying so (:func:`job_summary`, :func:`append_job_summary`). The sweep and ``budgetbench
  report`` both write it through these functions.
- **Annotations**: one ``::error`` workflow command per failed gate (``::warning`` per gate
  warning), escaped as GitHub's runner reads them (:func:`gate_annotations`); and the
  step's outputs, ``$GITHUB_OUTPUT`` (:func:`set_step_output`: the sweep's ``run_dir``).
- **The pull-request comment** of ``budgetbench diff --format=comment``: its Markdown behind
  :data:`COMMENT_MARKER`, a hidden line a workflow finds to update one comment rather than
  add one per push, cut to GitHub's 65,536 characters (:func:`comment_body`).
- **The trend files** of github-action-benchmark: ``customBiggerIsBetter.json`` (quality,
  evidence retention) and ``customSmallerIsBetter.json`` (violation rate), one series per
  task x strategy x budget, each a list of ``{name, unit, value, range?, extra?}``, the
  action's ``BenchmarkResult`` (:func:`trend_entries`, :func:`write_trend`).

The tables are the report's own views (:mod:`.render`'s columns over the report's summary and
paired tables); nothing here computes a statistic.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_budgetbench.redact import redact
from pytest_budgetbench.reports.gates.verdicts import (
    ANSWER_GATE,
    REGRESSION_GATE,
    RETENTION_GATE,
    VIOLATION_GATE,
    GateVerdict,
)

if TYPE_CHECKING:
    import pandas as pd

    from pytest_budgetbench.reports.builder import Report

STEP_SUMMARY_LIMIT = 1024 * 1024
"""Bytes a step's job summary may hold on GitHub (1 MiB): a larger one is not shown."""
COMMENT_LIMIT = 65_536
"""Characters an issue or pull-request comment body may hold on GitHub."""
COMMENT_MARKER = "<!-- budgetbench-diff -->"
"""The first line of the comment body: hidden when rendered, found by the workflow step
that updates the comment it posted before."""
FOLD_ROWS = 10
"""A table with more rows than this is folded into ``<details>``."""
TREND_FILES = {"customBiggerIsBetter": "customBiggerIsBetter.json",
               "customSmallerIsBetter": "customSmallerIsBetter.json"}
"""github-action-benchmark's ``tool`` -> the trend file written for it (one tool per step)."""


# -- GitHub's workflow commands ---------------------------------------------------------------
def in_github_actions(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process runs in a GitHub Actions job (its runner sets GITHUB_ACTIONS)."""
    return (os.environ if environ is None else environ).get("GITHUB_ACTIONS") == "true"


def escape_data(text: str) -> str:
    """A workflow command's message, as the runner reads it back: %, CR and LF encoded."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """A workflow command's property value (``title=...``): the message's encoding, and
    the ``:`` and ``,`` that would end the property."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def workflow_command(command: str, message: str, **properties: str) -> str:
    """``::command key=value,...::message``, every part escaped."""
    props = ",".join(f"{key}={escape_property(value)}" for key, value in properties.items())
    return f"::{command}{' ' + props if props else ''}::{escape_data(redact(message))}"


def gate_annotations(verdicts: Sequence[GateVerdict], failures: Sequence[str] = ()) -> list[str]:
    """One ``::error`` line per failed gate, one ``::warning`` per warning of a gate that
    passed, and one ``::error`` per ``failures`` line (a gate failure that is no one
    strategy@budget's: a regression gate's unusable baseline, a gate with nothing to
    judge): each shows on the run's page and the pull request."""
    lines = [workflow_command("error", verdict.message or "",
                              title=f"budgetbench gate {verdict.spec.gate_id} failed")
             for verdict in verdicts if not verdict.passed]
    lines += [workflow_command("warning", note,
                               title=f"budgetbench gate {verdict.spec.gate_id} warning")
              for verdict in verdicts for note in verdict.notes]
    lines += [workflow_command("error", line, title="budgetbench gate failed")
              for line in failures]
    return lines


def set_step_output(name: str, value: str, environ: Mapping[str, str] | None = None
                    ) -> Path | None:
    """Append ``name=value`` to the step's output file ($GITHUB_OUTPUT), so a later step
    reads ``steps.<id>.outputs.<name>``; the file, or None outside a GitHub Actions step.
    Raises OSError."""
    output = (os.environ if environ is None else environ).get("GITHUB_OUTPUT")
    if not output:
        return None
    if "\n" in value or "\r" in value:  # the one-line form; a path has no line break
        raise ValueError(f"step output {name} must be one line (got {value!r})")
    with open(output, "a", encoding="utf-8") as step_output:
        step_output.write(f"{name}={value}\n")
    return Path(output)


# -- fitting GitHub's limits ------------------------------------------------------------------
def utf8_size(text: str) -> int:
    return len(text.encode("utf-8"))


def fit(text: str, limit: int, cut_line: str, size: Callable[[str], int] = utf8_size) -> str:
    """``text`` when it is at most ``limit`` (by ``size``: bytes by default), else its first
    whole lines that fit with ``cut_line`` after them, every ``<details>`` they opened
    closed. Empty when not even ``cut_line`` fits."""
    if size(text) <= limit:
        return text
    closing = "\n</details>\n"
    kept: list[str] = []
    used = 0
    opened = 0
    for line in text.splitlines(keepends=True):
        after = opened + line.count("<details>") - line.count("</details>")
        tail = size(cut_line) + max(after, opened) * size(closing)
        if used + size(line) + tail > limit:
            break
        kept.append(line)
        used += size(line)
        opened = after
    if not kept and size(cut_line) > limit:
        return ""
    body = "".join(kept)
    if body and not body.endswith("\n"):
        body += "\n"
    return body + closing * opened + cut_line


# -- the job summary --------------------------------------------------------------------------
def _share(value: float | None, spec: str) -> str:
    return "-" if value is None or math.isnan(value) else format(value, spec)


def gate_value(verdict: GateVerdict) -> str:
    """What the gate measured, as it held it to its threshold."""
    kind = verdict.spec.kind
    if kind == VIOLATION_GATE:
        counts = (f" ({verdict.n_violation}/{verdict.n_judged})"
                  if verdict.n_judged is not None else "")
        return _share(verdict.rate, ".1%") + counts
    if kind == RETENTION_GATE:
        return f"retention {_share(verdict.retention, '.3f')}"
    if kind == ANSWER_GATE:
        return f"answer kept {_share(verdict.answer_kept, '.3f')}"
    if kind == REGRESSION_GATE and verdict.delta is not None:
        lo, hi = verdict.interval or (math.nan, math.nan)
        return f"change {verdict.delta:+.3f} [{lo:+.3f}, {hi:+.3f}]"
    return "-"


def gate_threshold(verdict: GateVerdict) -> str:
    """The threshold the gate held its value to, with the side it must be on."""
    value = verdict.threshold
    if value is None:
        return "-"
    if verdict.spec.kind == VIOLATION_GATE:
        return f"≤ {value:.1%}"
    if verdict.spec.kind == REGRESSION_GATE:
        return f"drop of at most {value:g}"
    return f"≥ {value:.3f}"


def _verdict_section(verdicts: Sequence[GateVerdict], failures: Sequence[str]) -> list[str]:
    from pytest_budgetbench.reports import render

    failed = [v for v in verdicts if not v.passed]
    count = len(failed) + len(failures)
    total = len(verdicts) + len(failures)
    if not total:
        heading = "no gate was asked for"
    elif count:
        heading = f"{count} of {total} gates failed"
    else:
        heading = f"all {total} gates passed"
    parts = [f"## budgetbench: {heading}\n"]
    if not verdicts and not failures:
        return parts
    headers = ["gate", "verdict", "value", "threshold"]

    def row(verdict: GateVerdict) -> list[str]:
        return [verdict.spec.gate_id, "✅ passed" if verdict.passed else "❌ failed",
                gate_value(verdict), gate_threshold(verdict)]

    passed = [row(v) for v in verdicts if v.passed]
    shown = [row(v) for v in failed] + [[line, "❌ failed", "-", "-"] for line in failures]
    if len(shown) + len(passed) <= FOLD_ROWS or not passed:
        parts.append(render.md_table(headers, shown + passed))
    else:  # the failures stay in sight; the passes fold away
        if shown:
            parts.append(render.md_table(headers, shown))
        parts.append(render.md_details(f"{len(passed)} gates passed",
                                       render.md_table(headers, passed)))
    reasons = [f"- **{render.md_escape(v.spec.gate_id)}**: {render.md_escape(v.message or '')}"
               for v in failed]
    reasons += [f"- gate warning, **{render.md_escape(v.spec.gate_id)}**: "
                f"{render.md_escape(note)}" for v in verdicts for note in v.notes]
    if reasons:
        parts += ["", *reasons, ""]
    return parts


def _with_reference(row: pd.Series) -> str:
    return str(row["strategy"]) + (" (ref)" if bool(row["reference"]) else "")


def _views() -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The job summary's two views, narrower than report.md's: per strategy@budget its
    quality, retention, violation rate and tokens; and its changes against the reference."""
    from pytest_budgetbench.reports import render

    summary = (
        render.col("task", "task"),
        render.Column("strategy", _with_reference),
        render.col("budget", "budget", render.integer),
        render.Column("admitted / items", lambda r: f"{render.integer(r['n_admitted'])} / "
                                                    f"{render.integer(r['n_items'])}"),
        render.Column("quality [95% CI]",
                      render.interval("quality_mean", "quality_lo", "quality_hi")),
        render.col("evidence retention", "evidence_retention_mean", render.num(3)),
        render.col("violation rate", "violation_rate", render.percent),
        render.Column("tokens mean / max",
                      render.pair("tokens_mean", "tokens_max", render.num(0), render.integer)),
    )
    paired = (
        render.col("task", "task"),
        render.col("strategy", "strategy"),
        render.col("budget", "budget", render.integer),
        render.Column("reference",
                      lambda r: f"{r['ref_strategy']}@{render.integer(r['ref_budget'])}"),
        # Scored in both: a model-free run pairs none (its retention pairs the admitted).
        render.Column("scored pairs",
                      lambda r: render.integer(r["n_paired"]) if r["n_paired"] else ""),
        *render.change_view("quality delta")[:1],
        render.Column("retention delta [95% CI]", render.interval(
            "retention_delta", "retention_delta_lo", "retention_delta_hi")),
        render.Column("answer kept delta [95% CI]", render.interval(
            "answer_kept_delta", "answer_kept_delta_lo", "answer_kept_delta_hi")),
    )
    return summary, paired


def _table(title: str, note: str, table: pd.DataFrame, columns: Sequence[Any]) -> list[str]:
    from pytest_budgetbench.reports import render

    headers, body = render.filled_columns(*render.view(table, columns))
    markdown = render.md_table(headers, body)
    if len(body) > FOLD_ROWS:
        markdown = render.md_details(f"{len(body)} rows", markdown)
    return [f"### {title}\n", render.md_escape(note), "", markdown]


def _facts(facts: Sequence[tuple[str, str]]) -> list[str]:
    from pytest_budgetbench.reports import render

    return [" · ".join(f"**{render.md_escape(key)}** {render.md_escape(value)}"
                       for key, value in facts if value), ""]


RUN_FACTS = ("runs", "model", "tokenizer", "reference")
"""The report's facts (builder.report_facts) the job summary repeats."""


def job_summary(
    verdicts: Sequence[GateVerdict] = (),
    report: Report | None = None,
    *,
    failures: Sequence[str] = (),
    facts: Sequence[tuple[str, str]] = (),
    notes: Sequence[str] = (),
    blocks: Sequence[tuple[str, str]] = (),
) -> str:
    """The job summary's Markdown (uncut): the gates' ``verdicts`` (and ``failures`` that
    are no one gate's) first, then the run's facts (``facts``, e.g. the run directory,
    after the report's own run, model, tokenizer and reference), ``blocks`` of plain text
    by title (a budget search's table), the report's summary and paired tables, and
    ``notes`` (e.g. why there is no table)."""
    parts = _verdict_section(verdicts, failures)
    if report is not None:
        from pytest_budgetbench.reports.builder import report_facts

        facts = [(key, value) for key, value in report_facts(report) if key in RUN_FACTS] \
            + list(facts)
    parts += _facts(facts)
    for title, text in blocks:  # four backticks: no line of the text can close the fence
        parts += [f"### {title}\n", f"````text\n{text}\n````\n"]
    if report is not None:
        summary_view, paired_view = _views()
        parts += _table("Per strategy@budget", "Quality over admitted items (empty in a "
                        "model-free run), evidence retention over admitted prompts, "
                        "violation rate = violations / (admitted + violations).",
                        report.summary, summary_view)
        if not report.paired.empty:
            parts += _table("Paired against the reference", "Changes over the items both "
                            "cells admitted (and scored), with 95% intervals.",
                            report.paired, paired_view)
    if notes:
        from pytest_budgetbench.reports.render import md_escape

        parts += [f"_{md_escape(line)}_\n" for line in notes]
    return "\n".join(parts).rstrip("\n") + "\n"


def summary_cut_line(where: str) -> str:
    """The line a cut job summary ends with: why, and where the whole is."""
    return (f"\n_budgetbench: the summary was cut here to stay within GitHub's 1 MiB job "
            f"summary limit; the whole report is in {where}_\n")


def append_job_summary(path: Path, markdown: str, *, where: str,
                       limit: int | None = None) -> None:
    """Append ``markdown`` to the job summary file ``path``, cut (:func:`fit`) to what the
    step's ``limit`` (:data:`STEP_SUMMARY_LIMIT`) leaves after what the file already holds;
    ``where`` names the whole report in the cut line. Raises OSError."""
    held = path.stat().st_size if path.exists() else 0
    room = (STEP_SUMMARY_LIMIT if limit is None else limit) - held
    text = fit(redact(markdown), room, summary_cut_line(where))
    if text:
        with path.open("a", encoding="utf-8") as out:
            out.write(text)


def comment_body(markdown: str, limit: int = COMMENT_LIMIT) -> str:
    """A pull-request comment: :data:`COMMENT_MARKER`, then ``markdown``, within
    GitHub's ``limit`` on a comment's characters."""
    cut = ("\n_budgetbench: the comment was cut here to stay within GitHub's 65,536 "
           "characters; `budgetbench diff --out DIR` writes the whole diff_\n")
    return fit(f"{COMMENT_MARKER}\n{redact(markdown)}", limit, cut, size=len)


# -- the trend files of github-action-benchmark ------------------------------------------------
def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def trend_entries(summary: pd.DataFrame) -> dict[str, list[dict[str, Any]]]:
    """github-action-benchmark's entries of a report's summary table, by ``tool``: quality
    and evidence retention (bigger is better), violation rate (smaller is better), one
    series per task x strategy x budget, named ``"task: strategy@budget measure"``. A
    measure a cell has not (quality in a model-free run) is left out."""
    bigger: list[dict[str, Any]] = []
    smaller: list[dict[str, Any]] = []
    for row in summary.to_dict("records"):
        cell = f"{row['task']}: {row['strategy']}@{int(row['budget'])}"
        quality, lo, hi = (_number(row[k]) for k in ("quality_mean", "quality_lo",
                                                      "quality_hi"))
        if quality is not None:
            entry: dict[str, Any] = {"name": f"{cell} quality", "unit": "score",
                                     "value": quality,
                                     "extra": f"over {int(row['n_scored'])} scored items"}
            if lo is not None and hi is not None:
                # The action reads a range as "± N"; the interval itself is in extra.
                entry["range"] = f"± {max(quality - lo, hi - quality):.4f}"
                entry["extra"] += f", 95% CI [{lo:.4f}, {hi:.4f}]"
            bigger.append(entry)
        retention = _number(row["evidence_retention_mean"])
        if retention is not None:
            bigger.append({"name": f"{cell} evidence retention", "unit": "share kept",
                           "value": retention,
                           "extra": f"over {int(row['n_admitted'])} admitted items"})
        rate = _number(row["violation_rate"])
        if rate is not None:
            judged = int(row["n_ok"]) + int(row["n_violation"])
            smaller.append({"name": f"{cell} violation rate", "unit": "share over budget",
                            "value": rate,
                            "extra": f"{int(row['n_violation'])} of {judged} prompts"})
    return {"customBiggerIsBetter": bigger, "customSmallerIsBetter": smaller}


def write_trend(summary: pd.DataFrame, out_dir: Path) -> list[Path]:
    """The two trend files (:data:`TREND_FILES`) in ``out_dir`` (made if missing); each is
    ``output-file-path`` of one github-action-benchmark step. Raises OSError."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for tool, entries in trend_entries(summary).items():
        path = out_dir / TREND_FILES[tool]
        path.write_text(redact(json.dumps(entries, ensure_ascii=False, allow_nan=False,
                                          indent=1)) + "\n", encoding="utf-8")
        paths.append(path)
    return paths
