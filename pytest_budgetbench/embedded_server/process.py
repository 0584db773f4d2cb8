"""The embedded llama.cpp server's process on 127.0.0.1 with pinned flags, started once, its
log, its readiness, and its stop (with the sweep's death too).

The server is llama.cpp's own ``llama-server`` where the install built one (.ci/install links
it beside the venv's python; ``$BUDGETBENCH_LLAMA_SERVER`` names another), else
llama-cpp-python's (``python -m llama_cpp.server`` through
:mod:`~pytest_budgetbench.embedded_server.serve`). Both load the same GGUF with the same
flags. llama-server renders and parses tool calls through llama.cpp's own chat code, counts
through its own template (``/apply-template``), and was measured at llama.cpp's own prompt
rate where llama-cpp-python's server reached half of it in a sweep (issue 41's machine);
on others the two run at the same rate (benchmarks/bench_server_threads.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_budgetbench.embedded_server import models
from pytest_budgetbench.errors import EmbeddedServerError, RequestTimeout
from pytest_budgetbench.model.chat import free_port
from pytest_budgetbench.model.deadline import DeadlineClients

if TYPE_CHECKING:
    import httpx

PR_SET_PDEATHSIG = 1  # from <sys/prctl.h>
SERVER_MODULES = ("llama_cpp", "uvicorn", "fastapi", "sse_starlette", "starlette_context",
                  "pydantic_settings")
"""What ``python -m llama_cpp.server`` imports: llama-cpp-python and its [server] extra."""
LLAMA_SERVER_ENV = "BUDGETBENCH_LLAMA_SERVER"
"""Names the ``llama-server`` binary to serve the embedded model with; ``off`` serves it
with llama-cpp-python's server even where a llama-server is installed."""
LLAMA_SERVER = "llama-server"
"""llama.cpp's own server; ``.ci/install`` builds it and links it beside the venv's python."""
SERVE_MODULE = "pytest_budgetbench.embedded_server.serve"
"""``llama_cpp.server``, run with tool calls' arguments rendered as objects (its module)."""
PORT_TAKEN_LINES = ("address already in use", "couldn't bind http server socket")
"""What llama-cpp-python's server (uvicorn) and llama-server log when their port is taken."""
READY_TIMEOUT_S = 120.0
"""How long one launch of the embedded server may take to answer /models."""
POLL_TIMEOUT_S = 2.0
STOP_GRACE_S = 2.0
"""How long a stopping server may take to exit before it is killed. Uvicorn's graceful
shutdown finishes the replies in flight first (seconds each on a CPU), and the sweep has
abandoned those already (Ctrl-C): they are not worth waiting for."""
"""The longest one readiness poll may take, reply included (less when the wait ends first)."""


