"""The native depthwise conv + 1x1 conv in one call (``dw_pointwise``, hetero.DwPointwiseConv's kernel): against
float64 and against the two convs run apart (conv2d_packed, the unfused pair), on every ISA, 1 and 2 threads; the
one-pass band kernel by its rule (stride 1, <= 64 channels) and, in a fresh process with HETERO_CPU_DW_PW=1, on every
case (strides 2, dilations, wide channel counts)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from hetero_cpu import _native

from .test_native import ACTS, _conv_ref

ISAS = _native.available_isas()
HS = (1 / 6, 0.5)  # hard_swish's alpha, beta as the kernels take them

CASES = [
    # (N, C, H, W, k, strides, pads, dilations, Cout, activation, activation2)
    (1, 16, 13, 37, 3, (1, 1), (1, 1, 1, 1), (1, 1), 24, "hard_swish", "hard_swish"),
    (2, 20, 17, 19, 3, (1, 1), (1, 0, 2, 1), (1, 1), 33, "relu", "none"),  # C, Cout off the vector; odd pads
    (1, 48, 14, 14, 5, (1, 1), (2, 2, 2, 2), (1, 1), 40, "none", "relu6"),
    (1, 64, 23, 21, 3, (1, 1), (1, 1, 1, 1), (1, 1), 64, "hard_swish", "hard_swish"),
    (1, 24, 15, 33, 3, (2, 2), (1, 1, 1, 1), (1, 1), 48, "hard_swish", "silu"),  # stride 2: the pair by the rule
    (1, 8, 40, 41, 3, (2, 2), (0, 1, 1, 0), (1, 1), 13, "relu", "relu"),
    (1, 16, 18, 20, 3, (1, 1), (2, 2, 2, 2), (2, 2), 16, "none", "none"),  # dilated
    (1, 96, 12, 18, 3, (1, 1), (1, 1, 1, 1), (1, 1), 32, "hard_swish", "none"),  # > 64 channels: the pair by the rule
    (1, 32, 7, 7, 5, (1, 1), (2, 2, 2, 2), (1, 1), 32, "relu", "relu"),  # rows under a vector: dw_nchwc's maps
]


def _act_args(name: str) -> tuple[str, float, float]:
    return (name, *HS) if name == "hard_swish" else (name, 0.0, 0.0)


def _case_outputs(case):
    """(dw_pointwise's output, the two convs' output, the float64 reference) of one case."""
    n, c, h, w, k, strides, pads, dil, cout, act, act2 = case
    rng = np.random.default_rng(c * 1000 + h * 10 + cout)
    x = rng.normal(0, 1, (n, c, h, w)).astype(np.float32)
    wd = rng.normal(0, 0.4, (c, 1, k, k)).astype(np.float32)
    bd = rng.normal(0, 0.5, c).astype(np.float32)
    wp = (rng.normal(0, 1, (cout, c, 1, 1)) / np.sqrt(c)).astype(np.float32)
    bp = rng.normal(0, 0.5, cout).astype(np.float32)
    dk, pk = _native.prepack_conv(wd, c), _native.prepack_conv(wp)
    mid64 = ACTS[act](_conv_ref(x.astype(np.float64), wd.astype(np.float64), bd, strides, pads, dil, c))
    ref = ACTS[act2](_conv_ref(mid64, wp.astype(np.float64), bp, (1, 1), (0, 0, 0, 0), (1, 1), 1))
    out = np.full(ref.shape, np.nan, np.float32)
    _native.dw_pointwise(x, dk, bd, pk, bp, out, strides, pads, dil, *_act_args(act), *_act_args(act2))
    mid = np.full(mid64.shape, np.nan, np.float32)
    _native.conv2d_packed(x, dk, bd, mid, strides, pads, dil, *_act_args(act))
    pair = np.full(ref.shape, np.nan, np.float32)
    _native.conv2d_packed(mid, pk, bp, pair, (1, 1), (0, 0, 0, 0), (1, 1), *_act_args(act2))
    return out, pair, ref


def _check(case, label: str) -> None:
    out, pair, ref = _case_outputs(case)
    atol = 1e-4 * (1 + float(np.abs(ref).max()))
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=atol, err_msg=f"{label} {case} vs float64")
    np.testing.assert_allclose(out, pair, rtol=1e-5, atol=atol / 10, err_msg=f"{label} {case} vs the pair")


@pytest.mark.parametrize("case", CASES, ids=[f"c{c[1]}_{c[2]}x{c[3]}_s{c[5][0]}_{c[8]}" for c in CASES])
def test_dw_pointwise_matches_the_pair_and_float64(isa, threads, case):
    _check(case, f"{isa} t{threads}")


def test_dw_pointwise_refuses_bad_operands():
    x = np.zeros((1, 8, 9, 9), np.float32)
    dk = _native.prepack_conv(np.zeros((8, 1, 3, 3), np.float32), 8)
    pk = _native.prepack_conv(np.zeros((4, 8, 1, 1), np.float32))
    with pytest.raises(ValueError, match="depthwise"):  # the first weights must be depthwise
        _native.dw_pointwise(x, pk, None, pk, None, np.empty((1, 4, 9, 9), np.float32))
    with pytest.raises(ValueError, match="shape"):  # the output must be the 1x1's
        _native.dw_pointwise(x, dk, None, pk, None, np.empty((1, 8, 9, 9), np.float32), pads=[1, 1, 1, 1])
    k3 = _native.prepack_conv(np.zeros((4, 8, 3, 3), np.float32))
    with pytest.raises(ValueError, match="1x1"):
        _native.dw_pointwise(x, dk, None, k3, None, np.empty((1, 4, 7, 7), np.float32), pads=[1, 1, 1, 1])


def test_dw_pointwise_forced_on_every_case():
    # HETERO_CPU_DW_PW=1: the band kernel on every case where the ISA has the tiles (strides 2, dilations, 96
    # channels), every ISA, 1 and 2 threads, in a fresh process (the rule's override is read once)
    env = dict(os.environ, HETERO_CPU_DW_PW="1")
    plugins = os.path.dirname(os.path.dirname(__file__))  # tests/plugins: this file as pytest names it, cpu.*
    code = f"import sys; sys.path.insert(0, {plugins!r}); import cpu.test_dw_pointwise as t; t.forced_checks()"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split()[-1] == str(len(ISAS) * 2 * len(CASES))


def forced_checks() -> None:
    before, checked = _native.num_threads(), 0
    for isa in ISAS:
        _native.set_isa(isa)
        for threads in (1, 2):
            _native.set_num_threads(threads)
            for case in CASES:
                _check(case, f"forced {isa} t{threads}")
                checked += 1
    _native.set_num_threads(before)
    print(checked)


def test_dw_pointwise_runs_in_a_replay_step():
    # a replay's run of native calls takes it as a step op (one native call for the run): the same bits as the call
    import functools

    from hetero_cpu import fuse

    assert "dw_pointwise" in _native.step_ops()
    rng = np.random.default_rng(7)
    x = rng.normal(0, 1, (1, 16, 20, 24)).astype(np.float32)
    dk = _native.prepack_conv(rng.normal(0, 0.4, (16, 1, 3, 3)).astype(np.float32), 16)
    pk = _native.prepack_conv(rng.normal(0, 0.3, (8, 16, 1, 1)).astype(np.float32))
    outs = [np.full((1, 8, 20, 24), np.nan, np.float32) for _ in range(3)]
    calls = [functools.partial(_native.dw_pointwise, x, dk, None, pk, None, o, (1, 1), (1, 1, 1, 1), (1, 1),
                               "hard_swish", *HS, "relu", 0.0, 0.0) for o in outs]
    program = fuse.step_calls(calls[:2])
    assert len(program) == 1 and isinstance(program[0], _native.LlmStep)
    program[0]()
    calls[2]()
    np.testing.assert_array_equal(outs[0], outs[2])
    np.testing.assert_array_equal(outs[1], outs[2])
