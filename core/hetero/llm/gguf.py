"""A GGUF reader of our own (versions 2 and 3): header, metadata, tensor infos, memory-mapped tensor data.

File layout (little-endian):

* ``"GGUF"`` magic, uint32 version, uint64 tensor count, uint64 metadata count;
* the metadata: each a string key, a uint32 value type and the value (strings are a uint64 length + UTF-8 bytes;
  arrays a uint32 element type, a uint64 count and the elements);
* the tensor infos: each a string name, a uint32 rank, rank x uint64 dims (``ne[0]`` is the innermost, contiguous
  one), a uint32 ggml type and a uint64 offset relative to the data section;
* padding up to ``general.alignment`` (default 32), then the data section.

Every count, length and offset is checked against the file size before anything is allocated from it, so a
malformed or hostile file raises ``ModelFormatError`` naming the field instead of crashing, hanging or exhausting
memory. Tensor data is never read: ``GgufFile.array`` returns read-only views into one memory map of the file.

Pages of the map that a process has touched count in its resident set (RSS) until they are unmapped. A backend that
repacks a quantized weight into its own buffer reads every page of it once and never again, so the model would be
resident twice (the file's pages + the repacked copy). ``GgufFile.release`` (or ``release(array)`` for any array that
views a map) drops pages from the process with ``madvise(MADV_DONTNEED)``: they stay in the page cache, and whatever
still reads them (weights used in place, the numpy reference) faults them back in transparently.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import struct
import threading
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..contract.errors import ModelFormatError
from .files import checked_file

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
MAX_NAME = 1 << 12  # tensor names (the spec says 64 bytes; be lenient, but bounded)
MAX_ARRAY_DEPTH = 4
MAX_DIM = 1 << 40  # no real dimension comes near; bounds shapes whose other dims are 0
# Metadata is copied into Python objects, which cost more than the file's bytes: a string array of tiny strings
# ~7x (a str object is ~50 bytes), a long string 1x (decoded straight from the map). These bound the copies: the
# largest real vocabularies hold ~260k tokens and ~500k merges; chat templates are ~10 KB, a whole embedded
# tokenizer.json ~10 MB.
MAX_STRING = 64 << 20
MAX_STRINGS = 1 << 21  # strings in one array
MAX_TOTAL_STRINGS = 1 << 22  # strings in all the metadata
# GgufFile.releasing: at ~1-2 GB/s of repacking, 20 ms lets ~40 MB of pages pile up between releases
RELEASE_INTERVAL = 0.02

# metadata value types
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_SCALARS: dict[int, tuple[str, str]] = {  # type -> (struct code, numpy dtype)
    UINT8: ("<B", "<u1"), INT8: ("<b", "<i1"), UINT16: ("<H", "<u2"), INT16: ("<h", "<i2"),
    UINT32: ("<I", "<u4"), INT32: ("<i", "<i4"), FLOAT32: ("<f", "<f4"), BOOL: ("<?", "?"),
    UINT64: ("<Q", "<u8"), INT64: ("<q", "<i8"), FLOAT64: ("<d", "<f8"),
}
TYPE_NAMES = {UINT8: "uint8", INT8: "int8", UINT16: "uint16", INT16: "int16", UINT32: "uint32", INT32: "int32",
              FLOAT32: "float32", BOOL: "bool", STRING: "string", ARRAY: "array", UINT64: "uint64", INT64: "int64",
              FLOAT64: "float64"}
INT_TYPES = (UINT8, INT8, UINT16, INT16, UINT32, INT32, UINT64, INT64)


@dataclass(frozen=True)
class GgmlType:
    """A ggml tensor type: ``block_size`` elements of ``ne[0]`` are stored in ``block_bytes`` bytes."""

    name: str
    id: int
    block_size: int
    block_bytes: int
    dtype: str | None = None  # numpy dtype of an unquantized type (BF16 as uint16 bits)


GGML_TYPES: dict[int, GgmlType] = {t.id: t for t in (
    GgmlType("F32", 0, 1, 4, "<f4"),
    GgmlType("F16", 1, 1, 2, "<f2"),
    GgmlType("Q4_0", 2, 32, 18),
    GgmlType("Q4_1", 3, 32, 20),
    GgmlType("Q5_0", 6, 32, 22),
    GgmlType("Q5_1", 7, 32, 24),
    GgmlType("Q8_0", 8, 32, 34),
    GgmlType("Q2_K", 10, 256, 84),
    GgmlType("Q3_K", 11, 256, 110),
    GgmlType("Q4_K", 12, 256, 144),
    GgmlType("Q5_K", 13, 256, 176),
    GgmlType("Q6_K", 14, 256, 210),
    GgmlType("Q8_K", 15, 256, 292),
    GgmlType("I8", 24, 1, 1, "<i1"),
    GgmlType("I16", 25, 1, 2, "<i2"),
    GgmlType("I32", 26, 1, 4, "<i4"),
    GgmlType("I64", 27, 1, 8, "<i8"),
    GgmlType("F64", 28, 1, 8, "<f8"),
    GgmlType("BF16", 30, 1, 2, "<u2"),
)}
GGML_BY_NAME = {t.name: t for t in GGML_TYPES.values()}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type: GgmlType
    dims: tuple[int, ...]  # ggml order: dims[0] is the innermost (row length)
    offset: int  # absolute offset of the data in the file
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy (row-major) order: the reverse of ``dims``."""
        return tuple(reversed(self.dims))


