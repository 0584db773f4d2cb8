"""report.md and report.html from the tables.

Both render the same curated views (the CSV files carry every column). Every cell goes
through one escaping function per format, because strategy names, task names, categories,
error messages and run metadata all come from plugins, data sets or models. The module
imports no numpy, pandas or matplotlib: the CI job summary (:mod:`.ci`) writes its gate
table with it in an install without the ``reports`` extra.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_budgetbench.records.rows import Status

if TYPE_CHECKING:
    import pandas as pd

    from pytest_budgetbench.reports.plots import Plot
    from pytest_budgetbench.reports.viewer_page import ViewerPage

MAX_ERRORS = 20
MAX_ERROR_CHARS = 300

Cell = Callable[[Any], str]


# -- formatting -----------------------------------------------------------------------------
def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def num(digits: int = 3) -> Cell:
    return lambda v: "" if _missing(v) else f"{float(v):.{digits}f}"


def integer(value: Any) -> str:
    return "" if _missing(value) else str(int(value))


def percent(value: Any) -> str:
    return "" if _missing(value) else f"{100.0 * float(value):.1f}%"


def text(value: Any) -> str:
    return "" if _missing(value) else str(value)


def interval(mean: str, lo: str, hi: str, digits: int = 3) -> Callable[[pd.Series], str]:
    """A 'mean [lo, hi]' cell from three columns of a row."""

    def cell(row: pd.Series) -> str:
        if _missing(row[mean]):
            return ""
        fmt = num(digits)
        if _missing(row[lo]):
            return fmt(row[mean])
        return f"{fmt(row[mean])} [{fmt(row[lo])}, {fmt(row[hi])}]"

    return cell


def pair(first: str, second: str, fmt: Cell, fmt_second: Cell | None = None) -> Callable[
    [pd.Series], str
]:
    """A 'first / second' cell (mean / max, p50 / p95) from two columns of a row."""

    def cell(row: pd.Series) -> str:
        if _missing(row[first]):
            return ""
        return f"{fmt(row[first])} / {(fmt_second or fmt)(row[second])}"

    return cell


@dataclass(frozen=True)
class Column:
    """A displayed column: a header and how to make its cell from a table row."""

    header: str
    cell: Callable[[pd.Series], str]


def col(header: str, name: str, fmt: Cell = text) -> Column:
    return Column(header, lambda row: fmt(row[name]))


def flips(row: pd.Series) -> str:
    """A 0/1 grader's 'down / up (p=...)' flips and McNemar p; empty for another grader."""
    if _missing(row["flips_down"]):
        return ""
    return f"{int(row['flips_down'])} / {int(row['flips_up'])} (p={float(row['mcnemar_p']):.3g})"


def change_view(header: str) -> tuple[Column, ...]:
    """The columns of a paired change (stats.PairedChange), its own headed ``header``."""
    return (
        Column(f"{header} [95% CI]", interval("delta", "delta_lo", "delta_hi")),
        col("CI", "ci_method"),
        Column("right->wrong / wrong->right (McNemar p)", flips),
        col("MDE (80% power)", "mde", num(3)),
    )


SUMMARY_VIEW: tuple[Column, ...] = (
    col("task", "task"),
    col("strategy", "strategy"),
    col("budget", "budget", integer),
    col("items", "n_items", integer),
    col("admitted", "n_admitted", integer),
    Column("quality [95% bootstrap]", interval("quality_mean", "quality_lo", "quality_hi")),
    Column("Wilson 95%", lambda r: "" if _missing(r["wilson_lo"]) else
           f"[{r['wilson_lo']:.3f}, {r['wilson_hi']:.3f}]"),
    col("violation rate", "violation_rate", percent),
    Column("tokens mean / max", pair("tokens_mean", "tokens_max", num(1), integer)),
    col("utilisation", "utilisation_mean", percent),
    col("evidence retention", "evidence_retention_mean", num(3)),
    col("answer kept", "answer_kept_mean", num(3)),
    col("answer kept (unique)", "answer_kept_unique_mean", num(3)),
    col("name-only step accuracy", "name_accuracy_mean", num(3)),
    Column("strategy s p50 / p95", pair("strategy_s_p50", "strategy_s_p95", num(3))),
    Column("model s p50 / p95", pair("model_s_p50", "model_s_p95", num(3))),
    col("output tok", "output_tokens_mean", num(1)),
    col("aux calls", "aux_calls_mean", num(2)),
    col("aux tok in", "aux_input_tokens_mean", num(1)),
    col("cost USD", "cost_usd_total", num(4)),
)

