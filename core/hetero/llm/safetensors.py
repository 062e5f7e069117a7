"""A safetensors reader and writer of our own: memory-mapped numpy views, every offset checked.

File layout: an unsigned little-endian 64-bit header length N, N bytes of JSON
(``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``), then the data; offsets count
from the first byte after the header. A sharded model has ``model.safetensors.index.json`` with a ``weight_map``
from tensor name to shard file.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..contract.errors import ModelFormatError
from ..contract.quant import bf16_to_f32
from .files import checked_file, model_root, parse_json, read_json

# safetensors dtype -> (numpy dtype of the stored bits, bytes per element). BF16 is carried as uint16 bits.
DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"), "U32": np.dtype("<u4"), "U16": np.dtype("<u2"), "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_TO_SAFETENSORS = {np.dtype(v).str: k for k, v in DTYPES.items() if k != "BF16"}
MAX_HEADER = 100 << 20  # the format's own limit on the JSON header
MAX_INDEX = 64 << 20  # model.safetensors.index.json (the largest models' are ~100 KB)
INDEX_NAME = "model.safetensors.index.json"


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str  # safetensors spelling: F32, F16, BF16, ...
    shape: tuple[int, ...]
    path: Path
    begin: int  # absolute offset in the file
    nbytes: int


class SafetensorsFile:
    """One .safetensors file: its header parsed and checked, its data memory-mapped on first access."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        try:
            fd = checked_file(self.path, 1 << 50)  # a regular file: a FIFO would block, a device never end
            size = os.fstat(fd).st_size
            with os.fdopen(fd, "rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise ModelFormatError(f"{self.path}: truncated safetensors file ({size} bytes, no header)")
                (n,) = struct.unpack("<Q", head)
                if n > MAX_HEADER or 8 + n > size:
                    raise ModelFormatError(
                        f"{self.path}: header length {n} does not fit in the {size}-byte file (truncated or not "
                        "a safetensors file)"
                    )
                raw = f.read(n)
        except OSError as exc:
            raise ModelFormatError(f"cannot read {self.path}: {exc.strerror or exc}") from exc
        header = parse_json(raw, f"{self.path}: the safetensors header")
        if not isinstance(header, dict):
            raise ModelFormatError(f"{self.path}: the safetensors header must be a JSON object")
        metadata = header.pop("__metadata__", None) or {}
        if not isinstance(metadata, dict):
            raise ModelFormatError(f"{self.path}: the safetensors '__metadata__' must be an object")
        self.metadata: dict[str, str] = metadata
        data_start, data_size = 8 + n, size - 8 - n
        self.entries = {name: _entry(self.path, name, spec, data_start, data_size) for name, spec in header.items()}
        self._map: np.memmap | None = None

    def _mapped(self) -> np.ndarray:
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        return self._map

    def raw(self, name: str) -> np.ndarray:
        """The stored values as a read-only memory-mapped array (BF16 as uint16 bits)."""
        entry = self.entries[name]
        if entry.nbytes == 0:
            return np.zeros(entry.shape, dtype=DTYPES[entry.dtype])
        data = self._mapped()[entry.begin:entry.begin + entry.nbytes]
        return data.view(DTYPES[entry.dtype]).reshape(entry.shape)


def _entry(path: Path, name: str, spec: object, data_start: int, data_size: int) -> TensorEntry:
    where = f"{path}: tensor {name!r}"
    if not isinstance(spec, dict):
        raise ModelFormatError(f"{where}: header entry must be an object")
    dtype, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
    if dtype not in DTYPES:
        raise ModelFormatError(f"{where}: dtype {dtype!r} is not supported; expected one of {sorted(DTYPES)}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in shape):
        raise ModelFormatError(f"{where}: shape {shape!r} must be a list of non-negative integers")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
        raise ModelFormatError(f"{where}: data_offsets {offsets!r} must be [begin, end]")
    begin, end = offsets
    expected = int(np.prod(shape, dtype=np.int64)) * DTYPES[dtype].itemsize
    if begin < 0 or end < begin:
        raise ModelFormatError(f"{where}: data_offsets {offsets} are not an ordered pair of offsets")
    if end - begin != expected:
        raise ModelFormatError(
            f"{where}: data_offsets {offsets} span {end - begin} bytes but {dtype}{shape} needs {expected}"
        )
    if end > data_size:
        raise ModelFormatError(
            f"{where}: data_offsets {offsets} run past the end of the data ({data_size} bytes): the file is truncated"
        )
    return TensorEntry(name, dtype, tuple(shape), path, data_start + begin, end - begin)


class SafetensorsModel(Mapping[str, TensorEntry]):
    """Every tensor of a model folder: ``model.safetensors``, a sharded index, or any ``*.safetensors`` in it."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self.files: dict[Path, SafetensorsFile] = {}
        self._where: dict[str, Path] = {}
        index = self.folder / INDEX_NAME
        if index.is_file():
            self._load_index(index)
        else:
            shards = sorted(self.folder.glob("*.safetensors"))
            if not shards:
                raise ModelFormatError(f"{self.folder}: no model.safetensors, {INDEX_NAME} or *.safetensors file")
            for shard in shards:
                self._add(shard)

    def _load_index(self, index: Path) -> None:
        weight_map = read_json(index, MAX_INDEX, model_root(self.folder)).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ModelFormatError(f"{index}: 'weight_map' must be an object of tensor name -> file")
        for name, filename in weight_map.items():
            shard = inside(self.folder, filename, f"{index}: tensor {name!r}")
            if shard not in self.files:
                self._add(shard)
            if name not in self.files[shard].entries:
                raise ModelFormatError(f"{index}: tensor {name!r} is mapped to {filename!r}, which does not hold it")
            self._where[name] = shard

    def _add(self, shard: Path) -> None:
        if not shard.is_file():
            raise ModelFormatError(f"{shard}: shard file is missing")
        if not shard.resolve().is_relative_to(model_root(self.folder)):
            raise ModelFormatError(f"{shard} resolves to {shard.resolve()}, outside the model folder {self.folder}")
        self.files[shard] = file = SafetensorsFile(shard)
        for name in file.entries:
            self._where.setdefault(name, shard)

    def __getitem__(self, name: str) -> TensorEntry:
        return self.files[self._where[name]].entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def raw(self, name: str) -> np.ndarray:
        """Memory-mapped stored values (BF16 as uint16 bits); KeyError-free: a missing tensor is a HeteroError."""
        if name not in self._where:
            raise ModelFormatError(f"{self.folder}: tensor {name!r} is missing from the model's safetensors")
        return self.files[self._where[name]].raw(name)

    def dtype(self, name: str) -> str:
        return self[name].dtype

    def float32(self, name: str) -> np.ndarray:
        """The tensor as float32 (a copy unless it is stored as F32)."""
        entry, data = self[name], self.raw(name)
        if entry.dtype == "BF16":
            return bf16_to_f32(data)
        return np.asarray(data, dtype=np.float32)

    def checked(self, name: str, shape: tuple[int, ...]) -> TensorEntry:
        """The entry of ``name``, which must have ``shape`` (the model's config decides it)."""
        if name not in self._where:
            raise ModelFormatError(f"{self.folder}: tensor {name!r} is missing from the model's safetensors")
        entry = self[name]
        if entry.shape != tuple(shape):
            raise ModelFormatError(
                f"{entry.path}: tensor {name!r} has shape {list(entry.shape)}; the config implies {list(shape)}"
            )
        return entry

    def source_files(self) -> list[Path]:
        return sorted(self.files)


def inside(folder: Path, relative: str, what: str) -> Path:
    """``folder / relative``, refusing names that leave the folder (absolute paths, ``..``).

    The check is lexical: a file inside the folder may still be a symlink (as in the Hugging Face cache).
    """
    if not isinstance(relative, str) or not relative or os.path.isabs(relative) or "\0" in relative:
        raise ModelFormatError(f"{what}: file name {str(relative)[:200]!r} must be a relative path inside {folder}")
    if len(relative) > 1024 or any(len(part) > 255 for part in relative.split("/")):
        raise ModelFormatError(f"{what}: file name {relative[:80]!r}... is too long (at most 255 bytes a part)")
    joined = os.path.normpath(os.path.join(folder, relative))
    root = os.path.normpath(folder)
    if os.path.commonpath([root, joined]) != root:
        raise ModelFormatError(f"{what}: file name {relative!r} points outside the model folder {folder}")
    return Path(joined)


def write(path: str | os.PathLike, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None,
          *, bf16: frozenset[str] = frozenset()) -> None:
    """Write a .safetensors file atomically (a temporary file renamed into place). ``bf16``: uint16 arrays to tag
    as BF16."""
    path = Path(path)
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    arrays = []
    for name, array in tensors.items():
        array = np.ascontiguousarray(array)
        key = "BF16" if name in bf16 else _TO_SAFETENSORS.get(array.dtype.newbyteorder("<").str
                                                             if array.dtype.byteorder == ">" else array.dtype.str)
        if key is None:
            raise ModelFormatError(f"cannot write tensor {name!r}: dtype {array.dtype} has no safetensors type")
        header[name] = {"dtype": key, "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        arrays.append(array)
        offset += array.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)  # keep the data 8-byte aligned for memory mapping
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(blob)))
            f.write(blob)
            for array in arrays:
                f.write(array.reshape(-1).view(np.uint8).data)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
