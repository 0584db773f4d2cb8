"""The README and the manual in docs/ cannot drift from the code: every Python block
compiles and, unless marked as a fragment, runs; JSON and TOML blocks parse; every
``--budgetbench-*`` flag and ``budgetbench_*`` ini name they mention is one the plugin
has; every relative link points at a page and a heading that exist.

A block that cannot run alone (it continues an earlier one) is preceded by
``<!-- not-run: why -->``; the reason is required.
"""

from __future__ import annotations

import json
import re
import tomllib
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
WORKFLOWS = tuple(sorted((ROOT / "docs" / "examples").glob("*.yml")))
"""The CI workflows the docs ship: their flags are checked as the pages' are."""

FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
NOT_RUN = re.compile(r"<!--\s*not-run:(.*?)-->\s*$", re.DOTALL)
FLAG = re.compile(r"--budget(?:s\b|bench-[\w-]*(?:<\w+>|\*)?)")
INI = re.compile(r"(?<![\w.])budgetbench_(?:\w+(?:<\w+>)?|<\w+>)")
LINK = re.compile(r"\]\(([^)\s]+)\)")

# Flags the docs name that exist only once their example is written: they are made by
# the example task, strategy or named task the same page defines.
EXAMPLE_FLAGS = {
    "--budgetbench-data-manuals": "the Manuals task of docs/tasks.md (its data file)",
    "--budgetbench-data-my_task": "a task named my_task, in docs/strategies.md's DataFile line",
    "--budgetbench-last-turns-max": "Option(..., flag='last-turns-max') in docs/strategies.md",
    "--budgetbench-data-support_chats": "the support_chats instance in docs/tasks.md's ini",
}
EXAMPLE_INI = {"budgetbench_data_support_chats": "the support_chats instance's data",
               # Not an ini name: the JUnit property a gate's verdict is written to.
               "budgetbench_gate": "docs/gates.md's JUnit property",
               "budgetbench_safe_budget": "docs/gates.md's JUnit property of a search"}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    code: str
    not_run: str | None  # the reason, when marked as a fragment

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip()
        marker = NOT_RUN.search(before[before.rfind("\n") + 1:])
        found.append(Block(page, text.count("\n", 0, match.start()) + 1, match.group(1),
                           match.group(2), marker.group(1).strip() if marker else None))
    return found


BLOCKS = [block for page in PAGES for block in _blocks(page)]
PYTHON = [block for block in BLOCKS if block.lang == "python"]


def test_the_pages_hold_python_blocks() -> None:
    # A broken fence pattern would make every test below pass over nothing.
    assert len(PYTHON) >= 8
    assert {block.page.name for block in PYTHON} >= {"README.md", "strategies.md", "tasks.md"}


@pytest.mark.parametrize("block", PYTHON, ids=lambda block: block.where)
def test_python_block_compiles(block: Block) -> None:
    compile(block.code, block.where, "exec")


@pytest.mark.parametrize("block", [b for b in PYTHON if b.not_run is None],
                         ids=lambda block: block.where)
def test_python_block_runs_on_its_own(block: Block) -> None:
    exec(compile(block.code, block.where, "exec"), {"__name__": "docs_example"})


def test_every_not_run_marker_says_why_and_marks_a_block() -> None:
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        marked = sum(1 for block in BLOCKS if block.page == page and block.not_run is not None)
        assert text.count("<!-- not-run:") == marked, f"{page.name}: a marker not before a block"
    for block in BLOCKS:
        if block.not_run is not None:
            assert block.not_run, f"{block.where}: not-run needs a reason"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang in ("json", "toml")],
                         ids=lambda block: block.where)
def test_json_and_toml_blocks_parse(block: Block) -> None:
    if block.lang == "json":
        json.loads(block.code)
    else:
        tomllib.loads(block.code)


def _undeclared(named: set[str], known: set[str], examples: dict[str, str]) -> list[str]:
    """The names that are neither known, an example's, nor a placeholder
    (``--budgetbench-data-<task>``, ``--budgetbench-judge-*``) some known name fits."""
    unknown = []
    for name in sorted(named - known - set(examples)):
        prefix = re.sub(r"(<\w+>|\*)$", "", name)
        if prefix == name or not any(flag.startswith(prefix) for flag in known):
            unknown.append(name)
    return unknown


def _plugin_help(pytester: pytest.Pytester) -> str:
    """``pytest --help`` with the plugin: the flags and ini names a user can pass."""
    result = pytester.runpytest("--help")
    assert "--budgetbench-only" in result.stdout.str()
    return result.stdout.str()


def test_every_flag_the_docs_name_exists(pytester: pytest.Pytester) -> None:
    known = set(FLAG.findall(_plugin_help(pytester)))
    named = {flag for page in (*PAGES, *WORKFLOWS)
             for flag in FLAG.findall(page.read_text(encoding="utf-8"))}
    assert WORKFLOWS, "docs/examples/ holds no workflow: the glob is wrong"
    assert _undeclared(named, known, EXAMPLE_FLAGS) == []
    assert set(EXAMPLE_FLAGS) <= named, "an example flag is no longer in the docs: drop it here"


def test_every_ini_name_the_docs_name_exists(pytester: pytest.Pytester) -> None:
    known = set(INI.findall(_plugin_help(pytester)))
    named = {name for page in PAGES for name in INI.findall(page.read_text(encoding="utf-8"))}
    assert _undeclared(named, known, EXAMPLE_INI) == []
    assert set(EXAMPLE_INI) <= named, "an example ini name is no longer in the docs: drop it here"


def _slug(heading: str) -> str:
    """The anchor of a heading, as mkdocs (and, for these headings, GitHub) makes it."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*?)\s*$", text, re.MULTILINE)}


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_relative_links_reach_a_page_and_a_heading(page: Path) -> None:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    for target in LINK.findall(text):
        if re.match(r"\w+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name}: link to {target}: no such file"
        if anchor and linked.suffix == ".md":
            assert anchor in _anchors(linked), f"{page.name}: link to {target}: no such heading"


def test_the_readme_stays_a_front_door() -> None:
    """The README is the five-minute introduction (under 300 lines); the manual is the rest,
    and its index lists every page of docs/."""
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) < 300
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    unlisted = [page.name for page in sorted((ROOT / "docs").glob("*.md"))
                if page.name != "index.md" and f"]({page.name})" not in index]
    assert not unlisted, f"docs/index.md does not list: {unlisted}"
