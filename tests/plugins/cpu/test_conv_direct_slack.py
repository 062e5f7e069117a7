"""conv_direct's zeros past the padded copy: at stride 1 along W a row's right padding is read from the next row's
left one, so the last row of the last channel reads its right padding (up to min(pl, pr) floats) past the copy. With
only a tile's width of zeros there, a conv padded wider than that (madmom's beat TCN: 5 x 1 taps at dilation 32 /
64 / ..., pads of twice the dilation, on thousands of frames) read stale floats from the thread's buffer as its
padding: wrong outputs (ORT's 0.72 beat activation off by 7e-3) or garbage (1e20). Each case first runs a wider
conv with huge values through the same path, so that stale floats are there to read, then checks against float64
on every ISA at 1 and 2 threads."""

from __future__ import annotations

import numpy as np
import pytest

from hetero_cpu import _native

from .test_native import _conv_ref, randn

ISAS = _native.available_isas()

CASES = [
    # (C, H, W, kh, kw, pads (top, left, bottom, right), dilations): 1-D convs along H (W = 1, run along W) and W
    (16, 2996, 1, 5, 1, (64, 0, 64, 0), (32, 1)),  # madmom TCN's sixth block
    (16, 2996, 1, 5, 1, (128, 0, 128, 0), (64, 1)),
    (16, 1501, 1, 5, 1, (512, 0, 512, 0), (256, 1)),  # pads wider than a third of the frames
    (16, 3001, 1, 5, 1, (40, 0, 40, 0), (20, 1)),  # a frame count that is no multiple of the tile
    (16, 1, 2000, 1, 5, (0, 96, 0, 96), (1, 48)),  # the same along W
    (12, 1, 2000, 1, 3, (0, 70, 0, 50), (1, 60)),  # uneven pads: min(pl, pr) past the copy
    (16, 40, 400, 3, 3, (1, 45, 1, 45), (1, 45)),  # 2-D: rows sharing their wide padding columns
]


def _expected_out(case) -> tuple[int, int]:
    _c, h, w, kh, kw, pads, dil = case
    return h + pads[0] + pads[2] - dil[0] * (kh - 1), w + pads[1] + pads[3] - dil[1] * (kw - 1)


def _run(x: np.ndarray, w: np.ndarray, bias: np.ndarray, pads, dil) -> np.ndarray:
    ho = x.shape[2] + pads[0] + pads[2] - dil[0] * (w.shape[2] - 1)
    wo = x.shape[3] + pads[1] + pads[3] - dil[1] * (w.shape[3] - 1)
    out = np.full((x.shape[0], w.shape[0], ho, wo), np.nan, np.float32)
    _native.conv2d(x, w, bias, out, pads=pads, dilations=dil)
    return out


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("case", CASES, ids=[f"{c[1]}x{c[2]}_k{c[3]}x{c[4]}_d{c[6][0]}x{c[6][1]}" for c in CASES])
def test_wide_pads_read_zeros_past_the_copy(case, isa, threads):
    c, h, wdt, kh, kw, pads, dil = case
    before_isa, before_threads = _native.isa(), _native.num_threads()
    try:
        _native.set_isa(isa)
        _native.set_num_threads(threads)
        w, bias = randn(c, c, kh, kw, seed=1) * 0.3, randn(c, seed=2)
        # The same conv on a wider input of huge values first: its copy fills the thread's buffer past the case's
        bigger = (h + 700, wdt) if wdt == 1 else (h, wdt + 700)
        _run(np.full((1, c, *bigger), 1e6, np.float32), w, bias, pads, dil)
        x = randn(1, c, h, wdt, seed=3)
        got = _run(x, w, bias, pads, dil)
        assert got.shape[2:] == _expected_out(case)
        ref = _conv_ref(x.astype(np.float64), w.astype(np.float64), bias, (1, 1), pads, dil, 1)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    finally:
        _native.set_isa(before_isa)
        _native.set_num_threads(before_threads)


def test_the_cases_take_the_direct_kernel():
    """The path under test: conv_direct on AVX-512 (other ISAs may pick other kernels; the cases check them too)."""
    if "avx512" not in ISAS:
        pytest.skip("the direct kernel's shapes were chosen on AVX-512")
    before = _native.isa()
    try:
        _native.set_isa("avx512")
        algos = set()
        for c, h, wdt, kh, kw, pads, dil in CASES:
            pc = _native.prepack_conv(randn(c, c, kh, kw, seed=1), precision="high")
            algos.add(pc.algorithm([1, c, h, wdt], [1, 1], list(pads), list(dil)))
        assert "direct" in algos, algos
    finally:
        _native.set_isa(before)
