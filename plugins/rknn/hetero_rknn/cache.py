"""Built RKNN models on disk, by content: ``$HETERO_CACHE_DIR/rknn/<key>.{onnx,rknn,json}``.

The key hashes the segment's ONNX bytes, the target, the dtype and the calibration samples, so an edited model,
another SoC or another calibration set builds anew. It leaves out the toolkit version, which a board does not know:
a board finds the file a PC built for the same session and options. The ``.rknn`` file is what a board loads; the
``.onnx`` is what the toolkit converted (kept for ``rknn-toolkit2`` users and bug reports); the ``.json`` says what
was built, from what, and with which toolkit. On a PC the simulator still converts in its own process (it cannot
run a loaded ``.rknn``): there the cache is the board's artifact and a record; the worker keeps built models for the
process.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hetero.contract.vendor_worker import cache_root

FORMAT = 1  # bumped when what a key covers changes


def cache_dir() -> Path:
    return cache_root() / "rknn"


def build_key(onnx_bytes: bytes, target: str, dtype: str, samples: Sequence[Sequence[np.ndarray]]) -> str:
    digest = hashlib.sha256()
    digest.update(f"hetero-rknn {FORMAT} {target} {dtype}\n".encode())
    digest.update(onnx_bytes)
    for sample in samples:
        for array in sample:
            digest.update(f"{array.dtype}{array.shape}".encode())
            digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()[:32]


@dataclass(frozen=True)
class Entry:
    key: str
    folder: Path

    @property
    def onnx(self) -> Path:
        return self.folder / f"{self.key}.onnx"

    @property
    def rknn(self) -> Path:
        return self.folder / f"{self.key}.rknn"

    @property
    def meta(self) -> Path:
        return self.folder / f"{self.key}.json"

    @property
    def built(self) -> bool:
        return self.rknn.is_file() and self.meta.is_file()

    def write_onnx(self, data: bytes) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        if not self.onnx.is_file():
            _write_atomic(self.onnx, data)

    def record(self, facts: dict[str, Any]) -> None:
        _write_atomic(self.meta, json.dumps(facts, indent=1, sort_keys=True).encode())


def entry(key: str) -> Entry:
    return Entry(key, cache_dir())


def _write_atomic(path: Path, data: bytes) -> None:
    """Readers see the whole file or none (two processes may build the same key)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
