"""Every bad input is stopped before the first cell: one usage line, and no file written.

Each case runs a real sweep command through pytester against the fake endpoint on
loopback and asserts three things: pytest's usage-error exit, the one line that names the
value and the fix, and an output directory that holds nothing new.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fake_openai import FakeOpenAI


def _args(fake: FakeOpenAI, out: Path, *extra: str) -> list[str]:
    return [
        "--budgets=512",
        "--budgetbench-items=2",
        "--budgetbench-strategies=truncation",
        f"--budgetbench-endpoint={fake.base_url}",
        "--budgetbench-tokenizer=approx",
        f"--budgetbench-out={out}",
        "--budgetbench-report=off",  # in-process runs cannot import numpy twice
        "-p", "no:cacheprovider",
        *extra,
    ]


def _files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


def _bad_inputs(tmp: Path) -> dict[str, tuple[list[str], str]]:
    text_file = tmp / "not-a-model.gguf"
    text_file.write_text("just text\n")
    a_file = tmp / "a-file"
    a_file.write_text("x")
    malformed = tmp / "malformed.json"
    malformed.write_text("{not json")
    return {
        "hf tokenizer missing": (["--budgetbench-tokenizer=hf:/nope"], "*tokenizer*/nope*"),
        "gguf missing": (["--budgetbench-tokenizer=gguf:/nope.gguf"], "*tokenizer*/nope.gguf*"),
        "gguf not a gguf": ([f"--budgetbench-tokenizer=gguf:{text_file}"],
                            f"*tokenizer*{text_file}*"),
        "server without /tokenize": (["--budgetbench-tokenizer=server"], "*tokeni*"),
        "auto without a route": (["--budgetbench-tokenizer=auto"], "*tokenizer=auto*"),
        "baseline missing": (["--budgetbench-baseline=/nope.json",
                              "--budgetbench-max-regression=0.1"], "*baseline*/nope.json*"),
        "baseline malformed": ([f"--budgetbench-baseline={malformed}",
                                "--budgetbench-max-regression=0.1"],
                               f"*baseline*{malformed}*"),
        "cache path unwritable": (["--budgetbench-cache-path=/proc/nope/x"],
                                  "*cache-path*/proc/nope/x*"),
        "out is a file": ([f"--budgetbench-out={a_file}"], f"*--budgetbench-out*{a_file}*"),
        "timeout zero": (["--budgetbench-timeout=0"], "*--budgetbench-timeout*"),
        "embedding model missing": (["--budgetbench-strategies=rag",
                                     "--budgetbench-embedding-model=/nope-model"],
                                    "*embedding*/nope-model*"),
        "budget twice": (["--budgets=2048,2048"], "*--budgets*2048*"),
        "budget absurd": (["--budgets=1000000000000"], "*--budgets*1000000000000*"),
        "reference budget not swept": (["--budgetbench-reference=truncation@999"],
                                       "*--budgetbench-reference*999*"),
        "data for a task not swept": ([f"--budgetbench-data-locomo={malformed}"],
                                      "*--budgetbench-data-locomo*"),
        "data path missing": (["--budgetbench-tasks=hotpotqa",
                               "--budgetbench-data-hotpotqa=/nope/hotpot.json"],
                              "*hotpotqa*/nope/hotpot.json*"),
        "data malformed": (["--budgetbench-tasks=hotpotqa",
                            f"--budgetbench-data-hotpotqa={malformed}"], f"*{malformed}*"),
        "violation gate over references": (
            ["--budgetbench-strategies=full_context", "--budgetbench-max-violation-rate=0.1"],
            "*--budgetbench-max-violation-rate=0.1 judges nothing: every strategy of the "
            "sweep (full_context) is a reference*"),
        "retention floor over references": (
            ["--budgetbench-strategies=full_context", "--budgetbench-min-retention=0.9"],
            "*--budgetbench-min-retention judges nothing: *(e.g. "
            "--budgetbench-min-retention=full_context@512=0.9)*"),
        "retention floor given twice": (
            ["--budgetbench-min-retention=truncation@512=0.5,truncation@512=0"],
            "*--budgetbench-min-retention sets 'truncation@512' twice with different values, "
            "0.5 and 0: keep the one you mean*"),
        "bare retention floor given twice": (
            ["--budgetbench-min-retention=0.5,0"],
            "*--budgetbench-min-retention sets the floor of every non-reference "
            "strategy@budget twice with different values, 0.5 and 0*"),
        "retention floor of a cell not swept": (
            ["--budgetbench-min-retention=rag@4096=0.5"],
            "*--budgetbench-min-retention: rag@4096 is not a strategy@budget of this sweep "
            "(it runs truncation@512); name one it runs"),
        "task option given twice": (
            ["--budgetbench-task-options=history_tokens=600,history_tokens=900"],
            "*--budgetbench-task-options sets 'history_tokens' twice with different values*"),
        "template kwargs not an object": (
            ["--budgetbench-chat-template-kwargs=[1]"],
            "*--budgetbench-chat-template-kwargs must be a JSON object*(got '?1?')"),
        "template kwargs with a counter that renders its own": (
            [f"--budgetbench-tokenizer=gguf:{text_file}",
             '--budgetbench-chat-template-kwargs={"enable_thinking": false}'],
            "*--budgetbench-tokenizer=gguf:*renders its own without them*"),
    }


CASES = [
    "hf tokenizer missing", "gguf missing", "gguf not a gguf", "server without /tokenize",
    "auto without a route", "baseline missing", "baseline malformed", "cache path unwritable",
    "out is a file", "timeout zero", "embedding model missing", "budget twice", "budget absurd",
    "reference budget not swept", "data for a task not swept", "data path missing",
    "data malformed", "violation gate over references", "retention floor over references",
    "retention floor given twice", "bare retention floor given twice",
    "retention floor of a cell not swept", "task option given twice",
    "template kwargs not an object", "template kwargs with a counter that renders its own",
]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_usage_line_before_any_cell_and_writes_nothing(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path, case: str
) -> None:
    extra, expected = _bad_inputs(tmp_path)[case]
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("the user's file")
    before = _files_under(out)
    result = pytester.runpytest(*_args(fake_endpoint, out, *extra))
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    errors = [line for line in result.stderr.lines if line.startswith("ERROR:")]
    assert len(errors) == 1, result.stderr.str()
    result.stderr.fnmatch_lines([expected])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    assert fake_endpoint.requests == []
    assert _files_under(out) == before


def test_an_empty_shard_exits_0_with_one_line_and_writes_nothing(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    result = pytester.runpytest(*_args(fake_endpoint, out, "--budgetbench-shard=5/5"))
    assert result.ret == pytest.ExitCode.OK
    assert "shard 5/5 holds no item" in result.stdout.str() + result.stderr.str()
    assert _files_under(out) == []


def test_resume_latest_finds_a_run_killed_in_its_first_cell_and_skips_a_failed_start(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    first = pytester.runpytest(*_args(fake_endpoint, out))
    first.assert_outcomes(passed=2)
    (run,) = [d for d in out.iterdir() if d.is_dir()]
    (run / "cells.jsonl").unlink()  # killed in its first cell: run.json and no row
    # A later start that failed before run.json (the embedded server did not start) is
    # not a run: it holds only the server's log.
    failed = out / "29990101-000000-dead"
    failed.mkdir()
    (failed / "server.log").write_text("error: could not load the model\n")
    resumed = pytester.runpytest(*_args(fake_endpoint, out, "--budgetbench-resume=latest"))
    resumed.assert_outcomes(passed=2)
    assert len((run / "cells.jsonl").read_text().splitlines()) == 2
    assert json.loads((run / "run.json").read_text()).get("resumed")
    assert sorted(p.name for p in failed.iterdir()) == ["server.log"]


# -- one row per cell, whatever a strategy does -------------------------------------------

MISBEHAVING = {
    "content as a list of strings": (
        "def apply(self, messages, budget):\n"
        "        return [{'role': 'user', 'content': ['a', 'b']}]",
        "strategy 'odd'*content*",
    ),
    "a value JSON cannot hold": (
        "def apply(self, messages, budget):\n"
        "        return [{'role': 'user', 'content': 'hi', 'extra': object()}]",
        "strategy 'odd'*JSON*",
    ),
    "__init__ raises": (
        "def __init__(self):\n        raise ValueError('no init for you')",
        "strategy 'odd'*ValueError: no init for you*",
    ),
    "reset raises": (
        "def reset(self, context):\n        raise KeyError('state')",
        "strategy 'odd'*KeyError*",
    ),
}


def _strategy_module(pytester: pytest.Pytester, body: str, *, name: str = "odd") -> None:
    pytester.makepyfile(
        oddmod=(
            "from pytest_budgetbench.strategies import Strategy\n\n"
            "class Odd(Strategy):\n"
            f"    name = {name!r}\n\n"
            "    def apply(self, messages, budget):\n"
            "        return list(messages)[-1:]\n\n"
            f"    {body}\n"
        )
    )
    pytester.syspathinsert()


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for p in out.glob("*/cells.jsonl")
            for line in p.read_text().splitlines()]


@pytest.mark.parametrize("case", sorted(MISBEHAVING))
def test_a_misbehaving_strategy_still_gets_one_error_row_naming_it(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path, case: str
) -> None:
    body, expected = MISBEHAVING[case]
    _strategy_module(pytester, body)
    out = tmp_path / "out"
    result = pytester.runpytest(
        *_args(fake_endpoint, out, "--budgetbench-strategies=oddmod:Odd,truncation")
    )
    result.assert_outcomes(passed=2, errors=2)
    rows = _rows(out)
    assert len(rows) == 4
    odd = [r for r in rows if r["cell_id"].split("-")[2] == "odd"]
    assert [r["status"] for r in odd] == ["error", "error"]
    result.stdout.fnmatch_lines([f"*{expected}*"])
    assert all("odd" in r["error"] for r in odd)


def test_a_strategy_without_a_name_is_a_usage_error(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    pytester.makepyfile(
        nameless=(
            "from pytest_budgetbench.strategies import Strategy\n\n"
            "class Nameless(Strategy):\n"
            "    def apply(self, messages, budget):\n"
            "        return list(messages)\n"
        )
    )
    pytester.syspathinsert()
    out = tmp_path / "out"
    result = pytester.runpytest(*_args(fake_endpoint, out,
                                       "--budgetbench-strategies=nameless:Nameless"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*nameless:Nameless*name*"])
    assert _files_under(out) == []


def test_two_strategies_with_one_name_are_a_usage_error(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    _strategy_module(pytester, "pass", name="truncation")
    out = tmp_path / "out"
    result = pytester.runpytest(
        *_args(fake_endpoint, out, "--budgetbench-strategies=truncation,oddmod:Odd")
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*'truncation'*oddmod:Odd*"])
    assert _files_under(out) == []


def test_system_exit_in_a_strategy_writes_its_row_and_stops_the_run_cleanly(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    _strategy_module(pytester, "def apply(self, messages, budget):\n        raise SystemExit(3)")
    out = tmp_path / "out"
    result = pytester.runpytest(
        *_args(fake_endpoint, out, "--budgetbench-strategies=oddmod:Odd,truncation")
    )
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    assert "AssertionError" not in result.stdout.str()
    rows = _rows(out)
    assert [r["status"] for r in rows] == ["error"]
    assert "SystemExit" in rows[0]["error"]


def test_a_hung_strategy_times_out_and_the_sweep_goes_on(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    _strategy_module(
        pytester,
        "def apply(self, messages, budget):\n"
        "        import time; time.sleep(30); return list(messages)",
    )
    out = tmp_path / "out"
    result = pytester.runpytest(
        *_args(fake_endpoint, out, "--budgetbench-strategies=oddmod:Odd,truncation",
               "--budgetbench-items=1", "--budgetbench-strategy-timeout=0.5")
    )
    result.assert_outcomes(passed=1, errors=1)
    (odd,) = [r for r in _rows(out) if r["status"] == "error"]
    assert "timed out" in odd["error"] and "0.5" in odd["error"]


@pytest.mark.parametrize(("extra", "env", "expected"), [
    (["--budgetbench-model=nope"], {}, "*--budgetbench-model=nope is not an embedded model*"),
    ([], {"BUDGETBENCH_MODEL_DIR": "{tmp}/no-models"},
     "*qwen2.5-coder-0.5b is not fetched*budgetbench fetch-model*"),
])
def test_an_embedded_model_that_cannot_serve_is_one_line_before_any_cell(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    extra: list[str], env: dict[str, str], expected: str,
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value.format(tmp=tmp_path))
    out = tmp_path / "out"
    result = pytester.runpytest("--budgets=512", "--budgetbench-items=1",
                                "--budgetbench-strategies=truncation",
                                f"--budgetbench-out={out}", "--budgetbench-report=off",
                                "-p", "no:cacheprovider", *extra)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    errors = [line for line in result.stderr.lines if line.startswith("ERROR:")]
    assert len(errors) == 1, result.stderr.str()
    result.stderr.fnmatch_lines([expected])
    assert _files_under(out) == []
