"""The embedded server starts on the first response-cache miss, once per run, and sleeps
when idle (OMP_WAIT_POLICY=PASSIVE in its own environment only).

The launcher's tests use a fake starter; the sweeps run the plugin in a pytest subprocess
whose EmbeddedServer runs ``tests/fake_llama_server.py`` instead of llama.cpp, so the real
class starts it (environment, death signal, readiness wait) without a model.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from pytest_budgetbench.embedded_server import models as gguf_models
from pytest_budgetbench.embedded_server import process
from pytest_budgetbench.embedded_server.launcher import (
    LaunchService,
    RemoteLauncher,
    ServerLauncher,
)
from pytest_budgetbench.errors import EmbeddedServerError
from pytest_budgetbench.model.endpoint import Endpoint
from tests import fake_llama_server

REPO = Path(__file__).resolve().parents[2]


class CountingServer:
    """A starter that records the thread of each start, and can fail."""

    base_url = "http://127.0.0.1:1/v1"

    def __init__(self, failure: str | None = None, started: threading.Event | None = None,
                 release: threading.Event | None = None) -> None:
        self.failure = failure
        self.start_threads: list[threading.Thread] = []
        self.stops = 0
        self._started, self._release = started, release

    def start(self) -> None:
        self.start_threads.append(threading.current_thread())
        if self._started is not None and self._release is not None:
            self._started.set()
            self._release.wait(10)  # hold the start open while others ask
        if self.failure:
            raise EmbeddedServerError(self.failure)

    def stop(self) -> None:
        self.stops += 1


def ask_in_threads(url: object, count: int) -> list[str | BaseException]:
    answers: list[str | BaseException] = []

    def ask() -> None:
        try:
            answers.append(url())  # type: ignore[operator]
        except BaseException as exc:
            answers.append(exc)

    threads = [threading.Thread(target=ask) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return answers


def test_two_threads_missing_at_once_start_the_server_once() -> None:
    started, release = threading.Event(), threading.Event()
    server = CountingServer(started=started, release=release)
    launcher = ServerLauncher(server)
    first = threading.Thread(target=launcher.url)
    first.start()
    assert started.wait(10)
    # The second asks while the first start is under way (it waits on the launcher).
    second = threading.Thread(target=launcher.url)
    second.start()
    second.join(0.2)
    release.set()
    first.join(10)
    second.join(10)
    assert launcher.url() == server.base_url and len(server.start_threads) == 1
    launcher.stop()
    assert server.stops == 1


def test_the_start_runs_in_a_thread_that_outlives_the_one_that_missed() -> None:
    """PR_SET_PDEATHSIG kills the server when the *thread* that started it ends; the first
    miss may come from a strategy's short-lived thread."""
    server = CountingServer()
    launcher = ServerLauncher(server)
    caller = threading.Thread(target=launcher.url)
    caller.start()
    caller.join(10)
    (starter,) = server.start_threads
    assert starter is not caller and starter.is_alive() and launcher.started
    launcher.stop()
    assert not starter.is_alive() and server.stops == 1


def test_a_failed_start_is_remembered_not_retried() -> None:
    server = CountingServer(failure="the server would not load")
    launcher = ServerLauncher(server)
    for _ in range(2):
        with pytest.raises(EmbeddedServerError, match="would not load"):
            launcher.url()
    assert len(server.start_threads) == 1 and not launcher.started
    launcher.stop()
    assert server.stops == 0


def test_workers_asking_the_controllers_service_share_one_start() -> None:
    server = CountingServer()
    service = LaunchService(ServerLauncher(server))
    try:
        workers = [RemoteLauncher(service.address), RemoteLauncher(service.address)]
        answers = [a for w in workers for a in ask_in_threads(w.url, 2)]
    finally:
        service.close()
    assert answers == [server.base_url] * 4 and len(server.start_threads) == 1
    assert workers[0].url() == server.base_url  # remembered: the service is gone
    assert not Path(service.address).exists()


def test_a_failed_start_reaches_the_worker_as_its_reason() -> None:
    service = LaunchService(ServerLauncher(CountingServer(failure="no model file")))
    try:
        with pytest.raises(EmbeddedServerError, match="no model file"):
            RemoteLauncher(service.address).url()
    finally:
        service.close()


