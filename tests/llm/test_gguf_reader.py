"""The GGUF reader on files built byte by byte here: metadata of every type, tensor views, and malformed files
(truncated, bad magic / version / offsets, overlaps, absurd counts and dimensions, unknown types) -> HeteroError
naming the field; a hypothesis fuzz test mutates headers and checks that nothing else escapes."""

from __future__ import annotations

import contextlib
import struct
from pathlib import Path

import numpy as np
import pytest

from hetero.contract import HeteroError, ModelFormatError
from hetero.llm import gguf
from hetero.llm.gguf import GgufFile


# -- a minimal writer (test-only) ------------------------------------------------------------------------------------
def _str(s: str | bytes) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


_CODES = {gguf.UINT8: "<B", gguf.INT8: "<b", gguf.UINT16: "<H", gguf.INT16: "<h", gguf.UINT32: "<I",
          gguf.INT32: "<i", gguf.FLOAT32: "<f", gguf.BOOL: "<B", gguf.UINT64: "<Q", gguf.INT64: "<q",
          gguf.FLOAT64: "<d"}


def _value(vtype: int, value) -> bytes:
    if vtype == gguf.STRING:
        return _str(value)
    if vtype == gguf.ARRAY:
        etype, items = value
        return struct.pack("<IQ", etype, len(items)) + b"".join(_value(etype, v) for v in items)
    return struct.pack(_CODES[vtype], value)


def build(kvs: list[tuple[str, int, object]], tensors: list[tuple[str, int, tuple[int, ...], bytes]], *,
          version: int = 3, alignment: int = 32, offsets: list[int] | None = None) -> bytes:
    """A GGUF file: kvs [(key, type, value)], tensors [(name, ggml type id, dims, data)]."""
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    head += b"".join(_str(k) + struct.pack("<I", t) + _value(t, v) for k, t, v in kvs)
    data = b""
    auto = []
    for _, _, _, payload in tensors:
        data += b"\0" * (-len(data) % alignment)
        auto.append(len(data))
        data += payload
    for (name, type_id, dims, _), off in zip(tensors, offsets or auto, strict=True):
        head += _str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        head += struct.pack("<IQ", type_id, off)
    head += b"\0" * (-len(head) % alignment)
    return head + data


def sample() -> bytes:
    q8 = np.zeros((2, 34), dtype=np.uint8)
    q8[:, 0:2] = np.array([0.5], dtype=np.float16).view(np.uint8)
    q8[:, 2:] = np.arange(32, dtype=np.int8).view(np.uint8)
    kvs = [
        ("general.architecture", gguf.STRING, "qwen3"),
        ("u8", gguf.UINT8, 7), ("i8", gguf.INT8, -7), ("u16", gguf.UINT16, 700), ("i16", gguf.INT16, -700),
        ("u32", gguf.UINT32, 70000), ("i32", gguf.INT32, -70000), ("f32", gguf.FLOAT32, 1.5),
        ("flag", gguf.BOOL, 1), ("u64", gguf.UINT64, 1 << 40), ("i64", gguf.INT64, -(1 << 40)),
        ("f64", gguf.FLOAT64, 0.25), ("text", gguf.STRING, "héllo"),
        ("ints", gguf.ARRAY, (gguf.INT32, [1, -2, 3])), ("words", gguf.ARRAY, (gguf.STRING, ["a", "bc", ""])),
        ("nested", gguf.ARRAY, (gguf.ARRAY, [(gguf.UINT8, [1, 2]), (gguf.UINT8, [])])),
    ]
    tensors = [
        ("w.f32", 0, (3, 2), np.arange(6, dtype=np.float32).tobytes()),
        ("w.f16", 1, (4,), np.array([1, 2, 3, 4], dtype=np.float16).tobytes()),
        ("w.q8", 8, (32, 2), q8.tobytes()),
    ]
    return build(kvs, tensors)


