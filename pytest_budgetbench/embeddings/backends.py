"""What turns texts into vectors: a sentence-transformers model run by torch, or its ONNX
export run by onnxruntime (float32, or with int8 weights).

``onnx`` and ``onnx-int8`` need neither torch nor sentence-transformers once exported: the
model's own fast tokenizer (``tokenizers``) and one onnxruntime session compute the
vectors, pooling and normalisation included in the graph. The export is made locally from
the model's files, once per machine, into the user cache directory
(``$XDG_CACHE_HOME/pytest-budgetbench/onnx``, default ``~/.cache/...``), never into the
model's (possibly read-only) directory: it is built in a temporary directory beside its
place and renamed into it, under a file lock, so two xdist workers export it once and a
killed export leaves nothing half-written. Each export is checked against torch on probe
sentences before it is published.

Why not sentence-transformers' own ``backend="onnx"``: it goes through optimum-onnx,
whose every release (up to 0.1.0) needs transformers < 4.58, while sentence-transformers
6 needs transformers >= 5; the export here uses only torch's exporter and onnxruntime's
quantizer, which sentence-transformers' path calls too.

Threads: onnxruntime gets ``threads`` intra-op threads that sleep instead of spinning
when idle (a spinning pool halves a neighbour's speed on a shared core), and torch gets
``threads`` for the duration of each encode only (torch's count is process-wide).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, get_type_hints

from pytest_budgetbench.cache.userdirs import user_cache
from pytest_budgetbench.errors import ConfigError, MissingDependency
from pytest_budgetbench.settings.config import Settings, literal_values

BACKENDS: tuple[str, ...] = literal_values(get_type_hints(Settings)["embedding_backend"])
DEFAULT_BACKEND = "onnx"
"""The fastest backend whose rankings match torch's (benchmarks/bench_embeddings.py):
``onnx`` ranked as torch did on every LongBench v2, LoCoMo and memory query (vectors
within 1e-6); ``onnx-int8`` is about 2.5x faster again, but its best candidate differed
from torch's on 20-33% of LoCoMo and LongBench v2 queries, and since dynamic quantisation
scales activations per batch, its vector of a text shifts slightly with the texts batched
beside it; so it is opt-in."""
EXPORT_VERSION = 1
"""Bump when the export (graph, quantisation, tokenizer settings) changes: a new version is
a new directory and a new vector space, so old exports and vectors are never reused."""
BATCH_SIZE = 8
"""Texts per onnxruntime pass, sorted by length first so a batch pads little; 4-8 were
20-30% faster than 32 (smaller activations stay in cache; measured on 2 cores)."""
TORCH_BATCH_SIZE = 64

ONNX_FILE = "model.onnx"
TOKENIZER_FILE = "tokenizer.json"
META_FILE = "export.json"
_PROBES = (
    "My dog is called Biscuit and he loves the beach.",
    "Quarterly tax filing is due at the end of the month.",
    "The violin lesson moved to Thursday evening.",
    "short",
)
# Cosine each export must keep against torch on the probes: fp32 is exact up to rounding;
# int8 weights move a vector by a few degrees (rankings are checked by the benchmark).
_MIN_COSINE = {"onnx": 0.999, "onnx-int8": 0.95}


class Encoder(Protocol):
    """Texts to L2-normalised float32 vectors, one row per text (a numpy array)."""

    def encode(self, texts: Sequence[str]) -> Any: ...


def default_threads() -> int:
    """The cores this process may use, shared among the xdist workers of its run: two
    workers on two cores get one thread each instead of four threads fighting for two."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    from pytest_budgetbench.sweep.workers import worker_count

    return max(1, cores // worker_count())


def model_fingerprint(path: str) -> str:
    """A digest of a model directory's files (names, sizes, modification times), naming
    this machine's ONNX export of it: a changed or reinstalled model is exported again, and
    computing it reads no weights. (Vector spaces, which travel between machines, are
    named by content: :func:`~pytest_budgetbench.model.digests.directory_digest`.)"""
    root = Path(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        stat = file.stat()
        digest.update(f"{file.relative_to(root)}\0{stat.st_size}\0{stat.st_mtime_ns}\n"
                      .encode())
    return digest.hexdigest()[:16]


def export_root() -> Path:
    return user_cache("onnx")


# -- torch ---------------------------------------------------------------------------------
def load_sentence_transformer(path: str, name: str, **kwargs: Any) -> Any:
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise MissingDependency(
            "sentence-transformers", "retrieval", "the retrieval strategies' embeddings"
        ) from exc
    try:
        # local_files_only: the model is a local directory, and nothing may reach a hub;
        # it asks this of this load alone, where an environment variable would change the
        # whole process (a user's own tests included).
        return SentenceTransformer(path, device="cpu", local_files_only=True, **kwargs)
    except Exception as exc:  # sentence-transformers raises many types for a bad directory
        first_line = (str(exc).strip().splitlines() or [""])[0]
        raise ConfigError(
            f"cannot load embedding model '{name}' from {path}: "
            f"{type(exc).__name__}: {first_line}"
        ) from exc


@contextmanager
def _torch_threads(threads: int) -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class TorchEncoder:
    """sentence-transformers on torch (which sorts each call's texts by length itself)."""

    def __init__(self, path: str, name: str, *, threads: int,
                 batch_size: int = TORCH_BATCH_SIZE) -> None:
        self.threads = threads
        self.batch_size = batch_size
        self._model = load_sentence_transformer(path, name)

    def encode(self, texts: Sequence[str]) -> Any:
        with _torch_threads(self.threads):
            return self._model.encode(
                list(texts), batch_size=self.batch_size, normalize_embeddings=True,
                convert_to_numpy=True, show_progress_bar=False,
            )


# -- onnxruntime ---------------------------------------------------------------------------
class OnnxEncoder:
    """An exported model (:func:`exported_model`) on one onnxruntime session."""

    def __init__(self, directory: Path, *, threads: int, batch_size: int = BATCH_SIZE) -> None:
        try:
            import onnxruntime
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise MissingDependency(
                "onnxruntime", "retrieval", "the ONNX embedding backends") from exc
        meta = json.loads((directory / META_FILE).read_text(encoding="utf-8"))
        self.threads = threads
        self.batch_size = batch_size
        self._pad_id = int(meta["pad_id"])
        self._tokenizer = Tokenizer.from_file(str(directory / TOKENIZER_FILE))
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        # Idle threads sleep: a spinning pool burns the core that the model server or
        # another xdist worker needs.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        self._session = onnxruntime.InferenceSession(
            str(directory / ONNX_FILE), options, providers=["CPUExecutionProvider"])
        self._inputs = [i.name for i in self._session.get_inputs()]
        self._dimension = int(meta["dimension"])

    def encode(self, texts: Sequence[str]) -> Any:
        import numpy as np

        encodings = self._tokenizer.encode_batch(list(texts))
        order = sorted(range(len(encodings)), key=lambda i: len(encodings[i].ids))
        vectors = np.empty((len(encodings), self._dimension), dtype=np.float32)
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            width = max(len(encodings[i].ids) for i in rows)
            arrays = {
                "input_ids": np.full((len(rows), width), self._pad_id, dtype=np.int64),
                "attention_mask": np.zeros((len(rows), width), dtype=np.int64),
                "token_type_ids": np.zeros((len(rows), width), dtype=np.int64),
            }
            for row, index in enumerate(rows):
                encoding = encodings[index]
                length = len(encoding.ids)
                arrays["input_ids"][row, :length] = encoding.ids
                arrays["attention_mask"][row, :length] = 1
                arrays["token_type_ids"][row, :length] = encoding.type_ids
            feed = {name: arrays[name] for name in self._inputs}
            vectors[rows] = self._session.run(None, feed)[0]
        return vectors


# -- export --------------------------------------------------------------------------------
def exported_model(path: str, name: str, backend: str, *, root: Path | None = None) -> Path:
    """The directory of ``backend``'s export of the model at ``path``, made on first use."""
    if backend not in _MIN_COSINE:
        raise ValueError(f"no ONNX export for backend {backend!r}")
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(name).name or "model")[:48]
    base = (root or export_root()) / f"{slug}-{model_fingerprint(path)}-v{EXPORT_VERSION}"
    fp32 = publish_atomically(base / "onnx", quietly(lambda tmp: _export_fp32(path, name, tmp)))
    if backend == "onnx":
        return fp32
    return publish_atomically(base / backend,
                              quietly(lambda tmp: _quantize(path, name, fp32, tmp)))


