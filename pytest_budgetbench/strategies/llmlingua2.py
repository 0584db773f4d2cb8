"""``llmlingua2``: LLMLingua-2's learned token compression (Pan et al., 2024) of the history.

The ``llmlingua`` package's compressor (``PromptCompressor(..., use_llmlingua2=True)`` and
its ``compress_prompt_llmlingua2``) runs a token classifier over the history and keeps the
words it scores most worth keeping, at a rate: the share of the tokens to keep (in each
512-token chunk). Consecutive history messages are compressed together, as contexts of up
to 500 classifier tokens joined by a separator llmlingua is told to keep, and split back
into messages with their roles.

The classifier is read from a local directory only, the declared option
``llmlingua2_model`` (``--budgetbench-strategy-options=llmlingua2_model=DIR``); there is
no default, and a sweep with this strategy but no usable directory (checked from its
files: a BERT or XLM-RoBERTa token classifier with its head, tokenizer and weights) stops
with one usage line before collection; weights that still fail to load are one error per
cell, naming the option, and are not loaded again. Trained weights (e.g.
microsoft/llmlingua-2-xlm-roberta-large-meetingbank) are the user's to download into that
directory: nothing here reaches a hub.

The budget is the runner's, counted by the served model's tokenizer, not llmlingua's:

1. a prompt that fits is sent unchanged, with no compression (and no model loaded);
2. the system messages and the final query are kept intact; the rate asked for is what
   the budget leaves for the history's text over that text's runner count, times
   ``SAFETY``;
3. the compressed prompt is counted by the runner; while it is over the budget and passes
   remain (``llmlingua2_passes``), the history is compressed again at a rate corrected by
   how far the last pass missed;
4. what is still over is cut by the shared packer, oldest compressed history first (the
   newest is kept, its oldest kept message possibly cut), so the prompt always fits.

``strategy_info.llmlingua2`` records the rates asked, the runner's counts before and after,
the compression seconds, the passes, whether the packer had to cut (``trimmed``) and the
seconds this cell spent loading the model (0 once loaded).

Where this had to work around llmlingua 0.2.2 (with transformers 5 and torch 2):

- ``PromptCompressor.__init__`` calls ``tiktoken.encoding_for_model("gpt-3.5-turbo")``,
  which downloads an encoding; llmlingua-2 uses it only to weigh each word by its token
  count when it sets the keep threshold and to report its own counts. The compressor is
  built here without that call (what ``__init__`` sets, set directly) and weighs words
  with the classifier's own tokenizer instead, so no encoding is ever fetched.
- llmlingua chooses its word-joining rules by a substring of the model name
  (``bert-base-multilingual-cased``: ``##`` continues a word; ``xlm-roberta-large``: ``▁``
  starts one); a directory path has neither, so the name is set from the directory's
  ``model_type`` (``bert`` or ``xlm-roberta``, the two LLMLingua-2 releases).
- The model loads with ``local_files_only=True`` and ``trust_remote_code=False`` (llmlingua
  defaults it to True, which would run code from the directory).
- transformers 5.24 and torch 2.13 needed no change to llmlingua's loading code (its
  ``torch_dtype`` and ``additional_special_tokens`` are still accepted).
- ``init_llmlingua2`` reseeds the process's ``random``, numpy and torch generators with 42;
  their states are restored afterwards, so loading the model changes no other strategy's
  draws.

The model is loaded lazily, at the first prompt that needs compressing, once per process
and directory (a lock keeps threads from loading it twice, and serialises compression).
"""

from __future__ import annotations

import json
import os
import random
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_budgetbench.errors import ConfigError, MissingDependency, Requirement, require
from pytest_budgetbench.messages import Message, text_of
from pytest_budgetbench.options import Option, positive_int
from pytest_budgetbench.strategies._chunking import newest_first
from pytest_budgetbench.strategies._packing import HistoryStrategy, Packer
from pytest_budgetbench.strategies.base import Regime

NAME = "llmlingua2"
MODEL_OPTION = "llmlingua2_model"
SAFETY = 0.95  # ask for a little less than fits: llmlingua's rate is approximate
MIN_RATE = 0.05  # below this the text is noise; the packer drops messages instead
MAX_RATE = 0.99  # llmlingua does not compress at all at a rate of 1
CHUNK_TOKENS = 512  # llmlingua feeds the classifier 512-token chunks
SEPARATOR = "@@msg@@"  # between messages compressed together; see Compressor.compress
CONTEXT_TOKENS = 500  # classifier tokens per context, under llmlingua's 510-token cut

# llmlingua 0.2.2 knows the word pieces of these two model families, by these names.
FAMILIES = {"bert": "bert-base-multilingual-cased", "xlm-roberta": "xlm-roberta-large"}
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                   "sentencepiece.bpe.model")
FIX = ("download a trained LLMLingua-2 model (e.g. "
       "microsoft/llmlingua-2-xlm-roberta-large-meetingbank) into a directory and pass it")


