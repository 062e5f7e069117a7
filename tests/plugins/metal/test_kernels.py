"""Every kernel family of hetero-metal, run through the emulator against numpy: odd sizes (partial tiles, partial
simdgroups), several seeds for the scheduling order."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hetero.contract import quant

from .conftest import needs_emulator

pytestmark = needs_emulator
pytest.importorskip("hetero_metal", reason="hetero-metal is not installed (pip install ./plugins/metal)")

from hetero_metal.kernels.elementwise import UNARY, broadcast_strides  # noqa: E402
from hetero_metal.kernels.llm import weight_params  # noqa: E402
from hetero_metal.kernels.nn import matmul_dispatch, row_threads  # noqa: E402
from hetero_metal.plan import dispatch, groups_for  # noqa: E402


def run(queue, *dispatches):
    queue.run(list(dispatches))


@pytest.mark.parametrize("op,ref", [
    ("sigmoid", lambda x: 1 / (1 + np.exp(-x))), ("tanh", np.tanh), ("silu", lambda x: x / (1 + np.exp(-x))),
    ("gelu_tanh", lambda x: 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x**3)))),
    ("softplus", lambda x: np.log1p(np.exp(x))),
])
def test_unary(queue, rng, op, ref):
    x = rng.standard_normal(1000).astype(np.float32)
    y = np.full_like(x, np.nan)
    run(queue, dispatch("unary_f32", {"x": x, "y": y, "p": {"n": x.size, "op": UNARY[op], "alpha": 0, "beta": 0}},
                        (groups_for(x.size, 256),), (256,)))
    np.testing.assert_allclose(y, ref(x.astype(np.float64)), rtol=1e-5, atol=1e-6)


def test_leaky_relu_min(queue, rng):
    """max(LeakyRelu(x), beta), the fused conv activation of a LeakyRelu and a Max by a constant; NaN stays NaN."""
    x = rng.standard_normal(1000).astype(np.float32) * 4
    x[7] = np.nan
    y = np.full_like(x, 1.0)
    run(queue, dispatch("unary_f32", {"x": x, "y": y, "p": {"n": x.size, "op": UNARY["leaky_relu_min"], "alpha": 0.2,
                                                            "beta": -0.4}}, (groups_for(x.size, 256),), (256,)))
    np.testing.assert_allclose(y, np.maximum(np.where(x < 0, 0.2 * x, x), np.float32(-0.4)), rtol=1e-6)


def test_binary_broadcast(queue, rng):
    a = rng.standard_normal((3, 1, 5)).astype(np.float32)
    b = rng.standard_normal((4, 1)).astype(np.float32)
    y = np.full((3, 4, 5), np.nan, np.float32)
    meta = np.array([*y.shape, *broadcast_strides(a.shape, y.shape), *broadcast_strides(b.shape, y.shape)], np.uint32)
    run(queue, dispatch("binary_f32", {"a": a, "b": b, "y": y, "shape": meta, "p": {"n": y.size, "op": 1, "rank": 3}},
                        (1,), (64,)))
    np.testing.assert_array_equal(y, a - b)


@pytest.mark.parametrize("n,inner", [(1, 1), (37, 1), (300, 1), (5, 3)])
def test_softmax(queue, rng, n, inner):
    x = rng.standard_normal((4, n, inner)).astype(np.float32) * 4
    y = np.full_like(x, np.nan)
    run(queue, dispatch("softmax_f32", {"x": x, "y": y, "p": {"n": n, "inner": inner, "log_softmax": 0}},
                        (4 * inner,), (row_threads(n),)))
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_layernorm_and_rmsnorm(queue, rng):
    x = rng.standard_normal((6, 77)).astype(np.float32) + 3
    scale, bias = rng.standard_normal(77).astype(np.float32), rng.standard_normal(77).astype(np.float32)
    y, mean, inv = np.full_like(x, np.nan), np.full(6, np.nan, np.float32), np.full(6, np.nan, np.float32)
    run(queue, dispatch("layernorm_f32", {"x": x, "scale": scale, "bias": bias, "y": y, "mean_out": mean,
                                          "inv_std_out": inv, "p": {"n": 77, "epsilon": 1e-5, "offset": 0.0,
                                                                    "has_bias": 1, "save_stats": 1}},
                        (6,), (row_threads(77),)))
    x64 = x.astype(np.float64)
    mu, var = x64.mean(1, keepdims=True), x64.var(1, keepdims=True)
    np.testing.assert_allclose(y, (x64 - mu) / np.sqrt(var + 1e-5) * scale + bias, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(mean, mu[:, 0], rtol=1e-6)
    np.testing.assert_allclose(inv, 1 / np.sqrt(var[:, 0] + 1e-5), rtol=1e-5)
    r = np.full_like(x, np.nan)
    run(queue, dispatch("rmsnorm_f32", {"x": x, "weight": scale, "y": r, "p": {"n": 77, "epsilon": 1e-6,
                                                                                "offset": 1.0, "has_bias": 0,
                                                                                "save_stats": 0}},
                        (6,), (row_threads(77),)))
    np.testing.assert_allclose(r, x64 / np.sqrt((x64 * x64).mean(1, keepdims=True) + 1e-6) * (1 + scale),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (37, 45, 29), (64, 32, 40)])
def test_matmul_f32(queue, rng, m, n, k):
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    c = np.full((m, n), np.nan, np.float32)
    run(queue, matmul_dispatch(a, b, c, m, n, k, (k, 1, n, 1), np.zeros((1, 3), np.uint32)))
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_matmul_batches_transposes_and_bias(queue, rng):
    m, n, k = 9, 17, 12
    a = rng.standard_normal((2, k, m)).astype(np.float32)  # stored transposed
    b = rng.standard_normal((n, k)).astype(np.float32)  # stored transposed, shared by both batches
    bias = rng.standard_normal(n).astype(np.float32)
    c = np.full((2, m, n), np.nan, np.float32)
    offsets = np.array([[0, 0, 0], [m * k, 0, m * n]], np.uint32)
    run(queue, matmul_dispatch(a, b, c, m, n, k, (1, m, 1, k), offsets, bias=bias, bias_strides=(0, 1),
                               alpha=0.5, beta=2.0))
    want = 0.5 * np.einsum("bkm,nk->bmn", a.astype(np.float64), b) + 2.0 * bias
    np.testing.assert_allclose(c, want, rtol=1e-4, atol=1e-4)


def test_matmul_half_inputs_accumulate_in_float(queue, rng):
    m, n, k = 33, 20, 70
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    c = np.full((m, n), np.nan, np.float16)
    run(queue, matmul_dispatch(a, b, c, m, n, k, (k, 1, n, 1), np.zeros((1, 3), np.uint32), kernel="matmul_f16"))
    exact = a.astype(np.float64) @ b.astype(np.float64)
    # float accumulation, one rounding to half at the end: within one half ulp of the exact product (plus the
    # float sum's own error)
    np.testing.assert_allclose(c.astype(np.float64), exact, rtol=2**-11, atol=1e-3)
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = np.full((m, n), np.nan, np.float32)
    run(queue, matmul_dispatch(x, b, y, m, n, k, (k, 1, n, 1), np.zeros((1, 3), np.uint32), kernel="matmul_f32_f16"))
    np.testing.assert_allclose(y, x.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-4)


QUANT_SPECS = ["q4", "q4_asym_b64", "q8", "q8_asym_b128", "q4_b128"]


@pytest.mark.parametrize("spec", [*QUANT_SPECS, "f32", "f16", "bf16"])
@pytest.mark.parametrize("m", [1, 3])
def test_qmatvec_matches_dequantized_weights(queue, rng, spec, m):
    n, k = 13, 200  # k not a whole number of blocks: the last block of each row is partial
    w = rng.standard_normal((n, k)).astype(np.float32)
    if spec in ("f32", "f16"):
        stored, attrs = w.astype(np.float32 if spec == "f32" else np.float16), {"wtype": spec}
        dense = stored.astype(np.float64)
    elif spec == "bf16":
        stored, attrs = quant.f32_to_bf16(w), {"wtype": "bf16"}
        dense = quant.bf16_to_f32(stored).astype(np.float64)
    else:
        fmt = quant.parse_quant(spec)
        stored, attrs = quant.quantize(w, fmt), fmt.attrs()
        dense = quant.dequantize(stored, fmt, k).astype(np.float64)
    x = rng.standard_normal((m, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    y = np.full((m, n), np.nan, np.float32)
    p = {**weight_params(attrs, k), "m": m, "n": n, "has_bias": 1}
    run(queue, dispatch("qmatvec", {"x": x, "w": stored.reshape(-1).view(np.uint8), "bias": bias, "y": y, "p": p},
                        (groups_for(n, 4),), (128,)))
    np.testing.assert_allclose(y, x @ dense.T + bias, rtol=1e-4, atol=1e-4)
    out = np.full((n, k), np.nan, np.float32)
    run(queue, dispatch("dequant_f32", {"w": stored.reshape(-1).view(np.uint8), "out": out, "p": p},
                        (groups_for(k, 32), n), (32, 1)))
    np.testing.assert_array_equal(out, dense.astype(np.float32))


def test_embedding_dequantizes_rows(queue, rng):
    fmt = quant.parse_quant("q8_asym_b64")
    table = rng.standard_normal((50, 70)).astype(np.float32)
    stored = quant.quantize(table, fmt)
    ids = np.array([3, 49, 0, 3], np.int64)
    out = np.full((4, 70), np.nan, np.float32)
    p = {**weight_params(fmt.attrs(), 70), "m": 4, "n": 50, "has_bias": 0}
    run(queue, dispatch("embedding", {"ids": ids, "table": stored.reshape(-1), "out": out, "p": p}, (3, 4), (32, 1)))
    np.testing.assert_array_equal(out, quant.dequantize(stored, fmt, 70)[ids])


def attention_reference(q, keys, values, past):
    """q [T, Hq, D]; keys / values [Hkv, L, D] as float64; causal from position past."""
    t, hq, d = q.shape
    group = hq // keys.shape[0]
    out = np.zeros((t, hq, d))
    for row in range(t):
        for h in range(hq):
            kv = h // group
            visible = past + row + 1
            s = keys[kv, :visible] @ q[row, h] / math.sqrt(d)
            p = np.exp(s - s.max())
            out[row, h] = (p / p.sum()) @ values[kv, :visible]
    return out.reshape(t, hq * d)


@pytest.mark.parametrize("t,hq,hkv,d,past", [(1, 4, 2, 64, 0), (1, 2, 1, 48, 37), (3, 4, 4, 256, 5)])
def test_attention_over_half_kv_cache(queue, rng, t, hq, hkv, d, past):
    context = 64
    k_cache = np.zeros((hkv, context, d), np.float16)
    v_cache = np.zeros((hkv, context, d), np.float16)
    k_cache[:, :past] = rng.standard_normal((hkv, past, d))
    v_cache[:, :past] = rng.standard_normal((hkv, past, d))
    q = rng.standard_normal((t, hq, d)).astype(np.float32)
    k = rng.standard_normal((t, hkv, d)).astype(np.float32)
    v = rng.standard_normal((t, hkv, d)).astype(np.float32)
    out = np.full((t, hq * d), np.nan, np.float32)
    p = {"t": t, "q_heads": hq, "kv_heads": hkv, "dim": d, "past_len": past, "context": context,
         "scale": 1 / math.sqrt(d)}
    run(queue, dispatch("kv_append", {"k": k, "v": v, "k_cache": k_cache, "v_cache": v_cache, "p": p},
                        (groups_for(d, 32), hkv, t), (32, 1, 1)),
        dispatch("attention_f16kv", {"q": q, "k_cache": k_cache, "v_cache": v_cache, "out": out, "p": p},
                 (hq, t), (128,)))
    np.testing.assert_array_equal(k_cache[:, past:past + t], k.transpose(1, 0, 2).astype(np.float16))
    want = attention_reference(q.astype(np.float64), k_cache.astype(np.float64), v_cache.astype(np.float64), past)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


def test_rope_matches_rotate_half(queue, rng):
    t, h, d, rot, past = 3, 2, 16, 12, 7
    x = rng.standard_normal((t, h, d)).astype(np.float32)
    inv_freq = 1.0 / 10000 ** (np.arange(0, rot, 2) / rot)
    angles = np.arange(64)[:, None] * inv_freq[None, :]
    table = np.ascontiguousarray(np.stack([np.cos(angles), np.sin(angles)], axis=1), np.float32)
    y = np.full_like(x, np.nan)
    run(queue, dispatch("rope", {"x": x, "y": y, "table": table, "p": {"t": t, "heads": h, "dim": d,
                                                                        "rotary_dim": rot, "past_len": past}},
                        (1, h, t), (32, 1, 1)))
    cos = table[past:past + t, 0][:, None, :]
    sin = table[past:past + t, 1][:, None, :]
    half = rot // 2
    want = x.copy()
    want[..., :half] = x[..., :half] * cos - x[..., half:rot] * sin
    want[..., half:rot] = x[..., half:rot] * cos + x[..., :half] * sin
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)


def gated_delta_reference(q, k, v, g, beta, state, scale):
    """The per-token recurrence in float64: S = a S; u = beta (v - S^T k); S += k u^T; o = scale S^T q."""
    t, hk, _ = q.shape
    hv = v.shape[1]
    s = state.astype(np.float64).copy()
    out = np.zeros(v.shape)
    for i in range(t):
        for h in range(hv):
            kh = h // (hv // hk)
            s[h] *= np.exp(g[i, h])
            u = beta[i, h] * (v[i, h] - s[h].T @ k[i, kh])
            s[h] += np.outer(k[i, kh], u)
            out[i, h] = scale * s[h].T @ q[i, kh]
    return out, s


@pytest.mark.parametrize("t", [1, 5])
def test_gated_delta_chunk_and_decode_step(queue, rng, t):
    hk, hv, dk, dv = 1, 2, 24, 40
    q = rng.standard_normal((t, hk, dk)).astype(np.float32)
    k = (rng.standard_normal((t, hk, dk)) / np.sqrt(dk)).astype(np.float32)
    v = rng.standard_normal((t, hv, dv)).astype(np.float32)
    g = -rng.random((t, hv)).astype(np.float32)
    beta = rng.random((t, hv)).astype(np.float32)
    state = rng.standard_normal((hv, dk, dv)).astype(np.float32)
    want_out, want_state = gated_delta_reference(q, k, v, g, beta, state, 0.2)
    out = np.full((t, hv, dv), np.nan, np.float32)
    run(queue, dispatch("gated_delta_chunk", {
        "q": q, "k": k, "v": v, "g": g, "beta": beta, "state": state, "out": out,
        "p": {"t": t, "k_heads": hk, "v_heads": hv, "k_dim": dk, "v_dim": dv, "qk_row": hk * dk, "v_row": hv * dv,
              "scale": 0.2}}, (hv,), (64,)))
    np.testing.assert_allclose(out, want_out, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state, want_state, rtol=1e-4, atol=1e-5)