def quietly(build: Callable[[Path], None]) -> Callable[[Path], None]:
    """``build`` with warnings silenced: torch's exporter and transformers warn about the
    trace (TracerWarning, deprecations) on this one-time export, which would otherwise land
    in the user's first sweep as pages of warnings about code that is not theirs."""

    def run(tmp: Path) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            build(tmp)

    return run


def publish_atomically(target: Path, build: Callable[[Path], None]) -> Path:
    """``target``, built by ``build(tmp)`` in a temporary directory beside it and renamed
    into place, unless it exists. A lock makes concurrent callers build it once; the
    rename makes a crash leave no half-built ``target``."""
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if target.is_dir():
            return target  # another process built it while this one waited
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache from other users
        try:
            build(tmp)
            os.rename(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _require_export_tools() -> None:
    for module, purpose in (("torch", "exporting the embedding model to ONNX"),
                            ("onnx", "exporting the embedding model to ONNX")):
        try:
            __import__(module)
        except ImportError as exc:
            raise MissingDependency(module, "retrieval", purpose) from exc


def _export_fp32(path: str, name: str, target: Path) -> None:
    """The model's transformer, mean or CLS pooling and normalisation as one ONNX graph,
    and its tokenizer truncating as sentence-transformers does."""
    _require_export_tools()
    import torch

    # Eager attention: SDPA's mask shortcuts are taken at trace time and would be frozen
    # into the graph (a batch without padding would decide how padded ones are read).
    model = load_sentence_transformer(path, name, model_kwargs={"attn_implementation": "eager"})
    modules = [type(m).__name__ for m in model]
    pooling = _pooling_mode(model[1]) if len(model) > 1 else None
    if modules[:2] != ["Transformer", "Pooling"] or modules[2:] not in ([], ["Normalize"]) \
            or pooling not in ("mean", "cls"):
        raise ConfigError(
            f"embedding model '{name}' ({' + '.join(modules)}, pooling {pooling}) cannot be "
            "exported to ONNX: only Transformer + mean or CLS Pooling (+ Normalize) models "
            "can; pass --budgetbench-embedding-backend=torch"
        )
    transformer = model[0]
    tokenizer = transformer.tokenizer
    names = [n for n in ("input_ids", "attention_mask", "token_type_ids")
             if n in tokenizer.model_input_names]
    backend_tokenizer = tokenizer.backend_tokenizer
    backend_tokenizer.enable_truncation(int(transformer.max_seq_length))
    backend_tokenizer.no_padding()
    backend_tokenizer.save(str(target / TOKENIZER_FILE))

    class Pooled(torch.nn.Module):
        def __init__(self, encoder: Any) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, *inputs: Any) -> Any:
            features = dict(zip(names, inputs, strict=True))
            hidden = self.encoder(**features).last_hidden_state
            if pooling == "cls":
                pooled = hidden[:, 0]
            else:
                mask = features["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2, dim=1)

    # A padded example batch, so nothing about padding is constant in the trace.
    sample = tokenizer(["a padded example sentence for the trace", "short"],
                       padding=True, return_tensors="pt")
    axes = {n: {0: "batch", 1: "tokens"} for n in names}
    torch.onnx.export(
        Pooled(transformer.auto_model).eval(), tuple(sample[n] for n in names),
        str(target / ONNX_FILE), input_names=names, output_names=["embedding"],
        dynamic_axes={**axes, "embedding": {0: "batch"}}, opset_version=17, dynamo=False,
    )
    meta = {"model": name, "pad_id": int(tokenizer.pad_token_id or 0),
            "dimension": len(model.encode(["probe"], convert_to_numpy=True)[0]),
            "pooling": pooling,
            "max_seq_length": int(transformer.max_seq_length), "version": EXPORT_VERSION}
    (target / META_FILE).write_text(json.dumps(meta, indent=1), encoding="utf-8")
    _check_against_torch(model, target, "onnx", name)


def _pooling_mode(module: Any) -> str | None:
    """"mean", "cls", or another mode's name, from a Pooling module's config (the single
    ``pooling_mode`` key of sentence-transformers 6, or the flags of earlier versions)."""
    config = module.get_config_dict() if hasattr(module, "get_config_dict") else {}
    if isinstance(config.get("pooling_mode"), str):
        return str(config["pooling_mode"])
    legacy = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}
    chosen = [mode for key, mode in legacy.items() if config.get(key)]
    others = [key for key, on in config.items() if key.startswith("pooling_mode_") and on
              and key not in legacy]
    return chosen[0] if len(chosen) == 1 and not others else None


