"""Convolutions on the bf16x3 path (precision "normal" on CPUs with AMX-BF16; conv.cpp's conv_bf16x3 and
conv_bf16x3_amx).

conv_bf16x3: out^T (HWo x Cout/g) = col^T (HWo x K) x W^T (K x Cout/g): the weights are bf16x3's packed B, the
channels-last im2col rows A. conv_bf16x3_amx (algorithms "bf16x3_pw" for 1x1 convs, "bf16x3_rows" for the others):
out = W x X, the weights split once as A, the NCHW input (zero-padded, in stride phases) split per call as B. Each
output before bias is a K-term dot product, so test_bf16x3.py's bound applies to it (K = Cin/g kh kw), plus one fp32
rounding of the bias add; ReLU does not widen an error. Shapes the measured rules do not route are checked in child
processes with the rules' overrides (HETERO_CPU_CONV_BF16X3, HETERO_CPU_CONV_BF16X3_PW, HETERO_CPU_CONV_BF16X3_ROWS).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from tests.plugins.cpu.conftest import thread_counts

_native = pytest.importorskip(
    "hetero_cpu._native",
    reason="the hetero-cpu native extension is not built (pip install --no-build-isolation ./plugins/cpu)",
)

amx = pytest.mark.skipif(not _native.bf16x3_available() or "avx512" not in _native.available_isas(),
                         reason="this CPU (or OS) has no AMX-BF16: precision normal runs the fp32 kernels here")

threads = thread_counts(1, 2, 3)


def conv64(x: np.ndarray, w: np.ndarray, stride: tuple[int, int], pads: tuple[int, int, int, int],
           group: int) -> np.ndarray:
    """Float64 convolution (no bias), NCHW."""
    n, _, h, wd = x.shape
    cout, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    ho, wo = (h + pads[0] + pads[2] - kh) // stride[0] + 1, (wd + pads[1] + pads[3] - kw) // stride[1] + 1
    og = cout // group
    out = np.zeros((n, cout, ho, wo))
    for gi in range(group):
        for ky in range(kh):
            for kx in range(kw):
                patch = xp[:, gi * cg:(gi + 1) * cg, ky:ky + stride[0] * ho:stride[0], kx:kx + stride[1] * wo:stride[1]]
                out[:, gi * og:(gi + 1) * og] += np.einsum(
                    "nchw,oc->nohw", patch, w[gi * og:(gi + 1) * og, :, ky, kx].astype(np.float64))
    return out


def run(x, w, bias, stride, pads, group, act, precision):
    packed = _native.prepack_conv(w, group, precision)
    ref = conv64(x, w, stride, pads, group)
    out = np.empty(ref.shape, np.float32)
    _native.conv2d_packed(x, packed, bias, out, stride, pads, (1, 1), act, 0.0, 0.0)
    return packed, out


def check_bound(x, w, bias, stride, pads, group, act) -> str:
    """Runs precision normal, checks it against float64 within the bf16x3 bound; returns the algorithm taken."""
    packed, out = run(x, w, bias, stride, pads, group, act, "normal")
    k = w.shape[1] * w.shape[2] * w.shape[3]
    y = conv64(x, w, stride, pads, group) + (0.0 if bias is None else bias.astype(np.float64)[None, :, None, None])
    s = conv64(np.abs(x), np.abs(w), stride, pads, group)
    tol = (2.0**-14 + 3 * k * 2.0**-24) * s + 2.0**-125 * (3 * k + 1e3) + 2.0**-23 * np.abs(y)
    want = np.maximum(y, 0) if act == "relu" else y
    assert np.all(np.abs(out - want) <= tol), float(np.max(np.abs(out - want) - tol))
    # the path is really bf16x3 (not fp32 within the bound by accident): it differs from precision high somewhere
    _, high = run(x, w, bias, stride, pads, group, act, "high")
    assert not np.array_equal(out, high)
    return packed.algorithm(list(x.shape), list(stride), list(pads), [1, 1])


def data(n, c, h, w_, cout, kh, kw, group, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w_), dtype=np.float32)
    w = (rng.standard_normal((cout, c // group, kh, kw)) / np.sqrt(c // group * kh * kw)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    return x, w, b


# Shapes the rule routes: 1x1 with Cout, K >= 32 (conv_bf16x3_pw); one-row kernels with K >= 1024 (pads, stride 2).
ROUTED = [
    # n, c, h, w, cout, kh, kw, stride, pads
    (1, 416, 6, 7, 400, 1, 1, (1, 1), (0, 0, 0, 0)),
    (2, 480, 3, 20, 480, 1, 1, (1, 1), (0, 0, 0, 0)),
    (1, 256, 1, 45, 96, 1, 5, (1, 1), (0, 2, 0, 2)),
    (1, 400, 1, 41, 64, 1, 3, (1, 2), (0, 1, 0, 0)),
]

# Shapes conv_bf16x3_rows' rule routes: the direct kernels', K >= 256, Cout >= 32 (YOLOv8n's 3x3 on 10 x 10 and stride 2
# onto 10 x 10 / 20 x 20, an odd map, two images); a strided 1x1 conv goes to its subsampled input's 1x1 rule.
ROWS = [
    # n, c, h, w, cout, kh, kw, stride, pads
    (1, 128, 10, 10, 128, 3, 3, (1, 1), (1, 1, 1, 1)),
    (1, 256, 10, 10, 64, 3, 3, (1, 1), (1, 1, 1, 1)),
    (1, 128, 20, 20, 256, 3, 3, (2, 2), (1, 1, 1, 1)),
    (1, 64, 21, 19, 128, 3, 3, (2, 2), (1, 1, 1, 1)),
    (2, 64, 9, 11, 64, 3, 3, (1, 1), (1, 1, 1, 1)),
    (1, 64, 15, 14, 128, 1, 1, (2, 2), (0, 0, 0, 0)),  # a strided 1x1 conv (ResNet's projection shortcut)
    (1, 96, 26, 26, 96, 3, 3, (1, 1), (1, 1, 1, 1)),  # Winograd's shape before (ddddocr's YOLOX)
    (1, 128, 20, 20, 256, 3, 3, (1, 1), (1, 1, 1, 1)),  # Winograd's shape before (OriNet)
]


@amx
@pytest.mark.parametrize("shape", ROUTED)
@pytest.mark.parametrize("act,with_bias", [("none", False), ("relu", True)])
def test_routed_within_bound_of_float64(shape, act, with_bias, threads):
    n, c, h, w_, cout, kh, kw, stride, pads = shape
    x, w, b = data(n, c, h, w_, cout, kh, kw, 1)
    want = "bf16x3_pw" if kh * kw == 1 else "bf16x3"
    assert check_bound(x, w, b if with_bias else None, stride, pads, 1, act) == want


@amx
@pytest.mark.parametrize("shape", ROUTED + ROWS)
def test_same_bits_at_1_2_3_threads(shape):
    n, c, h, w_, cout, kh, kw, stride, pads = shape
    x, w, b = data(n, c, h, w_, cout, kh, kw, 1, seed=1)
    before = _native.num_threads()
    outs = []
    try:
        for t in (1, 2, 3):
            _native.set_num_threads(t)
            outs.append(run(x, w, b, stride, pads, 1, "relu", "normal")[1])
    finally:
        _native.set_num_threads(before)
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])


@amx
@pytest.mark.parametrize("shape", [(1, 16, 12, 12, 64, 3, 3, (1, 1), (1, 1, 1, 1)),
                                   (1, 64, 40, 40, 64, 3, 3, (1, 1), (1, 1, 1, 1)),
                                   (1, 16, 20, 20, 64, 1, 1, (1, 1), (0, 0, 0, 0)),
                                   (1, 64, 20, 20, 16, 1, 1, (1, 1), (0, 0, 0, 0)),
                                   (1, 384, 2, 4, 384, 1, 1, (1, 1), (0, 0, 0, 0)),
                                   (1, 64, 12, 12, 16, 1, 1, (2, 2), (0, 0, 0, 0))])
def test_not_routed_is_precision_high(shape, threads):
    # below the measured rules (3x3 kernels with K < 256 or Winograd's; 1x1 with K or Cout < 32, at most 8 positions,
    # also on a strided one's subsampled input): precision normal runs the fp32 kernels, bit for bit
    n, c, h, w_, cout, kh, kw, stride, pads = shape
    x, w, b = data(n, c, h, w_, cout, kh, kw, 1, seed=2)
    pn, normal = run(x, w, b, stride, pads, 1, "relu", "normal")
    ph, high = run(x, w, b, stride, pads, 1, "relu", "high")
    assert pn.algorithm(list(x.shape), list(stride), list(pads), [1, 1]) not in ("bf16x3", "bf16x3_pw")
    assert not ph.bf16x3
    np.testing.assert_array_equal(normal, high)


@amx
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nonfinite_input_runs_fp32(bad, threads):
    n, c, h, w_, cout, kh, kw, stride, pads = ROUTED[0]
    x, w, b = data(n, c, h, w_, cout, kh, kw, 1, seed=3)
    x[0, 5, 2, 3] = bad
    _, normal = run(x, w, b, stride, pads, 1, "none", "normal")
    _, high = run(x, w, b, stride, pads, 1, "none", "high")
    np.testing.assert_array_equal(normal, high)


def forced_checks() -> None:
    """Run in a child with HETERO_CPU_CONV_BF16X3=1: 3x3 with pads and stride 2, groups > 1 (not depthwise)."""
    for n, c, h, w_, cout, kh, kw, stride, pads, group in [
        (1, 40, 11, 13, 48, 3, 3, (1, 1), (1, 1, 1, 1), 1),
        (2, 36, 15, 14, 64, 3, 3, (2, 2), (1, 0, 1, 1), 1),
        (1, 64, 9, 10, 96, 3, 3, (1, 1), (1, 1, 1, 1), 2),
        (1, 128, 7, 7, 128, 1, 1, (1, 1), (0, 0, 0, 0), 4),
    ]:
        x, w, b = data(n, c, h, w_, cout, kh, kw, group, seed=4)
        for act, bias in (("none", None), ("relu", b)):
            for t in (1, 2, 3):
                _native.set_num_threads(t)
                assert check_bound(x, w, bias, stride, pads, group, act) == "bf16x3"


@amx
def test_forced_3x3_stride_pads_and_groups():
    env = dict(os.environ, HETERO_CPU_CONV_BF16X3="1", HETERO_CPU_CONV_BF16X3_PW="0", HETERO_CPU_CONV_BF16X3_ROWS="0")
    code = "import tests.plugins.cpu.test_conv_bf16x3 as t; t.forced_checks()"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]


# conv_bf16x3_pw (1x1 convs, weights as A, the NCHW input split per call as B): positions off the 32-column blocks
# (196, 99, 9, a 1-D row of 300), K off the 32-k blocks (37, 40), Cout off the 32-row pairs (45: a pair and a lone
# 16-row tile; 33: one row in the last tile), two images, two groups, many chunks (56 x 56) and one chunk (7 x 7).
PW = [
    # n, c, h, w, cout, group
    (1, 256, 14, 14, 256, 1),
    (1, 64, 56, 56, 64, 1),
    (1, 512, 7, 7, 512, 1),
    (2, 37, 9, 11, 45, 1),
    (1, 40, 6, 7, 33, 1),
    (1, 96, 1, 300, 48, 1),
    (1, 128, 10, 10, 128, 2),
    (1, 64, 3, 3, 64, 1),
]


@amx
@pytest.mark.parametrize("shape", PW)
@pytest.mark.parametrize("act,with_bias", [("none", False), ("relu", True)])
def test_pointwise_within_bound_of_float64(shape, act, with_bias, threads):
    n, c, h, w_, cout, group = shape
    x, w, b = data(n, c, h, w_, cout, 1, 1, group, seed=5)
    assert check_bound(x, w, b if with_bias else None, (1, 1), (0, 0, 0, 0), group, act) == "bf16x3_pw"


@amx
@pytest.mark.parametrize("shape", PW[:4])
@pytest.mark.parametrize("act", ["hard_swish", "silu", "sigmoid", "hard_sigmoid"])
def test_pointwise_activations(shape, act, threads):
    # the epilogue's other activations: against precision high's kernels, within the bound times the activation's
    # largest slope (hard_swish 1.5) plus the activations' own rounding
    n, c, h, w_, cout, group = shape
    x, w, b = data(n, c, h, w_, cout, 1, 1, group, seed=6)
    alpha, beta = (0.2, 0.5) if act == "hard_sigmoid" else (0.0, 0.0)
    normal, high = (np.empty((n, cout, h, w_), np.float32) for _ in range(2))
    for precision, out in (("normal", normal), ("high", high)):
        packed = _native.prepack_conv(w, group, precision)
        _native.conv2d_packed(x, packed, b, out, (1, 1), (0, 0, 0, 0), (1, 1), act, alpha, beta)
    s = conv64(np.abs(x), np.abs(w), (1, 1), (0, 0, 0, 0), group)
    tol = 1.5 * (2.0**-14 + 4 * (c // group) * 2.0**-24) * s + 1e-6 * (1 + np.abs(high))
    assert np.all(np.abs(normal - high) <= tol), float(np.max(np.abs(normal - high) - tol))
    assert not np.array_equal(normal, high)


@amx
@pytest.mark.parametrize("shape", PW)
def test_pointwise_same_bits_at_1_2_3_threads(shape):
    n, c, h, w_, cout, group = shape
    x, w, b = data(n, c, h, w_, cout, 1, 1, group, seed=7)
    before = _native.num_threads()
    outs = []
    try:
        for t in (1, 2, 3):
            _native.set_num_threads(t)
            outs.append(run(x, w, b, (1, 1), (0, 0, 0, 0), group, "hard_swish", "normal")[1])
    finally:
        _native.set_num_threads(before)
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])


@amx
@pytest.mark.parametrize("bad", [np.nan, np.inf, 3e38])
@pytest.mark.parametrize("where", ["input", "weights"])
def test_pointwise_nonfinite_or_huge_runs_fp32(bad, where, threads):
    # a NaN, an inf or a value too large to split (in one chunk of the input, or in the weights): precision high's
    # bits everywhere
    x, w, b = data(1, 64, 20, 20, 64, 1, 1, 1, seed=8)
    if where == "input":
        x[0, 5, 17, 3] = bad
    else:
        w[7, 11, 0, 0] = bad
    pn, normal = run(x, w, b, (1, 1), (0, 0, 0, 0), 1, "none", "normal")
    _, high = run(x, w, b, (1, 1), (0, 0, 0, 0), 1, "none", "high")
    assert pn.algorithm(list(x.shape), [1, 1], [0, 0, 0, 0], [1, 1]) == "bf16x3_pw"
    np.testing.assert_array_equal(normal, high)


def forced_pointwise_checks() -> None:
    """Run in a child with HETERO_CPU_CONV_BF16X3_PW=1: 1x1 convs below the rule (K or Cout < 32, Cout of 16 alone,
    one input channel)."""
    for n, c, h, w_, cout, group in [(1, 16, 20, 20, 32, 1), (1, 48, 5, 5, 16, 1), (2, 8, 4, 4, 8, 1),
                                     (1, 1, 12, 12, 40, 1), (1, 32, 9, 9, 6, 2)]:
        x, w, b = data(n, c, h, w_, cout, 1, 1, group, seed=9)
        for act, bias in (("none", None), ("relu", b)):
            for t in (1, 2, 3):
                _native.set_num_threads(t)
                assert check_bound(x, w, bias, (1, 1), (0, 0, 0, 0), group, act) == "bf16x3_pw"


@amx
def test_pointwise_forced_small_shapes():
    env = dict(os.environ, HETERO_CPU_CONV_BF16X3_PW="1")
    code = "import tests.plugins.cpu.test_conv_bf16x3 as t; t.forced_pointwise_checks()"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]


# conv_bf16x3_rows (kh x kw > 1: B rows are taps of the zero-padded input's phase planes): the rule's shapes (ROWS),
# then in a child with the switch on every other form: pads on one side, a 5 x 3 kernel,
# dilation 2, strides (1, 2) and (2, 1), groups, Cout of 40 / 16, few channels, 3 x 3 maps (9 positions), a 1x3
# kernel, a strided 1x1 with pads, unpadded 3x3 convs (the input split in place, one image and group after another).


@amx
@pytest.mark.parametrize("shape", ROWS)
@pytest.mark.parametrize("act,with_bias", [("none", False), ("relu", True)])
def test_rows_within_bound_of_float64(shape, act, with_bias, threads):
    n, c, h, w_, cout, kh, kw, stride, pads = shape
    x, w, b = data(n, c, h, w_, cout, kh, kw, 1, seed=10)
    # a strided 1x1 conv without pads runs as a stride-1 conv on its subsampled input (strided_pointwise), where the
    # 1x1 rule applies (512 -> 1024 / 2 on 14 x 14 247 us against 291 us on the rows path, 1 thread); the rows path's
    # form of it is checked in the child with HETERO_CPU_CONV_SUBSAMPLE=0 (forced_rows_checks)
    want = "bf16x3_pw" if kh * kw == 1 else "bf16x3_rows"
    assert check_bound(x, w, b if with_bias else None, stride, pads, 1, act) == want


@amx
@pytest.mark.parametrize("bad", [np.nan, np.inf, 3e38])
def test_rows_nonfinite_or_huge_runs_fp32(bad, threads):
    n, c, h, w_, cout, kh, kw, stride, pads = ROWS[0]
    x, w, b = data(n, c, h, w_, cout, kh, kw, 1, seed=12)
    x[0, 100, 9, 0] = bad
    _, normal = run(x, w, b, stride, pads, 1, "none", "normal")
    _, high = run(x, w, b, stride, pads, 1, "none", "high")
    np.testing.assert_array_equal(normal, high)


def forced_rows_checks() -> None:
    """Run in a child with HETERO_CPU_CONV_BF16X3_ROWS=1: every form the rows path takes."""
    for n, c, h, w_, cout, kh, kw, stride, pads, dil, group in [
        (1, 24, 11, 13, 48, 3, 3, (1, 1), (0, 1, 2, 0), (1, 1), 1),
        (1, 20, 9, 14, 40, 5, 3, (1, 1), (2, 1, 2, 1), (1, 1), 1),
        (1, 16, 12, 12, 32, 3, 3, (1, 1), (2, 2, 2, 2), (2, 2), 1),
        (2, 16, 10, 15, 32, 3, 3, (1, 2), (1, 1, 1, 1), (1, 1), 1),
        (1, 12, 15, 10, 16, 3, 3, (2, 1), (1, 0, 0, 1), (1, 1), 1),
        (1, 32, 9, 10, 64, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 2),
        (1, 3, 30, 30, 16, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 1),
        (1, 40, 3, 3, 40, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),
        (1, 8, 6, 40, 8, 1, 3, (1, 1), (0, 1, 0, 1), (1, 1), 1),
        (1, 24, 9, 10, 16, 1, 1, (2, 2), (1, 0, 0, 1), (1, 1), 1),
        (1, 64, 15, 14, 128, 1, 1, (2, 2), (0, 0, 0, 0), (1, 1), 1),  # with HETERO_CPU_CONV_SUBSAMPLE=0 only
        (1, 16, 9, 12, 32, 3, 3, (1, 1), (0, 0, 0, 0), (1, 1), 1),  # no pads: the input read in place
        (2, 32, 7, 8, 64, 3, 3, (1, 1), (0, 0, 0, 0), (1, 1), 2),
    ]:
        x, w, b = data(n, c, h, w_, cout, kh, kw, group, seed=13)
        for act, bias in (("none", None), ("relu", b)):
            for t in (1, 2, 3):
                _native.set_num_threads(t)
                packed, out = run_dil(x, w, bias, stride, pads, dil, group, act)
                ref = conv64_dil(x, w, stride, pads, dil, group)
                s = conv64_dil(np.abs(x), np.abs(w), stride, pads, dil, group)
                y = ref + (0.0 if bias is None else bias.astype(np.float64)[None, :, None, None])
                k = w.shape[1] * w.shape[2] * w.shape[3]
                tol = (2.0**-14 + 3 * k * 2.0**-24) * s + 2.0**-125 * (3 * k + 1e3) + 2.0**-23 * np.abs(y)
                want = np.maximum(y, 0) if act == "relu" else y
                assert np.all(np.abs(out - want) <= tol), (n, c, h, w_, cout, kh, kw, stride, pads, dil, group)
                assert packed.algorithm(list(x.shape), list(stride), list(pads), list(dil)) == "bf16x3_rows"


def conv64_dil(x, w, stride, pads, dil, group):
    """Float64 convolution with dilation (no bias), NCHW."""
    n, _, h, wd = x.shape
    cout, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    ho = (h + pads[0] + pads[2] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (wd + pads[1] + pads[3] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    og = cout // group
    out = np.zeros((n, cout, ho, wo))
    for gi in range(group):
        for ky in range(kh):
            for kx in range(kw):
                y0, x0 = ky * dil[0], kx * dil[1]
                patch = xp[:, gi * cg:(gi + 1) * cg, y0:y0 + stride[0] * ho:stride[0], x0:x0 + stride[1] * wo:stride[1]]
                out[:, gi * og:(gi + 1) * og] += np.einsum(
                    "nchw,oc->nohw", patch, w[gi * og:(gi + 1) * og, :, ky, kx].astype(np.float64))
    return out


def run_dil(x, w, bias, stride, pads, dil, group, act):
    packed = _native.prepack_conv(w, group, "normal")
    out = np.full(conv64_dil(x[:, :, :, :], w, stride, pads, dil, group).shape, np.nan, np.float32)
    _native.conv2d_packed(x, packed, bias, out, stride, pads, dil, act, 0.0, 0.0)
    return packed, out


@amx
def test_rows_forced_every_form():
    env = dict(os.environ, HETERO_CPU_CONV_BF16X3_ROWS="1", HETERO_CPU_CONV_SUBSAMPLE="0")
    code = "import tests.plugins.cpu.test_conv_bf16x3 as t; t.forced_rows_checks()"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]


def _pw_and_rows_outputs() -> dict[str, np.ndarray]:
    """Every PW and ROWS shape at precision normal, HardSwish: outputs by shape."""
    outs = {}
    for i, (n, c, h, w_, cout, group) in enumerate(PW):
        x, w, b = data(n, c, h, w_, cout, 1, 1, group, seed=11)
        outs[f"pw{i}"] = run(x, w, b, (1, 1), (0, 0, 0, 0), group, "hard_swish", "normal")[1]
    for i, (n, c, h, w_, cout, kh, kw, stride, pads) in enumerate(ROWS):
        x, w, b = data(n, c, h, w_, cout, kh, kw, 1, seed=12)
        outs[f"rows{i}"] = run(x, w, b, stride, pads, 1, "hard_swish", "normal")[1]
    return outs


@amx
def test_tiled_weights_same_bits_as_rows(tmp_path):
    """The weights as A in 1 KB tiles (bf16x3_block32_ta, the default) give the bits of the row layout
    (HETERO_CPU_BF16X3_TILED_A=0, in a child): the same products in the same order, only the loads differ."""
    path = tmp_path / "rows.npz"
    code = ("import numpy as np\nfrom tests.plugins.cpu.test_conv_bf16x3 import _pw_and_rows_outputs\n"
            f"np.savez({str(path)!r}, **_pw_and_rows_outputs())\n")
    env = dict(os.environ, HETERO_CPU_BF16X3_TILED_A="0")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = np.load(path)
    for name, out in _pw_and_rows_outputs().items():
        assert np.array_equal(out, rows[name]), name


# Shapes where conv_bf16x3_amx splits the output rows at 2+ threads (one image's B one chunk, fewer images than
# threads): a thread splits B at its first row pair of a call and reuses it for its later ones. 1x1 convs (14 x 14,
# 7 x 7, 28 x 28 at K = 64, Cout off the 32-row pairs, two groups at 3 threads) and the rows path (3x3 on small maps,
# stride 2), each run on two inputs in turn (a thread's B of the first call must not serve the second).
ROW_SPLIT = [
    # n, c, h, w, cout, kh, kw, stride, pads, group
    (1, 256, 14, 14, 256, 1, 1, (1, 1), (0, 0, 0, 0), 1),
    (1, 512, 7, 7, 512, 1, 1, (1, 1), (0, 0, 0, 0), 1),
    (1, 64, 28, 28, 128, 1, 1, (1, 1), (0, 0, 0, 0), 1),
    (1, 40, 6, 7, 45, 1, 1, (1, 1), (0, 0, 0, 0), 1),
    (1, 128, 10, 10, 128, 1, 1, (1, 1), (0, 0, 0, 0), 2),
    (1, 32, 8, 8, 64, 3, 3, (1, 1), (1, 1, 1, 1), 1),
    (1, 48, 9, 7, 40, 3, 3, (2, 2), (1, 1, 1, 1), 1),
]


def _row_split_outputs() -> dict[str, np.ndarray]:
    """Every ROW_SPLIT shape at 1, 2 and 3 threads on two inputs (HardSwish): outputs by shape, threads and input."""
    before = _native.num_threads()
    outs = {}
    try:
        for i, (n, c, h, w_, cout, kh, kw, stride, pads, group) in enumerate(ROW_SPLIT):
            x, w, b = data(n, c, h, w_, cout, kh, kw, group, seed=14)
            packed = _native.prepack_conv(w, group, "normal")
            for t in (1, 2, 3):
                _native.set_num_threads(t)
                for j, xj in enumerate((x, 0.5 - x[:, ::-1].copy())):
                    ref = conv64(xj, w, stride, pads, group)
                    out = np.full(ref.shape, np.nan, np.float32)
                    _native.conv2d_packed(xj, packed, b, out, stride, pads, (1, 1), "hard_swish", 0.0, 0.0)
                    outs[f"s{i}t{t}x{j}"] = out
            want = "bf16x3_pw" if kh * kw == 1 else "bf16x3_rows"
            assert packed.algorithm(list(x.shape), list(stride), list(pads), [1, 1]) == want
    finally:
        _native.set_num_threads(before)
    return outs


@amx
def test_row_split_same_bits(tmp_path):
    """The row split at 2 and 3 threads gives 1 thread's bits on each of two inputs, and the bits of the column
    chunks it replaces (HETERO_CPU_BF16X3_ROW_SPLIT=0, in a child)."""
    got = {}
    for side, extra in (("on", {}), ("off", {"HETERO_CPU_BF16X3_ROW_SPLIT": "0"})):
        path = tmp_path / f"{side}.npz"
        code = ("import numpy as np\nfrom tests.plugins.cpu.test_conv_bf16x3 import _row_split_outputs\n"
                f"np.savez({str(path)!r}, **_row_split_outputs())\n")
        env = dict(os.environ, HETERO_CPU_CONV_BF16X3_ROWS="1", **extra)
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        got[side] = dict(np.load(path))
    for name, out in got["on"].items():
        assert not np.isnan(out).any(), name
        assert np.array_equal(out, got["off"][name]), name
        assert np.array_equal(out, got["on"][name[:name.index("t")] + "t1" + name[name.index("x"):]]), name
    i = next(k for k in got["on"] if k.endswith("x0"))
    assert not np.array_equal(got["on"][i], got["on"][i[:-1] + "1"])