_U64 = struct.Struct("<Q")


class _Cursor:
    """Bounds-checked little-endian reads from a buffer; ``what`` names the field for error messages."""

    def __init__(self, buf: Any, size: int, path: Path) -> None:
        self.buf, self.size, self.path, self.pos = buf, size, path, 0
        self.strings_left = MAX_TOTAL_STRINGS

    def fail(self, what: str, problem: str) -> ModelFormatError:
        return ModelFormatError(f"{self.path}: {what} {problem} (at byte {self.pos} of {self.size})")

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(what, f"needs {n} bytes but the file ends: truncated or corrupt GGUF")

    def scalar(self, vtype: int, what: str) -> Any:
        code, _ = _SCALARS[vtype]
        n = struct.calcsize(code)
        self.need(n, what)
        (value,) = struct.unpack_from(code, self.buf, self.pos)
        self.pos += n
        return value

    def u32(self, what: str) -> int:
        return self.scalar(UINT32, what)

    def u64(self, what: str) -> int:
        return self.scalar(UINT64, what)

    def string(self, what: str, limit: int | None = None) -> str:
        n = self.u64(f"{what} (string length)")
        self.need(n, what)
        limit = MAX_STRING if limit is None else limit
        if n > limit:
            raise self.fail(what, f"is {n} bytes long; at most {limit} expected")
        try:
            with memoryview(self.buf) as view, view[self.pos:self.pos + n] as raw:
                text = str(raw, "utf-8")  # decoded from the map: no intermediate bytes copy
        except UnicodeDecodeError:
            raise self.fail(what, "is not valid UTF-8") from None
        self.pos += n
        return text

    def strings(self, count: int, what: str) -> list[str]:
        """An array's ``count`` strings (the hot loop of a vocabulary: 150k tokens and as many merges)."""
        if count > MAX_STRINGS or count > self.strings_left:
            raise self.fail(what, f"holds {count} strings; at most {min(MAX_STRINGS, self.strings_left)} more "
                            f"allowed ({MAX_TOTAL_STRINGS} in all the metadata)")
        self.strings_left -= count
        pos, size, longest = self.pos, self.size, MAX_STRING
        unpack = _U64.unpack_from
        out: list[str] = [""] * count
        with memoryview(self.buf) as view:  # each string decoded straight from the map: no bytes copies
            for i in range(count):
                if pos + 8 > size:
                    self.pos = pos
                    raise self.fail(f"{what}[{i}] (string length)", "needs 8 bytes but the file ends: truncated")
                (n,) = unpack(view, pos)
                pos += 8
                if n > size - pos or n > longest:
                    self.pos = pos
                    raise self.fail(f"{what}[{i}]", f"is {n} bytes long but the file ends: truncated or corrupt")
                try:
                    with view[pos:pos + n] as raw:
                        out[i] = str(raw, "utf-8")
                except UnicodeDecodeError:
                    self.pos = pos
                    raise self.fail(f"{what}[{i}]", "is not valid UTF-8") from None
                pos += n
        self.pos = pos
        return out

    def value(self, vtype: int, what: str, depth: int = 0) -> Any:
        if vtype == BOOL:
            value = self.scalar(UINT8, what)
            if value > 1:
                raise self.fail(what, f"is {value}, not a bool (0 or 1)")
            return bool(value)
        if vtype in _SCALARS:
            return self.scalar(vtype, what)
        if vtype == STRING:
            return self.string(what)
        if vtype == ARRAY:
            if depth >= MAX_ARRAY_DEPTH:
                raise self.fail(what, f"nests arrays deeper than {MAX_ARRAY_DEPTH} levels")
            etype = self.u32(f"{what} (array element type)")
            count = self.u64(f"{what} (array length)")
            if etype in _SCALARS:
                _, dtype = _SCALARS[etype]
                itemsize = np.dtype(dtype).itemsize
                self.need(count * itemsize, f"{what} ({count} x {TYPE_NAMES[etype]})")
                array = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
                self.pos += count * itemsize
                if etype == BOOL and array.size and array.view(np.uint8).max() > 1:
                    raise self.fail(what, "holds a bool that is neither 0 nor 1")
                return array
            if etype not in (STRING, ARRAY):
                raise self.fail(what, f"has unknown array element type {etype}")
            minimum = 8 if etype == STRING else 12  # a string's length / a nested array's type + count
            if count * minimum > self.size - self.pos:
                raise self.fail(what, f"claims {count} elements; the rest of the file cannot hold them")
            if etype == STRING:
                return self.strings(count, what)
            if count > self.strings_left:  # nested arrays are Python objects too: the same budget
                raise self.fail(what, f"holds {count} arrays; at most {self.strings_left} more allowed")
            self.strings_left -= count
            return [self.value(etype, what, depth + 1) for _ in range(count)]
        raise self.fail(what, f"has unknown value type {vtype}")