def _die_with_parent() -> None:
    """Runs in the server's process before exec: on Linux, ask for SIGKILL when the sweep
    that started it dies, even by SIGKILL, so a killed sweep leaves no server behind."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: stop() is the only cleanup
        pass


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask: taskset, a cgroup's cpuset),
    which can be fewer than the machine has."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def llama_server_program() -> Path | None:
    """The ``llama-server`` to serve with: ``$BUDGETBENCH_LLAMA_SERVER`` (which must exist:
    checked at start; ``off``: none), else the one beside this interpreter, else None
    (llama-cpp-python's server is used)."""
    named = os.environ.get(LLAMA_SERVER_ENV)
    if named == "off":
        return None
    if named:
        return Path(named)
    beside = Path(sys.executable).parent / LLAMA_SERVER
    return beside if beside.exists() else None


WAIT_POLICY = "PASSIVE"
"""The embedded server's ``OMP_WAIT_POLICY``. llama.cpp's OpenMP threads otherwise spin
at every barrier and for a while after each request, taking the cores from the sweep's
own work (and from xdist workers, tests, other jobs); PASSIVE makes them sleep. It changes
no output (see benchmarks/bench_server_threads.py for what it costs and saves)."""


class EmbeddedServer:
    """llama.cpp's server on 127.0.0.1 serving an embedded model (embedded.models), started
    once: ``llama-server`` where :func:`llama_server_program` finds one, else
    llama-cpp-python's.

    The flags are pinned, because the servers' defaults differ (llama-cpp-python: one
    thread, logits_all; llama-server: four slots sharing the context, flash attention on
    where it runs) and flash attention changes the generated text; every row records them
    (:attr:`recorded_flags`), with which server and the environment it runs in
    (:attr:`env`). Building one reads no more than the GGUF's path: :meth:`start` starts it.
    """

    def __init__(self, n_ctx: int, threads: int | None, log_path: Path,
                 model_name: str | None = None, *,
                 wait_policy: str | None = WAIT_POLICY,
                 prefer_llama_server: bool = True) -> None:
        self.model = models.embedded_model(model_name)
        self.model_path = models.gguf_path(self.model)
        self.port = free_port()
        self.threads = threads or usable_cores()
        self.program = llama_server_program() if prefer_llama_server else None
        """llama-server's binary, or None for llama-cpp-python's server."""
        self.env: dict[str, str] = {} if wait_policy is None else {
            "OMP_WAIT_POLICY": wait_policy}
        """Set in the server's environment only, never in this process's."""
        self.flags: dict[str, Any] = {
            "n_ctx": n_ctx,
            "n_threads": self.threads,
            "n_threads_batch": self.threads,
            "n_batch": 512,
            "flash_attn": False,
            "seed": 0,
        }
        if self.program is None:
            self.flags["logits_all"] = False
        self.log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (benchmarks read its CPU time)."""
        return self._process.pid if self._process is not None else None

    @property
    def server(self) -> str:
        """Which server answers: ``llama-server`` or ``llama-cpp-python``."""
        return LLAMA_SERVER if self.program is not None else "llama-cpp-python"

    @property
    def recorded_flags(self) -> dict[str, Any]:
        """What a row's ``server_flags`` says: the server, its flags, how it hands tool
        calls' arguments to the chat template (as objects: llama-server's own chat code,
        ``embedded.serve`` for llama-cpp-python's) and the environment."""
        return {"server": self.server, **self.flags, "tool_arguments": "object", **self.env}

    def child_environment(self) -> dict[str, str]:
        return {**os.environ, **self.env}

    def check_startable(self) -> None:
        """What can be known without starting it, cheaply: the named llama-server exists,
        or llama-cpp-python and its server extra are installed (the GGUF was found when
        this object was built)."""
        import importlib.util

        if self.program is not None:
            if not os.access(self.program, os.X_OK):
                raise EmbeddedServerError(
                    f"{LLAMA_SERVER_ENV}={self.program} is not an executable file: point it "
                    "at a llama-server binary, or unset it to use the one .ci/install builds"
                )
            return
        missing = [name for name in SERVER_MODULES if importlib.util.find_spec(name) is None]
        if missing:
            raise EmbeddedServerError(
                f"the embedded model needs llama-cpp-python with its server extra (missing: "
                f"{', '.join(missing)}): CMAKE_ARGS='-DGGML_NATIVE=OFF' pip install "
                "--no-cache-dir 'llama-cpp-python[server]', or pass --budgetbench-endpoint=URL"
            )

    def command(self) -> list[str]:
        if self.program is not None:
            return self._llama_server_command(self.program)
        argv = [sys.executable, "-m", SERVE_MODULE, "--model", str(self.model_path),
                "--model_alias", self.model.alias, "--host", "127.0.0.1",
                "--port", str(self.port)]
        for key, value in self.flags.items():
            argv += [f"--{key}", str(value)]
        return argv

    def _llama_server_command(self, program: Path) -> list[str]:
        """llama-server's flags for :attr:`flags`. One slot (``-np 1``): its default splits
        the context among four, so a prompt of the largest budget would not fit; requests
        queue as they do in llama-cpp-python's server. ``--jinja``: the GGUF's own chat
        template, tools included. No web UI."""
        flags = self.flags
        return [str(program), "--model", str(self.model_path), "--alias", self.model.alias,
                "--host", "127.0.0.1", "--port", str(self.port),
                "--ctx-size", str(flags["n_ctx"]), "--threads", str(flags["n_threads"]),
                "--threads-batch", str(flags["n_threads_batch"]),
                "--batch-size", str(flags["n_batch"]), "--ubatch-size", str(flags["n_batch"]),
                "--flash-attn", "on" if flags["flash_attn"] else "off",
                "--seed", str(flags["seed"]), "--parallel", "1", "--jinja", "--no-webui"]

    def start(self, ready_timeout: float = READY_TIMEOUT_S) -> None:
        self.check_startable()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._launch(ready_timeout)
        except EmbeddedServerError:
            # The free port can be taken between our probe and the server's bind.
            log = self._log_tail().lower()
            if not any(line in log for line in PORT_TAKEN_LINES):
                raise
            self.port = free_port()
            self._launch(ready_timeout)

    def _launch(self, ready_timeout: float) -> None:
        with self.log_path.open("wb") as log:
            self._process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.child_environment(), preexec_fn=_die_with_parent,
            )
        try:
            self._wait_ready(ready_timeout)
        except BaseException:
            self.stop()  # never leave an orphaned server behind
            raise

    def _wait_ready(self, timeout: float) -> None:
        """Poll /models until it answers 200, the process exits, or ``timeout`` passes.

        httpx's timeout bounds each read, not the request: a server that accepts and then
        drips its reply (or never ends it) would hold one poll past ``timeout``. So each
        poll runs under a whole-request deadline (:mod:`~pytest_budgetbench.model.deadline`) that
        ends with the wait's own."""
        import httpx

        clients: DeadlineClients[httpx.Client] = DeadlineClients(
            lambda: httpx.Client(timeout=POLL_TIMEOUT_S), close=httpx.Client.close)
        deadline = time.monotonic() + timeout
        try:
            while (left := deadline - time.monotonic()) > 0:
                assert self._process is not None
                if self._process.poll() is not None:
                    raise EmbeddedServerError(
                        f"the embedded llama.cpp server exited with code "
                        f"{self._process.returncode} before it was ready; its log "
                        f"({self.log_path}) ends:\n{self._log_tail()}"
                    )
                if self._answers_models(clients, min(POLL_TIMEOUT_S, left)):
                    return
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        finally:
            clients.close()
        raise EmbeddedServerError(
            f"the embedded llama.cpp server was not ready after {timeout:g}s (no complete 200 "
            f"reply from {self.base_url}/models); see its log: {self.log_path}"
        )

    def _answers_models(self, clients: DeadlineClients[httpx.Client], timeout: float) -> bool:
        """Whether /models answered 200 within ``timeout``, its whole reply included."""
        import httpx

        url = self.base_url + "/models"
        try:
            response = clients.call(lambda client: client.get(url), timeout)
        except (httpx.TransportError, RequestTimeout):  # not listening, or not answering yet
            return False
        return response.status_code == 200

    def _log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
