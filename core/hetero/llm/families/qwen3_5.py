"""Qwen3.5 (dense and MoE) and Qwen3-Next: hybrid decoders of Gated DeltaNet linear attention and gated full
attention, as transformers defines them (``qwen3_5_text``, ``qwen3_5_moe_text``, ``qwen3_next``).

* ``layer_types`` (or every ``full_attention_interval``-th layer) picks the token mixer of each layer.
* Every RMSNorm of the residual stream, and q/k norms, scale by (1 + weight) (``norm_offset`` 1).
* Full attention: q_proj yields, per head, [query, gate]; the attention output is multiplied by sigmoid(gate);
  partial rotary (``partial_rotary_factor``); q/k norm.
* Linear attention (``GatedDeltaRule``, which owns the conv and recurrent state): projections q | k | v (conv'd),
  z (output gate), b (β = sigmoid(b)), a (g = -exp(A_log) softplus(a + dt_bias)); Qwen3.5 stores them as
  ``in_proj_qkv`` / ``in_proj_z`` / ``in_proj_b`` / ``in_proj_a``, Qwen3-Next as ``in_proj_qkvz`` / ``in_proj_ba``
  interleaved per key head ([q, k, v..., z...] and [b..., a...] per group), whose rows are regrouped here.
  Output: rmsnorm(o) * norm.weight * silu(z) per value head, then out_proj.
* MoE layers: routed top-k experts plus a shared expert scaled by sigmoid(x @ shared_expert_gate^T). The shared
  expert is built from QMatMul / SwiGLU / Sigmoid / Mul (every backend runs those); the MoE op's optional
  shared-expert inputs (``hetero.ops.llm``) are the fused form for backends that implement them.
"""

from __future__ import annotations

import numpy as np

from ...contract.errors import ModelFormatError
from ...contract.graph import Graph
from ..config import LlmConfig
from ..weights import Weight, WeightSource
from .decoder import PAST_LEN, Naming, _Builder, _mlp, _moe, build_decoder

NAMING = Naming()
# Qwen3_5ForConditionalGeneration checkpoints keep the text model under model.language_model.
NAMING_MULTIMODAL = Naming(embed="model.language_model.embed_tokens.weight",
                           final_norm="model.language_model.norm.weight", layer="model.language_model.layers.{i}.")


def build(cfg: LlmConfig, weights: WeightSource, **options) -> Graph:
    if not cfg.layer_types or len(cfg.layer_types) != cfg.num_layers:
        raise ModelFormatError(f"the {cfg.family} builder needs a layer pattern (config.json key 'layer_types')")
    naming = NAMING_MULTIMODAL if not weights.has(NAMING.embed) and weights.has(NAMING_MULTIMODAL.embed) \
        else NAMING
    return build_decoder(cfg, weights, naming, layer=_layer, **options)


def _rows(weight: Weight, rows: np.ndarray) -> Weight:
    """Some rows of a ``[N, ...]`` weight (float or block-quantized: rows are independent)."""
    return Weight(np.ascontiguousarray(np.take(weight.array, rows, axis=0)), dict(weight.attrs))


def _norm(b: _Builder, cfg: LlmConfig, w: WeightSource, name: str, x: str, n: int, node: str) -> str:
    weight = b.const(name, w.vector(name, n))
    return b.node("RMSNorm", [x, weight], node, {"epsilon": cfg.rms_norm_eps, "offset": cfg.norm_offset})


def _layer(b: _Builder, cfg: LlmConfig, w: WeightSource, nm: Naming, i: int, h: str, shapes: dict[int, str],
           context: int) -> str:
    p = nm.layer.format(i=i)
    x = _norm(b, cfg, w, p + nm.input_norm, h, cfg.hidden_size, f"{p}input_norm")
    mixer = _linear_attention(b, cfg, w, p, x, context) if cfg.is_linear_layer(i) \
        else _gated_attention(b, cfg, w, nm, p, x, shapes, context)
    h = b.node("Add", [h, mixer], f"{p}attn_residual", domain="")
    x = _norm(b, cfg, w, p + nm.post_norm, h, cfg.hidden_size, f"{p}post_norm")
    if cfg.is_moe_layer(i):
        mlp = _moe(b, cfg, w, nm, p, x)
        if cfg.shared_expert_intermediate_size:
            shared = _shared_expert(b, cfg, w, p, x)
            mlp = b.node("Add", [mlp, shared], f"{p}moe_plus_shared", domain="")
    else:
        mlp = _mlp(b, cfg, w, nm, p, x)
    return b.node("Add", [h, mlp], f"{p}mlp_residual", domain="")


