"""The per-cell viewer of report.html: its data (rows, prompts, caps), the page parts, and
the page in headless Chromium (skipped, with the reason, where none is installed)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import urllib.parse
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.engine.evidence import spans_kept
from pytest_budgetbench.records.episodes import EPISODES_FILE
from pytest_budgetbench.records.prompts import PROMPTS_FILE, PromptRecord
from pytest_budgetbench.records.rows import Status
from pytest_budgetbench.reports import build_report
from pytest_budgetbench.reports.synthetic import (
    make_row,
    synthetic_history,
    synthetic_rows,
    write_prompts,
    write_run,
)
from pytest_budgetbench.reports.viewer import Side, ViewerCell, viewer_data
from pytest_budgetbench.reports.viewer_page import page_json, script_csp_source, script_text

pytest.importorskip("pandas")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
try:
    from screenshot_report import find_chromium
finally:
    sys.path.pop(0)

EVIL_REPLY = "<script>document.title='pwned'</script><img src=x id=evil>"
STRATEGIES = ("full_context", "truncation", "recency", "summary", "rag")


def sweep(tmp_path: Path, items: int = 8, **row_fields: Any) -> tuple[Path, list[dict[str, Any]]]:
    rows = synthetic_rows(items=items, strategies=STRATEGIES, budgets=(512, 1024, 2048, 4096))
    rows = [{**row, "gold": ["note 21"], **row_fields} for row in rows]
    run = write_run(tmp_path / "run", rows)
    write_prompts(run, rows)
    return run, rows


def cells_of(rows: list[dict[str, Any]]) -> list[ViewerCell]:
    keys = sorted({(r["task"], r["strategy"], r["budget"], r["reference"]) for r in rows})
    return [ViewerCell("", task, strategy, budget, reference)
            for task, strategy, budget, reference in keys]


# -- the data -------------------------------------------------------------------------------
def test_an_item_holds_every_cell_with_its_prompt_marked_against_the_full_history(
    tmp_path: Path,
) -> None:
    run, rows = sweep(tmp_path)
    cells = cells_of(rows)
    data = viewer_data([Side("", [run])], cells)
    assert data["note"] == ""
    item = next(i for i in data["items"] if i["key"] == "memory/item00003")
    assert len(item["rows"]) == len(cells) and item["gold"] == ["note 21"]
    # Each distinct message is held once; the full history is the reference's prompt.
    texts = [text for _role, text in item["msgs"]]
    assert len(texts) == len(set(texts)) == len(synthetic_history("item00003"))
    assert [item["msgs"][i][1] for i in item["full"]] == [
        m["content"] for m in synthetic_history("item00003")]
    truncation = next(r for r in item["rows"] if cells[r["c"]].strategy == "truncation"
                      and cells[r["c"]].budget == 512)
    assert truncation["pm"] == "full" and set(truncation["p"]) < set(item["full"])
    assert truncation["s"] in ("ok", "violation") and truncation["id"].endswith("truncation-512")


def test_prompts_follow_the_audit_hash_only_or_absent(tmp_path: Path) -> None:
    run, rows = sweep(tmp_path, items=2)
    records = [json.loads(line) for line in (run / PROMPTS_FILE).read_text().splitlines()]
    hashed = [{k: v for k, v in r.items() if k != "messages"} | {"prompt_sha256": "ab" * 32}
              for r in records]
    (run / PROMPTS_FILE).write_text("".join(json.dumps(r) + "\n" for r in hashed))
    data = viewer_data([Side("", [run])], cells_of(rows))
    assert {r["pm"] for i in data["items"] for r in i["rows"]} == {"hash"}
    assert all(i["full"] is None and i["msgs"] == [] for i in data["items"])
    (run / PROMPTS_FILE).unlink()
    data = viewer_data([Side("", [run])], cells_of(rows))
    assert {r["pm"] for i in data["items"] for r in i["rows"]} == {"none"}


# In item00003's history; truncation@512 keeps the newest turn and drops turn 3.
KEPT_SPAN, DROPPED_SPAN = "item00003 turn 7: note 49", "item00003 turn 3: note 21"


def mark_evidence(run: Path, item: str = "item00003") -> None:
    """Gives the item's prompts.jsonl records the evidence marks the runner writes (the
    engine's rule, on each prompt); other items' records keep none."""
    path = run / PROMPTS_FILE
    records = [PromptRecord.from_record(json.loads(line))
               for line in path.read_text().splitlines()]
    marked = [replace(r, evidence=spans_kept((KEPT_SPAN, DROPPED_SPAN), r.messages or []))
              if item in r.cell_id else r for r in records]
    path.write_text("".join(json.dumps(r.record()) + "\n" for r in marked))


def test_a_prompt_lists_the_evidence_spans_each_marked_kept_or_dropped(tmp_path: Path) -> None:
    run, rows = sweep(tmp_path, items=4)
    mark_evidence(run)
    cells = cells_of(rows)
    items = {i["item"]: i for i in viewer_data([Side("", [run])], cells)["items"]}
    by_cell = {(cells[r["c"]].strategy, cells[r["c"]].budget): r
               for r in items["item00003"]["rows"]}
    assert by_cell[("truncation", 512)]["ev"] == [[KEPT_SPAN, True], [DROPPED_SPAN, False]]
    assert by_cell[("full_context", 4096)]["ev"] == [[KEPT_SPAN, True], [DROPPED_SPAN, True]]
    # An item without evidence, or records that predate the marks: nothing extra.
    assert all("ev" not in r for r in items["item00002"]["rows"])
    capped = viewer_data([Side("", [run])], cells, max_prompt_chars=10)
    assert all("ev" not in r for i in capped["items"] for r in i["rows"])


def test_a_large_run_is_capped_with_a_note_and_whole_items(tmp_path: Path) -> None:
    run, rows = sweep(tmp_path, items=30)
    per_item = len(STRATEGIES) * 4
    data = viewer_data([Side("", [run])], cells_of(rows), max_rows=5 * per_item)
    assert len(data["items"]) == 5
    assert all(len(item["rows"]) == per_item for item in data["items"])  # never half an item
    assert "holds 5 of 30 items" in data["note"]
    capped = viewer_data([Side("", [run])], cells_of(rows), max_prompt_chars=2000)
    modes = [{r["pm"] for r in item["rows"]} for item in capped["items"]]
    assert {"full"} in modes and {"cap"} in modes and "prompts of" in capped["note"]


def test_a_resumed_cell_shows_its_last_row(tmp_path: Path) -> None:
    run, rows = sweep(tmp_path, items=2)
    again = make_row("memory", "item00001", "rag", 512, prediction="second try", quality=0.0)
    with (run / "cells.jsonl").open("a") as handle:
        handle.write(json.dumps(again) + "\n")
    data = viewer_data([Side("", [run])], cells_of(rows))
    item = next(i for i in data["items"] if i["item"] == "item00001")
    replies = [r.get("y") for r in item["rows"] if r["id"] == again["cell_id"]]
    assert replies == ["second try"]


def test_page_json_cannot_close_its_script_block() -> None:
    document = {"reply": EVIL_REPLY + "</script><!-- & -->"}
    text = page_json(document)
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == document


def test_report_html_links_the_summary_to_the_viewer_and_allows_only_its_script(
    tmp_path: Path,
) -> None:
    run, _rows = sweep(tmp_path, items=3)
    report = build_report([run], tmp_path / "out", resamples=100, plots=False)
    page = report.paths["html"].read_text(encoding="utf-8")
    assert page.count('href="#cell=') >= len(report.summary)
    assert 'id="cell=0"' in page and "#item=memory%2Fitem00002" in page
    policy = re.search(r'Content-Security-Policy" content="([^"]*)"', page)
    assert policy is not None
    assert policy.group(1).endswith(f"script-src {script_csp_source(script_text())}")
    assert f"<script>{script_text()}</script>" in page  # the hashed text, byte for byte
    assert " on" + "click=" not in page.replace(script_text(), "")  # no inline handlers
    no_viewer = build_report([run], tmp_path / "plain", resamples=100, plots=False,
                             viewer_rows=0)
    assert "<script" not in no_viewer.paths["html"].read_text(encoding="utf-8")


# -- tool calls and episodes ----------------------------------------------------------------
def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": arguments}}


TRAJECTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "You book flights."},
    {"role": "user", "content": "Book me the cheapest flight to Oslo on Friday."},
    {"role": "assistant", "content": None,
     "tool_calls": [_call("call_a", "search_flights", '{"to": "OSL", "day": "fri"}')]},
    {"role": "tool", "tool_call_id": "call_a", "content": "SK123 99 EUR; DY45 120 EUR"},
    {"role": "assistant", "content": "SK123 is cheapest.",
     "tool_calls": [_call("call_b", "book", '{"flight": "SK123"}')]},
    {"role": "tool", "tool_call_id": "call_b", "content": "booked: ref XQ7"},
]
SUMMARY = {"role": "user", "content": "[summary] searched flights to Oslo, SK123 cheapest"}


def _episode_record(cell_id: str, last_reply: str = "Booked SK123, ref XQ7.") -> dict[str, Any]:
    """Three calls: the first two send the trajectory as is, the third a summary in place
    of the search (call_a and its result dropped)."""
    calls = [
        {"call": 1, "prompt": [{"t": 0}, {"t": 1}], "tools": 2, "counted_tokens": 120,
         "server_prompt_tokens": 121, "prefix_tokens": 0, "model_s": 0.2, "cached": False,
         "output_tokens": 9, "seen": 2},
        {"call": 2, "prompt": [{"t": i} for i in range(4)], "tools": 2, "counted_tokens": 300,
         "server_prompt_tokens": 301, "prefix_tokens": 120, "model_s": 0.3, "cached": False,
         "output_tokens": 12, "seen": 4},
        {"call": 3, "prompt": [{"t": 0}, {"m": SUMMARY}, {"t": 4}, {"t": 5}], "tools": 2,
         "counted_tokens": 700, "server_prompt_tokens": None, "prefix_tokens": 0,
         "model_s": None, "cached": False, "output_tokens": None, "seen": 6},
    ]
    tools = [{"type": "function", "function": {"name": n, "parameters": {}}}
             for n in ("search_flights", "book")]
    return {"cell_id": cell_id, "run_id": "run", "tools": tools,
            "trajectory": [*TRAJECTORY, {"role": "assistant", "content": last_reply}],
            "ended": "violation", "calls": calls}


def agent_run(tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    """A run with an item of two cells: an episode cell (rows with ``calls``) whose record
    in episodes.jsonl was rewritten by a rerun (a stale record, a torn line, the last
    record), and a plain cell whose prompt holds the trajectory's tool calls."""
    episode_row = make_row("flights", "trip1", "summary", 512, status=Status.VIOLATION,
                           counted_tokens=700) | {
        "calls": 3, "call_tokens": [120, 300, 700], "max_call_tokens": 700,
        "p95_call_tokens": 700, "sum_call_tokens": 1120, "violated_call": 3,
        "total_tokens": 1141, "prefix_reuse": 0.4, "ended": "violation"}
    plain = make_row("flights", "trip1", "full_context", 4096, reference=True)
    rows = [episode_row, plain]
    run = write_run(tmp_path / "run", rows)
    with (run / PROMPTS_FILE).open("w") as handle:
        handle.write(json.dumps({"cell_id": plain["cell_id"], "prompt_sha256": "",
                                 "messages": TRAJECTORY}) + "\n")
    with (run / EPISODES_FILE).open("w") as handle:
        handle.write(json.dumps(_episode_record(episode_row["cell_id"], "stale")) + "\n")
        handle.write('{"cell_id": "flights-trip1-summary-512", "trajec\n')  # torn
        handle.write(json.dumps(_episode_record(episode_row["cell_id"])) + "\n")
    return run, rows


