"""The GitHub Actions workflow of docs/ci.md (docs/examples/budgetbench.yml), run step by
step: its ``policy`` job's shell steps, as written in the file, in order, with bash, as a
push to main and then as a pull request that changes the memory policy.

How the runner is stood in for (each rule says what is not run as written, and why):

- **``uses:`` steps are not run**: they are the runner's actions (checkout, setup-python,
  caches, artifacts, github-action-benchmark). One scratch project directory serves both
  runs, so what main's run leaves there (``budgetbench-baseline``) is what the cache
  restores for the pull request; the trend files are checked against github-action-
  benchmark's documented fields instead of uploaded.
- **Steps named ``Install ...`` are not run**: nothing is downloaded. ``pytest`` and
  ``budgetbench`` on PATH run this checkout's code (``python -m``), and the scratch
  project's modules are importable (PYTHONPATH), as ``pip install -e .`` makes them.
- **``gh`` is a stub** on PATH: it writes its arguments to ``gh-calls.txt`` and answers the
  listing of comments with the id in ``gh-comment-id`` when that file exists (an earlier
  comment of the workflow), else nothing.
- **The scratch project's pytest.ini is the team's own configuration**: the approximate
  counter (the GGUF of ``--budgetbench-tokenizer=auto`` is a download), 4 items of the
  memory task with a short history (every prompt fits 2048), the strategies
  ``full_context`` and the team's ``policy:Policy``, and no report files (the summary
  computes its tables either way; writing plots would double the time).
- **The runner's environment**: each step gets its own GITHUB_STEP_SUMMARY and GITHUB_OUTPUT
  files, GITHUB_ACTIONS=true, GITHUB_EVENT_NAME and GITHUB_REPOSITORY; ``${{ ... }}``
  expressions are read from the workflow's ``env:``, the steps' outputs and a few
  ``github.*`` values, and ``if:`` conditions are evaluated for the forms the file uses
  (``github.event_name == '...'``, ``!cancelled()``, ``&&``, ``||``); an expression outside
  them fails the test, so the file stays one that this test can run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.reports.ci import COMMENT_MARKER, TREND_FILES

yaml = pytest.importorskip("yaml")
pytest.importorskip("pandas")

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / "docs" / "examples" / "budgetbench.yml"
JOB = "policy"
GITHUB = {"github.token": "stub-token", "github.repository": "team/project",
          "github.event.pull_request.number": "7", "github.sha": "abc123",
          "github.event.pull_request.base.sha": "abc123", "github.run_id": "1"}
"""The ``github.*`` values the job's shell steps may read."""

INI = """\
[pytest]
budgetbench_strategies = full_context,policy:Policy
budgetbench_items = 4
budgetbench_tokenizer = approx
budgetbench_memory_history = 1200
budgetbench_report = off
"""

POLICY_ON_MAIN = """\
from pytest_budgetbench.strategies.truncation import Truncation


class Policy(Truncation):
    name = "policy"
"""

POLICY_IN_THE_PULL_REQUEST = """\
from pytest_budgetbench.messages import split_ends
from pytest_budgetbench.strategies.truncation import Truncation


class Policy(Truncation):
    name = "policy"

    def apply(self, messages, budget):  # a careless change: the older half goes
        head, history, query = split_ends(messages)
        return super().apply(head + history[len(history) // 2:] + query, budget)
"""

GH_STUB = """\
#!/usr/bin/env bash
printf '%s\\n' "$*" >> gh-calls.txt
if [ "$1" = api ] && [[ "$*" == *"--jq"* ]] && [ -f gh-comment-id ]; then cat gh-comment-id; fi
"""


@dataclass
class StepRun:
    name: str
    returncode: int | None
    """None: not run (a ``uses:`` or install step, or its ``if:`` was false)."""
    output: str = ""
    summary: str = ""
    outputs: dict[str, str] = field(default_factory=dict)


@dataclass
class JobRun:
    steps: list[StepRun]

    @property
    def failed(self) -> bool:
        return any(step.returncode not in (None, 0) for step in self.steps)

    def step(self, name: str) -> StepRun:
        return next(step for step in self.steps if step.name == name)


def _workflow() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    return document


def _expression(text: str, context: dict[str, str]) -> str:
    """``text`` with each ``${{ name }}`` replaced by its value in ``context``."""
    def value(match: re.Match[str]) -> str:
        name = match.group(1).strip()
        assert name in context, f"{WORKFLOW.name}: the test cannot evaluate ${{{{ {name} }}}}"
        return context[name]

    return re.sub(r"\$\{\{(.*?)\}\}", value, text)