def _gated_attention(b: _Builder, cfg: LlmConfig, w: WeightSource, nm: Naming, p: str, x: str,
                     shapes: dict[int, str], context: int) -> str:
    hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    qname = p + nm.attn.format(p="q", kind="weight")
    both = w.linear(qname, hq * d * 2, cfg.hidden_size)
    # per head: d query rows, then d gate rows
    heads = np.arange(hq)[:, None] * 2 * d
    query_rows, gate_rows = (heads + np.arange(d)).reshape(-1), (heads + d + np.arange(d)).reshape(-1)
    qbias = gbias = ""
    if cfg.qkv_bias:
        bname = p + nm.attn.format(p="q", kind="bias")
        full = w.vector(bname, hq * d * 2)
        qbias = b.const(bname + "#query", np.ascontiguousarray(full[query_rows]))
        gbias = b.const(bname + "#gate", np.ascontiguousarray(full[gate_rows]))
    q = b.linear(x, _rows(both, query_rows), qname + "#query", f"{p}q_proj", qbias)
    gate = b.linear(x, _rows(both, gate_rows), qname + "#gate", f"{p}gate_proj_attn", gbias)
    proj = {"q": b.node("Reshape", [q, shapes[hq]], f"{p}q_heads", domain="")}
    for name in ("k", "v"):
        wname = p + nm.attn.format(p=name, kind="weight")
        bias = ""
        if cfg.qkv_bias:
            bname = p + nm.attn.format(p=name, kind="bias")
            bias = b.const(bname, w.vector(bname, hkv * d))
        flat = b.linear(x, w.linear(wname, hkv * d, cfg.hidden_size), wname, f"{p}{name}_proj", bias)
        proj[name] = b.node("Reshape", [flat, shapes[hkv]], f"{p}{name}_heads", domain="")
    for name, key in (("q", nm.q_norm), ("k", nm.k_norm)):
        proj[name] = _norm(b, cfg, w, p + key, proj[name], d, f"{p}{name}_norm")
    rope = cfg.rope.attrs()
    qr = b.node("RotaryEmbedding", [proj["q"], PAST_LEN], f"{p}q_rope", rope)
    kr = b.node("RotaryEmbedding", [proj["k"], PAST_LEN], f"{p}k_rope", rope)
    attn = b.node("Attention", [qr, kr, proj["v"], PAST_LEN], f"{p}attention", {"max_context": context})
    sig = b.node("Sigmoid", [gate], f"{p}attn_gate", domain="")
    gated = b.node("Mul", [attn, sig], f"{p}attn_gated", domain="")
    oname = p + nm.attn.format(p="o", kind="weight")
    obias = ""
    if cfg.o_bias:
        bname = p + nm.attn.format(p="o", kind="bias")
        obias = b.const(bname, w.vector(bname, cfg.hidden_size))
    return b.linear(gated, w.linear(oname, cfg.hidden_size, hq * d), oname, f"{p}o_proj", obias)


