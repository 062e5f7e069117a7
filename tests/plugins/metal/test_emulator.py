"""The emulator itself: half rounding, the simdgroup functions, and the faults it reports — and the deliberately
wrong kernels of tests/plugins/metal/broken (an off-by-one in a tile, a missing barrier, a wrong simdgroup
reduction), each of which must fail its run while the right kernel beside it passes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from .conftest import needs_emulator

pytestmark = needs_emulator
pytest.importorskip("hetero_metal", reason="hetero-metal is not installed (pip install ./plugins/metal)")

from hetero_metal.emulator import EmulatorLibrary, EmulatorQueue, KernelFault  # noqa: E402
from hetero_metal.emulator_build import build_library, compiler  # noqa: E402
from hetero_metal.plan import Dispatch, dispatch, groups_for  # noqa: E402

from hetero.contract import BackendError  # noqa: E402

BROKEN = Path(__file__).parent / "broken"
SEEDS = range(4)


@pytest.fixture(scope="module")
def test_library(tmp_path_factory):
    if compiler() is None:
        pytest.skip("no C++ compiler to build the test-only kernels")
    sources = sorted(BROKEN.glob("*.metal"))
    return EmulatorLibrary(build_library(sources, tmp_path_factory.mktemp("msl")))


def bind(library: EmulatorLibrary, kernel: str, buffers: list, groups, threads) -> Dispatch:
    """A Dispatch for a test-only kernel (not in the plugin's signature table): buffers in index order."""
    packed = {i: (b if isinstance(b, np.ndarray) else np.asarray(b, np.uint32).tobytes()) for i, b in
              enumerate(buffers)}
    return Dispatch("test", kernel, packed, (*groups, 1, 1)[:3], (*threads, 1, 1)[:3])


def run(library, d: Dispatch, seed: int = 0) -> None:
    EmulatorQueue(library, seed=seed).run([d])


def test_half_conversion_rounds_to_nearest_even(test_library):
    bits = np.arange(0, 1 << 16, dtype=np.uint32)
    # every half value, the midpoints between neighbours (ties), and values just off them
    values = np.concatenate([np.frombuffer(bits.astype(np.uint16).tobytes(), np.float16).astype(np.float32),
                             np.float32([65504, 65519.99, 65520, 1e-8, -3e-8, 6e-8, np.inf, -np.inf])])
    finite = np.frombuffer(bits.astype(np.uint16).tobytes(), np.float16)
    finite = finite[np.isfinite(finite)].astype(np.float64)
    finite.sort()
    mids = ((finite[1:] + finite[:-1]) / 2).astype(np.float32)
    x = np.concatenate([values, mids, np.nextafter(mids, np.float32(np.inf))]).astype(np.float32)
    y = np.zeros(x.size, np.float16)
    run(test_library, bind(test_library, "to_half", [x, y, [x.size]], (groups_for(x.size, 256),), (256,)))
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    same = (y.view(np.uint16) == want.view(np.uint16)) | (np.isnan(y) & np.isnan(want))
    assert same.all(), f"{(~same).sum()} values differ, first {x[~same][:5]}"


def test_half_arithmetic_rounds_each_result(test_library, rng):
    a = rng.standard_normal(500).astype(np.float16)
    b = (rng.standard_normal(500) + 3).astype(np.float16)
    y = np.zeros(2000, np.float16)
    run(test_library, bind(test_library, "half_arithmetic", [a, b, y, [500]], (2,), (256,)))
    np.testing.assert_array_equal(y.reshape(500, 4), np.stack([a + b, a * b, a - b, a / b], axis=1))


def test_simd_functions(test_library, rng):
    x = rng.standard_normal(64).astype(np.float32)
    y = np.zeros(64 * 7, np.float32)
    run(test_library, bind(test_library, "simd_functions", [x, y], (1,), (64,)))
    y = y.reshape(2, 32, 7)
    for s in range(2):
        v = x[32 * s:32 * s + 32].astype(np.float64)
        lanes = np.arange(32)
        np.testing.assert_allclose(y[s, :, 0], v.sum(), rtol=1e-6)
        np.testing.assert_array_equal(y[s, :, 1], np.float32(v.max()))
        np.testing.assert_allclose(y[s, :, 2], np.concatenate([[0], np.cumsum(v)[:-1]]), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(y[s, :, 3], v[lanes ^ 1].astype(np.float32))
        np.testing.assert_array_equal(y[s, :, 4], np.float32(v[3]))
        np.testing.assert_array_equal(y[s, :, 5], v[np.where(lanes >= 2, lanes - 2, lanes)].astype(np.float32))
        np.testing.assert_array_equal(y[s, :, 6], v[31 - lanes].astype(np.float32))


def test_simd_sum_covers_the_live_lanes_of_a_partial_simdgroup(test_library):
    x = np.arange(48, dtype=np.float32)
    y = np.full(48, np.nan, np.float32)
    run(test_library, bind(test_library, "sum_live_lanes", [x, y, [40]], (1,), (48,)))
    np.testing.assert_array_equal(y[:32], np.float32(x[:32].sum()))
    np.testing.assert_array_equal(y[32:40], np.float32(x[32:40].sum()))


def test_barrier_after_an_early_return_is_reported(test_library):
    y = np.zeros(64, np.float32)
    with pytest.raises(KernelFault, match="threadgroup_barrier reached by 40 threads while 24 threads"):
        run(test_library, bind(test_library, "barrier_after_return", [y, [40]], (1,), (64,)))


def test_divergent_simdgroup_functions_are_reported(test_library):
    x = np.ones(32, np.float32)
    with pytest.raises(KernelFault, match="different simdgroup functions"):
        run(test_library, bind(test_library, "divergent_simd_sum", [x, np.zeros(1, np.float32), [32]], (1,), (32,)))


# -- the deliberately wrong kernels ----------------------------------------------------------------------------
def softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("seed", SEEDS)
def test_missing_barrier_is_a_race(test_library, rng, seed):
    x = rng.standard_normal((3, 300)).astype(np.float32)
    y = np.zeros_like(x)
    # thread 0 reads partials before their writers ran (unwritten), or after one did, without a barrier (a race)
    with pytest.raises(KernelFault, match=r"race in threadgroup memory|that no thread of the group has written"):
        run(test_library, bind(test_library, "softmax_missing_barrier", [x, y, [300, 1, 0]], (3,), (128,)), seed)
    # the shipped kernel, same shapes and seed: clean and right
    good = np.zeros_like(x)
    EmulatorQueue(seed=seed).run([dispatch("softmax_f32", {"x": x, "y": good, "p": {"n": 300, "inner": 1,
                                                                                      "log_softmax": 0}},
                                              (3,), (128,))])
    np.testing.assert_allclose(good, softmax(x.astype(np.float64)), rtol=1e-5, atol=1e-7)


def test_missing_barrier_without_the_race_checker_gives_wrong_values(test_library, rng):
    """Scheduling alone exposes it: each thread runs to its first yield before the next starts."""
    x = rng.standard_normal((3, 300)).astype(np.float32)
    wrong = 0
    for seed in SEEDS:
        y = np.zeros_like(x)
        d = bind(test_library, "softmax_missing_barrier", [x, y, [300, 1, 0]], (3,), (128,))
        test_library.run(d, seed, check_races=False)
        wrong += not np.allclose(y, softmax(x.astype(np.float64)), rtol=1e-4)
    assert wrong == len(SEEDS)


def test_off_by_one_tile_is_caught(test_library, rng):
    m, n, k = 40, 40, 24
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = np.zeros((m, n), np.float32)
    with pytest.raises(KernelFault, match=r"indexes a threadgroup array at 5[0-9][0-9] \(it holds 512 elements\)"):
        run(test_library, bind(test_library, "matmul_tile_off_by_one", [a, b, c, [m, n, k]], (2, 2), (128,)))


def test_shifted_tile_store_gives_wrong_values(test_library, rng):
    m, n, k = 64, 32, 16
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = np.zeros((m, n), np.float32)
    run(test_library, bind(test_library, "matmul_store_shifted", [a, b, c, [m, n, k]], (1, 2), (128,)))
    assert not np.allclose(c, a @ b, rtol=1e-3)
    np.testing.assert_allclose(c[:31], (a @ b)[1:32], rtol=1e-4, atol=1e-4)  # it is the shift, nothing else


def test_wrong_simdgroup_reduction_gives_wrong_sums(test_library, rng):
    x = rng.standard_normal((5, 100)).astype(np.float32)
    right, wrong = np.zeros(5, np.float32), np.zeros(5, np.float32)
    run(test_library, bind(test_library, "row_sum_shuffle", [x, right, [100]], (5,), (32,)))
    run(test_library, bind(test_library, "row_sum_wrong_tree", [x, wrong, [100]], (5,), (32,)))
    np.testing.assert_allclose(right, x.astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)
    assert not np.allclose(wrong, x.astype(np.float64).sum(1), rtol=1e-3)


def test_unknown_kernel_and_bad_arguments_are_refused():
    with pytest.raises(BackendError, match="no kernel 'nope'"):
        dispatch("nope", {}, (1,), (1,))
    with pytest.raises(BackendError, match=r"takes float32 \(float\), got float64"):
        dispatch("unary_f32", {"x": np.zeros(4), "y": np.zeros(4, np.float32),
                               "p": {"n": 4, "op": 0, "alpha": 0, "beta": 0}}, (1,), (32,))
    with pytest.raises(BackendError, match="needs fields"):
        dispatch("unary_f32", {"x": np.zeros(4, np.float32), "y": np.zeros(4, np.float32), "p": {"n": 4}},
                 (1,), (32,))
    with pytest.raises(BackendError, match="threadgroups"):
        dispatch("unary_f32", {"x": np.zeros(4, np.float32), "y": np.zeros(4, np.float32),
                               "p": {"n": 4, "op": 0, "alpha": 0, "beta": 0}}, (1,), (2048,))


def test_signature_reader_refuses_what_it_cannot_bind():
    from hetero_metal.msl_signature import SignatureError, parse

    kernels, structs = parse("struct P { uint n; float s; };\n"
                             "kernel void k(device const float* x [[buffer(0)]], constant P& p [[buffer(1)]],\n"
                             "              uint2 pos [[thread_position_in_grid]]) {}")
    assert [(p.name, p.attribute, p.index) for p in kernels["k"].params] == [
        ("x", "buffer", 0), ("p", "buffer", 1), ("pos", "thread_position_in_grid", -1)]
    assert kernels["k"].params[0].element == "float" and kernels["k"].params[1].struct_name == "P"
    assert structs["P"].pack({"n": 3, "s": 0.5}, "k.p") == np.array([3], np.uint32).tobytes() + \
        np.array([0.5], np.float32).tobytes()
    with pytest.raises(SignatureError, match=r"\[\[texture\]\] is not bound"):
        parse("kernel void k(device float* x [[texture(0)]]) {}")
    with pytest.raises(SignatureError, match="uint, int or float fields only"):
        parse("struct Q { half h; };")