PAIRED_VIEW: tuple[Column, ...] = (
    col("task", "task"),
    col("strategy", "strategy"),
    col("budget", "budget", integer),
    Column("reference", lambda r: f"{r['ref_strategy']}@{integer(r['ref_budget'])}"),
    col("paired items", "n_paired", integer),
    col("quality", "quality", num(3)),
    col("ref quality", "ref_quality", num(3)),
    *change_view("delta"),
    col("excluded (violations)", "excluded_violation", integer),
    col("ref excluded (violations)", "ref_excluded_violation", integer),
    col("excluded (other)", "excluded_other", integer),
    col("ref quality of excluded", "ref_quality_of_excluded", num(3)),
    col("retention", "retention", num(3)),
    col("ref retention", "ref_retention", num(3)),
    Column("retention delta [95% CI]",
           interval("retention_delta", "retention_delta_lo", "retention_delta_hi")),
    col("answer kept", "answer_kept", num(3)),
    col("ref answer kept", "ref_answer_kept", num(3)),
    Column("answer kept delta [95% CI]",
           interval("answer_kept_delta", "answer_kept_delta_lo", "answer_kept_delta_hi")),
)

CATEGORY_VIEW: tuple[Column, ...] = (
    col("task", "task"),
    col("category", "category"),
    col("strategy", "strategy"),
    col("budget", "budget", integer),
    col("items", "n_items", integer),
    col("admitted", "n_admitted", integer),
    Column("quality [95% bootstrap]", interval("quality_mean", "quality_lo", "quality_hi")),
    col("violation rate", "violation_rate", percent),
    Column("delta vs reference", interval("delta", "delta_lo", "delta_hi")),
    col("evidence retention", "evidence_retention_mean", num(3)),
    Column("retention delta vs reference",
           interval("retention_delta", "retention_delta_lo", "retention_delta_hi")),
    col("answer kept", "answer_kept_mean", num(3)),
    Column("answer kept delta vs reference",
           interval("answer_kept_delta", "answer_kept_delta_lo", "answer_kept_delta_hi")),
)


def view(table: pd.DataFrame, columns: Sequence[Column]) -> tuple[list[str], list[list[str]]]:
    """Headers and formatted (not yet escaped) cells."""
    headers = [c.header for c in columns]
    body = [[c.cell(row) for c in columns] for _, row in table.iterrows()]
    return headers, body


@dataclass(frozen=True)
class Document:
    """What both formats render: title, provenance lines, tables, plots and errors."""

    title: str
    facts: list[tuple[str, str]]
    sections: list[tuple[str, str, tuple[list[str], list[list[str]]]]]
    plots: list[Plot]
    errors: list[tuple[str, str, int]]
    viewer: ViewerPage | None = None
    """The per-cell viewer (report.html only)."""
    row_links: dict[int, list[str]] = field(default_factory=dict)
    """Section index -> one viewer link per row of its table (report.html only)."""


def error_lines(rows: pd.DataFrame) -> list[tuple[str, str, int]]:
    """The distinct error messages of errored cells: (strategy, message, count)."""
    from pytest_budgetbench.reports.tables import key_values

    errors = rows.loc[rows["status"] == Status.ERROR, ["strategy", "error"]].fillna("")
    if errors.empty:
        return []
    counts = errors.groupby(["strategy", "error"], sort=False).size().sort_values(ascending=False)
    lines = []
    for key, count in counts.head(MAX_ERRORS).items():
        strategy, message = key_values(key)
        lines.append((str(strategy), _clip(str(message)), int(count)))
    return lines


def _clip(message: str) -> str:
    return message if len(message) <= MAX_ERROR_CHARS else message[:MAX_ERROR_CHARS] + "…"


# -- markdown -------------------------------------------------------------------------------
def md_escape(value: str) -> str:
    """Plain text in a Markdown table cell: no HTML, no column breaks, no line breaks."""
    escaped = html.escape(value, quote=False).replace("|", "\\|")
    for char in "`*_[]":
        escaped = escaped.replace(char, "\\" + char)
    return " ".join(escaped.split())


