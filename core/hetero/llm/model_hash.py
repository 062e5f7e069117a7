"""A model's content hash: what a prefix-cache file (``hetero.llm.prompt_cache_file``) is keyed by, so a file
written for one model file is never used with another, nor with the same path after the file changed.

The hash is sha256 over the files that decide what a model computes: a GGUF file, or a Hugging Face folder's
``config.json`` and its weights (the safetensors, and a quantization cache's file when the model was quantized at
load). Hashing a 1 GB GGUF takes seconds, so each file's digest is memoized in a small on-disk index,
``$HETERO_CACHE_DIR/model-hashes.json`` (default ``~/.cache/hetero``), keyed by the file's resolved path, size,
modification time (ns) and inode: a file rewritten in place or replaced changes one of them and is hashed again.

``ModelIdentity`` takes the files' stat at load: a file changed on disk *after* the model was loaded is not the one
in memory, and its hash would name the wrong weights, so ``digest`` then refuses (the caller warns and skips).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from ..contract.errors import HeteroError
from ..contract.vendor_worker import cache_root

INDEX_NAME = "model-hashes.json"
INDEX_LIMIT = 4096  # entries kept (oldest out first): a few hundred KB of JSON at most
_CHUNK = 1 << 22
_lock = threading.Lock()  # one index update at a time in this process (others: the atomic rename)

Stat = tuple[int, int, int, int]  # size, mtime_ns, inode, device


def _stat(path: Path) -> Stat:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev


def index_path() -> Path:
    return cache_root() / INDEX_NAME


def _read_index(path: Path) -> dict[str, list]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return {}  # none yet, or damaged: hashes are computed again
    return data if isinstance(data, dict) else {}


def _write_index(path: Path, index: dict[str, list]) -> None:
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".model-hashes.", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(index, f)
        os.replace(tmp, path)
    except OSError:  # a read-only cache dir: the hash is just not remembered
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def file_sha256(path: Path) -> str:
    """sha256 of ``path``'s bytes, memoized by (resolved path, size, mtime_ns, inode) in the on-disk index."""
    real = str(Path(path).resolve())
    stat = _stat(Path(real))
    where = index_path()
    with _lock:
        entry = _read_index(where).get(real)
    if isinstance(entry, list) and len(entry) == 5 and tuple(entry[:4]) == stat and isinstance(entry[4], str):
        return entry[4]
    digest = hashlib.sha256()
    with open(real, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    if _stat(Path(real)) != stat:
        raise HeteroError(f"{real} changed while it was hashed")
    value = digest.hexdigest()
    with _lock:
        index = _read_index(where)
        index.pop(real, None)
        index[real] = [*stat, value]
        while len(index) > INDEX_LIMIT:
            index.pop(next(iter(index)))
        _write_index(where, index)
    return value


class ModelIdentity:
    """The files of a loaded model and their stat at load; ``digest()`` is their content hash (memoized)."""

    def __init__(self, files: Sequence[Path]) -> None:
        self.files = [Path(f) for f in dict.fromkeys(files)]
        self._at_load: dict[Path, Stat | None] = {}
        for f in self.files:
            try:
                self._at_load[f] = _stat(f)
            except OSError:
                self._at_load[f] = None
        self._digest: str | None = None

    def digest(self) -> str:
        """The content hash; a ``HeteroError`` when a file is gone or changed since the model was loaded."""
        if not self.files:
            raise HeteroError("the model has no files to hash (built in memory)")
        for f in self.files:
            try:
                now: Stat | None = _stat(f)
            except OSError:
                now = None
            if now is None or now != self._at_load[f]:
                raise HeteroError(f"{f} changed on disk since the model was loaded: its hash would not name the "
                                  "weights in memory", hint="load the model again")
        if self._digest is None:
            total = hashlib.sha256()
            for f in self.files:
                total.update(f"{f.name}\0{file_sha256(f)}\n".encode())
            self._digest = total.hexdigest()
        return self._digest


def model_files(path: Path | None, mapped: Sequence[Path]) -> list[Path]:
    """What decides a model's output: its GGUF file, or a folder's config.json and weight files."""
    if path is None:
        return []
    files = [path / "config.json"] if path.is_dir() else [path]
    return [*files, *(Path(m) for m in mapped)]


__all__ = ["INDEX_NAME", "ModelIdentity", "file_sha256", "index_path", "model_files"]
