"""The ``mem0ai`` 2.2.1 library wired to the run, imported only when the mem0 strategy is
first used (importing it loads mem0, qdrant-client and posthog).

- Telemetry off, the mem0 directory the run's: ``MEM0_TELEMETRY=False`` and ``MEM0_DIR``
  (``<run>/strategy-files/mem0``; outside a run a temporary directory removed at exit) are
  set before mem0 is imported. mem0 writes
  ``$MEM0_DIR/config.json`` on import whatever the telemetry setting, so it never reaches
  ``~/.mem0``; if mem0 was imported earlier, its telemetry flags are switched off in place.
- No downloads: mem0 would fetch spaCy's ``en_core_web_sm`` when spaCy is installed without
  it (entity boosts, lemmas), and Qdrant's BM25 encoder fetches ``Qdrant/bm25`` through
  fastembed; both are switched off unless the spaCy model is already installed. Without
  them mem0 ranks by the run's embedder alone.
- :class:`AuxLLM` and :class:`RunEmbedding` are mem0 provider classes (subclasses of its
  ``LLMBase`` and ``EmbeddingBase``) registered in its factories as ``budgetbench``; each
  built memory gets its own instances, bound to the strategy after construction.
- :func:`new_memory`: a ``mem0.Memory`` with a Qdrant collection in an in-memory client
  (``QdrantClient(location=":memory:")``: no path, no server) and the history database in
  an in-memory SQLite (``":memory:"``).
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Sequence
from typing import Any


def _mem0_dir() -> str:
    """The run's mem0 directory (set by the strategy), else a private one removed at exit."""
    chosen = os.environ.get("BUDGETBENCH_MEM0_DIR")
    if chosen:
        return chosen
    private = tempfile.mkdtemp(prefix="budgetbench-mem0-")
    atexit.register(shutil.rmtree, private, True)
    return private


PRIVATE_DIR = _mem0_dir()
os.environ["MEM0_TELEMETRY"] = "False"
os.environ["MEM0_DIR"] = PRIVATE_DIR

import mem0  # noqa: E402
import mem0.memory.main as mem0_main  # noqa: E402
from mem0.configs.base import MemoryConfig  # noqa: E402
from mem0.configs.prompts import ADDITIVE_EXTRACTION_PROMPT  # noqa: E402
from mem0.embeddings.base import EmbeddingBase  # noqa: E402
from mem0.embeddings.configs import EmbedderConfig  # noqa: E402
from mem0.llms.base import LLMBase  # noqa: E402
from mem0.llms.configs import LlmConfig  # noqa: E402
from mem0.memory import telemetry  # noqa: E402
from mem0.memory.utils import parse_messages  # noqa: E402
from mem0.utils import spacy_models  # noqa: E402
from mem0.utils.factory import EmbedderFactory, LlmFactory  # noqa: E402
from mem0.vector_stores.configs import VectorStoreConfig  # noqa: E402
from qdrant_client import QdrantClient  # noqa: E402

# mem0 read the variable when first imported; one imported before us is switched off here.
telemetry.MEM0_TELEMETRY = False
mem0_main.MEM0_TELEMETRY = False

VERSION = str(mem0.__version__)
PROVIDER = "budgetbench"
EXTRACTION_PROMPT = str(ADDITIVE_EXTRACTION_PROMPT)


NLP = importlib.util.find_spec("spacy") is not None and \
    importlib.util.find_spec("en_core_web_sm") is not None
if not NLP:  # mem0 treats a failed load as "no spaCy" and never tries again
    spacy_models._load_failed_full = True
    spacy_models._load_failed_lemma = True


Respond = Callable[[list[dict[str, Any]]], str]
Embed = Callable[[Sequence[str]], list[list[float]]]


class AuxLLM(LLMBase):
    """mem0's LLM: every call is answered by ``respond`` (the strategy's auxiliary call)."""

    respond: Respond | None = None

    def generate_response(self, messages: list[dict[str, Any]], tools: Any = None,
                          tool_choice: str = "auto", **kwargs: Any) -> str:
        if self.respond is None:
            raise RuntimeError("mem0's LLM is not bound to a strategy context")
        return self.respond(messages)


class RunEmbedding(EmbeddingBase):
    """mem0's embedder: the run's embedder (``embed``), one batch per mem0 request."""

    embed_texts: Embed | None = None

    def embed(self, text: str, memory_action: str | None = None) -> list[float]:
        return self.embed_batch([text], memory_action)[0]

    def embed_batch(self, texts: Sequence[str], memory_action: str | None = "add"
                    ) -> list[list[float]]:
        if self.embed_texts is None:
            raise RuntimeError("mem0's embedder is not bound to the run's embedder")
        return [list(map(float, v)) for v in self.embed_texts(list(texts))]


LlmFactory.register_provider(PROVIDER, f"{__name__}.AuxLLM")
EmbedderFactory.provider_to_class[PROVIDER] = f"{__name__}.RunEmbedding"


def new_memory(collection: str, dimensions: int) -> Any:
    """A ``mem0.Memory`` in memory only, with unbound :class:`AuxLLM` and
    :class:`RunEmbedding` (see the module docstring)."""
    # Provider names are checked against mem0's own list; ours are registered above.
    config = MemoryConfig(
        llm=LlmConfig.model_construct(provider=PROVIDER, config={}),
        embedder=EmbedderConfig.model_construct(
            provider=PROVIDER, config={"embedding_dims": dimensions}),
        vector_store=VectorStoreConfig(provider="qdrant", config={
            "collection_name": collection, "embedding_model_dims": dimensions,
            "client": QdrantClient(location=":memory:")}),
        history_db_path=":memory:",
    )
    with warnings.catch_warnings():
        # mem0 asks even a local client for payload indexes, which qdrant warns are moot.
        warnings.filterwarnings("ignore", message=".*[Pp]ayload index")
        memory = mem0.Memory(config)
        stores = [memory.vector_store, memory.entity_store]
    for store in stores:
        store._bm25_encoder = False  # mem0's "tried and failed": never loads fastembed
    return memory


def bind(memory: Any, respond: Respond | None, embed: Embed | None) -> None:
    """Point ``memory``'s LLM and embedder at a cell's services (None: unbound)."""
    memory.llm.respond = respond
    memory.embedding_model.embed_texts = embed


def rendered(messages: Sequence[dict[str, Any]]) -> str:
    """The messages as mem0 writes them into its extraction prompt (``New Messages``)."""
    return str(parse_messages(list(messages)))
