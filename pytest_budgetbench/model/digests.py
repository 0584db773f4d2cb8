"""Content digests of model files: the names of cache spaces that travel between machines.

A cached value derived from a model file (a token count made by a GGUF's tokenizer, a
vector made by an embedding model) is addressed by what the file holds, never by where it
lies or when it was written, so a cache merged from another machine (``budgetbench cache
merge``) answers there as it answered here.

Reading a whole model costs about half a second a GB (sha256 measured at 0.48 s for a
469 MiB GGUF, 0.09 s for a 94 MiB one, from the page cache), so a file's digest is
remembered: in this process, and on this machine in the user's cache directory, by the
file's resolved path, size, modification time and inode. A file changed in place (new
size, time or inode) is read again; a memo that cannot be read or written is ignored.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path

from pytest_budgetbench.cache.userdirs import user_cache

_BLOCK = 1 << 20
_MEMO: dict[tuple[str, int, int, int], str] = {}


def file_digest(path: Path) -> str:
    """The sha256 of the file's content (hex), read once per machine and file state."""
    resolved = path.resolve()
    stat = resolved.stat()
    state = (str(resolved), stat.st_size, stat.st_mtime_ns, stat.st_ino)
    found = _MEMO.get(state) or _remembered(state)
    if found is None:
        found = file_sha256(resolved)
        _remember(state, found)
    _MEMO[state] = found
    return found


def directory_digest(root: Path) -> str:
    """A digest of every file under ``root``: its name relative to ``root`` and its content."""
    digest = hashlib.sha256()
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(f"{file.relative_to(root).as_posix()}\0{file_digest(file)}\n".encode())
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read in blocks (not remembered: see :func:`file_digest`)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _memo_path(state: tuple[str, int, int, int]) -> Path:
    name = hashlib.sha256(state[0].encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return user_cache("digests", f"{name}.json")


def _remembered(state: tuple[str, int, int, int]) -> str | None:
    try:
        memo = json.loads(_memo_path(state).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(memo, dict) or memo.get("state") != list(state):
        return None
    digest = memo.get("sha256")
    return digest if isinstance(digest, str) else None


def _remember(state: tuple[str, int, int, int], digest: str) -> None:
    """Write the memo atomically (xdist workers may write it at once); a failure (a
    read-only home, say) only costs the next process a read of the file."""
    path = _memo_path(state)
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(json.dumps({"state": list(state), "sha256": digest}),
                             encoding="utf-8")
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