def test_a_worker_without_its_controller_gets_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(EmbeddedServerError, match="cannot ask the xdist controller"):
        RemoteLauncher(str(tmp_path / "gone.sock")).url()


@pytest.fixture
def fake_gguf(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gguf_models, "gguf_path", lambda _model: fake_llama_server.FAKE_GGUF)


@pytest.mark.usefixtures("fake_gguf")
def test_the_server_waits_passively_and_this_process_env_is_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setenv(fake_llama_server.STARTS, str(tmp_path / "starts.jsonl"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    before = dict(os.environ)
    server = fake_llama_server.fake_server_class()(8192, 1, tmp_path / "server.log")
    server.start()
    try:
        (start,) = fake_llama_server.starts(tmp_path / "starts.jsonl")
    finally:
        server.stop()
    assert start["omp_wait_policy"] == "PASSIVE" and start["pid"] != os.getpid()
    assert dict(os.environ) == before and "OMP_WAIT_POLICY" not in os.environ
    assert server.recorded_flags["OMP_WAIT_POLICY"] == "PASSIVE"


def test_the_wait_policy_is_recorded_but_keys_no_cache_entry() -> None:
    flags = {"n_ctx": 8192, "n_threads": 2, "seed": 0}
    spinning = Endpoint("", "m", embedded=True, gguf_path="/p/M.gguf", server_flags=flags)
    passive = Endpoint("", "m", embedded=True, gguf_path="/p/M.gguf",
                       server_flags={**flags, "OMP_WAIT_POLICY": "PASSIVE"})
    assert passive.identity == spinning.identity and passive.label == "embedded"


@pytest.mark.usefixtures("fake_gguf")
def test_a_missing_server_module_is_named_before_any_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(process, "SERVER_MODULES", ("json", "no_such_server_module"))
    server = process.EmbeddedServer(8192, 1, tmp_path / "server.log", prefer_llama_server=False)
    with pytest.raises(EmbeddedServerError, match="missing: no_such_server_module"):
        server.check_startable()


@pytest.mark.usefixtures("fake_gguf")
def test_a_named_llama_server_that_is_not_a_program_is_named_before_any_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(process.LLAMA_SERVER_ENV, str(tmp_path / "no-such-llama-server"))
    server = process.EmbeddedServer(8192, 1, tmp_path / "server.log")
    assert server.recorded_flags["server"] == "llama-server"
    with pytest.raises(EmbeddedServerError, match=r"BUDGETBENCH_LLAMA_SERVER=.*no-such"):
        server.check_startable()


@pytest.mark.usefixtures("fake_gguf")
def test_llama_server_gets_the_pinned_flags_and_one_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    program = tmp_path / "llama-server"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    monkeypatch.setenv(process.LLAMA_SERVER_ENV, str(program))
    server = process.EmbeddedServer(8192, 2, tmp_path / "server.log")
    server.check_startable()
    argv = server.command()
    options = dict(zip(argv[1::2], argv[2::2], strict=False))
    assert argv[0] == str(program)
    assert (options["--ctx-size"], options["--threads"], options["--threads-batch"],
            options["--batch-size"], options["--flash-attn"], options["--seed"],
            options["--parallel"]) == ("8192", "2", "2", "512", "off", "0", "1")
    assert "--jinja" in argv and "logits_all" not in server.recorded_flags
    # Replies from the two servers never answer for each other in the response cache.
    other = process.EmbeddedServer(8192, 2, tmp_path / "server.log", prefer_llama_server=False)
    assert other.recorded_flags["server"] == "llama-cpp-python"
    assert other.command()[1:3] == ["-m", process.SERVE_MODULE]
    monkeypatch.setenv(process.LLAMA_SERVER_ENV, "off")
    assert process.EmbeddedServer(8192, 2, tmp_path / "server.log").server == "llama-cpp-python"
    identities = {Endpoint("", "m", embedded=True, gguf_path="/p/M.gguf",
                           server_flags=each.recorded_flags).identity for each in (server, other)}
    assert len(identities) == 2


# -- sweeps through the plugin -------------------------------------------------------------
SWEEP = ("--budgets=512", "--budgetbench-items=2", "--budgetbench-strategies=truncation",
         "--budgetbench-tokenizer=approx", "--budgetbench-report=off",
         "-p", "tests.fake_llama_server", "-p", "no:cacheprovider")


@pytest.fixture
def starts_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the fake server records its starts; the sweeps' subprocesses import tests."""
    path = tmp_path / "starts.jsonl"
    monkeypatch.setenv(fake_llama_server.STARTS, str(path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv(fake_llama_server.FAIL, raising=False)
    return path


def sweep(pytester: pytest.Pytester, out: Path, *extra: str) -> tuple[pytest.RunResult,
                                                                     list[dict]]:
    """One sweep in a subprocess, and the rows of the run it made."""
    before = set(out.glob("*/cells.jsonl"))
    result = pytester.runpytest_subprocess(*SWEEP, f"--budgetbench-out={out}", *extra,
                                           timeout=120)
    made = sorted(set(out.glob("*/cells.jsonl")) - before)
    rows = [json.loads(line) for path in made for line in path.read_text().splitlines()]
    return result, rows


@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["serial", "xdist"])
def test_the_server_starts_once_at_the_first_miss_and_a_cached_rerun_starts_none(
    pytester: pytest.Pytester, tmp_path: Path, starts_file: Path,
    monkeypatch: pytest.MonkeyPatch, workers: tuple[str, ...]
) -> None:
    out = tmp_path / "out"
    # 1. The server cannot start: the first miss stops the run with the reason, once.
    monkeypatch.setenv(fake_llama_server.FAIL, "fake: cannot load the model file")
    failed, rows = sweep(pytester, out, *workers)
    output = failed.stdout.str() + failed.stderr.str()
    assert failed.ret != pytest.ExitCode.OK
    reason = [line for line in output.splitlines()
              if "embedded llama.cpp server exited with code 3" in line]
    assert reason and all("budgetbench: " in line for line in reason), output
    assert "cannot load the model file" in output  # the server's log tail says why
    assert "Traceback" not in output and "INTERNALERROR" not in output
    assert "was not started" not in output
    assert all(r["status"] == "error" and r["prediction"] is None for r in rows), rows
    assert len(fake_llama_server.starts(starts_file)) == 1  # tried once, not once per cell

    # 2. It can: the first miss starts it, once, for every worker.
    monkeypatch.delenv(fake_llama_server.FAIL)
    cold, rows = sweep(pytester, out, *workers)
    cold.assert_outcomes(passed=2)
    assert len(fake_llama_server.starts(starts_file)) == 2
    assert [r["status"] for r in rows] == ["ok", "ok"] and not any(r["cached"] for r in rows)
    assert {r["endpoint"] for r in rows} == {"embedded"}
    assert {r["server_flags"]["OMP_WAIT_POLICY"] for r in rows} == {"PASSIVE"}
    if workers:
        assert {r["worker"] for r in rows} == {"gw0", "gw1"}  # two workers, one server
    cold.stdout.fnmatch_lines(["Starting the embedded model (*"])

    # 3. Every reply is cached: nothing starts, and the summary says so.
    warm, again = sweep(pytester, out, *workers)
    warm.assert_outcomes(passed=2)
    assert len(fake_llama_server.starts(starts_file)) == 2
    assert all(r["cached"] for r in again) and len(again) == 2
    assert "Starting the embedded model" not in warm.stdout.str()
    warm.stdout.fnmatch_lines(["*the embedded model was not started*"])


@pytest.mark.usefixtures("fake_gguf")
def test_a_server_that_could_not_start_is_a_usage_error_before_any_cell(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(process, "SERVER_MODULES", ("json", "no_such_server_module"))
    monkeypatch.setenv(process.LLAMA_SERVER_ENV, "off")  # llama-cpp-python's server, checked
    result = pytester.runpytest(*SWEEP[:5], "-p", "no:cacheprovider",
                                f"--budgetbench-out={tmp_path / 'out'}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: budgetbench: *missing: no_such_server_module*"])
    assert not list((tmp_path / "out").glob("*/cells.jsonl"))
