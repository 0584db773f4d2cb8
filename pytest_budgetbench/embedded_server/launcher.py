"""The embedded server starts when the first reply is needed, not before: a sweep answered
entirely from the response cache starts nothing.

Everything a run needs from the embedded model *besides* its replies (the GGUF for exact
counting, the model id and flags that key the response cache and fill each row) comes
from the GGUF file alone, so only a cache miss has to wait for a server.

- :class:`ServerLauncher`, in the process that owns the server: starts it on the first
  :meth:`~ServerLauncher.url`, once, behind a lock; a failed start is remembered, so every
  later caller gets the same error at once instead of a second wait.
- :class:`LaunchService`, the xdist controller's side: it owns the launcher (the server
  is the controller's child and dies with it) and answers on a unix socket in a private
  temporary directory. A connection is one request; the reply is one JSON line,
  ``{"url": ...}`` or ``{"error": ...}``, sent once the server is up or has failed.
- :class:`RemoteLauncher`, a worker's side: asks the service on its first ``url()``, waits
  at most ``timeout_s``, and remembers the answer.

Step by step, under ``pytest -n 2``: the controller builds the launcher and the service
at session start (no server yet) and hands the socket's path to the workers; worker gw1's
first cache miss connects and waits; the service calls ``launcher.url()``, which starts
the server; gw0's first miss, a moment later, connects too and waits on the same lock;
both get the same URL; every later call of either is answered from memory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from pytest_budgetbench.embedded_server import process
from pytest_budgetbench.embedded_server.process import READY_TIMEOUT_S
from pytest_budgetbench.errors import EmbeddedServerError
from pytest_budgetbench.model.endpoint import Endpoint

REMOTE_TIMEOUT_S = 2 * READY_TIMEOUT_S + 60.0
"""How long a worker waits for the controller's answer: two launches (the second after
its port was taken) and some slack."""
MIN_EMBEDDED_CONTEXT = 8192


class Startable(Protocol):
    """What a launcher starts: :class:`~pytest_budgetbench.model.chat.EmbeddedServer`, or a fake."""

    @property
    def base_url(self) -> str: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...


class Launcher(Protocol):
    """Where a lazily started server's URL comes from; ``url()`` starts it if need be and
    raises :class:`~pytest_budgetbench.errors.EmbeddedServerError` if it cannot."""

    def url(self) -> str: ...


class ServerLauncher:
    """Starts ``server`` on the first :meth:`url`, once, for every thread of this process.
    ``on_start`` runs just before the start (the plugin prints its line there).

    The start and the stop happen in a thread of the launcher's own that lives until
    :meth:`stop`: the server asks the kernel to kill it when *the thread that started it*
    ends (PR_SET_PDEATHSIG is per thread), and the first miss may come from a short-lived
    thread (a strategy's auxiliary call runs in one, cells run ahead in a pool).
    """

    def __init__(self, server: Startable, on_start: Callable[[], None] | None = None) -> None:
        self.server = server
        self.on_start = on_start
        self._error: str | None = None
        self._lock = threading.Lock()
        self._keeper: threading.Thread | None = None
        self._stopping = threading.Event()

    @property
    def attempted(self) -> bool:
        """Whether anything asked for the server in this run (it may have failed)."""
        return self._keeper is not None

    @property
    def started(self) -> bool:
        """Whether the server was started (and did not fail) in this run."""
        return self._keeper is not None and self._error is None

    def url(self) -> str:
        with self._lock:
            if self._error is None and self._keeper is None:
                if self.on_start is not None:
                    self.on_start()
                self._error = self._start_in_keeper()
            if self._error is not None:
                raise EmbeddedServerError(self._error)
            return self.server.base_url

    def _start_in_keeper(self) -> str | None:
        """Start the server from the keeper thread; the error it gave, or None."""
        ready = threading.Event()
        failure: list[str] = []

        def keep() -> None:
            try:
                self.server.start()
            except EmbeddedServerError as exc:
                failure.append(str(exc))
            except Exception as exc:  # e.g. the log directory cannot be written
                failure.append(f"the embedded server could not start: "
                               f"{type(exc).__name__}: {exc}")
            ready.set()
            if failure:
                return
            self._stopping.wait()
            self.server.stop()

        self._keeper = threading.Thread(target=keep, name="budgetbench-server", daemon=True)
        self._keeper.start()
        ready.wait()
        return failure[0] if failure else None

    def stop(self) -> None:
        with self._lock:
            keeper = self._keeper
            self._stopping.set()
        if keeper is not None:
            keeper.join()


class LaunchService:
    """Answers workers' requests for the server's URL from ``launcher``, in a thread that
    sleeps in ``accept()`` (nothing polls); :meth:`close` ends it and removes the socket."""

    def __init__(self, launcher: ServerLauncher) -> None:
        self.launcher = launcher
        # A directory of our own: only this user may connect, and the path stays short
        # (a unix socket's path has a limit near 100 bytes; a run directory may not).
        self._directory = tempfile.mkdtemp(prefix="budgetbench-")
        self.address = os.path.join(self._directory, "server.sock")
        self._closing = False
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.address)
        self._listener.listen(16)
        self._thread = threading.Thread(target=self._serve, name="budgetbench-launch",
                                        daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            if self._closing:
                connection.close()
                return
            threading.Thread(target=self._answer, args=(connection,),
                             name="budgetbench-launch-answer", daemon=True).start()

    def _answer(self, connection: socket.socket) -> None:
        with connection:
            try:
                reply = {"url": self.launcher.url()}
            except EmbeddedServerError as exc:
                reply = {"error": str(exc)}
            with contextlib.suppress(OSError):  # the worker gave up or died: nobody to tell
                connection.sendall(json.dumps(reply).encode("utf-8") + b"\n")

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        # accept() does not return when its socket is closed under it: wake it instead.
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as wake:
            wake.connect(self.address)
        self._thread.join(timeout=5)
        self._listener.close()
        shutil.rmtree(self._directory, ignore_errors=True)


class RemoteLauncher:
    """A worker's view of the controller's :class:`LaunchService` at ``address``."""

    def __init__(self, address: str, timeout_s: float = REMOTE_TIMEOUT_S) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._url: str | None = None
        self._error: str | None = None
        self._lock = threading.Lock()

    def url(self) -> str:
        with self._lock:
            if self._url is None and self._error is None:
                self._url, self._error = self._ask()
            if self._error is not None:
                raise EmbeddedServerError(self._error)
            assert self._url is not None
            return self._url

    def _ask(self) -> tuple[str | None, str | None]:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(self.timeout_s)
                sock.connect(self.address)
                data = b""
                while not data.endswith(b"\n"):
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    data += chunk
        except TimeoutError:
            return None, (f"the embedded server was not started within {self.timeout_s:.0f} s "
                          "of this worker's request to the xdist controller")
        except OSError as exc:
            return None, (f"cannot ask the xdist controller to start the embedded server "
                          f"({self.address}: {exc.strerror or exc})")
        try:
            reply = json.loads(data.decode("utf-8"))
        except ValueError:
            return None, "the xdist controller closed the request for the embedded server " \
                         "without an answer (did it stop?)"
        if "url" in reply:
            return str(reply["url"]), None
        return None, str(reply.get("error", "the embedded server did not start"))


# -- a run's embedded endpoint (the session and train-router) ---------------------------
def embedded_context(budget: int, max_tokens: int) -> int:
    """The embedded server's context: the largest budget plus the answer, with headroom."""
    return max(MIN_EMBEDDED_CONTEXT, budget + max_tokens + 64)


def embedded_launcher(
    n_ctx: int, threads: int | None, log_path: Path, model_name: str | None = None,
    on_start: Callable[[], None] | None = None,
) -> tuple[ServerLauncher, Endpoint]:
    """The embedded llama.cpp server serving ``model_name`` (see embedded.models; the default
    when None), not started, and its endpoint: the model id, the GGUF and the flags, all
    known from the GGUF file (the response cache's key, the exact counter and every row
    need no more). The launcher starts the server on the first reply needed, calling
    ``on_start`` just before; the caller stops it. What can be known now (no GGUF, no
    llama-cpp-python) is an EmbeddedServerError now."""
    server = process.EmbeddedServer(n_ctx=n_ctx, threads=threads, log_path=log_path,
                                    model_name=model_name)
    server.check_startable()
    return ServerLauncher(server, on_start), Endpoint(
        base_url="",
        model=server.model.alias,
        embedded=True,
        gguf_path=str(server.model_path),
        server_flags=server.recorded_flags,
    )


def counting_endpoint(tokenizer: str, endpoint: Endpoint, launcher: ServerLauncher) -> Endpoint:
    """``endpoint``, with the embedded server started now when ``tokenizer`` counts through
    its /tokenize route (``server``): counting comes before the first cell's reply."""
    if tokenizer != "server" or endpoint.base_url:
        return endpoint
    return dataclasses.replace(endpoint, base_url=launcher.url())