def _condition(condition: str | None, event: str, failed: bool) -> bool:
    """A step's ``if:``, for the forms the workflow uses; without a status function it
    implies ``success()``, as on GitHub."""
    if condition is None:
        return not failed
    text = condition.strip().removeprefix("${{").removesuffix("}}").strip()
    python = re.sub(r"github\.event_name\s*(==|!=)\s*'(\w+)'",
                    lambda m: repr((event == m.group(2)) == (m.group(1) == "==")), text)
    python = (python.replace("!cancelled()", "True").replace("always()", "True")
              .replace("&&", " and ").replace("||", " or "))
    assert re.fullmatch(r"[\s()]*(True|False)([\s()]*(and|or)[\s()]*(True|False))*[\s()]*",
                        python), f"{WORKFLOW.name}: the test cannot evaluate if: {condition}"
    result = bool(eval(python, {"__builtins__": {}}))  # True/False, and, or: checked above
    status = any(f in text for f in ("cancelled()", "always()", "failure()", "success()"))
    return result if status else result and not failed


def _outputs(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    pairs = (line.partition("=") for line in path.read_text(encoding="utf-8").splitlines())
    return {key: value for key, sep, value in pairs if sep}


def _environment(project: Path) -> dict[str, str]:
    """The runner's environment without GitHub's own variables: shims for pytest,
    budgetbench and gh first on PATH, this checkout and the project importable."""
    shims = project.parent / "bin"
    shims.mkdir(exist_ok=True)
    for name, module in (("pytest", "pytest"),
                         ("budgetbench", "pytest_budgetbench.commands.cli")):
        (shims / name).write_text(
            f'#!/usr/bin/env bash\nexec "{sys.executable}" -m {module} "$@"\n')
    (shims / "gh").write_text(GH_STUB)
    for shim in shims.iterdir():
        shim.chmod(0o755)
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("GITHUB_", "RUNNER_", "PYTEST_", "BUDGETBENCH_"))}
    env["PATH"] = f"{shims}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(project), str(ROOT)])
    return env


def run_job(project: Path, event: str, *, only: str | None = None) -> JobRun:
    """The ``policy`` job's steps for ``event`` in ``project`` (``only``: that step alone)."""
    workflow = _workflow()
    job = workflow["jobs"][JOB]
    base = _environment(project)
    context = {f"env.{key}": str(value) for key, value in workflow.get("env", {}).items()}
    context.update(GITHUB)
    runner = project.parent / "runner"
    runner.mkdir(exist_ok=True)
    runs: list[StepRun] = []
    failed = False
    for index, step in enumerate(job["steps"]):
        name = step.get("name") or step.get("uses", "")
        if only is not None and name != only:
            continue
        if "uses" in step or name.startswith("Install"):
            runs.append(StepRun(name, None))
            continue
        if not _condition(step.get("if"), event, failed):
            runs.append(StepRun(name, None))
            continue
        summary, output = runner / f"{event}-{index}-summary.md", runner / f"{event}-{index}-output"
        for path in (summary, output):
            path.write_text("")
        env = {**base, **{k: str(v) for k, v in workflow.get("env", {}).items()},
               **{k: _expression(str(v), context) for k, v in step.get("env", {}).items()},
               "GITHUB_ACTIONS": "true", "CI": "true", "GITHUB_EVENT_NAME": event,
               "GITHUB_REPOSITORY": GITHUB["github.repository"],
               "GITHUB_STEP_SUMMARY": str(summary), "GITHUB_OUTPUT": str(output)}
        script = runner / f"{event}-{index}.sh"
        script.write_text(_expression(step["run"], context))
        done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
                              cwd=project, env=env, capture_output=True, text=True, timeout=300)
        run = StepRun(name, done.returncode, done.stdout + done.stderr,
                      summary.read_text(encoding="utf-8"), _outputs(output))
        runs.append(run)
        failed = failed or done.returncode != 0
        if "id" in step:
            context.update({f"steps.{step['id']}.outputs.{key}": value
                            for key, value in run.outputs.items()})
    return JobRun(runs)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A team's repository: its ini and its memory policy, as on main."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "pytest.ini").write_text(INI)
    (root / "policy.py").write_text(POLICY_ON_MAIN)
    return root


def _trend_entries(path: Path) -> list[dict[str, Any]]:
    """A trend file, checked against github-action-benchmark's custom tools: a JSON list of
    BenchmarkResult, ``{name: string, value: number, unit: string, range?: string,
    extra?: string}`` (its src/extract.ts), a range as ``± N`` (extractRangeInfo.ts)."""
    entries = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(entries, list) and entries
    for entry in entries:
        assert set(entry) <= {"name", "value", "unit", "range", "extra"}, entry
        assert isinstance(entry["name"], str) and isinstance(entry["unit"], str)
        assert isinstance(entry["value"], int | float) and not isinstance(entry["value"], bool)
        assert all(isinstance(entry[k], str) for k in ("range", "extra") if k in entry)
        if "range" in entry:
            assert re.fullmatch(r"± \d.*", entry["range"]), entry["range"]
    assert len({entry["name"] for entry in entries}) == len(entries)
    return entries