def _linear_attention(b: _Builder, cfg: LlmConfig, w: WeightSource, p: str, x: str, context: int) -> str:
    hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    key_dim, value_dim = hk * dk, hv * dv
    channels = 2 * key_dim + value_dim
    la = p + "linear_attn."
    hidden = cfg.hidden_size
    if cfg.family == "qwen3_next":  # fused in_proj_qkvz / in_proj_ba: regroup the per-key-head interleaved rows
        r = hv // hk
        group = 2 * dk + 2 * r * dv
        base = np.arange(hk)[:, None] * group
        q_rows = (base + np.arange(dk)).reshape(-1)
        k_rows = (base + dk + np.arange(dk)).reshape(-1)
        v_rows = (base + 2 * dk + np.arange(r * dv)).reshape(-1)
        z_rows = (base + 2 * dk + r * dv + np.arange(r * dv)).reshape(-1)
        qkvz = w.linear(la + "in_proj_qkvz.weight", channels + value_dim, hidden)
        qkv_w = _rows(qkvz, np.concatenate([q_rows, k_rows, v_rows]))
        z_w = _rows(qkvz, z_rows)
        ba = w.linear(la + "in_proj_ba.weight", 2 * hv, hidden)
        gbase = np.arange(hk)[:, None] * 2 * r
        b_w = _rows(ba, (gbase + np.arange(r)).reshape(-1))
        a_w = _rows(ba, (gbase + r + np.arange(r)).reshape(-1))
        names = {k: la + f"in_proj_qkvz.weight#{k}" for k in ("qkv", "z")}
        names.update({k: la + f"in_proj_ba.weight#{k}" for k in ("b", "a")})
    else:
        qkv_w = w.linear(la + "in_proj_qkv.weight", channels, hidden)
        z_w = w.linear(la + "in_proj_z.weight", value_dim, hidden)
        b_w = w.linear(la + "in_proj_b.weight", hv, hidden)
        a_w = w.linear(la + "in_proj_a.weight", hv, hidden)
        names = {k: la + f"in_proj_{k}.weight" for k in ("qkv", "z", "b", "a")}
    qkv = b.linear(x, qkv_w, names["qkv"], f"{p}qkv_proj")
    z = b.linear(x, z_w, names["z"], f"{p}z_proj")
    beta = b.linear(x, b_w, names["b"], f"{p}b_proj")
    a = b.linear(x, a_w, names["a"], f"{p}a_proj")
    kernel = cfg.linear_conv_kernel_dim
    conv = w.matrix(la + "conv1d.weight", (channels, 1, kernel)).reshape(channels, kernel)
    inputs = [qkv, b.const(la + "conv1d.weight", np.ascontiguousarray(conv, dtype=np.float32)), a, beta, PAST_LEN, "",
              b.const(la + "A_log", w.vector(la + "A_log", hv)), b.const(la + "dt_bias", w.vector(la + "dt_bias", hv)),
              z, b.const(la + "norm.weight", w.vector(la + "norm.weight", dv))]
    attrs = {"k_heads": hk, "v_heads": hv, "k_dim": dk, "v_dim": dv, "conv_activation": "silu", "qk_l2norm": 1,
             "norm_eps": cfg.rms_norm_eps, "max_context": context}
    o = b.node("GatedDeltaRule", inputs, f"{p}gated_delta", attrs)
    oname = la + "out_proj.weight"
    return b.linear(o, w.linear(oname, hidden, value_dim), oname, f"{p}out_proj")


def _shared_expert(b: _Builder, cfg: LlmConfig, w: WeightSource, p: str, x: str) -> str:
    inter, hidden = cfg.shared_expert_intermediate_size, cfg.hidden_size
    names = {k: p + f"mlp.shared_expert.{k}_proj.weight" for k in ("gate", "up", "down")}
    gate = b.linear(x, w.linear(names["gate"], inter, hidden), names["gate"], f"{p}shared_gate_proj")
    up = b.linear(x, w.linear(names["up"], inter, hidden), names["up"], f"{p}shared_up_proj")
    act = b.node("SwiGLU", [gate, up], f"{p}shared_swiglu")
    down = b.linear(act, w.linear(names["down"], hidden, inter), names["down"], f"{p}shared_down_proj")
    gname = p + "mlp.shared_expert_gate.weight"
    score = b.node("QMatMul", [x, b.const(gname, w.matrix(gname, (1, hidden)))], f"{p}shared_score",
                   {"wtype": "f32"})
    sig = b.node("Sigmoid", [score], f"{p}shared_sigmoid", domain="")
    return b.node("Mul", [down, sig], f"{p}shared_scaled", domain="")
