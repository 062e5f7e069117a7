"""Where a model's weights come from: a Hugging Face folder (memory-mapped, optionally quantized with a cache next
to the model) or a synthetic generator. The graph builders only see the ``WeightSource`` methods."""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..contract.errors import HeteroWarning, ModelFormatError
from ..contract.quant import QuantFormat, bf16_to_f32, quantize
from . import safetensors

CACHE_DIR = ".hetero-cache"
CACHE_VERSION = 1
_WTYPE_OF = {"F32": "f32", "F16": "f16", "BF16": "bf16"}


@dataclass
class Weight:
    """A weight array as a node consumes it, with the node attributes that describe its format."""

    array: np.ndarray
    attrs: dict[str, Any] = field(default_factory=lambda: {"wtype": "f32"})


class WeightSource:
    """The interface the graph builders use. Names are Hugging Face tensor names."""

    quant: QuantFormat | None = None

    def has(self, name: str) -> bool:
        raise NotImplementedError

    def vector(self, name: str, n: int) -> np.ndarray:
        """A small float32 tensor (norm weights, biases)."""
        raise NotImplementedError

    def matrix(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """A float32 matrix that stays float (the MoE router)."""
        raise NotImplementedError

    def linear(self, name: str, rows: int, cols: int) -> Weight:
        """A ``[rows, cols]`` weight for QMatMul or Embedding, quantized if the source was asked to."""
        raise NotImplementedError

    def experts(self, names: list[str], fused: tuple[str, int] | None, rows: int, cols: int) -> Weight:
        """Expert weights stacked to ``[E, rows, cols]``: from per-expert ``names``, or from a ``fused`` tensor
        ``(name, part)`` holding part ``part`` of each expert's rows (gate_up fused as [E, 2*rows, cols])."""
        raise NotImplementedError

    def finish(self) -> None:
        """Called once the graph is built (the HF source writes its quantization cache here)."""


class HfWeights(WeightSource):
    def __init__(self, folder: Path, quant: QuantFormat | None, *, cache: bool = True, verbose: bool = True) -> None:
        self.folder = folder
        self.st = safetensors.SafetensorsModel(folder)
        self.quant = quant
        self.verbose = verbose
        self._new: dict[str, np.ndarray] = {}
        self._cache: safetensors.SafetensorsFile | None = None
        self.cache_path = _cache_path(folder, self.st, quant) if quant is not None and cache else None
        if self.cache_path is not None and self.cache_path.is_file():
            try:
                self._cache = safetensors.SafetensorsFile(self.cache_path)
            except ModelFormatError:
                self._cache = None  # a damaged cache is rebuilt, never trusted

    # -- WeightSource ---------------------------------------------------------------------------------------------
    def has(self, name: str) -> bool:
        return name in self.st

    def vector(self, name: str, n: int) -> np.ndarray:
        self.st.checked(name, (n,))
        return self.st.float32(name)

    def matrix(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        self.st.checked(name, shape)
        return self.st.float32(name)

    def linear(self, name: str, rows: int, cols: int) -> Weight:
        entry = self.st.checked(name, (rows, cols))
        if self.quant is None:
            return self._float(entry)
        return Weight(self._quantized(name, lambda: self.st.raw(name), entry.dtype), self.quant.attrs())

    def experts(self, names: list[str], fused: tuple[str, int] | None, rows: int, cols: int) -> Weight:
        if all(n in self.st for n in names):
            for n in names:
                self.st.checked(n, (rows, cols))
            dtype = self.st[names[0]].dtype
            load = lambda: np.stack([self.st.raw(n) for n in names])  # noqa: E731
            key = names[0] + f"+{len(names)}"
        elif fused is not None and fused[0] in self.st:
            name, part = fused
            entry = self.st[name]
            parts = entry.shape[1] // rows if len(entry.shape) == 3 else 0
            if len(entry.shape) != 3 or entry.shape[0] != len(names) or entry.shape[2] != cols or parts * rows \
                    != entry.shape[1]:
                raise ModelFormatError(f"{entry.path}: tensor {name!r} has shape {list(entry.shape)}; expected "
                                       f"[{len(names)}, k*{rows}, {cols}]")
            dtype = entry.dtype
            load = lambda: self.st.raw(name)[:, part * rows:(part + 1) * rows]  # noqa: E731
            key = f"{name}#{part}"
        else:
            raise ModelFormatError(f"{self.folder}: expert tensor {names[0]!r} is missing from the model's safetensors")
        if self.quant is None:
            stacked = np.ascontiguousarray(load())  # stacking copies: float MoE models are not memory-mapped
            return Weight(stacked, {"wtype": _WTYPE_OF.get(dtype, "f32")} if dtype in _WTYPE_OF else
                          {"wtype": "f32"})
        return Weight(self._quantized(key, load, dtype), self.quant.attrs())

    def finish(self) -> None:
        if self.cache_path is None or not self._new:
            return
        tensors: dict[str, np.ndarray] = {}
        if self._cache is not None:
            tensors.update({n: self._cache.raw(n) for n in self._cache.entries})
        tensors.update(self._new)
        try:
            self.cache_path.parent.mkdir(parents=True, exist_ok=True)
            safetensors.write(self.cache_path, tensors, {"hetero": f"quant cache v{CACHE_VERSION}",
                                                         "format": self.quant.name if self.quant else ""})
        except OSError as exc:
            warnings.warn(f"hetero: cannot write the quantization cache {self.cache_path}: {exc}; the next load "
                          "will quantize again", HeteroWarning, stacklevel=3)

    # -- helpers --------------------------------------------------------------------------------------------------
    def _float(self, entry: safetensors.TensorEntry) -> Weight:
        data = self.st.raw(entry.name)
        if entry.dtype in _WTYPE_OF:
            return Weight(data, {"wtype": _WTYPE_OF[entry.dtype]})
        return Weight(np.asarray(data, dtype=np.float32), {"wtype": "f32"})

    def _quantized(self, key: str, load, dtype: str) -> np.ndarray:
        assert self.quant is not None
        if self._cache is not None and key in self._cache.entries:
            return self._cache.raw(key)
        source = load()
        values = bf16_to_f32(source) if dtype == "BF16" else source
        self._new[key] = packed = quantize(values, self.quant)
        return packed


def _cache_path(folder: Path, st: safetensors.SafetensorsModel, quant: QuantFormat) -> Path:
    """``<model>/.hetero-cache/<format>-<key>.safetensors``; the key changes with the source files' sizes and mtimes,
    so an edited model is quantized again. ``HETERO_CACHE_DIR`` moves the cache (read-only model folders)."""
    stats = []
    for path in st.source_files():
        info = path.stat()
        stats.append([path.name, info.st_size, info.st_mtime_ns])
    key = hashlib.sha256(json.dumps([CACHE_VERSION, quant.name, stats]).encode()).hexdigest()[:16]
    root = Path(os.environ["HETERO_CACHE_DIR"]) / folder.resolve().name if os.environ.get("HETERO_CACHE_DIR") \
        else folder / CACHE_DIR
    return root / f"{quant.name}-{key}.safetensors"
