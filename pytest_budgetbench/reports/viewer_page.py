"""The viewer's part of an HTML page: a panel its script fills, per-cell item tables that
work without JavaScript, the data as an inert JSON block, and the script with its CSP hash.

Progressive enhancement: every link is an anchor. Without JavaScript, ``#cell=N`` jumps to
that cell's ``<details>`` table of items; with it, the script (viewer.js) renders the cell
with filters, and ``#item=TASK/ID`` renders every cell of that item side by side: its
prompt message by message (tool calls as calls with their arguments, tool results tied to
their call's id) and, for an episode cell, the trajectory call by call. Nothing
from the records is ever markup: the tables escape it, the JSON block has no ``<`` left
in it, and the script only sets ``textContent``.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from pytest_budgetbench.records.rows import Status

STYLE = """
#bb-viewer{position:fixed;inset:10px;overflow:auto;z-index:10;background:#fff;
border:2px solid #0969da;border-radius:6px;padding:8px 12px;box-shadow:0 4px 24px #0004}
.bb-bar{display:flex;align-items:baseline;gap:16px}.bb-bar h2{border:0;margin:4px 0}
.bb-close{margin-left:auto;font-size:13px}
.bb-filters{display:flex;gap:14px;font-size:13px;margin:6px 0}
.bb-cols{display:flex;gap:10px;overflow-x:auto;align-items:flex-start;padding-bottom:8px}
.bb-col{flex:0 0 380px;max-width:380px;min-width:0;overflow:hidden;border:1px solid #d0d7de;
border-radius:6px;padding:6px 8px;font-size:12px}
.bb-col h3{font-size:14px;margin:2px 0 6px}.bb-col dl{font-size:12px}
.bb-pre{white-space:pre-wrap;word-break:break-word;font-family:ui-monospace,monospace;
font-size:12px;margin:2px 0;max-height:22em;overflow:auto}
pre.bb-reply{background:#f6f8fa;padding:4px}pre.bb-error{background:#fff0f0;padding:4px}
.bb-label{font-weight:600;margin-top:6px}
.bb-msg{border-left:4px solid #d0d7de;margin:3px 0;padding-left:6px}
.bb-msg summary{cursor:pointer;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.bb-kept{border-color:#2da44e}.bb-new{border-color:#bf8700}
.bb-dropped .bb-msg,.bb-msg.bb-dropped{border-color:#cf222e;opacity:.75}
.bb-msg.bb-call{background:#f1f8ff}.bb-msg.bb-result{background:#fbf5ff}
.bb-evidence{font-size:12px;margin:3px 0}.bb-ev{margin:1px 0}
.bb-ev-tag{font-weight:600;margin-right:6px}.bb-ev-kept .bb-ev-tag{color:#1a7f37}
.bb-ev-dropped .bb-ev-tag{color:#cf222e}mark.bb-ev-hit{background:#dafbe1}
.bb-tool-head{font-weight:600;font-size:12px;margin-top:3px}
pre.bb-args{background:#f6f8fa;padding:3px}
.bb-step{border:1px solid #d0d7de;border-radius:4px;margin:4px 0;padding:2px 6px}
.bb-step>summary{cursor:pointer}.bb-step.bb-violated{border:2px solid #cf222e}
td.bb-clip{max-width:260px;overflow:hidden;text-overflow:ellipsis}
.bb-ok,.bb-win{color:#1a7f37}.bb-violation,.bb-loss{color:#cf222e}.bb-error{color:#9a6700}
details.bb-cell{margin:2px 0}details.bb-cell>summary{cursor:pointer;font-size:13px}
details.bb-cell:target{outline:2px solid #0969da}
""".strip()


@dataclass(frozen=True)
class ViewerPage:
    """What render_html puts into a page that has a viewer."""

    panel: str
    """The (hidden) panel and the JSON block: goes above the tables."""
    cell_tables: str
    """The per-cell item tables (a section of <details>): goes after the tables."""
    script: str
    """The <script> element."""
    csp_source: str
    """The CSP source that allows exactly that script: 'sha256-…'."""


@cache
def script_text() -> str:
    return resources.files(__package__).joinpath("viewer.js").read_text(encoding="utf-8")


def script_csp_source(script: str) -> str:
    digest = hashlib.sha256(script.encode("utf-8")).digest()
    return f"'sha256-{base64.b64encode(digest).decode('ascii')}'"


def cell_href(index: int) -> str:
    return f"#cell={index}"


def item_href(key: str) -> str:
    return "#item=" + urllib.parse.quote(key, safe="")


def page_json(document: Mapping[str, Any]) -> str:
    """The document as JSON that can sit inside a <script type="application/json"> block:
    no "<", ">" or "&" is left in it, so model text can never close the block."""
    text = json.dumps(document, ensure_ascii=False, allow_nan=False, default=str,
                      separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def viewer_page(document: Mapping[str, Any]) -> ViewerPage:
    """The page parts for a viewer document (reports.viewer.viewer_data)."""
    script = script_text()
    note = document.get("note") or ""
    panel = (
        "<noscript><p class=\"note\">The item viewer needs JavaScript; the tables and the "
        "item lists below work without it.</p></noscript>"
        "<section id=\"bb-viewer\" hidden></section>"
        f"<script type=\"application/json\" id=\"bb-data\">{page_json(document)}</script>"
    )
    return ViewerPage(panel=panel, cell_tables=_cell_tables(document, note),
                      script=f"<script>{script}</script>", csp_source=script_csp_source(script))


def _esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _cell_tables(document: Mapping[str, Any], note: str) -> str:
    """Per cell, a closed <details> with its items' status and quality (links to #item=)."""
    cells = document["cells"]
    per_cell: list[list[str]] = [[] for _ in cells]
    for item in document["items"]:
        href = _esc(item_href(item["key"]))
        merged: dict[int, tuple[str, list[float], Any]] = {}
        for row in item["rows"]:
            status, scores, tokens = merged.get(row["c"], ("", [], row.get("t")))
            if row.get("s") == Status.OK and isinstance(row.get("q"), int | float):
                scores.append(float(row["q"]))
            row_status = str(row.get("s", Status.ERROR.value))
            merged[row["c"]] = (_merge_status(status, row_status), scores, tokens)
        for cell, (status, scores, tokens) in merged.items():
            quality = f"{sum(scores) / len(scores):.3f}" if scores else ""
            per_cell[cell].append(
                f"<tr><td class=\"t\"><a href=\"{href}\">{_esc(item['item'])}</a></td>"
                f"<td class=\"t\">{_esc(item['category'])}</td>"
                f"<td class=\"t bb-{_esc(status)}\">{_esc(status)}</td><td>{quality}</td>"
                f"<td>{'' if tokens is None else _esc(tokens)}</td></tr>"
            )
    parts = ["<h2>Items by cell</h2><p class=\"note\">Each cell's items; an item's link opens "
             "every cell of it side by side (with JavaScript). " + _esc(note) + "</p>"]
    for index, (cell, rows) in enumerate(zip(cells, per_cell, strict=True)):
        label = f"{cell['side']} " if cell["side"] else ""
        label += f"{cell['task']}: {cell['strategy']}@{cell['budget']}"
        parts.append(
            f"<details class=\"bb-cell\" id=\"cell={index}\"><summary>{_esc(label)} "
            f"({len(rows)} items)</summary><div class=\"scroll\"><table><thead><tr>"
            "<th>item</th><th>category</th><th>status</th><th>quality</th><th>tokens</th>"
            f"</tr></thead><tbody>{''.join(rows)}</tbody></table></div></details>"
        )
    return "".join(parts)


def _merge_status(before: str, status: str) -> str:
    """Repeats merge as the item table merges them: ok if any, else violation if any."""
    order = {Status.OK.value: 0, Status.VIOLATION.value: 1, Status.ERROR.value: 2}
    if not before:
        return status
    return min(before, status, key=lambda s: order.get(s, 3))