def test_the_workflow_runs_on_main_and_on_a_pull_request_that_breaks_a_gate(
    project: Path,
) -> None:
    main = run_job(project, "push")
    sweep = main.step("Model-free sweep and its gates")
    assert not main.failed, sweep.output[-3000:]
    assert main.step("Diff against main").returncode is None  # a pull request's step
    # The job summary: every gate's verdict first, then the table, the run's facts.
    assert sweep.summary.startswith("## budgetbench: all 4 gates passed\n"), sweep.summary
    assert "| retention-floor policy@2048 | ✅ passed | retention 1.000 | ≥ 0.900 |" \
        in sweep.summary
    assert "| violation-rate policy@8192 | ✅ passed | 0.0% (0/4) | ≤ 5.0% |" in sweep.summary
    assert "### Per strategy@budget" in sweep.summary
    assert "| memory | policy | 2048 | 4 / 4 | 1.000 | 0.0% |" in sweep.summary
    assert "**model** none" in sweep.summary and "**tokenizer** approx" in sweep.summary
    assert "::error" not in sweep.output
    run_dir = sweep.outputs["run_dir"]
    assert (project / run_dir / "cells.jsonl").is_file()
    assert (project / "budgetbench-baseline" / "cells.jsonl").is_file()
    trend = project / "budgetbench-trend"
    bigger = _trend_entries(trend / TREND_FILES["customBiggerIsBetter"])
    smaller = _trend_entries(trend / TREND_FILES["customSmallerIsBetter"])
    assert {"name": "memory: policy@2048 evidence retention", "unit": "share kept",
            "value": 1.0, "extra": "over 4 admitted items"} in bigger
    assert {e["name"] for e in smaller} == {f"memory: {s}@{b} violation rate"
                                            for s in ("full_context", "policy")
                                            for b in (2048, 8192)}
    # The workflow hands github-action-benchmark these files, one tool per step.
    uses = [s["with"] for s in _workflow()["jobs"][JOB]["steps"]
            if str(s.get("uses", "")).startswith("benchmark-action/github-action-benchmark")]
    assert {(w["tool"], w["output-file-path"]) for w in uses} == {
        (tool, f"budgetbench-trend/{name}") for tool, name in TREND_FILES.items()}

    # A pull request that changes the policy: its prompts lose the older half, the
    # retention floors fail, and the comment shows the change against main.
    (project / "policy.py").write_text(POLICY_IN_THE_PULL_REQUEST)
    pull = run_job(project, "pull_request")
    sweep = pull.step("Model-free sweep and its gates")
    assert pull.failed and sweep.returncode == 1, sweep.output[-3000:]
    assert re.search(r"^::error title=budgetbench gate retention-floor policy@2048 failed::"
                     r"policy@2048: mean evidence retention 0\.\d+ over", sweep.output,
                     re.MULTILINE), sweep.output[-3000:]
    assert sweep.summary.startswith("## budgetbench: 2 of 4 gates failed\n")
    assert "| retention-floor policy@2048 | ❌ failed |" in sweep.summary
    assert pull.step("Diff against main").returncode == 0  # !cancelled(): after a failure
    body = (project / "budgetbench-comment.md").read_text(encoding="utf-8")
    assert body.startswith(f"{COMMENT_MARKER}\n## budgetbench diff\n")
    assert "retention B-A" in body and "| memory | policy | 2048 |" in body
    # One comment: posted, then found by its marker and updated.
    assert pull.step("Comment on the pull request").returncode == 0
    (project / "gh-comment-id").write_text("42\n")
    run_job(project, "pull_request", only="Comment on the pull request")
    calls = (project / "gh-calls.txt").read_text().splitlines()
    assert [c.split()[:3] for c in calls if "--method" in c] == [
        ["api", "--method", "POST"], ["api", "--method", "PATCH"]]
    assert calls[-1] == ("api --method PATCH repos/team/project/issues/comments/42 "
                         "-F body=@budgetbench-comment.md")
    assert all(COMMENT_MARKER in c for c in calls if "--jq" in c)


def test_the_workflow_runs_shell_steps_and_published_actions_only() -> None:
    """What the test stands in for is what a runner gives: each step is a shell step or a
    published action (owner/name@version), never both."""
    for job in _workflow()["jobs"].values():
        for step in job["steps"]:
            assert ("uses" in step) != ("run" in step), step
            if "uses" in step:
                assert re.fullmatch(r"[\w-]+/[\w/-]+@v\d+", step["uses"]), step["uses"]


EXCERPT = re.compile(r"<!-- excerpt: examples/budgetbench\.yml -->\n```yaml\n(.*?)^```",
                     re.DOTALL | re.MULTILINE)


def test_the_page_quotes_the_workflow_as_it_is() -> None:
    """docs/ci.md's excerpts of the workflow are the file's own lines, so the page cannot
    show steps the tested file no longer has."""
    page = (ROOT / "docs" / "ci.md").read_text(encoding="utf-8")
    excerpts = EXCERPT.findall(page)
    assert len(excerpts) >= 2
    text = WORKFLOW.read_text(encoding="utf-8")
    for excerpt in excerpts:
        assert excerpt in text, excerpt
