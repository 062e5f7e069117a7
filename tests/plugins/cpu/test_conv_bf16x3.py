"""Convolutions on the bf16x3 path (precision "normal" on CPUs with AMX-BF16; conv.cpp's conv_bf16x3).

out^T (HWo x Cout/g) = col^T (HWo x K) x W^T (K x Cout/g): the weights are bf16x3's packed B, the channels-last im2col
rows A. Each output before bias is a K-term dot product, so test_bf16x3.py's bound applies to it (K = Cin/g kh kw),
plus one fp32 rounding of the bias add; ReLU does not widen an error. Shapes the measured rule does not route
(3x3 kernels, groups) are checked in a child process with HETERO_CPU_CONV_BF16X3=1 (the rule's override).
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


# Shapes the rule routes: 1x1 with Cout, K >= 400; one-row kernels with K >= 1024 (pads, stride 2).
ROUTED = [
    # n, c, h, w, cout, kh, kw, stride, pads
    (1, 416, 6, 7, 400, 1, 1, (1, 1), (0, 0, 0, 0)),
    (2, 480, 3, 20, 480, 1, 1, (1, 1), (0, 0, 0, 0)),
    (1, 256, 1, 45, 96, 1, 5, (1, 1), (0, 2, 0, 2)),
    (1, 400, 1, 41, 64, 1, 3, (1, 2), (0, 1, 0, 0)),
]


@amx
@pytest.mark.parametrize("shape", ROUTED)
@pytest.mark.parametrize("act,with_bias", [("none", False), ("relu", True)])
def test_routed_within_bound_of_float64(shape, act, with_bias, threads):
    n, c, h, w_, cout, kh, kw, stride, pads = shape
    x, w, b = data(n, c, h, w_, cout, kh, kw, 1)
    assert check_bound(x, w, b if with_bias else None, stride, pads, 1, act) == "bf16x3"


@amx
@pytest.mark.parametrize("shape", ROUTED)
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
@pytest.mark.parametrize("shape", [(1, 64, 12, 12, 64, 3, 3, (1, 1), (1, 1, 1, 1)),
                                   (1, 32, 20, 20, 64, 1, 1, (1, 1), (0, 0, 0, 0)),
                                   (1, 384, 6, 7, 384, 1, 1, (1, 1), (0, 0, 0, 0))])
def test_not_routed_is_precision_high(shape, threads):
    # below the measured rule (3x3 kernels, K or Cout < 400 for 1x1): precision normal runs the fp32 kernels, bit
    # for bit
    n, c, h, w_, cout, kh, kw, stride, pads = shape
    x, w, b = data(n, c, h, w_, cout, kh, kw, 1, seed=2)
    pn, normal = run(x, w, b, stride, pads, 1, "relu", "normal")
    ph, high = run(x, w, b, stride, pads, 1, "relu", "high")
    assert pn.algorithm(list(x.shape), list(stride), list(pads), [1, 1]) != "bf16x3"
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
    env = dict(os.environ, HETERO_CPU_CONV_BF16X3="1")
    code = "import tests.plugins.cpu.test_conv_bf16x3 as t; t.forced_checks()"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
