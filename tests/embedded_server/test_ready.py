"""The embedded server's readiness wait honours its timeout even when the server accepts
the poll and then drips its reply: each poll has a deadline on the whole request, not
only on each read.

No assertion is on time: the drip server drips for a bounded while and records whether it
was still dripping when the wait gave up. A wait whose poll lasts until the reply ends
gives up only after the drip ended.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_budgetbench.embedded_server import models as gguf_models
from pytest_budgetbench.embedded_server import process
from pytest_budgetbench.errors import EmbeddedServerError
from tests import fake_llama_server

DRIP_FOR_S = 8.0
"""How long the server drips before it ends by itself: far longer than the wait's timeout,
so a wait that honours it gives up while the drip goes on."""
DRIP_EVERY_S = 0.05
"""Far shorter than any read timeout: no single read ever waits long."""
READY_TIMEOUT_S = 0.3


class DripServer:
    """A loopback HTTP server that answers every request with a 200 whose body never
    completes: headers promising 1 MB, then one byte every DRIP_EVERY_S seconds, for
    DRIP_FOR_S seconds in all (then it closes everything), or until :meth:`stop`."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(DRIP_EVERY_S)
        self.port: int = self._listener.getsockname()[1]
        self.dripped_out = threading.Event()
        """Set when DRIP_FOR_S passed: the drip ended by itself."""
        self.requested = threading.Event()
        """Set when a request came in: the wait really polled this server."""
        self._stop = threading.Event()
        self._until = time.monotonic() + DRIP_FOR_S
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._listener.close()

    def _running(self) -> bool:
        if time.monotonic() >= self._until:
            self.dripped_out.set()
        return not self._stop.is_set() and not self.dripped_out.is_set()

    def _serve(self) -> None:
        while self._running():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            with connection:
                self._drip(connection)

    def _drip(self, connection: socket.socket) -> None:
        connection.settimeout(1.0)
        with contextlib.suppress(OSError):  # the client hung up: wait for the next one
            connection.recv(65536)  # the request (a GET fits in one read)
            self.requested.set()
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                               b"Content-Length: 1000000\r\n\r\n")
            while self._running():
                connection.sendall(b" ")
                time.sleep(DRIP_EVERY_S)


class _Running:
    """Stands for the server's process: alive, so only the readiness poll decides."""

    returncode = None

    def poll(self) -> None:
        return None


@pytest.fixture
def drip() -> Iterator[DripServer]:
    server = DripServer()
    try:
        yield server
    finally:
        server.stop()


def test_a_server_that_drips_its_models_reply_is_not_ready_after_the_timeout(
    drip: DripServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gguf_models, "gguf_path", lambda _model: fake_llama_server.FAKE_GGUF)
    server = process.EmbeddedServer(8192, 1, tmp_path / "server.log")
    server.port = drip.port
    server._process = _Running()  # type: ignore[assignment]
    with pytest.raises(EmbeddedServerError) as info:
        server._wait_ready(READY_TIMEOUT_S)
    # Given up while the reply was still dripping: the poll did not wait for it to end.
    assert not drip.dripped_out.is_set()
    assert drip.requested.wait(DRIP_FOR_S)
    assert str(info.value) == (
        f"the embedded llama.cpp server was not ready after {READY_TIMEOUT_S:g}s (no "
        f"complete 200 reply from {server.base_url}/models); see its log: "
        f"{tmp_path / 'server.log'}")