def write(tmp_path: Path, data: bytes, name: str = "m.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_metadata_of_every_type_and_tensor_views(tmp_path):
    gf = GgufFile(write(tmp_path, sample()))
    m = gf.metadata
    assert gf.version == 3 and gf.alignment == 32 and len(gf) == 3
    assert (m["u8"], m["i8"], m["u16"], m["i16"], m["u32"], m["i32"]) == (7, -7, 700, -700, 70000, -70000)
    assert m["f32"] == 1.5 and m["flag"] is True and m["u64"] == 1 << 40 and m["i64"] == -(1 << 40)
    assert m["f64"] == 0.25 and m["text"] == "héllo" and m["words"] == ["a", "bc", ""]
    assert m["ints"].tolist() == [1, -2, 3] and m["ints"].dtype == np.int32
    assert [a.tolist() for a in m["nested"]] == [[1, 2], []]
    assert gf.metadata_types["text"] == gguf.STRING and gf.meta("missing", 5) == 5
    a = gf.array("w.f32")
    assert a.shape == (2, 3) and a.dtype == np.float32 and a.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert not a.flags.writeable  # a view of the memory map, not a copy
    assert gf.array("w.f16").tolist() == [1, 2, 3, 4]
    q = gf.array("w.q8")
    assert q.shape == (2, 34) and q.dtype == np.uint8 and gf["w.q8"].shape == (2, 32)
    assert gf["w.q8"].offset % 32 == 0 and gf["w.q8"].offset >= gf.data_start


def test_version_2_and_custom_alignment(tmp_path):
    data = build([("general.alignment", gguf.UINT32, 64)], [("t", 0, (2,), b"\0" * 8), ("u", 0, (1,), b"\0" * 4)],
                 version=2, alignment=64)
    gf = GgufFile(write(tmp_path, data))
    assert gf.version == 2 and gf.alignment == 64 and gf["u"].offset % 64 == 0


@pytest.mark.parametrize("mutate, field", [
    (lambda d: b"GGML" + d[4:], "magic"),
    (lambda d: d[:4] + struct.pack("<I", 1) + d[8:], "version"),
    (lambda d: d[:4] + struct.pack(">I", 3) + d[8:], "big-endian"),
    (lambda d: d[:4], "too short"),
    (lambda d: d[:8] + struct.pack("<Q", 1 << 60) + d[16:], "tensor_count"),
    (lambda d: d[:16] + struct.pack("<Q", 1 << 60) + d[24:], "metadata_kv_count"),
    (lambda d: d[:-10], "truncated"),
])
def test_malformed_headers(tmp_path, mutate, field):
    with pytest.raises(ModelFormatError, match=field):
        GgufFile(write(tmp_path, mutate(sample())))


def test_malformed_entries(tmp_path):
    long_string = build([("k", gguf.STRING, "x")], []).replace(struct.pack("<Q", 1) + b"x",
                                                              struct.pack("<Q", 1 << 50) + b"x")
    with pytest.raises(ModelFormatError, match=r"metadata 'k'.*(string length|file ends)"):
        GgufFile(write(tmp_path, long_string, "a.gguf"))
    bad_type = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _str("k") + struct.pack("<I", 99) + b"\0" * 16
    with pytest.raises(ModelFormatError, match=r"metadata 'k'.*unknown value type 99"):
        GgufFile(write(tmp_path, bad_type, "b.gguf"))
    huge_array = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _str("arr") + struct.pack("<IIQ", gguf.ARRAY, gguf.INT64,
                                                                                       1 << 61) + b"\0" * 16
    with pytest.raises(ModelFormatError, match=r"metadata 'arr'"):
        GgufFile(write(tmp_path, huge_array, "c.gguf"))
    many_strings = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _str("s") + struct.pack("<IIQ", gguf.ARRAY, gguf.STRING,
                                                                                       1 << 40) + b"\0" * 16
    with pytest.raises(ModelFormatError, match=r"metadata 's'.*cannot hold"):
        GgufFile(write(tmp_path, many_strings, "d.gguf"))
    bad_bool = build([("b", gguf.BOOL, 2)], [])
    with pytest.raises(ModelFormatError, match=r"metadata 'b'.*not a bool"):
        GgufFile(write(tmp_path, bad_bool, "e.gguf"))
    dup = build([("k", gguf.UINT8, 1), ("k", gguf.UINT8, 2)], [])
    with pytest.raises(ModelFormatError, match="appears twice"):
        GgufFile(write(tmp_path, dup, "f.gguf"))
    bad_utf8 = build([("k", gguf.STRING, b"\xff\xfe")], [])
    with pytest.raises(ModelFormatError, match="UTF-8"):
        GgufFile(write(tmp_path, bad_utf8, "g.gguf"))
    bad_align = build([("general.alignment", gguf.UINT32, 24)], [])
    with pytest.raises(ModelFormatError, match=r"general\.alignment"):
        GgufFile(write(tmp_path, bad_align, "h.gguf"))


@pytest.mark.parametrize("tensors, offsets, field", [
    ([("t", 77, (4,), b"\0" * 16)], None, "type"),
    ([("t", 0, (4, 1 << 41), b"\0" * 16)], None, "absurd dimension"),
    ([("t", 0, (1 << 30, 1 << 20), b"\0" * 16)], None, "absurd dimensions or a truncated"),
    ([("t", 0, (4,), b"\0" * 16)], [1 << 20], "runs past the end"),
    ([("t", 0, (4,), b"\0" * 16)], [8], "not a multiple of the alignment"),
    ([("t", 0, (8,), b"\0" * 32), ("u", 0, (8,), b"\0" * 32)], [0, 0], "overlap"),
    ([("t", 8, (16,), b"\0" * 34)], None, "not a multiple of the Q8_0 block size"),
    ([("t", 0, (), b"")], None, "n_dims"),
    ([("t", 0, (1, 1, 1, 1, 1), b"\0" * 4)], None, "n_dims"),
    ([("t", 0, (1,), b"\0" * 4), ("t", 0, (1,), b"\0" * 4)], None, "appears twice"),
])
def test_malformed_tensors(tmp_path, tensors, offsets, field):
    with pytest.raises(ModelFormatError, match=field):
        GgufFile(write(tmp_path, build([], tensors, offsets=offsets)))


def test_missing_file_and_not_a_model(tmp_path):
    with pytest.raises(ModelFormatError, match="cannot open"):
        GgufFile(tmp_path / "absent.gguf")
    with pytest.raises(ModelFormatError, match="too short"):
        GgufFile(write(tmp_path, b""))
    assert not gguf.is_gguf(tmp_path / "absent.gguf") and gguf.is_gguf(write(tmp_path, sample(), "x.gguf"))


# -- fuzzing ---------------------------------------------------------------------------------------------------------
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_SAMPLE = sample()
_HEADER = _SAMPLE.index(b"w.f32") + 200  # the metadata and the tensor infos


def _exercise(path: Path) -> None:
    """Open, then touch everything a load touches: the metadata, the tensor views, the config mapping."""
    from hetero.llm.gguf_model import gguf_config

    try:
        gf = GgufFile(path)
    except HeteroError:
        return
    for name in gf:
        view = gf.array(name)
        assert view.nbytes == gf[name].nbytes or gf[name].nbytes == 0
        view.sum()  # every byte is inside the file
    with contextlib.suppress(HeteroError):
        gguf_config(gf)


@settings(max_examples=300, deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, _HEADER - 1), st.integers(0, 255)), min_size=1, max_size=8),
       cut=st.one_of(st.none(), st.integers(0, len(_SAMPLE))))
def test_fuzz_header_bytes(tmp_path, edits, cut):
    data = bytearray(_SAMPLE)
    for at, byte in edits:
        data[at] = byte
    if cut is not None:
        data = data[:cut]
    _exercise(write(tmp_path, bytes(data), "fuzz.gguf"))


@settings(max_examples=200, deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(at=st.integers(0, _HEADER - 8), value=st.sampled_from([0, 1, 2, 31, 32, 33, 255, 1 << 16, 1 << 31,
                                                             (1 << 32) - 1, 1 << 40, 1 << 62, (1 << 64) - 1]))
def test_fuzz_header_words(tmp_path, at, value):
    """Counts, lengths, dims and offsets replaced by boundary values (a uint64 written over any position)."""
    data = bytearray(_SAMPLE)
    data[at:at + 8] = struct.pack("<Q", value)
    _exercise(write(tmp_path, bytes(data), "fuzz.gguf"))
