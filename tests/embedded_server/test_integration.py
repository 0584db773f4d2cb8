"""Tiny real sweeps on the embedded llama.cpp models: SmolLM2-135M-Instruct (fast) for the
machinery, and one cell of the default Qwen2.5-Coder-0.5B for its exact counts."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from pytest_budgetbench.embedded_server import models as gguf_models
from pytest_budgetbench.embedded_server.process import llama_server_program

pytest.importorskip("llama_cpp")
pytestmark = pytest.mark.integration


USER_MODEL_DIR = gguf_models.model_dir()
"""Where the user's fetched models are, read before pytester gives each test its own HOME."""
SERVER = "llama-server" if llama_server_program() else "llama-cpp-python"
"""Which server a sweep starts here: .ci/install builds llama-server, so CI runs that one."""

SWEEP = ("--budgets=512,1024", "--budgetbench-items=3",
         "--budgetbench-strategies=truncation,full_context", "--budgetbench-tasks=memory",
         "--budgetbench-model=smollm2", "-p", "no:cacheprovider")


def test_real_sweep_counts_exactly_and_xfails_the_reference_over_budget(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    # Two xdist workers share the one embedded server the controller starts.
    result = pytester.runpytest_subprocess(*SWEEP, f"--budgetbench-out={tmp_path}", "-n", "2",
                                           timeout=600)
    result.assert_outcomes(passed=6, xfailed=6)
    (cells,) = tmp_path.glob("*/cells.jsonl")
    rows = [json.loads(line) for line in cells.read_text().splitlines()]
    assert {r["worker"] for r in rows} == {"gw0", "gw1"}
    assert len(list(tmp_path.glob("*/server.log"))) == 1
    assert len(rows) == 12
    admitted = [r for r in rows if r["status"] == "ok"]
    assert {r["strategy"] for r in admitted} == {"truncation"}
    for row in admitted:
        # The runner's count is the server's own count of the same prompt.
        assert row["counted_tokens"] == row["server_prompt_tokens"] <= row["budget"]
        assert row["tokenizer_exact"] is True
        assert row["model"] == "smollm2-135m-instruct-q4_1"
        assert row["server_flags"]["server"] == SERVER
        assert isinstance(row["prediction"], str)
    assert all(r["status"] == "violation" for r in rows if r["strategy"] == "full_context")
    report = tmp_path / rows[0]["run_id"] / "report" / "report.html"
    assert report.exists()
    result.stdout.fnmatch_lines(["*budgetbench summary*", "*truncation*512*", "*report: *"])

    assert all(r["server_flags"]["OMP_WAIT_POLICY"] == "PASSIVE" for r in rows)

    # The same sweep again: every answer comes from the response cache, unchanged, and
    # the server, which starts on the first cache miss, never starts.
    warm = pytester.runpytest_subprocess(*SWEEP, f"--budgetbench-out={tmp_path}", timeout=600)
    warm.stdout.fnmatch_lines(["*the embedded model was not started*"])
    assert len(list(tmp_path.glob("*/server.log"))) == 1
    (rerun,) = [p for p in tmp_path.glob("*/cells.jsonl") if p != cells]
    again = [json.loads(line) for line in rerun.read_text().splitlines()]
    assert all(r["cached"] for r in again if r["status"] == "ok")
    assert sorted((r["cell_id"], r["prediction"], r["model_s"]) for r in again) == sorted(
        (r["cell_id"], r["prediction"], r["model_s"]) for r in rows)


@pytest.mark.parametrize("server_kind", ["llama-server", "llama-cpp-python"])
def test_embedded_server_moves_to_a_free_port_when_its_port_is_taken(
    tmp_path: Path, server_kind: str
) -> None:
    from pytest_budgetbench.embedded_server.models import SMOLLM2
    from pytest_budgetbench.embedded_server.process import EmbeddedServer
    from pytest_budgetbench.model.chat import probe_endpoint

    if server_kind == "llama-server" and llama_server_program() is None:
        pytest.skip("no llama-server beside this python (.ci/install builds it)")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = EmbeddedServer(n_ctx=512, threads=1, log_path=tmp_path / "server.log",
                                model_name=SMOLLM2.name,
                                prefer_llama_server=server_kind == "llama-server")
        assert server.server == server_kind
        server.port = taken.getsockname()[1]
        server.start()
        try:
            assert server.port != taken.getsockname()[1]
            assert probe_endpoint(server.base_url, None) == [SMOLLM2.alias]
        finally:
            server.stop()


def test_the_default_model_counts_exactly_as_its_server(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Qwen2.5-Coder's template injects a system prompt when there is none: the runner's
    count must still be the server's."""
    from pytest_budgetbench.embedded_server.models import MODEL_DIR_ENV, QWEN

    if not (USER_MODEL_DIR / QWEN.file_name).is_file():
        pytest.skip("the default model is not fetched (budgetbench fetch-model)")
    monkeypatch.setenv(MODEL_DIR_ENV, str(USER_MODEL_DIR))  # pytester moves HOME
    result = pytester.runpytest_subprocess(
        "--budgets=1024", "--budgetbench-items=2", "--budgetbench-strategies=truncation",
        "--budgetbench-task-options=history_tokens=600", f"--budgetbench-out={tmp_path}",
        "-p", "no:cacheprovider", timeout=600)
    result.assert_outcomes(passed=2)
    (cells,) = tmp_path.glob("*/cells.jsonl")
    rows = [json.loads(line) for line in cells.read_text().splitlines()]
    assert [r["model"] for r in rows] == [QWEN.alias] * 2
    assert all(r["counted_tokens"] == r["server_prompt_tokens"] <= 1024 for r in rows)