def test_tool_calls_are_shown_as_calls_and_results_as_results_of_their_call(
    tmp_path: Path,
) -> None:
    run, rows = agent_run(tmp_path)
    (item,) = viewer_data([Side("", [run])], cells_of(rows))["items"]
    plain = next(r for r in item["rows"] if r["c"] == 0)  # full_context sorts first
    shown = [item["msgs"][i] for i in plain["p"]]
    assert shown[2] == ["assistant", "", {"calls": [
        ["call_a", "search_flights", '{\n  "to": "OSL",\n  "day": "fri"\n}']]}]
    assert shown[3] == ["tool", "SK123 99 EUR; DY45 120 EUR", {"call": "call_a"}]
    assert shown[4][:2] == ["assistant", "SK123 is cheapest."]  # text and call, apart
    assert shown[4][2]["calls"][0][:2] == ["call_b", "book"]
    assert all("tool_call" not in text for _role, text, *_ in item["msgs"])  # no JSON dump


def test_an_episode_cell_shows_each_call_prompt_with_kept_new_and_dropped_messages(
    tmp_path: Path,
) -> None:
    run, rows = agent_run(tmp_path)
    (item,) = viewer_data([Side("", [run])], cells_of(rows))["items"]
    row = next(r for r in item["rows"] if r["c"] == 1)
    assert (row["nc"], row["vc"], row["ct"], row["en"]) == (3, 3, [120, 300, 700], "violation")
    episode = row["ep"]
    msgs = item["msgs"]
    assert [msgs[i][1] for i in episode["traj"]][-1] == "Booked SK123, ref XQ7."  # last wins
    assert episode["tools"] == ["search_flights", "book"] and episode["ended"] == "violation"
    first, second, third = episode["calls"]
    assert [msgs[i][0] for i in second["p"]] == ["system", "user", "assistant", "tool"]
    assert (first["d"], second["d"], second["n"]) == ([], [], [])
    assert [msgs[i] for i in third["p"]] == [
        ["system", "You book flights."], ["user", SUMMARY["content"]],
        *[msgs[episode["traj"][i]] for i in (4, 5)]]
    assert third["n"] == [1]  # the summary is the strategy's
    assert [msgs[i][1] for i in third["d"]] == [  # before seen, named by no entry
        TRAJECTORY[1]["content"], "", TRAJECTORY[3]["content"]]
    assert (third["k"], third["t"], third["seen"], third["nt"]) == (3, 700, 6, 2)
    assert "st" not in third and second["st"] == 301


