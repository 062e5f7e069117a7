"""The native float16 <-> float32 conversion (src/half*.cpp: AVX-512, F16C, scalar) against numpy's astype, bit for
bit, on every ISA path this CPU runs: all 65536 half values, float32 edge values (rounding ties, the overflow
boundary, subnormals, signalling and quiet NaNs, signed zeros), random bit patterns, every tail length; and the
kernels that use it (Cast, the float16 nodes of kernels/half.py)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import hetero
from conftest import make_model

native = pytest.importorskip("hetero_cpu._native", reason="the hetero-cpu native extension is not built")


@pytest.fixture(params=native.available_isas())
def isa(request):
    before = native.isa()
    native.set_isa(request.param)
    yield request.param
    native.set_isa(before)


def _bits16(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint16)


def _bits32(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32)


def _to_float(h: np.ndarray) -> np.ndarray:
    out = np.empty(h.shape, np.float32)
    native.half_to_float(h, out)
    return out


def _to_half(f: np.ndarray) -> np.ndarray:
    out = np.empty(f.shape, np.float16)
    native.float_to_half(f, out)
    return out


def _float32_edges() -> np.ndarray:
    """float32 bit patterns around every rounding boundary of float16."""
    bits: list[int] = [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0x00000001, 0x007FFFFF, 0x00800000]
    bits += [0x7F800001, 0x7FA00000, 0x7FC00000, 0x7FC00001, 0x7FFFFFFF, 0xFF800001, 0xFFC00000, 0x7F801FFF,
             0x7F802000, 0x7FBFE000]  # NaNs: signalling, quiet, payloads lost or kept by the truncation
    for h in range(0x7C00):  # every finite positive half: the value, the tie half an ulp above, and +-1 around them
        f = int(np.array([h], np.uint16).view(np.float16).astype(np.float32).view(np.uint32)[0])
        bits += [f - 1, f, f + 1]
        # past the largest finite half (65504) the next step would be 65536: the tie there (65520) overflows to Inf
        up = int(np.array([h + 1], np.uint16).view(np.float16).astype(np.float32).view(np.uint32)[0]) if h < 0x7BFF \
            else 0x47800000
        mid = np.float32((np.float64(np.uint32(f).view(np.float32)) + np.float64(np.uint32(up).view(np.float32))) / 2)
        m = int(np.array([mid], np.float32).view(np.uint32)[0])
        bits += [m - 1, m, m + 1]
    b = np.array([x & 0xFFFFFFFF for x in bits if 0 <= x < 2**32], np.uint32)
    return np.concatenate([b, b | np.uint32(0x80000000)])


def test_all_halves_to_float(isa):
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    np.testing.assert_array_equal(_bits32(_to_float(h)), _bits32(h.astype(np.float32)))


def test_float32_edges_to_half(isa):
    f = _float32_edges().view(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        want = f.astype(np.float16)
    np.testing.assert_array_equal(_bits16(_to_half(f)), _bits16(want))


def test_random_bits_both_ways(isa):
    rng = np.random.default_rng(0)
    f = rng.integers(0, 2**32, size=200_003, dtype=np.uint64).astype(np.uint32).view(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        want = f.astype(np.float16)
    np.testing.assert_array_equal(_bits16(_to_half(f)), _bits16(want))
    h = rng.integers(0, 2**16, size=200_003, dtype=np.uint32).astype(np.uint16).view(np.float16)
    np.testing.assert_array_equal(_bits32(_to_float(h)), _bits32(h.astype(np.float32)))


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 100])
def test_tails_and_nan_in_a_vector(isa, n):
    """Every tail length; a NaN in a full vector or a tail takes the scalar rule for its values only."""
    rng = np.random.default_rng(n)
    f = (rng.standard_normal(n) * 1000).astype(np.float32)
    if n:
        f[n // 2] = np.uint32(0x7F800001).view(np.float32)  # a signalling NaN: F16C would quiet it
    np.testing.assert_array_equal(_bits16(_to_half(f)), _bits16(f.astype(np.float16)))
    h = f.astype(np.float16)
    if n:
        h[-1] = np.uint16(0x7C01).view(np.float16)
    np.testing.assert_array_equal(_bits32(_to_float(h)), _bits32(h.astype(np.float32)))
    # the values around the slice are untouched (the tails' masked / scalar stores stay inside)
    out = np.full(n + 2, 7, np.float32)
    native.half_to_float(h, out[1:-1])
    assert out[0] == 7 and out[-1] == 7


def test_large_arrays_split_over_threads():
    threads = native.num_threads()
    try:
        native.set_num_threads(2)
        f = np.random.default_rng(1).standard_normal(1_000_001).astype(np.float32) * 70000
        with np.errstate(over="ignore"):
            want = f.astype(np.float16)
        np.testing.assert_array_equal(_bits16(_to_half(f)), _bits16(want))
        np.testing.assert_array_equal(_bits32(_to_float(want)), _bits32(want.astype(np.float32)))
    finally:
        native.set_num_threads(threads)


def test_argument_checks():
    with pytest.raises(ValueError, match="float16"):
        native.half_to_float(np.zeros(4, np.float32), np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="sizes"):
        native.float_to_half(np.zeros(4, np.float32), np.zeros(5, np.float16))
    with pytest.raises(ValueError, match="contiguous"):
        native.float_to_half(np.zeros(8, np.float32)[::2], np.zeros(4, np.float16))


@pytest.mark.parametrize(("src", "dst"), [(TensorProto.FLOAT16, TensorProto.FLOAT),
                                          (TensorProto.FLOAT, TensorProto.FLOAT16)])
def test_cast_node(src, dst):
    """Cast float16 <-> float32 on the native conversion, numpy's astype bit for bit (ties, overflow, NaN)."""
    model = make_model([helper.make_node("Cast", ["x"], ["y"], to=dst)], [("x", src, [5, 13])], [("y", dst, None)],
                       [], opset=17)
    session = hetero.Session(model, backends=["cpu"], on_fallback="error")
    assert [type(k).__name__ for _, k in session.kernels()] == ["CpuCast"]
    rng = np.random.default_rng(2)
    for _ in range(2):  # the second run replays
        x = (rng.standard_normal((5, 13)) * 30000).astype(np.float32)
        x[0, :4] = [65519.99, 65520.0, np.nan, -np.inf]
        with np.errstate(over="ignore"):
            x = x.astype(np.float16) if src == TensorProto.FLOAT16 else x
            want = x.astype(np.float32 if dst == TensorProto.FLOAT else np.float16)
        got = session.run({"x": x})["y"]
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