def md_table(headers: list[str], body: list[list[str]]) -> str:
    if not body:
        return "_no rows_\n"
    lines = ["| " + " | ".join(md_escape(h) for h in headers) + " |",
             "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in body]
    return "\n".join(lines) + "\n"


def md_details(summary: str, content: str) -> str:
    """``content`` (Markdown) folded under a ``<details>`` line saying ``summary``, as
    GitHub renders it: blank lines around the content, so its tables stay tables."""
    return f"<details><summary>{html.escape(summary)}</summary>\n\n{content}\n</details>\n"


def filled_columns(headers: list[str], body: list[list[str]]
                   ) -> tuple[list[str], list[list[str]]]:
    """The columns of a view that some row fills: a model-free run's tables have no
    quality or latency, and a narrow table reads where a wide one scrolls."""
    keep = [i for i in range(len(headers)) if any(row[i] for row in body)] if body \
        else list(range(len(headers)))
    return [headers[i] for i in keep], [[row[i] for i in keep] for row in body]


def render_markdown(doc: Document, out_dir: Path) -> str:
    parts = [f"# {md_escape(doc.title)}\n"]
    parts += [f"- **{md_escape(k)}**: {md_escape(v)}" for k, v in doc.facts]
    for index, (heading, note, (headers, body)) in enumerate(doc.sections):
        parts.append(f"\n## {md_escape(heading)}\n\n{md_escape(note)}\n")
        parts.append(md_table(headers, body))
        if index == 0 and doc.plots:
            parts.append("\n## Plots\n")
            parts.extend(
                f"![{md_escape(plot.title)}]({plot.path.relative_to(out_dir).as_posix()})\n"
                for plot in doc.plots
            )
    if doc.errors:
        parts.append("\n## Errors\n")
        parts.append(md_table(["strategy", "cells", "message"],
                               [[s, str(n), m] for s, m, n in doc.errors]))
    return "\n".join(parts) + "\n"


# -- html -----------------------------------------------------------------------------------
def esc(value: str) -> str:
    return html.escape(value, quote=True)


STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1b1f24}
h1{font-size:22px;margin:0 0 8px}h2{font-size:17px;margin:28px 0 6px;border-bottom:1px solid #ddd}
p.note{color:#555;font-size:13px;margin:4px 0 8px}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 14px;font-size:13px}
dt{font-weight:600}dd{margin:0}
.scroll{overflow-x:auto}
table{border-collapse:collapse;font-size:12px;margin:6px 0}
th,td{border:1px solid #d0d7de;padding:3px 7px;text-align:right;white-space:nowrap}
th{background:#f3f5f7}td.t{text-align:left}
tbody tr:nth-child(even){background:#fafbfc}
figure{display:inline-block;width:calc(50% - 16px);margin:8px 12px 8px 0;vertical-align:top}
figcaption{font-size:12px;color:#555}img{max-width:100%;height:auto;border:1px solid #eee}
""".strip()

# No network, and no script but the viewer's own, allowed by its hash: the report opens
# offline, and injected markup could not run even if it slipped past escaping.
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


def csp(script_source: str | None = None) -> str:
    return CSP if script_source is None else f"{CSP}; script-src {script_source}"


# Columns of words rather than numbers, aligned left.
TEXT_HEADERS = frozenset({"task", "strategy", "category", "reference", "message", "run",
                          "model", "tokenizer"})


def _html_table(headers: list[str], body: list[list[str]], links: list[str] | None = None
                ) -> str:
    """A table of escaped cells; ``links``, one href per row, adds a column of links to
    the viewer."""
    if not body:
        return "<p class=\"note\">no rows</p>"
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    if links is not None:
        head += "<th>items</th>"
    opening = ["<td class=\"t\">" if h in TEXT_HEADERS else "<td>" for h in headers]
    rows = []
    for index, row in enumerate(body):
        cells = "".join(f"{opening[i]}{esc(c)}</td>" for i, c in enumerate(row))
        if links is not None:
            cells += f"<td class=\"t\"><a href=\"{esc(links[index])}\">view</a></td>"
        rows.append(f"<tr>{cells}</tr>")
    return (f"<div class=\"scroll\"><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table></div>")


def _data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def render_html(doc: Document) -> str:
    facts = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in doc.facts)
    viewer = doc.viewer
    style = STYLE
    if viewer is not None:
        from pytest_budgetbench.reports.viewer_page import STYLE as VIEWER_STYLE

        style += "\n" + VIEWER_STYLE
    policy = csp(viewer.csp_source if viewer is not None else None)
    parts = [
        "<!DOCTYPE html>",
        "<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{policy}\">",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">",
        f"<title>{esc(doc.title)}</title><style>{style}</style></head><body>",
        f"<h1>{esc(doc.title)}</h1><dl>{facts}</dl>",
    ]
    if viewer is not None:
        parts.append(viewer.panel)
    # The summary first, then the plots of it, then the detail tables.
    for index, (heading, note, (headers, body)) in enumerate(doc.sections):
        parts.append(f"<h2>{esc(heading)}</h2><p class=\"note\">{esc(note)}</p>")
        parts.append(_html_table(headers, body, doc.row_links.get(index)))
        if index == 0 and doc.plots:
            parts.append("<h2>Plots</h2>")
            parts.extend(
                f"<figure><img src=\"{_data_uri(plot.path)}\" alt=\"{esc(plot.title)}\">"
                f"<figcaption>{esc(plot.title)}</figcaption></figure>"
                for plot in doc.plots
            )
    if doc.errors:
        parts.append("<h2>Errors</h2>")
        parts.append(_html_table(["strategy", "cells", "message"],
                                 [[s, str(n), m] for s, m, n in doc.errors]))
    if viewer is not None:
        parts.extend((viewer.cell_tables, viewer.script))
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