def test_an_episode_without_its_record_says_so_and_plain_cells_have_none(
    tmp_path: Path,
) -> None:
    run, rows = agent_run(tmp_path)
    (run / EPISODES_FILE).unlink()
    (item,) = viewer_data([Side("", [run])], cells_of(rows))["items"]
    episode_row, plain = sorted(item["rows"], key=lambda r: -r["c"])
    assert episode_row["em"] == "none" and "ep" not in episode_row
    assert "em" not in plain and "nc" not in plain
    (run / EPISODES_FILE).mkdir()  # unreadable: still no episode view, and no error
    (item,) = viewer_data([Side("", [run])], cells_of(rows))["items"]
    assert {r.get("em") for r in item["rows"]} == {"none", None}
    capped = viewer_data([Side("", [run])], cells_of(rows), max_prompt_chars=10)
    assert {r.get("em") for r in capped["items"][0]["rows"]} == {"none", None}


def test_a_capped_item_leaves_its_episode_out(tmp_path: Path) -> None:
    run, rows = agent_run(tmp_path)
    (item,) = viewer_data([Side("", [run])], cells_of(rows), max_prompt_chars=10)["items"]
    assert [r.get("em") for r in item["rows"] if "nc" in r] == ["cap"]
    assert all("ep" not in r for r in item["rows"])