def _quantize(path: str, name: str, fp32: Path, target: Path) -> None:
    """int8 weights, per output channel (per-tensor scales moved vectors 3x as far)."""
    _require_export_tools()
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    for file in (TOKENIZER_FILE, META_FILE):
        shutil.copy2(fp32 / file, target / file)
    quantize_dynamic(
        str(fp32 / ONNX_FILE), str(target / ONNX_FILE), weight_type=QuantType.QInt8,
        per_channel=True,
        # The exporter leaves some intermediate types to inference; they are all float.
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )
    _check_against_torch(load_sentence_transformer(path, name), target, "onnx-int8", name)


def _check_against_torch(model: Any, directory: Path, backend: str, name: str) -> None:
    import numpy as np

    expected = model.encode(list(_PROBES), normalize_embeddings=True, convert_to_numpy=True,
                            show_progress_bar=False)
    got = OnnxEncoder(directory, threads=1).encode(_PROBES)
    worst = float(np.min(np.sum(expected * got, axis=1)))
    if worst < _MIN_COSINE[backend]:
        raise ConfigError(
            f"the {backend} export of embedding model '{name}' disagrees with torch (cosine "
            f"{worst:.4f} < {_MIN_COSINE[backend]}); pass --budgetbench-embedding-backend=torch"
        )
