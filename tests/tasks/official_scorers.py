"""Upstream scorers and shared data for the differential tests, read by path.

``../shared/official_scorers`` holds unmodified copies of each benchmark's official
scoring code (commits in its SOURCES.txt) and ``../shared/data`` the real data, both next
to the repository root as CI lays them out (``BUDGETBENCH_SHARED_DIR`` points elsewhere,
e.g. from a git worktree). Nothing of them is copied into the repository: the functions a
test compares are taken out of the upstream file with ``ast`` and executed in a namespace
holding the real modules they call (``re``, ``regex``, ``numpy``, nltk's PorterStemmer),
so their top-level imports of packages they never call (openai, bert_score, tiktoken,
ujson, tau2) are never run, and nothing is stubbed.

``replies(...)`` generates the tricky replies every benchmark is scored on.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("BUDGETBENCH_SHARED_DIR") or ROOT.parent / "shared")
SCORERS = SHARED / "official_scorers"
DATA = SHARED / "data"


def missing(*paths: Path) -> str | None:
    """A skip reason naming the first absent shared file, or None when all are there."""
    for path in paths:
        if not path.exists():
            return f"shared file not present: {path} (set BUDGETBENCH_SHARED_DIR)"
    return None


def load_upstream(file: str, names: tuple[str, ...], namespace: dict[str, Any]
                  ) -> dict[str, Any]:
    """Execute only the named top-level definitions of an upstream file.

    A name may be ``Class.method``: that method is loaded as a plain function. Returns
    the namespace, which now holds the definitions.
    """
    tree = ast.parse((SCORERS / file).read_text(encoding="utf-8"))
    wanted: list[ast.stmt] = []
    for name in names:
        outer, _, inner = name.partition(".")
        node = _top_level(tree, outer)
        if inner:
            assert isinstance(node, ast.ClassDef), f"{outer} in {file} is not a class"
            node = _top_level(ast.Module(body=node.body, type_ignores=[]), inner)
        wanted.append(node)
    module = ast.Module(body=wanted, type_ignores=[])
    exec(compile(module, str(SCORERS / file), "exec"), namespace)
    return namespace


def upstream_statements(file: str, targets: tuple[str, ...], namespace: dict[str, Any]
                        ) -> dict[str, Any]:
    """Execute, in order, the assignments to ``targets`` found anywhere in a file (e.g. the
    label rule inside LongMemEval's ``__main__`` block), in ``namespace``."""
    tree = ast.parse((SCORERS / file).read_text(encoding="utf-8"))
    found = [node for node in ast.walk(tree) if isinstance(node, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id in targets for t in node.targets)]
    found.sort(key=lambda node: node.lineno)
    assert {t.id for node in found for t in node.targets if isinstance(t, ast.Name)} >= set(
        targets), f"{file} lacks assignments to {targets}"
    exec(compile(ast.Module(body=list(found), type_ignores=[]), str(SCORERS / file), "exec"),
         namespace)
    return namespace


def _top_level(tree: ast.Module, name: str) -> ast.stmt:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name == name:
            return node
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return node
    raise AssertionError(f"upstream definition {name!r} not found")


# -- generated replies ------------------------------------------------------------------------
REFUSALS = ("I don't know.", "I'm sorry, I cannot answer that.", "Connection refused",
            "N/A", "No information available.", "Not mentioned in the conversation.")
NUMBER_WORDS = {"1": "one", "2": "two", "3": "three", "4": "four", "5": "five", "6": "six",
                "7": "seven", "8": "eight", "9": "nine", "10": "ten"}


def replies(gold: str, other: str) -> list[str]:
    """Replies a model might give for a short-answer question with answer ``gold``
    (``other`` is a wrong answer from the same data)."""
    worded = " ".join(NUMBER_WORDS.get(word, word) for word in gold.split())
    return [
        "", "   ", "\n\n", *REFUSALS,
        gold, gold.lower(), gold.upper(), f" {gold} ", f"**{gold}**", f"*{gold}*",
        f"`{gold}`", f"# {gold}", f"- {gold}",
        f"Answer: {gold}", f"Final answer: {gold}", f"Short answer: {gold}",
        f"The answer is {gold}.", f"“{gold}”", f"‘{gold}’", f"{gold} — as stated.",
        f"{gold}…", worded, f"{gold}\nThis is stated in the second session.",
        f"**{gold}**\n\nExplanation: the text says so on several occasions.",
        f"Based on the conversation, I believe that the answer to your question is {gold}, "
        "although the details are somewhat unclear and there may be other readings.",
        f"{gold}\n{other}", f"{other}\n{gold}", f"{gold} or {other}", f"{gold}, {other}",
        f"Maybe {gold}.\nOr perhaps {other}.", "Yes\nNo", "Yes", "No", "yes or no",
        f"Answer: yes\n{gold}", other, f"Answer: {other}", "(a)", "a", "(b)", "b", "B", "(c)",
        "yes", f"Not mentioned in the conversation\n{gold}",
        f"{gold}\nNot mentioned in the conversation", f"{gold}\n\n\n", f"\t{gold}\r\n",
    ]