class GgufFile(Mapping[str, TensorInfo]):
    """One GGUF file: ``metadata`` (key -> value; numeric arrays as numpy arrays, string arrays as lists),
    ``metadata_types`` (key -> value type), and the tensors as a mapping name -> ``TensorInfo``."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        # a regular file only (a FIFO would block, a device never end), opened without blocking
        self._file = os.fdopen(checked_file(self.path, 1 << 50), "rb")
        try:
            self.size = os.fstat(self._file.fileno()).st_size
            if self.size < 24:
                raise ModelFormatError(f"{self.path}: {self.size} bytes is too short for a GGUF header (24 bytes)")
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
            self._file.close()  # the map keeps the file's pages; no descriptor stays open
            probe = np.frombuffer(self._map, dtype=np.uint8, count=1)
            self._address = int(probe.ctypes.data)  # where the map starts, to find the pages under a view
            del probe  # an exported buffer would keep close() from unmapping
            _OPEN[id(self)] = self
            self._parse()
        except BaseException:
            self.close()
            raise

    # -- parsing --------------------------------------------------------------------------------------------------
    def _parse(self) -> None:
        c = _Cursor(self._map, self.size, self.path)
        magic = bytes(self._map[0:4])
        if magic != MAGIC:
            raise ModelFormatError(f"{self.path}: magic {magic!r} is not {MAGIC!r}: not a GGUF file")
        c.pos = 4
        version = c.u32("version")
        if version not in VERSIONS:
            swapped = struct.unpack("<I", struct.pack(">I", version))[0]
            why = "a big-endian GGUF file" if swapped in VERSIONS else "an unknown GGUF version"
            raise ModelFormatError(f"{self.path}: version {version} is {why}; hetero reads versions 2 and 3 "
                                   "(little-endian)")
        self.version = version
        n_tensors = c.u64("tensor_count")
        n_kv = c.u64("metadata_kv_count")
        # Smallest possible entries: a KV is key length 8 + type 4 + a 1-byte value; a tensor info is name length
        # 8 + rank 4 + one dim 8 + type 4 + offset 8.
        if n_kv * 13 > self.size - c.pos:
            raise c.fail("metadata_kv_count", f"{n_kv} cannot fit in the file")
        if n_tensors * 32 > self.size - c.pos:
            raise c.fail("tensor_count", f"{n_tensors} cannot fit in the file")
        self.metadata: dict[str, Any] = {}
        self.metadata_types: dict[str, int] = {}
        for i in range(n_kv):
            key = c.string(f"metadata key #{i}", limit=1 << 16)
            if key in self.metadata:
                raise c.fail(f"metadata key {key!r}", "appears twice")
            vtype = c.u32(f"metadata {key!r} (value type)")
            self.metadata_types[key] = vtype
            self.metadata[key] = c.value(vtype, f"metadata {key!r}")
        alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if "general.alignment" in self.metadata and (
                self.metadata_types["general.alignment"] != UINT32 or alignment < 1 or alignment & (alignment - 1)):
            raise ModelFormatError(f"{self.path}: metadata 'general.alignment' = {alignment!r} must be a uint32 power "
                                   "of two")
        self.alignment = int(alignment)
        raw: list[tuple[str, GgmlType, tuple[int, ...], int]] = []
        names: set[str] = set()
        for i in range(n_tensors):
            name = c.string(f"tensor #{i} name", limit=MAX_NAME)
            where = f"tensor {name!r}"
            if name in names:
                raise c.fail(where, "appears twice")
            names.add(name)
            rank = c.u32(f"{where} n_dims")
            if not 1 <= rank <= MAX_DIMS:
                raise c.fail(f"{where} n_dims", f"is {rank}; expected 1 to {MAX_DIMS}")
            dims = tuple(c.u64(f"{where} dims[{d}]") for d in range(rank))
            if any(d > MAX_DIM for d in dims):
                raise c.fail(f"{where} dims", f"{list(dims)} hold an absurd dimension (above {MAX_DIM})")
            type_id = c.u32(f"{where} type")
            gtype = GGML_TYPES.get(type_id)
            if gtype is None:
                raise c.fail(f"{where} type", f"{type_id} is not a ggml type hetero knows "
                             f"({', '.join(t.name for t in GGML_TYPES.values())})")
            offset = c.u64(f"{where} offset")
            raw.append((name, gtype, dims, offset))
        data_start = -(-c.pos // self.alignment) * self.alignment
        if raw and data_start > self.size:
            raise ModelFormatError(f"{self.path}: the data section would start at byte {data_start}, past the end of "
                                   f"the {self.size}-byte file: truncated")
        self.data_start = data_start
        data_size = self.size - data_start
        tensors: dict[str, TensorInfo] = {}
        for name, gtype, dims, offset in raw:
            where = f"{self.path}: tensor {name!r}"
            if dims[0] % gtype.block_size:
                raise ModelFormatError(f"{where}: dims[0] = {dims[0]} is not a multiple of the {gtype.name} block "
                                       f"size {gtype.block_size}")
            count = 1
            for d in dims:
                count *= d  # Python ints: no overflow
            nbytes = count // gtype.block_size * gtype.block_bytes
            if nbytes > data_size:
                raise ModelFormatError(f"{where}: dims {list(dims)} ({gtype.name}) need {nbytes} bytes; the data "
                                       f"section holds {data_size}: absurd dimensions or a truncated file")
            if offset % self.alignment:
                raise ModelFormatError(f"{where}: offset {offset} is not a multiple of the alignment {self.alignment}")
            if offset + nbytes > data_size:
                raise ModelFormatError(f"{where}: offset {offset} + {nbytes} bytes runs past the end of the data "
                                       f"section ({data_size} bytes): truncated file or bad offset")
            tensors[name] = TensorInfo(name, gtype, dims, data_start + offset, nbytes)
        spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in tensors.values() if t.nbytes)
        for (_, end, first), (begin, _, second) in itertools.pairwise(spans):
            if begin < end:
                raise ModelFormatError(f"{self.path}: tensors {first!r} and {second!r} overlap in the data section "
                                       "(bad offsets)")
        self.tensors = tensors

    # -- access ---------------------------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> TensorInfo:
        return self.tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def meta(self, key: str, default: Any = None) -> Any:
        """A metadata value (tensors are ``self[name]``)."""
        return self.metadata.get(key, default)

    def array(self, name: str) -> np.ndarray:
        """The tensor's data as a read-only view of the memory map: unquantized types in their numpy dtype with
        shape ``reversed(dims)`` (BF16 as uint16 bits); block-quantized types as uint8
        ``[..., dims[1], dims[0] / block_size * block_bytes]``."""
        info = self.tensors[name]
        shape = info.shape
        if info.type.dtype is not None:
            dtype = np.dtype(info.type.dtype)
        else:
            dtype = np.dtype(np.uint8)
            shape = (*shape[:-1], shape[-1] // info.type.block_size * info.type.block_bytes)
        if info.nbytes == 0:
            return np.zeros(shape, dtype=dtype)
        count = info.nbytes // dtype.itemsize
        return np.frombuffer(self._map, dtype=dtype, count=count, offset=info.offset).reshape(shape)

    def span(self, array: np.ndarray) -> tuple[int, int] | None:
        """The byte range ``[start, end)`` of the file that ``array``'s memory covers, or None if it is not a view of
        this file's map."""
        if getattr(self, "_map", None) is None or self._map.closed or array.size == 0:
            return None
        low, high = _byte_bounds(array)
        if low < self._address or high > self._address + self.size:
            return None
        return low - self._address, high - self._address

    def release(self, start: int = 0, end: int | None = None) -> int:
        """Drop the whole pages of ``[start, end)`` (default: the whole file) from this process's resident set; the
        data stays readable (pages come back from the page cache on the next read). Returns the bytes advised."""
        if getattr(self, "_map", None) is None or self._map.closed or not hasattr(mmap, "MADV_DONTNEED"):
            return 0
        end = self.size if end is None else min(end, self.size)
        page = mmap.PAGESIZE
        first = -(-max(start, 0) // page) * page  # whole pages only: a neighbour's partial page may be in use
        last = end // page * page if end < self.size else end  # the map's last page may be partial
        if last <= first:
            return 0
        self._map.madvise(mmap.MADV_DONTNEED, first, last - first)
        return last - first

    @contextlib.contextmanager
    def releasing(self, interval: float = RELEASE_INTERVAL) -> Iterator[None]:
        """While the block runs, a background thread releases the whole map every ``interval`` seconds, and once
        more at the end. For building a session: backends that repack weights read each page once, at an
        unpredictable moment, so the pages they have finished with are dropped shortly after, without a hook in
        every backend. Harmless to pages still in use (they fault back in), cheap over pages already dropped."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(interval):
                self.release()

        worker = threading.Thread(target=loop, name=f"hetero-release-{self.path.name}", daemon=True)
        worker.start()
        try:
            yield
        finally:
            stop.set()
            worker.join()
            self.release()

    def close(self) -> None:
        _OPEN.pop(id(self), None)
        mapped = getattr(self, "_map", None)
        if mapped is not None:
            with contextlib.suppress(BufferError):  # views of it are still alive: the map goes when they do
                mapped.close()
        if getattr(self, "_file", None) is not None:
            self._file.close()

    def __repr__(self) -> str:
        return f"<GgufFile {self.path.name} v{self.version}: {len(self.metadata)} keys, {len(self.tensors)} tensors>"


try:  # numpy >= 2 moved it
    from numpy.lib.array_utils import byte_bounds as _byte_bounds
except ImportError:  # pragma: no cover - numpy 1.26
    _byte_bounds = np.byte_bounds  # type: ignore[attr-defined]  # numpy < 2 only: numpy 2's stubs lack it

# The open files by id, for ``release`` (weak: a file nobody holds is unmapped and forgotten; GgufFile is a Mapping,
# so not hashable).
_OPEN: weakref.WeakValueDictionary[int, GgufFile] = weakref.WeakValueDictionary()


def release(array: np.ndarray) -> int:
    """Drop the pages under ``array`` from the process if it views an open GGUF file's map (0 otherwise). For a
    backend that has copied a constant weight into its own format and will not read the array again."""
    for gf in list(_OPEN.values()):
        span = gf.span(array)
        if span is not None:
            return gf.release(*span)
    return 0


def is_gguf(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a file that starts with the GGUF magic."""
    try:
        with os.fdopen(checked_file(Path(path), 1 << 50), "rb") as f:
            return f.read(4) == MAGIC
    except (OSError, ModelFormatError):
        return False