# -- the model directory ---------------------------------------------------------------
def model_directory(raw: str) -> str:
    """The option's parser: a local directory holding an LLMLingua-2 token classifier,
    checked from its files alone (no import of transformers), as an absolute path."""
    path = Path(raw).expanduser()
    problem = _problem(path)
    if problem:
        raise ValueError(f"must be a directory holding an LLMLingua-2 token-classification "
                         f"model, but {problem}; {FIX}")
    return str(path.resolve())


def _problem(path: Path) -> str:
    """What keeps ``path`` from being a model llmlingua-2 can load ("" when nothing)."""
    if not path.is_dir():
        return f"{path} is not a directory"
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return f"{path} has no readable config.json"
    if not isinstance(config, dict):
        return f"{path / 'config.json'} is not a JSON object"
    kind = config.get("model_type")
    if kind not in FAMILIES:
        return (f"its model_type is {kind!r}; llmlingua 0.2.2 reads only "
                f"{' and '.join(FAMILIES)} token classifiers")
    architectures = config.get("architectures") or []
    if not any("ForTokenClassification" in str(a) for a in architectures):
        return f"its architectures {architectures} hold no ...ForTokenClassification"
    labels = len(config.get("id2label") or {}) or int(config.get("num_labels", 2))
    if labels < 2:
        return f"it has {labels} label; LLMLingua-2 needs 2 (drop, keep)"
    positions = int(config.get("max_position_embeddings", 0))
    if positions < CHUNK_TOKENS:
        return f"it takes {positions} positions; llmlingua feeds it {CHUNK_TOKENS}-token chunks"
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        return f"it holds no tokenizer ({', '.join(TOKENIZER_FILES)})"
    weights = [name for name in WEIGHT_FILES if (path / name).is_file()]
    if not weights:
        return f"it holds no weights ({', '.join(WEIGHT_FILES)})"
    names = _tensor_names(path / weights[0])
    if names is not None and not any(n.endswith("classifier.weight") for n in names):
        return f"{weights[0]} has no token-classification head (classifier.weight)"
    return ""


def _tensor_names(path: Path) -> list[str] | None:
    """The tensor names a safetensors file or index lists, from its header alone (None for
    a pickled checkpoint, which cannot be read without loading it); a file that is not
    what its name says lists none."""
    try:
        if path.name.endswith(".index.json"):
            return list(json.loads(path.read_text(encoding="utf-8")).get("weight_map", {}))
        if path.suffix != ".safetensors":
            return None
        with path.open("rb") as file:
            (size,) = struct.unpack("<Q", file.read(8))
            if size > 100_000_000:  # a header is kilobytes: this is not safetensors
                return []
            return [n for n in json.loads(file.read(size)) if n != "__metadata__"]
    except (OSError, ValueError, AttributeError, struct.error):
        return []


LLMLINGUA2_MODEL = Option(
    MODEL_OPTION,
    "the directory of a trained LLMLingua-2 token-classification model (local files only)",
    model_directory,
    None,
    metavar="DIR",
    required=True,
)
LLMLINGUA2_PASSES = Option(
    "llmlingua2_passes",
    "compressions per cell at most, each at a rate corrected by the last one's count; "
    "what is then still over the budget loses its oldest history",
    positive_int,
    2,
)


