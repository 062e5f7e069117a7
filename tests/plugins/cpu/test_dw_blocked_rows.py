"""The channel-blocked depthwise kernel's row blocks (``dwc_row_block``: AVX-512, kernels 3 or 5 wide, stride 1 or 2
along W, undilated along W): against float64 on every ISA at 1 and 2 threads, and bit for bit against its
per-position blocks (``dwc_block``), which a fresh process with HETERO_CPU_DW_BLOCKED_ROWS=0 runs instead."""

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
    # (N, C, H, W, kh, kw, strides, pads, dilations): rows narrower than a vector (the channel-blocked kernel)
    (1, 512, 7, 7, 5, 5, (1, 1), (2, 2, 2, 2), (1, 1)),  # PP-LCNet's 7 x 7 (a row: one block of 7)
    # 3x3 / 2 onto 14 x 14 (a block of 8, then 6); without left padding (with it, rows of 12+ run the in-place row
    # kernel: test_dw_s2_in_place.py)
    (1, 128, 28, 28, 3, 3, (2, 2), (0, 0, 1, 1), (1, 1)),
    (1, 256, 14, 14, 5, 5, (2, 2), (2, 2, 2, 2), (1, 1)),  # 5x5 / 2 onto 7 x 7
    (2, 40, 9, 15, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),  # rows of 15 (8 + 7), a part-filled block, two images
    (1, 24, 13, 11, 3, 5, (2, 1), (1, 0, 1, 2), (1, 1)),  # 3 x 5, strides (2, 1), uneven pads: rows of 9 (8 + 1)
    (1, 17, 10, 19, 5, 3, (1, 2), (2, 1, 2, 1), (2, 1)),  # dilated along H only, stride 2 along W: rows of 10
    (1, 20, 8, 12, 3, 3, (1, 1), (0, 0, 0, 0), (1, 1)),  # unpadded: rows of 10 (8 + 2)
    (1, 32, 6, 13, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),  # rows of 13 (8 + 5)
    (1, 16, 5, 4, 5, 5, (1, 1), (2, 2, 2, 2), (1, 1)),  # rows of 4
    (1, 16, 8, 6, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1)),  # rows of 3
    (1, 16, 9, 9, 3, 3, (1, 1), (2, 2, 2, 2), (1, 2)),  # dilated along W: the per-position blocks
]


def _inputs(case, seed: int):
    n, c, h, w, kh, kw = case[:6]
    return randn(n, c, h, w, seed=seed), randn(c, 1, kh, kw, seed=seed + 1) * 0.3, randn(c, seed=seed + 2)


def dw_outputs(case, seed: int) -> np.ndarray:
    """The depthwise conv (+ hard-swish) of ``case`` on the inputs drawn from ``seed``, by the native kernel."""
    strides, pads, dil = case[6:]
    x, w, bias = _inputs(case, seed)
    ho = (x.shape[2] + pads[0] + pads[2] - dil[0] * (w.shape[2] - 1) - 1) // strides[0] + 1
    wo = (x.shape[3] + pads[1] + pads[3] - dil[1] * (w.shape[3] - 1) - 1) // strides[1] + 1
    out = np.full((x.shape[0], x.shape[1], ho, wo), np.nan, np.float32)
    _native.conv2d(x, w, bias, out, strides=strides, pads=pads, dilations=dil, group=x.shape[1],
                   activation="hard_swish")
    return out


def check_against_float64(case, seed: int) -> None:
    x, w, bias = _inputs(case, seed)
    y = _conv_ref(x.astype(np.float64), w.astype(np.float64), bias, case[6], case[7], case[8], x.shape[1])
    ref = y * np.clip(y / 6 + 0.5, 0, 1)
    np.testing.assert_allclose(dw_outputs(case, seed), ref, rtol=1e-4, atol=1e-4)


def save_all_outputs(cases, seed: int, path: str) -> None:
    """Every case on every ISA at 1 and 2 threads, saved to the .npz ``path`` (run in a fresh process)."""
    before, res = _native.num_threads(), {}
    for isa in ISAS:
        _native.set_isa(isa)
        for threads in (1, 2):
            _native.set_num_threads(threads)
            for i, case in enumerate(cases):
                res[f"{isa}_{threads}_{i}"] = dw_outputs(case, seed)
    _native.set_num_threads(before)
    np.savez(path, **res)


def check_same_bits_with_paths_off(module: str, switches: tuple[str, ...], case_count: int, tmp_path) -> None:
    """``module``'s ``all_outputs`` in two fresh processes, one with the environment ``switches`` at 0 (the older
    kernel paths), one without them (the defaults): the same bits everywhere, no output left unwritten."""
    plugins = os.path.dirname(os.path.dirname(__file__))  # tests/plugins: this file as pytest names it, cpu.*
    code = f"import sys; sys.path.insert(0, {plugins!r}); import cpu.{module} as t; t.all_outputs()"
    runs = {}
    for side in ("0", "1"):
        path = tmp_path / f"side{side}.npz"
        env = {k: v for k, v in os.environ.items() if k not in switches}
        if side == "0":
            env.update(dict.fromkeys(switches, "0"))
        r = subprocess.run([sys.executable, "-c", code, str(path)], env=env, capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        runs[side] = np.load(path)
    assert sorted(runs["0"].files) == sorted(runs["1"].files) and len(runs["0"].files) == len(ISAS) * 2 * case_count
    for key in runs["0"].files:
        assert not np.isnan(runs["1"][key]).any(), key
        np.testing.assert_array_equal(runs["1"][key], runs["0"][key], err_msg=key)


SEED = 121


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_dw_blocked_rows_against_float64(isa, threads, case):
    check_against_float64(case, SEED)


def all_outputs() -> None:
    save_all_outputs(CASES, SEED, sys.argv[1])


def test_dw_blocked_rows_same_bits_as_the_position_blocks(tmp_path):
    check_same_bits_with_paths_off("test_dw_blocked_rows", ("HETERO_CPU_DW_BLOCKED_ROWS",), len(CASES), tmp_path)
