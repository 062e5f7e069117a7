"""GatedDeltaRule: the chunked and recurrent forms against ONNX opset 27's CausalConvWithState + LinearAttention
(update_rule gated_delta) references, and rollback through the snapshots."""

from __future__ import annotations

import numpy as np
import pytest

from hetero.contract import HeteroError, ShapeError, registry
from hetero.contract.graph import HETERO_DOMAIN, Node
from hetero.contract.registry import OpContext
from hetero.runtime.infer import info_of

rng = np.random.default_rng(11)

HK, HV, DK, DV, K = 2, 4, 8, 6, 4
C = 2 * HK * DK + HV * DV
ATTRS = dict(k_heads=HK, v_heads=HV, k_dim=DK, v_dim=DV)


def run(inputs: list, state: dict | None = None, **attrs) -> np.ndarray:
    schema = registry.get(HETERO_DOMAIN, "GatedDeltaRule")
    node = Node("GatedDeltaRule", [f"i{k}" if v is not None else "" for k, v in enumerate(inputs)], ["y"],
                {**ATTRS, **attrs}, domain=HETERO_DOMAIN)
    infos = [None if v is None else info_of(v) for v in inputs]
    (info,) = schema.infer(OpContext(node, infos, list(inputs), 1))
    (out,) = schema.reference(OpContext(node, infos, list(inputs), 1, None, state))
    assert out.shape == info.shape and out.dtype == info.dtype.np_dtype
    return out


def onnx_ref(op: str, inputs: list, **attrs) -> list[np.ndarray]:
    schema = registry.get("", op)
    node = Node(op, [f"i{k}" if v is not None else "" for k, v in enumerate(inputs)], ["y", "s"], attrs)
    infos = [None if v is None else info_of(v) for v in inputs]
    return schema.reference(OpContext(node, infos, list(inputs), 27))


def make(t: int, seed: int = 0) -> dict[str, np.ndarray]:
    r = np.random.default_rng(seed)
    return dict(
        qkv=r.standard_normal((t, C)).astype(np.float32),
        w=(0.5 * r.standard_normal((C, K))).astype(np.float32),
        a=r.standard_normal((t, HV)).astype(np.float32),
        b=r.standard_normal((t, HV)).astype(np.float32),
        a_log=np.log(r.uniform(1, 8, HV)).astype(np.float32),
        dt_bias=r.standard_normal(HV).astype(np.float32),
        z=r.standard_normal((t, HV * DV)).astype(np.float32),
        nw=(1 + 0.1 * r.standard_normal(DV)).astype(np.float32),
    )


def inputs(d: dict, past: int, lo: int = 0, hi: int | None = None, gating: bool = True, norm: bool = True) -> list:
    s = slice(lo, hi)
    return [d["qkv"][s], d["w"], d["a"][s], d["b"][s], np.array(past, dtype=np.int64), None,
            d["a_log"] if gating else None, d["dt_bias"] if gating else None,
            d["z"][s] if norm else None, d["nw"] if norm else None]