# -- the compressor --------------------------------------------------------------------
class OwnTokens:
    """Stands in for llmlingua's tiktoken encoding, which weighs each word by its token
    count when the keep threshold is set: the classifier's own tokenizer, with the message
    separator weighing nothing (it is always kept, so it must not take the rate's share)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        if text.strip() == SEPARATOR:
            return []
        return list(self.tokenizer.encode(text, add_special_tokens=False))


@dataclass
class Compressor:
    """One loaded LLMLingua-2 compressor, shared by the process's cells."""

    directory: str
    prompt_compressor: Any
    lock: threading.Lock = field(default_factory=threading.Lock)

    def compress(self, texts: Sequence[str], rate: float) -> list[str]:
        """Each of ``texts`` compressed at ``rate`` (the share of its tokens to keep).

        Consecutive texts are compressed as one context of up to ``CONTEXT_TOKENS``,
        joined by ``SEPARATOR``, a forced token (kept whatever its score) that splits the
        result back into messages: llmlingua pads every context to 512 tokens, so a chat of
        short messages would cost a 512-token pass each. A context stays under llmlingua's
        own 510-token cut, which glues the words either side of it (only a longer message
        is still cut). A text holding the separator, or a result that does not split back,
        is compressed message by message instead."""
        if not texts:
            return []
        with self.lock:  # the model and its tokenizer are not known to be thread-safe
            if not any(SEPARATOR in t for t in texts):
                groups = self._groups(texts)
                result = self.prompt_compressor.compress_prompt_llmlingua2(
                    [f" {SEPARATOR} ".join(texts[i] for i in group) for group in groups],
                    rate=rate, force_tokens=[SEPARATOR],
                    chunk_end_tokens=[".", "\n", SEPARATOR])
                parts = [str(c).split(SEPARATOR) for c in result["compressed_prompt_list"]]
                if [len(p) for p in parts] == [len(g) for g in groups]:
                    return [part.strip() for context in parts for part in context]
            result = self.prompt_compressor.compress_prompt_llmlingua2(
                list(texts), rate=rate, use_context_level_filter=False)
        compressed = [str(t).strip() for t in result["compressed_prompt_list"]]
        if len(compressed) != len(texts):
            raise RuntimeError(f"llmlingua returned {len(compressed)} texts for {len(texts)}")
        return compressed

    def _groups(self, texts: Sequence[str]) -> list[list[int]]:
        """Runs of consecutive text indices, each of up to ``CONTEXT_TOKENS`` classifier
        tokens (the separators included); a longer text alone."""
        tokenizer = self.prompt_compressor.tokenizer
        groups: list[list[int]] = []
        size = 0
        for index, text in enumerate(texts):
            tokens = len(tokenizer.tokenize(text)) + 1  # and its separator
            if groups and size + tokens <= CONTEXT_TOKENS:
                groups[-1].append(index)
                size += tokens
            else:
                groups.append([index])
                size = tokens
        return groups


_COMPRESSORS: dict[str, Compressor] = {}
_LOAD_FAILURES: dict[str, str] = {}
_LOAD_LOCK = threading.Lock()


def compressor_for(directory: str) -> tuple[Compressor, float]:
    """The directory's compressor, loaded on first use, and the seconds this call spent
    loading it (0.0 when it was loaded already). A directory that does not load is a
    ConfigError naming the option, once loaded and then again without retrying."""
    with _LOAD_LOCK:
        found = _COMPRESSORS.get(directory)
        if found is not None:
            return found, 0.0
        if directory in _LOAD_FAILURES:
            raise ConfigError(_LOAD_FAILURES[directory])
        started = time.perf_counter()
        try:
            compressor = _load(directory)
        except MissingDependency:
            raise
        except Exception as exc:
            message = _LOAD_FAILURES[directory] = (
                f"{MODEL_OPTION}={directory}: llmlingua could not load a token classifier "
                f"from it ({type(exc).__name__}: {exc}); {FIX}")
            raise ConfigError(message) from exc
        _COMPRESSORS[directory] = compressor
        return compressor, time.perf_counter() - started


def _load(directory: str) -> Compressor:
    llmlingua: Any = require("llmlingua", "llmlingua2", "the llmlingua2 strategy")
    config = json.loads((Path(directory) / "config.json").read_text(encoding="utf-8"))
    base = llmlingua.PromptCompressor
    compressor = base.__new__(base)
    # What PromptCompressor.__init__ sets, but for its tiktoken encoding (a download).
    compressor.model_name = FAMILIES[config["model_type"]]  # picks llmlingua's word rules
    compressor.use_llmlingua2 = True
    compressor.retrieval_model = None
    compressor.retrieval_model_name = None
    compressor.open_api_config = {}
    compressor.cache_bos_num, compressor.prefix_bos_num = 10, 100
    compressor.load_model(directory, "cpu",
                          {"trust_remote_code": False, "local_files_only": True})
    compressor.oai_tokenizer = OwnTokens(compressor.tokenizer)
    with _random_state_kept():
        compressor.init_llmlingua2()
    return Compressor(directory, compressor)


@contextmanager
def _random_state_kept() -> Iterator[None]:
    """Undo llmlingua's ``seed_everything(42)``: the generators' states and
    PYTHONHASHSEED as they were."""
    numpy: Any = require("numpy", "llmlingua2", "the llmlingua2 strategy")
    torch: Any = require("torch", "llmlingua2", "the llmlingua2 strategy")
    python_state, numpy_state, torch_state = (random.getstate(), numpy.random.get_state(),
                                              torch.get_rng_state())
    hash_seed = os.environ.get("PYTHONHASHSEED")
    cudnn = torch.backends.cudnn
    deterministic, benchmark = cudnn.deterministic, cudnn.benchmark
    try:
        yield
    finally:
        random.setstate(python_state)
        numpy.random.set_state(numpy_state)
        torch.set_rng_state(torch_state)
        if hash_seed is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = hash_seed
        cudnn.deterministic, cudnn.benchmark = deterministic, benchmark


