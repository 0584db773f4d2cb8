"""``swe_verified``: SWE-bench Verified issues, answered with a patch (Jimenez et al., 2024).

Reads the SWE-bench Verified test split given by ``--budgetbench-data-swe_verified``: a
JSON-lines file (or a JSON list) of records with at least ``instance_id, repo,
base_commit, problem_statement, patch`` (the gold patch).

History: the repository and commit, then the problem statement as several user messages
of about ``chunk_tokens`` tokens. The final user message asks for a unified diff only.

Category: the ``repo`` (e.g. ``django/django``).

Grader ``swe-verified-patch-proxy/2``: a deterministic PROXY, not the official resolved
rate (that needs the repositories' tests in containers):
``0.4 x file-level recall + 0.6 x changed-line overlap``. File recall is the share of the
gold patch's files the predicted diff touches. Changed-line overlap is the F1 of the
multisets of changed lines (``+``/``-`` sign and whitespace-collapsed text) between the
predicted and gold diffs, restricted to the files both touch. File names come from the
``diff --git``, ``---`` and ``+++`` headers, with an ``a/`` or ``b/`` prefix removed as a
prefix (never character-stripped), and ``/dev/null`` ignored. A reply with no diff scores 0.
The patch scored is the one exported: SWE-bench's own ``extract_diff`` (the first fenced or
``<diff>``/``<patch>``-tagged block named diff or patch, else the first other fenced or
tagged block, else the whole reply up to ``</s>``), as its inference scripts extract it.

export(): the official SWE-bench predictions format, ``{"instance_id",
"model_name_or_path", "model_patch"}`` with ``model_patch`` as SWE-bench's
``extract_diff`` gives it, one JSONL file per strategy and budget
(``swe_verified_predictions.<strategy>-<budget>.jsonl``), ready for
``swebench.harness.run_evaluation --predictions_path``.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_budgetbench.messages import Message
from pytest_budgetbench.options import DataFile
from pytest_budgetbench.tasks._data import cell_suffix, read_json, records, require, resolve_file
from pytest_budgetbench.tasks._text import document_messages, token_f1
from pytest_budgetbench.tasks.base import Grade, Item, Task

OFFICIAL_FILES = ("swebench_verified.jsonl", "test.jsonl", "data.jsonl", "swebench_verified.json")
FIELDS = ("instance_id", "repo", "base_commit", "problem_statement", "patch")
FILE_WEIGHT = 0.4
LINE_WEIGHT = 0.6

SYSTEM_PROMPT = (
    "You are an expert software engineer. You will be given an issue from a GitHub "
    "repository. Write a patch that resolves it."
)
REQUEST = (
    "Write a patch that resolves the issue above, as a unified diff in `git diff` format "
    "(headers `diff --git a/<path> b/<path>`, `--- a/<path>`, `+++ b/<path>`, then hunks). "
    "Reply with the diff only."
)

_TAGGED = re.compile(r"\<([\w-]+)\>(.*?)\<\/\1\>", re.DOTALL)
_FENCED = re.compile(r"```(\w+)?\n(.*?)```", re.DOTALL)
_GIT_HEADER = re.compile(r"^diff --git (\S+) (\S+)")


@dataclass
class FileChange:
    path: str
    lines: Counter[str] = field(default_factory=Counter)


def strip_prefix(path: str) -> str:
    """``a/x`` or ``b/x`` -> ``x``; other paths unchanged (``b/`` is a prefix, not a set)."""
    path = path.strip().split("\t")[0].strip()
    if path.startswith('"') and path.endswith('"') and len(path) >= 2:
        path = path[1:-1]
    for prefix in ("a/", "b/"):
        if path.startswith(prefix):
            return path[len(prefix):]
    return path


def extract_diff(reply: str | None) -> str:
    """The patch in a reply, as SWE-bench's ``inference/make_datasets/utils.extract_diff``
    finds it: the first block tagged or fenced ``diff``/``patch``, else the first other
    tagged or fenced block, else the reply up to ``</s>``. None becomes ""."""
    if reply is None:
        return ""
    diffs: list[str] = []
    others: list[str] = []
    for pattern in (_TAGGED, _FENCED):
        for label, body in pattern.findall(reply):
            (diffs if label in {"diff", "patch"} else others).append(body)
    if diffs:
        return diffs[0]
    if others:
        return others[0]
    return reply.split("</s>")[0]


def parse_diff(diff: str) -> dict[str, FileChange]:
    """Changed lines per file of a unified diff (files named by their new path)."""
    files: dict[str, FileChange] = {}
    current: FileChange | None = None
    lines = diff.splitlines()
    in_hunk = False
    for index, line in enumerate(lines):
        following = lines[index + 1] if index + 1 < len(lines) else ""
        git = _GIT_HEADER.match(line)
        if git:
            path = strip_prefix(git.group(2))
            current = files.setdefault(path, FileChange(path))
            in_hunk = False
        elif line.startswith("--- ") and following.startswith("+++ "):
            # A file header, even inside a hunk: "--- x" then "+++ y" is never a hunk body.
            in_hunk = False
        elif line.startswith("+++ ") and not in_hunk:
            current = _switch_file(files, current, line[4:], lines[index - 1] if index else "")
        elif line.startswith("@@"):
            in_hunk = current is not None
        elif in_hunk and current is not None and line[:1] in ("+", "-"):
            current.lines[line[0] + " ".join(line[1:].split())] += 1
    return files


def _switch_file(
    files: dict[str, FileChange], current: FileChange | None, new: str, previous: str
) -> FileChange | None:
    new_path = strip_prefix(new)
    if new_path == "/dev/null":
        # A deleted file is named by its old path.
        old = previous[4:] if previous.startswith("--- ") else ""
        new_path = strip_prefix(old)
    if not new_path or new_path == "/dev/null":
        return current
    if current is not None and current.path != new_path and not current.lines:
        # The git header named the file differently (a rename): the +++ path wins.
        files.pop(current.path, None)
    return files.setdefault(new_path, FileChange(new_path))


def proxy_score(prediction_diff: str, gold_diff: str) -> tuple[float, dict[str, Any]]:
    """(score, detail) of the patch proxy; see the module docstring."""
    predicted, gold = parse_diff(prediction_diff), parse_diff(gold_diff)
    gold_files = {path for path, change in gold.items() if change.lines} or set(gold)
    matched = sorted(gold_files & set(predicted))
    recall = len(matched) / len(gold_files) if gold_files else 0.0
    predicted_lines = _flatten(predicted, matched)
    gold_lines = _flatten(gold, matched)
    overlap = token_f1(predicted_lines, gold_lines)[0] if matched else 0.0
    score = FILE_WEIGHT * recall + LINE_WEIGHT * overlap
    return score, {
        "file_recall": recall,
        "line_overlap_f1": overlap,
        "gold_files": sorted(gold_files),
        "predicted_files": sorted(predicted),
    }


def _flatten(files: dict[str, FileChange], paths: list[str]) -> list[str]:
    return [f"{path}\0{line}" for path in paths for line in files[path].lines.elements()]


class SWEVerifiedTask(Task):
    name = "swe_verified"
    grader_version = "swe-verified-patch-proxy/2"
    data = DataFile(OFFICIAL_FILES[0])

    def load(self) -> list[Item]:
        path = resolve_file(self.name, self.options.data_path, OFFICIAL_FILES)
        rows = records(self.name, path, read_json(self.name, path, "SWE-bench Verified jsonl"),
                       "SWE-bench Verified jsonl")
        return [self._item(path, index, row) for index, row in enumerate(rows)]

    def _item(self, path: Path, index: int, row: dict[str, Any]) -> Item:
        require(self.name, path, row, index, FIELDS, key="instance_id")
        header = f"Repository: {row['repo']} at commit {row['base_commit']}\nIssue:"
        messages: list[Message] = [{"role": "system", "content": SYSTEM_PROMPT}]
        messages += document_messages(str(row["problem_statement"]), self.options.chunk_tokens,
                                      header=header, numbered=True)
        messages.append({"role": "user", "content": REQUEST})
        return Item(
            item_id=str(row["instance_id"]),
            messages=tuple(messages),
            answer=str(row["patch"]),
            category=str(row["repo"]),
            meta={"repo": row["repo"], "base_commit": row["base_commit"],
                  "gold_files": sorted(parse_diff(str(row["patch"])))},
        )

    def grade(self, item: Item, prediction: str) -> Grade:
        diff = extract_diff(prediction)
        if not parse_diff(diff):
            return Grade(0.0, "", self.grader_version, {"reason": "no diff in the reply"})
        score, detail = proxy_score(diff, str(item.answer))
        return Grade(score, diff, self.grader_version, detail)

    def export(self, item: Item, prediction: str, cell_id: str) -> tuple[str, dict[str, Any]]:
        suffix = cell_suffix(cell_id)
        return f"swe_verified_predictions.{suffix}.jsonl", {
            "instance_id": item.item_id,
            "model_name_or_path": f"budgetbench__{suffix}",
            "model_patch": extract_diff(prediction),
        }
