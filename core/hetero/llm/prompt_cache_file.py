"""Prefix-cache files: a computed prompt prefix (``hetero.llm.snapshot.Snapshot``: the KV cache rows, and for
hybrid models the recurrent and conv state) on disk, for a later process to load instead of computing it.

Layout (little-endian)::

    0   8   magic b"HTPCACHE"
    8   4   format version (1)
    12  4   n: bytes of the JSON metadata
    16  8   payload offset (a multiple of 4096: the arrays start on a page)
    24  8   payload bytes
    32  16  blake2b-128 of the header: bytes [0, 32) and [64, payload offset)
    48  16  blake2b-128 of the payload
    64  n   JSON metadata: the key (model content hash, backend, KV cache type, quantization, the model's shape
            signature), the tokens, whether the state is recurrent, and each array's node, name, dtype, shape and
            offset in the payload (64-byte aligned)
    ... the arrays, in the kernels' own layouts (``export_state``)

Reading maps the file (``mmap``) and hands the kernels numpy views of it: nothing is copied before
``import_state`` copies into the cache. The checks, cheapest first: magic and version (garbage, other formats), the
sizes against the file's (truncation, appended bytes), the JSON, the key (a file of another model, backend, KV type,
or of the same path before the model file changed), every array's bounds and dtype (no object arrays, nothing read
outside the file), then the payload's checksum (a flipped byte anywhere; the header's is checked before its JSON
is read, so damaged metadata is reported as such, not as a file of another model). The checksums detect damage,
not an attacker: a file rewritten with valid checksums still cannot make a kernel read outside its arrays
(``import_state`` checks the shapes), but it can hold made-up state. Writes go to a temporary file beside the
target, renamed over it: a reader sees the old file or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..contract.errors import HeteroError, HeteroWarning
from .snapshot import Snapshot

MAGIC = b"HTPCACHE"
VERSION = 1
_FIXED = struct.Struct("<8sIIQQ16s16s")  # 64 bytes
PAGE = 4096
ALIGN = 64
MAX_META = 64 << 20  # a JSON header larger than this is not one of ours (tokens of a 1M context are ~8 MB)
_DTYPE_KINDS = "biufU"  # plain numbers and fixed-width strings (a cache type's name); never objects


class PromptCacheWarning(HeteroWarning):
    """A prefix-cache file was not used (stale, foreign, damaged) or not written; the prompt is computed instead."""


class BadFile(HeteroError):
    """A prefix-cache file that cannot be used: not one, damaged, or written for another model / backend / type."""


@dataclass
class CacheFile:
    """A verified file: ``states`` are read-only views of the mapped file, valid until ``close()``."""

    path: Path
    key: dict[str, Any]
    tokens: tuple[int, ...]
    recurrent: bool
    states: dict[str, dict[str, np.ndarray]]
    logits: np.ndarray | None  # the last token's logits (float32 [vocab]), when saved
    nbytes: int
    _map: mmap.mmap | None = field(default=None, repr=False)

    def snapshot(self) -> Snapshot:
        return Snapshot(self.tokens, self.states, str(self.key.get("fingerprint", "")), self.recurrent)

    def close(self) -> None:
        self.states = {}
        self.logits = None
        if self._map is not None:
            with contextlib.suppress(BufferError):  # a view still held elsewhere: the map goes with it
                self._map.close()
            self._map = None

    def __enter__(self) -> CacheFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _align(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def _arrays(snap: Snapshot, logits: np.ndarray | None) -> Iterator[tuple[str, str, np.ndarray]]:
    for node, state in snap.states.items():
        for name, value in state.items():
            value = np.asarray(value)  # (not ascontiguousarray: it makes a 0-d array, a cache type's name, 1-d)
            yield node, name, value if value.flags.c_contiguous else value.copy(order="C")
    if logits is not None:
        yield "", "logits", np.ascontiguousarray(logits, dtype=np.float32).reshape(-1)


def write(path: str | os.PathLike, key: dict[str, Any], snap: Snapshot, logits: np.ndarray | None = None) -> int:
    """Write ``snap`` (and optionally its last token's ``logits``) to ``path`` atomically; returns its bytes."""
    path = Path(path)
    entries, arrays, offset = [], [], 0
    for node, name, array in _arrays(snap, logits):
        if array.dtype.kind not in _DTYPE_KINDS or array.dtype.hasobject:
            raise HeteroError(f"prompt cache: array {node}/{name} has dtype {array.dtype}, which a file cannot hold")
        offset = _align(offset, ALIGN)
        entries.append({"node": node, "name": name, "dtype": array.dtype.str, "shape": list(array.shape),
                        "offset": offset, "nbytes": int(array.nbytes)})
        arrays.append((offset, array))
        offset += array.nbytes
    meta = json.dumps({"key": key, "tokens": list(snap.tokens), "recurrent": snap.recurrent,
                       "arrays": entries}, separators=(",", ":")).encode()
    payload_at = _align(_FIXED.size + len(meta), PAGE)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w+b") as f:
            fixed = _FIXED.pack(MAGIC, VERSION, len(meta), payload_at, offset, b"", b"")[:32]
            meta += b"\0" * (payload_at - _FIXED.size - len(meta))
            f.write(fixed + _blake(fixed, meta) + b"\0" * 16)
            f.write(meta)
            digest = hashlib.blake2b(digest_size=16)
            at = 0
            for where, array in arrays:
                _put(f, digest, b"\0" * (where - at))
                _put(f, digest, array.reshape(-1).view(np.uint8).data if array.size else b"")
                at = where + array.nbytes
            f.seek(48)
            f.write(digest.digest())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return payload_at + offset


def _blake(*parts: bytes) -> bytes:
    digest = hashlib.blake2b(digest_size=16)
    for part in parts:
        digest.update(part)
    return digest.digest()


def _put(f: BinaryIO, digest: Any, data: bytes | memoryview) -> None:
    if len(data):
        digest.update(data)
        f.write(data)


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    """A file's metadata (key, tokens, arrays) after the cheap checks (the header's checksum, not the payload's):
    for indexing a folder and deciding whether a file helps before reading all of it."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(_FIXED.size)
        meta_len, payload_at, payload_len = _check_fixed(Path(path), head, size)
        return _parse_meta(Path(path), head, f.read(payload_at - _FIXED.size), meta_len, payload_len)


def _check_fixed(path: Path, head: bytes, size: int) -> tuple[int, int, int]:
    if len(head) < _FIXED.size or head[:8] != MAGIC:
        raise BadFile(f"{path}: not a hetero prefix-cache file (no {MAGIC.decode()} header)")
    _, version, meta_len, payload_at, payload_len, _, _ = _FIXED.unpack(head)
    if version != VERSION:
        raise BadFile(f"{path}: prefix-cache format version {version}; this hetero reads version {VERSION}")
    if meta_len > MAX_META or payload_at != _align(_FIXED.size + meta_len, PAGE):
        raise BadFile(f"{path}: damaged header (metadata {meta_len} bytes, payload at {payload_at})")
    if payload_at + payload_len != size:
        raise BadFile(f"{path}: {size} bytes, expected {payload_at + payload_len} (truncated or appended to)")
    return meta_len, payload_at, payload_len


def _parse_meta(path: Path, head: bytes, padded: bytes, meta_len: int, payload_len: int) -> dict[str, Any]:
    """The JSON metadata (``padded``: the bytes from the fixed header to the payload) once its checksum matches."""
    if _blake(head[:32], padded) != head[32:48]:
        raise BadFile(f"{path}: header checksum mismatch (damaged metadata)")
    try:
        meta = json.loads(padded[:meta_len].decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise BadFile(f"{path}: damaged metadata (not JSON)") from None
    ok = (isinstance(meta, dict) and isinstance(meta.get("key"), dict) and isinstance(meta.get("tokens"), list)
          and isinstance(meta.get("arrays"), list) and isinstance(meta.get("recurrent"), bool)
          and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in meta["tokens"]))
    if not ok or not meta["tokens"]:
        raise BadFile(f"{path}: damaged metadata (expected key, tokens, recurrent, arrays)")
    for entry in meta["arrays"]:
        _check_entry(path, entry, payload_len)
    return meta


def _check_entry(path: Path, entry: Any, payload_len: int) -> None:
    """An array's entry: a plain dtype and a shape whose bytes lie inside the payload."""
    try:
        dtype = np.dtype(entry["dtype"])
        shape = [int(s) for s in entry["shape"]]
        offset, nbytes = int(entry["offset"]), int(entry["nbytes"])
        str(entry["node"]), str(entry["name"])
    except (KeyError, TypeError, ValueError):
        raise BadFile(f"{path}: damaged array entry {str(entry)[:80]}") from None
    if dtype.kind not in _DTYPE_KINDS or dtype.hasobject or any(s < 0 for s in shape) or offset < 0:
        raise BadFile(f"{path}: array {entry['node']}/{entry['name']}: dtype {dtype} / shape {shape} not allowed")
    if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize != nbytes or offset + nbytes > payload_len:
        raise BadFile(f"{path}: array {entry['node']}/{entry['name']} ({nbytes} bytes at {offset}) does not fit "
                      f"its shape or the payload of {payload_len} bytes")


def mismatch(found: dict[str, Any], wanted: dict[str, Any]) -> str | None:
    """What differs between a file's key and the model's (None: they match), in words."""
    for name in wanted:
        if found.get(name) != wanted[name]:
            what = {"model_sha256": "model file (content hash)", "kv_cache": "KV cache type"}.get(name, name)
            return f"{what}: the file has {_short(found.get(name))}, the model {_short(wanted[name])}"
    return None


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 24 else text[:20] + "..."


def open_file(path: str | os.PathLike, key: dict[str, Any]) -> CacheFile:
    """Map and verify ``path`` for a model whose key is ``key``; ``BadFile`` says why it cannot be used."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(_FIXED.size)
            meta_len, payload_at, payload_len = _check_fixed(path, head, size)
            meta = _parse_meta(path, head, f.read(payload_at - _FIXED.size), meta_len, payload_len)
            why = mismatch(meta["key"], key)
            if why is not None:
                raise BadFile(f"{path}: written for another model or setting ({why})")
            mapped = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise BadFile(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        with memoryview(mapped) as view:
            matches = hashlib.blake2b(view[payload_at:], digest_size=16).digest() == head[48:64]
        if not matches:
            raise BadFile(f"{path}: payload checksum mismatch (the file was damaged or changed)")
        states: dict[str, dict[str, np.ndarray]] = {}
        logits = None
        for entry in meta["arrays"]:
            dtype, shape = np.dtype(entry["dtype"]), tuple(int(s) for s in entry["shape"])
            count = int(np.prod(shape, dtype=np.int64))
            array = np.frombuffer(mapped, dtype=dtype, count=count, offset=payload_at + int(entry["offset"]))
            array = array.reshape(shape)
            if entry["node"] == "" and entry["name"] == "logits":
                logits = array
            else:
                states.setdefault(str(entry["node"]), {})[str(entry["name"])] = array
    except BaseException:
        with contextlib.suppress(BufferError):  # views made so far: the map goes with them
            mapped.close()
        raise
    return CacheFile(path, meta["key"], tuple(meta["tokens"]), meta["recurrent"], states, logits, size, mapped)


__all__ = ["MAGIC", "VERSION", "BadFile", "CacheFile", "PromptCacheWarning", "mismatch", "open_file", "read_meta",
           "write"]