def oracle(d: dict, t: int) -> np.ndarray:
    """CausalConvWithState (silu) -> l2norm q, k -> repeat to the value heads -> LinearAttention(gated_delta)."""
    x = d["qkv"][:t].T[None].astype(np.float32)  # (1, C, T)
    (y, _) = onnx_ref("CausalConvWithState", [x, d["w"][:, None, :]], activation="silu")
    y = y[0].T.astype(np.float64)
    q = y[:, :HK * DK].reshape(t, HK, DK)
    k = y[:, HK * DK:2 * HK * DK].reshape(t, HK, DK)
    v = y[:, 2 * HK * DK:]
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6)
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    q, k = (np.repeat(a, HV // HK, axis=1).reshape(1, t, HV * DK) for a in (q, k))
    g = -np.exp(d["a_log"].astype(np.float64)) * np.logaddexp(0, d["a"][:t] + d["dt_bias"].astype(np.float64))
    beta = 1 / (1 + np.exp(-d["b"][:t].astype(np.float64)))
    out, _ = onnx_ref("LinearAttention", [q, k, v[None], None, g[None], beta[None]], q_num_heads=HV,
                      kv_num_heads=HV, update_rule="gated_delta")
    return out[0]


@pytest.mark.parametrize("mode", ["recurrent", "chunked"])
@pytest.mark.parametrize("t", [1, 5, 64, 150])
def test_matches_onnx_ops(mode, t):
    d = make(t)
    got = run(inputs(d, 0, norm=False), {}, mode=mode)
    np.testing.assert_allclose(got, oracle(d, t), rtol=1e-5, atol=1e-5)


def test_chunked_equals_recurrent_across_calls():
    d = make(200, seed=3)
    outs = {}
    for mode in ("chunked", "recurrent", "auto"):
        state: dict = {}
        parts, pos = [], 0
        for n in (37, 64, 70, 1, 1, 27):  # calls crossing chunk boundaries at odd offsets
            parts.append(run(inputs(d, pos, pos, pos + n), state, mode=mode, chunk_size=16 if mode == "auto" else 64))
            pos += n
        outs[mode] = np.concatenate(parts)
    np.testing.assert_allclose(outs["chunked"], outs["recurrent"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs["auto"], outs["recurrent"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("interval", [0, 32])
def test_rollback_equals_fresh_run(interval):
    d = make(160, seed=5)
    attrs = dict(snapshot_interval=interval, max_snapshots=3)
    state: dict = {}
    run(inputs(d, 0, 0, 100), state, **attrs)
    for _ in range(20):  # decode past the prompt
        pos = state["delta"].pos
        run(inputs(d, pos, pos, pos + 1), state, **attrs)
    # roll back into the middle of the first call, continue with other tokens
    e = make(160, seed=9)
    mixed = {k: (np.concatenate([d[k][:73], e[k][73:]]) if d[k].shape[0] == 160 else d[k]) for k in d}
    got = run(inputs(mixed, 73, 73, 130), state, **attrs)
    fresh = run(inputs(mixed, 0, 0, 130), {}, **attrs)[73:]
    np.testing.assert_allclose(got, fresh, rtol=1e-5, atol=1e-6)


def test_errors():
    d = make(4)
    with pytest.raises(HeteroError):
        run(inputs(d, 3), {})  # past_len beyond what was consumed
    with pytest.raises(ShapeError):
        run(inputs(d, 0), {}, v_heads=3)
    with pytest.raises(ShapeError):
        run([d["qkv"][:, :-1], *inputs(d, 0)[1:]], {})


def test_moe_shared_expert():
    """MoE's optional shared-expert inputs: routed experts plus sigmoid(x @ g^T) * SwiGLU shared expert."""
    r = np.random.default_rng(2)
    t, h, e, inter, s_inter = 5, 16, 4, 8, 12
    f = (lambda *s: r.standard_normal(s).astype(np.float32))  # noqa: E731
    x, router = f(t, h), f(e, h)
    gate, up, down = f(e, inter, h), f(e, inter, h), f(e, h, inter)
    sg, su, sd, score = f(s_inter, h), f(s_inter, h), f(h, s_inter), f(1, h)
    schema = registry.get(HETERO_DOMAIN, "MoE")

    def moe(inputs):
        node = Node("MoE", [f"i{k}" for k in range(len(inputs))], ["y"], {"top_k": 2}, domain=HETERO_DOMAIN)
        infos = [info_of(v) for v in inputs]
        schema.infer(OpContext(node, infos, inputs, 1))
        return schema.reference(OpContext(node, infos, inputs, 1))[0]

    routed = moe([x, router, gate, up, down])
    silu = (lambda v: v / (1 + np.exp(-v)))  # noqa: E731
    shared = (silu(x @ sg.T) * (x @ su.T)) @ sd.T
    sig = 1 / (1 + np.exp(-(x @ score.T)))
    np.testing.assert_allclose(moe([x, router, gate, up, down, sg, su, sd, score]), routed + sig * shared,
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(moe([x, router, gate, up, down, sg, su, sd]), routed + shared, rtol=1e-4, atol=1e-4)
    with pytest.raises(ShapeError):
        moe([x, router, gate, up, down, sg, su])