def forget_compressors() -> None:
    """Drop the loaded compressors and remembered failures (for tests)."""
    with _LOAD_LOCK:
        _COMPRESSORS.clear()
        _LOAD_FAILURES.clear()


# -- the strategy ----------------------------------------------------------------------
@dataclass
class Record:
    """What one cell's compression did, for ``strategy_info.llmlingua2``."""

    tokens_before: int
    tokens_after: int = 0
    rates: list[float] = field(default_factory=list)
    seconds: float = 0.0
    load_seconds: float = 0.0
    trimmed: bool = False

    def info(self) -> dict[str, Any]:
        return {"rates": self.rates, "passes": len(self.rates),
                "tokens_before": self.tokens_before, "tokens_after": self.tokens_after,
                "seconds": round(self.seconds, 6), "load_seconds": round(self.load_seconds, 6),
                "trimmed": self.trimmed}


class LLMLingua2(HistoryStrategy):
    """The history compressed by LLMLingua-2 to the budget's rate; see the module docstring."""

    name = NAME
    requires = (Requirement("llmlingua", "llmlingua2"), Requirement("torch", "llmlingua2"),
                Requirement("numpy", "llmlingua2"))
    regimes = frozenset({Regime.LOCAL_ONLY, Regime.RESET_PER_ITEM})
    declared_options = (LLMLINGUA2_MODEL, LLMLINGUA2_PASSES)
    record: Record

    def apply(self, messages: Sequence[Message], budget: int) -> list[Message]:
        tokens = self.context.tokens
        self.record = Record(tokens_before=tokens.count_messages(messages))
        prompt = super().apply(messages, budget)
        self.record.tokens_after = tokens.count_messages(prompt)
        self.context.info[NAME] = self.record.info()
        return prompt

    def fit(self, head: list[Message], history: list[Message], query: list[Message],
            room: int, budget: int) -> list[Message]:
        tokens, record = self.context.tokens, self.record
        directory = self.context.options.get(MODEL_OPTION)
        if not directory:  # the preflight stops a sweep without it; a direct caller too
            raise ConfigError(f"strategy '{NAME}' needs {MODEL_OPTION}=DIR: {FIX}")
        compressor, record.load_seconds = compressor_for(str(directory))
        # Text messages are compressed; others (images, tool calls without text) stay.
        compressible = [i for i, m in enumerate(history)
                        if isinstance(m.get("content"), str) and text_of(m).strip()]
        texts = [text_of(history[i]) for i in compressible]
        text_tokens = sum(tokens.count_text(t) for t in texts)
        fixed = record.tokens_before - text_tokens  # what compression cannot shrink
        rate: float | None = _rate(budget - fixed, text_tokens)
        passes = int(self.context.options.get("llmlingua2_passes", LLMLINGUA2_PASSES.default))
        shorter = history
        while rate is not None and len(record.rates) < passes:
            started = time.perf_counter()
            compressed = compressor.compress(texts, rate)
            record.seconds += time.perf_counter() - started
            record.rates.append(round(rate, 6))
            shorter = _rebuilt(history, compressible, compressed)
            counted = tokens.count_messages([*head, *shorter, *query])
            if counted <= budget:
                return [*head, *shorter, *query]
            kept = sum(tokens.count_text(t) for t in compressed)
            rate = _next_rate(rate, budget - (counted - kept), kept)
        record.trimmed = True
        recent = newest_first(tokens, shorter)
        return Packer(tokens, shorter).pack(head, query, recent, budget)


def _rate(target: int, text_tokens: int) -> float | None:
    """The first rate to ask for: ``target`` tokens of ``text_tokens``, with a margin;
    None when compression cannot help (no text)."""
    if text_tokens <= 0:
        return None
    return min(MAX_RATE, max(MIN_RATE, SAFETY * target / text_tokens))


def _next_rate(rate: float, target: int, kept: int) -> float | None:
    """The rate after one that kept ``kept`` tokens where ``target`` fit: lower by the miss,
    and at least by the margin; None when no lower rate is worth asking for."""
    if target <= 0 or kept <= 0 or rate <= MIN_RATE:
        return None
    return max(MIN_RATE, SAFETY * min(rate, rate * target / kept))


def _rebuilt(history: Sequence[Message], compressible: Sequence[int],
             compressed: Sequence[str]) -> list[Message]:
    """``history`` with each compressible message's text replaced by its compression; a
    plain message compressed to nothing is left out, one with more than a role and content
    (a tool call or its result) stays, empty, so no call loses its answer."""
    replaced = dict(zip(compressible, compressed, strict=True))
    messages: list[Message] = []
    for index, message in enumerate(history):
        if index not in replaced:
            messages.append(dict(message))
        elif replaced[index] or set(message) - {"role", "content"}:
            messages.append({**message, "content": replaced[index]})
    return messages