# -- in a browser ---------------------------------------------------------------------------
CHROMIUM = find_chromium()
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium on PATH (chromium, chromium-browser or google-chrome)"
)


def browse(url: str) -> str:
    """The DOM of ``url`` after its scripts ran, from headless Chromium (no network)."""
    assert CHROMIUM is not None
    with tempfile.TemporaryDirectory(prefix="budgetbench-chromium-") as profile:
        result = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={profile}", "--virtual-time-budget=5000",
             "--dump-dom", url],
            capture_output=True, text=True, timeout=120, check=False,
        )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


@pytest.fixture(scope="module")
def big_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1,200 cells (5 strategies x 5 budgets x 48 items), prompts kept, and a reply that
    carries markup."""
    tmp = tmp_path_factory.mktemp("viewer")
    rows = synthetic_rows(items=48)
    rows.append(make_row("memory", "item00003", "rag", 512, prediction=EVIL_REPLY,
                         extracted="<b>x</b>", quality=0.0, gold=["note 21"]))
    run = write_run(tmp / "run", rows)
    write_prompts(run, rows)
    assert len({r["cell_id"] for r in rows}) >= 1000
    report = build_report([run], tmp / "out", resamples=100, plots=False)
    return report.paths["html"]


@needs_chromium
def test_the_viewer_opens_an_item_with_its_prompts_and_keeps_model_markup_inert(
    big_report: Path,
) -> None:
    url = big_report.resolve().as_uri() + "#item=" + urllib.parse.quote("memory/item00003",
                                                                        safe="")
    dom = browse(url)
    panel = dom.split('<section id="bb-viewer"', 1)[1].split("</section>", 1)[0]
    assert "memory / item00003" in panel
    assert panel.count('class="bb-col"') == 25  # every strategy x budget, side by side
    assert "item00003 turn 5: note 35" in panel  # the prompt, message by message
    assert "· kept ·" in panel and "dropped from the full history" in panel
    # The reply is shown as text: its script never ran and its img is no element.
    assert "&lt;script&gt;document.title='pwned'&lt;/script&gt;" in panel
    assert "<title>budgetbench report</title>" in dom and "pwned</title>" not in dom
    assert 'id="evil"' not in dom and dom.count("<script") == 2


@needs_chromium
def test_a_cell_lists_its_items_and_without_javascript_the_tables_remain(
    big_report: Path,
) -> None:
    dom = browse(big_report.resolve().as_uri() + "#cell=7")
    panel = dom.split('<section id="bb-viewer"', 1)[1].split("</section>", 1)[0]
    assert "48 items; wins and losses against full_context@4096" in panel
    assert panel.count('href="#item=memory%2Fitem') == 48
    # Without JavaScript (headless Chromium cannot dump a DOM without it, so the file is
    # read): the panel stays hidden, and #cell=7 is the id of that cell's item table.
    page = big_report.read_text(encoding="utf-8")
    assert '<section id="bb-viewer" hidden></section>' in page and "<noscript>" in page
    assert '<details class="bb-cell" id="cell=7">' in page and "<h2>Summary</h2>" in page


@needs_chromium
def test_the_viewer_shows_tool_calls_and_an_episode_call_by_call(tmp_path: Path) -> None:
    run, _rows = agent_run(tmp_path)
    report = build_report([run], tmp_path / "out", resamples=100, plots=False)
    dom = browse(report.paths["html"].resolve().as_uri() + "#item=flights%2Ftrip1")
    panel = dom.split('<section id="bb-viewer"', 1)[1].split("</section>", 1)[0]
    # Calls as calls, with their arguments; results as results of their call.
    assert "assistant · kept · calls search_flights" in panel
    assert "call call_a: search_flights" in panel and '"to": "OSL"' in panel
    assert "tool result · kept · of call call_a (search_flights)" in panel
    assert "result of call call_b (book)" in panel
    # The episode: every call, the violating one open and marked, the dropped messages.
    assert "episode: 3 calls · ended violation · call 3 violated the budget" in panel
    assert "tools: search_flights, book" in panel
    assert "call 1 · 120 tokens · sent 2 (2 kept, 0 new) · dropped 0" in panel
    assert ("call 3 · 700 tokens (over 512) · sent 4 (3 kept, 1 new) · dropped 3 · VIOLATION"
            in panel)
    assert 'class="bb-step bb-violated" open=""' in panel
    assert "3 dropped from the trajectory" in panel and "user · new · [summary]" in panel


@needs_chromium
def test_the_viewer_marks_evidence_kept_or_dropped_and_highlights_kept_spans(
    tmp_path: Path,
) -> None:
    run, _rows = sweep(tmp_path, items=4)
    old_report = build_report([run], tmp_path / "old", resamples=100, plots=False)
    mark_evidence(run)
    report = build_report([run], tmp_path / "out", resamples=100, plots=False)
    dom = browse(report.paths["html"].resolve().as_uri() + "#item=memory%2Fitem00003")
    panel = dom.split('<section id="bb-viewer"', 1)[1].split("</section>", 1)[0]
    truncation = next(col for col in panel.split('class="bb-col"')
                      if ">truncation@512<" in col)
    assert "evidence: 1 of 2 spans kept verbatim" in truncation
    assert (f'<div class="bb-ev bb-ev-kept"><span class="bb-ev-tag">\u2713 kept</span>'
            f'<span class="bb-pre">{KEPT_SPAN}</span></div>') in truncation
    assert (f'<div class="bb-ev bb-ev-dropped"><span class="bb-ev-tag">\u2717 dropped</span>'
            f'<span class="bb-pre">{DROPPED_SPAN}</span></div>') in truncation
    assert f'<mark class="bb-ev-hit">{KEPT_SPAN}</mark>' in truncation
    assert f'<mark class="bb-ev-hit">{DROPPED_SPAN}' not in truncation
    # The same run before the marks (an old prompts.jsonl) renders its prompts, no marks.
    dom = browse(old_report.paths["html"].resolve().as_uri() + "#item=memory%2Fitem00003")
    panel = dom.split('<section id="bb-viewer"', 1)[1].split("</section>", 1)[0]
    assert "item00003 turn 7: note 49" in panel and "bb-ev" not in panel


def test_a_row_carries_answer_kept_to_the_page_and_an_episode_call_its_own(
    tmp_path: Path,
) -> None:
    run, rows = sweep(tmp_path, items=2, answer_kept=False, answer_unique=False)
    (item, *_rest) = viewer_data([Side("", [run])], cells_of(rows))["items"]
    assert {(row["ak"], row["au"]) for row in item["rows"]} == {(False, False)}
    run, rows = agent_run(tmp_path / "agent")
    record = json.loads((run / EPISODES_FILE).read_text().splitlines()[-1])
    record["calls"][1] |= {"answer_kept": True, "answer_unique": True}
    (run / EPISODES_FILE).write_text(json.dumps(record) + "\n")
    (item,) = viewer_data([Side("", [run])], cells_of(rows))["items"]
    calls = next(row for row in item["rows"] if "ep" in row)["ep"]["calls"]
    assert [(call.get("ak"), call.get("au")) for call in calls] == [
        (None, None), (True, True), (None, None)]


@needs_chromium
def test_the_viewer_says_whether_a_prompt_kept_the_answer(tmp_path: Path) -> None:
    run, _rows = sweep(tmp_path, items=2, answer_kept=False, answer_unique=False)
    report = build_report([run], tmp_path / "out", resamples=100, plots=False)
    dom = browse(report.paths["html"].resolve().as_uri() + "#item=memory%2Fitem00001")
    panel = dom.split('<section id="bb-viewer"', 1)[1].split("</section>", 1)[0]
    assert ("<dt>answer kept</dt><dd>no (not unique: the history holds it outside the "
            "evidence too)</dd>") in panel
