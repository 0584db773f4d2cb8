"""The composition root: the plugin session and ``budgetbench train-router`` build their
endpoint, counter, chat client, response cache and runner the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest

from pytest_budgetbench import embeddings
from pytest_budgetbench.commands import cli
from pytest_budgetbench.embedded_server import models as gguf_models
from pytest_budgetbench.embedded_server import process
from pytest_budgetbench.testing import HashingEmbedder
from tests.fake_openai import FakeOpenAI

pytest.importorskip("torch")


class FakeEmbeddedServer:
    """Stands in for the llama.cpp server: the same model file and flags every start, but a
    new port, as the real one gets; every server it started is kept in ``started``."""

    started: ClassVar[list[FakeOpenAI]] = []

    def __init__(self, n_ctx: int, threads: int | None, log_path: Path,
                 model_name: str | None = None) -> None:
        self.model = gguf_models.embedded_model(model_name)
        self.model_path = Path("/models") / self.model.file_name
        self.recorded_flags: dict[str, Any] = {"n_ctx": n_ctx, "n_threads": 1, "seed": 0}
        self._fake = FakeOpenAI(model=self.model.alias)

    def check_startable(self) -> None:
        pass

    @property
    def base_url(self) -> str:
        return self._fake.base_url

    def start(self) -> None:
        self._fake.start()
        FakeEmbeddedServer.started.append(self._fake)

    def stop(self) -> None:
        self._fake.stop()


def test_train_router_rerun_from_the_cache_starts_no_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run twice on the embedded model with the same seed: the second run is answered from
    the response cache, so its server, started on the first miss, never starts."""
    monkeypatch.setattr(process, "EmbeddedServer", FakeEmbeddedServer)
    monkeypatch.setattr(FakeEmbeddedServer, "started", [])
    monkeypatch.setattr(embeddings, "make_embedder", lambda *_a, **_k: HashingEmbedder())
    argv = ["train-router", "--task", "memory", "--items", "2", "--episodes", "2",
            "--batch", "2", "--budget", "900", "--out", str(tmp_path), "--tokenizer", "approx",
            "--fresh"]
    assert cli.main(argv) == 0
    assert cli.main(argv) == 0
    output = capsys.readouterr().out
    (first,) = FakeEmbeddedServer.started
    assert len(first.requests) > 0
    assert output.count("train-router: starting the embedded model") == 1
