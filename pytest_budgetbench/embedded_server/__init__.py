"""The embedded llama.cpp server, used when no endpoint is given (the sentence embedders are
:mod:`pytest_budgetbench.embeddings`), in one place:

- :mod:`.models`: the model registry (which GGUF is served), its fetch and its checks;
- :mod:`.process`: starting and stopping llama.cpp's ``llama-server`` (or
  ``python -m llama_cpp.server``), its log, its readiness;
- :mod:`.launcher`: starting it on the first reply needed, in-process or for xdist workers.

Tests replace ``process.EmbeddedServer`` and ``models.gguf_path``: callers that must see such
a replacement look them up on the submodule.
"""

from __future__ import annotations

from pytest_budgetbench.embedded_server.launcher import (
    Launcher,
    LaunchService,
    RemoteLauncher,
    ServerLauncher,
    counting_endpoint,
    embedded_context,
    embedded_launcher,
)
from pytest_budgetbench.embedded_server.models import (
    DEFAULT_MODEL,
    MODEL_DIR_ENV,
    MODELS,
    EmbeddedModel,
    embedded_gguf_path,
    embedded_model,
    fetch,
)
from pytest_budgetbench.embedded_server.process import EmbeddedServer

__all__ = ["DEFAULT_MODEL", "MODELS", "MODEL_DIR_ENV", "EmbeddedModel", "EmbeddedServer",
           "LaunchService", "Launcher", "RemoteLauncher", "ServerLauncher",
           "counting_endpoint", "embedded_context", "embedded_gguf_path", "embedded_launcher",
           "embedded_model", "fetch"]
