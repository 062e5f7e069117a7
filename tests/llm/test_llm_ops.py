"""The hetero-domain LLM ops: each numpy reference against a direct, naive formulation, and shape inference."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hetero.contract import HeteroError, ShapeError, registry
from hetero.contract.graph import HETERO_DOMAIN, Node
from hetero.contract.opforms import rope_inv_freq
from hetero.contract.quant import QuantFormat, dequantize, f32_to_bf16, quantize
from hetero.contract.registry import OpContext
from hetero.ops.llm import moe_routing
from hetero.runtime.infer import info_of

rng = np.random.default_rng(7)


def run(op_type: str, inputs: list[np.ndarray | None], state: dict | None = None, **attrs) -> np.ndarray:
    """Infer, then run the reference; the result must have the inferred shape and dtype."""
    schema = registry.get(HETERO_DOMAIN, op_type)
    node = Node(op_type, [f"i{k}" if v is not None else "" for k, v in enumerate(inputs)], ["y"], attrs,
                domain=HETERO_DOMAIN)
    infos = [None if v is None else info_of(v) for v in inputs]
    (info,) = schema.infer(OpContext(node, infos, list(inputs), 1))
    (out,) = schema.reference(OpContext(node, infos, list(inputs), 1, None, state))
    assert out.shape == info.shape and out.dtype == info.dtype.np_dtype
    return out


def f32(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def test_rmsnorm():
    x, w = f32(3, 5, 8), f32(8)
    want = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(run("RMSNorm", [x, w], epsilon=1e-5), want, rtol=1e-5)
    np.testing.assert_allclose(run("RMSNorm", [x, w], epsilon=1e-5, offset=1.0), want / w * (1 + w), rtol=1e-4)
    with pytest.raises(ShapeError):
        run("RMSNorm", [x, f32(7)])


def naive_rope(x: np.ndarray, start: int, inv_freq: np.ndarray, rotary: int, scale: float = 1.0) -> np.ndarray:
    out = x.astype(np.float64).copy()
    half = rotary // 2
    for t in range(x.shape[0]):
        for i in range(half):
            a = (start + t) * inv_freq[i]
            c, s = math.cos(a) * scale, math.sin(a) * scale
            x1, x2 = x[t, :, i].astype(np.float64), x[t, :, i + half].astype(np.float64)
            out[t, :, i], out[t, :, i + half] = x1 * c - x2 * s, x2 * c + x1 * s
    return out


@pytest.mark.parametrize("rotary_dim", [0, 8])
def test_rope_neox_and_partial(rotary_dim):
    x = f32(5, 3, 16)
    rot = rotary_dim or 16
    inv = 10000.0 ** (-np.arange(0, rot, 2) / rot)
    out = run("RotaryEmbedding", [x, np.array(7, dtype=np.int64)], theta=10000.0, rotary_dim=rotary_dim)
    np.testing.assert_allclose(out, naive_rope(x, 7, inv, rot), atol=1e-5)
    if rotary_dim:
        np.testing.assert_array_equal(out[..., rot:], x[..., rot:])  # the rest passes through


def test_rope_linear_and_yarn_frequencies():
    base = 10000.0 ** (-np.arange(0, 32, 2) / 32)
    inv, scale = rope_inv_freq(32, {"theta": 10000.0, "scaling": "linear", "factor": 4.0})
    np.testing.assert_allclose(inv, base / 4)
    assert scale == 1.0
    inv, scale = rope_inv_freq(32, {"theta": 10000.0, "scaling": "yarn", "factor": 4.0, "original_max_position": 64,
                                    "attention_factor": 1.2})
    assert scale == 1.2
    # fast-turning dims keep their frequency, slow ones are interpolated, the blend in between is monotone
    assert inv[0] == pytest.approx(base[0]) and inv[-1] == pytest.approx(base[-1] / 4)
    ratio = inv / base
    assert np.all(np.diff(ratio) <= 1e-12)


def naive_attention(q, keys, values, positions_q):
    t, hq, d = q.shape
    group = hq // keys.shape[1]
    out = np.zeros((t, hq, d))
    for i in range(t):
        for h in range(hq):
            k = keys[: positions_q[i] + 1, h // group].astype(np.float64)
            v = values[: positions_q[i] + 1, h // group].astype(np.float64)
            s = k @ q[i, h] / math.sqrt(d)
            p = np.exp(s - s.max())
            out[i, h] = (p / p.sum()) @ v
    return out.reshape(t, hq * d)


def test_attention_prefill_decode_rollback_and_overflow():
    """With the exact float32 cache (kv_dtype f32); the float16 cache is checked against it below."""
    state: dict = {}
    q, k, v = f32(6, 4, 8), f32(6, 2, 8), f32(6, 2, 8)
    pl = lambda n: np.array(n, dtype=np.int64)  # noqa: E731
    out = run("Attention", [q, k, v, pl(0)], state, max_context=8, kv_dtype="f32")
    np.testing.assert_allclose(out, naive_attention(q, k, v, np.arange(6)), atol=1e-5)
    # decode one token on top of the cache
    q1, k1, v1 = f32(1, 4, 8), f32(1, 2, 8), f32(1, 2, 8)
    keys, values = np.concatenate([k, k1]), np.concatenate([v, v1])
    out = run("Attention", [q1, k1, v1, pl(6)], state, max_context=8, kv_dtype="f32")
    np.testing.assert_allclose(out, naive_attention(q1, keys, values, [6]), atol=1e-5)
    # roll back to 3 and write different tokens there: positions 3.. are overwritten
    q2, k2, v2 = f32(2, 4, 8), f32(2, 2, 8), f32(2, 2, 8)
    out = run("Attention", [q2, k2, v2, pl(3)], state, max_context=8, kv_dtype="f32")
    keys, values = np.concatenate([k[:3], k2]), np.concatenate([v[:3], v2])
    np.testing.assert_allclose(out, naive_attention(q2, keys, values, [3, 4]), atol=1e-5)
    with pytest.raises(HeteroError, match="exceed the context of 8"):
        run("Attention", [f32(4, 4, 8), f32(4, 2, 8), f32(4, 2, 8), pl(5)], state, max_context=8)
    with pytest.raises(HeteroError, match="outside the 5 cached positions"):
        run("Attention", [q1, k1, v1, pl(6)], state, max_context=8)


def test_attention_float16_cache_rounds_keys_and_values():
    q, k, v = f32(5, 4, 8), f32(5, 2, 8), f32(5, 2, 8)
    out = run("Attention", [q, k, v, np.array(0, dtype=np.int64)], {}, max_context=8)  # the default: f16
    half = naive_attention(q, k.astype(np.float16).astype(np.float32), v.astype(np.float16).astype(np.float32),
                           np.arange(5))
    np.testing.assert_allclose(out, half, atol=1e-5)
    assert np.abs(out - naive_attention(q, k, v, np.arange(5))).max() > 0  # it really is rounded


def test_attention_rejects_bad_heads():
    with pytest.raises(ShapeError, match="multiple"):
        run("Attention", [f32(2, 3, 8), f32(2, 2, 8), f32(2, 2, 8), np.array(0, dtype=np.int64)], {}, max_context=4)


def test_swiglu():
    g, u = f32(4, 6), f32(4, 6)
    np.testing.assert_allclose(run("SwiGLU", [g, u]), g / (1 + np.exp(-g)) * u, rtol=1e-5)


FORMATS = [QuantFormat(b, s, sym) for b in (8, 4) for s in (32, 64, 128) for sym in (True, False)]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_qmatmul_quantized_equals_dequantized(fmt):
    x, w, b = f32(3, 96), f32(10, 96), f32(10)  # 96: a partial last block for sizes 64 and 128
    packed = quantize(w, fmt)
    dense = dequantize(packed, fmt, 96)
    out = run("QMatMul", [x, packed, b], **fmt.attrs())
    np.testing.assert_allclose(out, x @ dense.T + b, rtol=1e-5, atol=1e-5)


def test_qmatmul_float_types():
    x, w = f32(2, 16), f32(5, 16)
    np.testing.assert_allclose(run("QMatMul", [x, w]), x @ w.T, rtol=1e-5)
    np.testing.assert_allclose(run("QMatMul", [x, w.astype(np.float16)], wtype="f16"),
                               x @ w.astype(np.float16).astype(np.float32).T, rtol=1e-5)
    bits = f32_to_bf16(w)
    out = run("QMatMul", [x, bits], wtype="bf16")
    np.testing.assert_allclose(out, x @ w.T, rtol=2e-2, atol=2e-2)
    with pytest.raises(ShapeError, match="rows"):
        run("QMatMul", [x, f32(5, 15)])
    with pytest.raises(ShapeError, match="must be"):
        run("QMatMul", [x, w], wtype="f16")


def test_qmatmul_argmax_output():
    """QMatMul's optional second output: numpy's argmax of each output row (first of ties, first NaN), int64."""
    x, w = f32(4, 16), f32(9, 16)
    w[5] = w[2]  # rows 2 and 5 of the output: equal in every row of x
    node = Node("QMatMul", ["x", "w", "b"], ["y", "best"], {}, domain=HETERO_DOMAIN)
    schema = registry.get(HETERO_DOMAIN, "QMatMul")
    for bias in (np.zeros(9, np.float32), np.where(np.arange(9) == 6, np.nan, 0).astype(np.float32),
                 np.where(np.arange(9) == 2, 100, 0).astype(np.float32)):
        inputs = [x, w, bias]
        infos = [info_of(v) for v in inputs]
        y_info, best_info = schema.infer(OpContext(node, infos, list(inputs), 1))
        y, best = schema.reference(OpContext(node, infos, list(inputs), 1, None, None))
        assert best.dtype == np.int64 and best.shape == best_info.shape == (4,) and y.shape == y_info.shape
        np.testing.assert_array_equal(best, [int(np.argmax(row)) for row in y])


def test_embedding_float_and_quantized():
    table = f32(20, 64)
    ids = np.array([[3, 0], [19, 3]], dtype=np.int64)
    np.testing.assert_array_equal(run("Embedding", [ids, table]), table[ids])
    fmt = QuantFormat(4, 32, False)
    packed = quantize(table, fmt)
    out = run("Embedding", [ids, packed], dim=64, **fmt.attrs())
    np.testing.assert_allclose(out, dequantize(packed, fmt, 64)[ids], rtol=1e-6)
    with pytest.raises(HeteroError, match="outside the vocabulary"):
        run("Embedding", [np.array([20], dtype=np.int64), table])


def test_moe_matches_per_token_loop():
    t, h, inter, e, k = 7, 16, 8, 5, 2
    x, router = f32(t, h), f32(e, h)
    gate, up, down = f32(e, inter, h), f32(e, inter, h), f32(e, h, inter)
    silu = lambda z: z / (1 + np.exp(-z))  # noqa: E731
    for normalize in (0, 1):
        out = run("MoE", [x, router, gate, up, down], top_k=k, norm_topk_prob=normalize)
        want = np.zeros((t, h))
        for i in range(t):
            p = np.exp(router @ x[i] - (router @ x[i]).max())
            p /= p.sum()
            top = np.argsort(-p)[:k]
            weights = p[top] / (p[top].sum() if normalize else 1)
            for wgt, j in zip(weights, top, strict=True):
                want[i] += wgt * (down[j] @ (silu(gate[j] @ x[i]) * (up[j] @ x[i])))
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
    chosen, weights = moe_routing(x, router, k, True)
    assert chosen.shape == (t, k) and np.allclose(weights.sum(-1), 1)


def test_moe_quantized_experts():
    fmt = QuantFormat(8, 32, True)
    x, router = f32(3, 64), f32(4, 64)
    gate, up, down = f32(4, 32, 64), f32(4, 32, 64), f32(4, 64, 32)
    q = [quantize(w, fmt) for w in (gate, up, down)]
    dq = [dequantize(p, fmt, w.shape[-1]) for p, w in zip(q, (gate, up, down), strict=True)]
    out = run("MoE", [x, router, *q], top_k=2, **fmt.attrs())
    np.testing.assert_allclose(out, run("MoE", [x, router, *dq], top_k=2), rtol=1e-5, atol=1e-5)
