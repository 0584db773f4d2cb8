"""A stand-in for ``python -m llama_cpp.server``, for tests of the embedded server's start.

Loaded as a pytest plugin (``-p tests.fake_llama_server``, in every process of a sweep,
xdist workers included), it makes
:class:`~pytest_budgetbench.embedded_server.process.EmbeddedServer` run
this module instead of llama.cpp: the real class starts it (its environment, its death
signal, its readiness wait), and no model or GGUF is needed (run with
``--budgetbench-tokenizer=approx``). Run as a program, it is the fake server:

- it appends one JSON line per start, ``{"pid": ..., "omp_wait_policy": ...}``, to the file
  ``$FAKE_LLAMA_STARTS``;
- with ``$FAKE_LLAMA_FAIL`` set, it prints that text and exits with code 3 before it
  listens, as a server that cannot load its model does;
- else it serves :class:`~tests.fake_openai.FakeOpenAI` on ``--port`` until killed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

STARTS = "FAKE_LLAMA_STARTS"
FAIL = "FAKE_LLAMA_FAIL"
FAKE_GGUF = Path("/fake-models/Fake-Model.Q4.gguf")


def starts(path: Path) -> list[dict[str, object]]:
    """The starts recorded in ``path`` (none if it does not exist)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def fake_server_class() -> type:
    """:class:`~pytest_budgetbench.embedded_server.process.EmbeddedServer`, running this fake
    instead."""
    from pytest_budgetbench.embedded_server import process

    class FakeLlamaServer(process.EmbeddedServer):
        def command(self) -> list[str]:
            return [sys.executable, "-m", "tests.fake_llama_server", "--port", str(self.port)]

        def check_startable(self) -> None:
            pass  # it needs no llama-cpp-python

    return FakeLlamaServer


def pytest_configure() -> None:
    """As a plugin: every embedded server of this process is the fake."""
    from pytest_budgetbench.embedded_server import models, process

    process.EmbeddedServer = fake_server_class()  # type: ignore[misc]
    models.gguf_path = lambda _model: FAKE_GGUF


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    port = parser.parse_args().port
    with open(os.environ[STARTS], "a", encoding="utf-8") as log:
        log.write(json.dumps({"pid": os.getpid(),
                              "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}) + "\n")
    if os.environ.get(FAIL):
        print(os.environ[FAIL], flush=True)
        sys.exit(3)
    from pytest_budgetbench.embedded_server.models import embedded_model
    from tests.fake_openai import FakeOpenAI

    FakeOpenAI(model=embedded_model().alias, port=port).start()
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
