"""The LLM decoder ops (domain ``hetero``) on Metal: RMSNorm, QMatMul (the fused dequantising matrix-vector kernel
for decode, the simdgroup_matrix GEMM for prefill), Embedding, RotaryEmbedding and Attention over
a half-precision KV cache owned by the node, and MoE's routed experts (msl/quant.metal, msl/attention.metal,
msl/norm.metal)."""

from __future__ import annotations

import math

import numpy as np

from hetero.contract import SUPPORTED, HeteroError, NodeInfo, Support, quant, unsupported
from hetero.contract.opforms import cache_range_error, one_sequence, rope_inv_freq

from ..memory import device_array
from ..plan import ArgumentBuffer, dispatch, groups_for
from .common import MetalKernel, float32_only, placeholder
from .nn import matmul_dispatch, row_threads

MATVEC_MAX_ROWS = 8  # rows of x the matrix-vector kernel takes (msl/quant.metal MATVEC_MAX_ROWS)
MATVEC_ROWS_PER_GROUP = 4  # simdgroups per threadgroup, one output row each
ATTN_MAX_DIM = 256
_FLOAT_WTYPES = {"f32": (0, 4), "f16": (1, 2), "bf16": (2, 2)}


def weight_params(attrs: dict, k: int) -> dict[str, int]:
    """The WeightParams fields (msl/quant.metal) that describe a weight's format and row length."""
    wtype = str(attrs.get("wtype", "f32"))
    if wtype in _FLOAT_WTYPES:
        code, size = _FLOAT_WTYPES[wtype]
        return {"k": k, "row_bytes": size * k, "wtype": code, "bits": 0, "symmetric": 1, "block_size": 1,
                "block_bytes": size, "header_bytes": 0}
    fmt = quant.format_from_attrs(wtype, int(attrs.get("block_size", 32)), int(attrs.get("symmetric", 1)))
    if fmt is None:
        raise HeteroError(f"weight type {wtype!r}")
    return {"k": k, "row_bytes": fmt.row_bytes(k), "wtype": 3, "bits": fmt.bits, "symmetric": int(fmt.symmetric),
            "block_size": fmt.block_size, "block_bytes": fmt.block_bytes, "header_bytes": fmt.header_bytes}


def _known_wtype(node: NodeInfo) -> Support:
    wtype = str(node.attr("wtype", "f32"))
    if wtype in _FLOAT_WTYPES:
        return SUPPORTED
    try:
        if quant.format_from_attrs(wtype, int(node.attr("block_size", 32)), int(node.attr("symmetric", 1))):
            return SUPPORTED
    except HeteroError:
        pass
    return unsupported(f"metal has no kernel for weight type {wtype!r}")


def _bytes(w: np.ndarray) -> np.ndarray:
    return w.reshape(-1).view(np.uint8)


class MetalQMatMul(MetalKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        if len(node.outputs) > 1:
            return unsupported("QMatMul with its rows' argmax (a second output)")
        verdict = _known_wtype(node)
        return float32_only(node, [0]) if verdict else verdict

    def plan(self, inputs, outputs):
        return linear_steps(self.backend, inputs[0], inputs[1], inputs[2] if len(inputs) > 2 else None, outputs[0],
                            self.node.attrs)


def linear_steps(backend, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, y: np.ndarray,
                 attrs: dict) -> list:
    """y = x W^T (+ bias) for W [N, K] in the format ``attrs`` names: the matrix-vector kernel for up to
    MATVEC_MAX_ROWS rows of x, else the GEMM (quantised and bf16 weights dequantised first, to a scratch)."""
    k = x.shape[-1]
    n = w.shape[0]
    m = x.size // k if k else 0
    if m == 0 or n == 0:
        return []
    p = {**weight_params(attrs, k), "m": m, "n": n, "has_bias": int(bias is not None)}
    if m <= MATVEC_MAX_ROWS:
        return [dispatch("qmatvec", {"x": x, "w": _bytes(w), "bias": placeholder() if bias is None else bias,
                                     "y": y, "p": p},
                         (groups_for(n, MATVEC_ROWS_PER_GROUP),), (32 * MATVEC_ROWS_PER_GROUP,))]
    # y = x W^T: B element (k, n) is W[n, k]
    wtype, steps = str(attrs.get("wtype", "f32")), []
    if wtype in ("f32", "f16"):
        dense, kernel = w, "matmul_f32" if wtype == "f32" else "matmul_f32_f16"
    else:
        dense, kernel = backend.scratch("dequant", n * k, np.float32), "matmul_f32"
        steps.append(dispatch("dequant_f32", {"w": _bytes(w), "out": dense, "p": p}, (groups_for(k, 32), n),
                              (32, 1)))
    steps.append(matmul_dispatch(x, dense, y, m, n, k, (k, 1, 1, k), np.zeros((1, 3), np.uint32), kernel=kernel,
                                 bias=bias, bias_strides=(0, 1)))
    return steps


class MetalEmbedding(MetalKernel):
    """Token ids are checked on the host and copied, as int64, into a buffer of the kernel's own (its argument
    buffer: a bound plan reads the ids from there at every step)."""

    host_inputs = (0,)

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        return _known_wtype(node)

    def __init__(self, node: NodeInfo, backend) -> None:
        super().__init__(node, backend)
        self.ids = np.zeros(0, np.int64)

    def update(self, inputs) -> bool:
        ids, vocab = inputs[0], inputs[1].shape[0]
        if ids.size and (ids.min() < 0 or ids.max() >= vocab):
            bad = int(ids[(ids < 0) | (ids >= vocab)].reshape(-1)[0])
            raise HeteroError(f"{self.node.label()}: token id {bad} is outside the vocabulary [0, {vocab})")
        resized = self.ids.size != ids.size
        if resized:
            self.ids = np.empty(ids.size, np.int64)
        np.copyto(self.ids, ids.reshape(-1), casting="unsafe")
        return not resized

    def plan(self, inputs, outputs):
        self.update(inputs)
        ids, table, y = inputs[0], inputs[1], outputs[0]
        dim = y.shape[-1]
        if ids.size == 0:
            return []
        p = {**weight_params(self.node.attrs, dim), "m": ids.size, "n": table.shape[0], "has_bias": 0}
        return [dispatch("embedding", {"ids": self.ids, "table": _bytes(table), "out": y, "p": p},
                         (groups_for(dim, 32), ids.size), (32, 1))]


class MetalRMSNorm(MetalKernel):
    accepts = staticmethod(float32_only)

    def plan(self, inputs, outputs):
        x, w, y = inputs[0], inputs[1], outputs[0]
        d = x.shape[-1]
        rows = x.size // d if d else 0
        if rows == 0:
            return []
        return [dispatch("rmsnorm_f32", {"x": x, "weight": w, "y": y, "p": {
            "n": d, "epsilon": float(self.attr("epsilon", 1e-6)), "offset": float(self.attr("offset", 0.0)),
            "has_bias": 0, "save_stats": 0}}, (rows,), (row_threads(d),))]


def _past_len(value: np.ndarray | None) -> int:
    if value is None:
        raise HeteroError("past_len is missing")
    return int(np.asarray(value).reshape(-1)[0])


class MetalRotary(MetalKernel):
    """The cos/sin table is computed on the host in float64 (as the reference does) and grows by doubling; the
    position (past_len) is in the kernel's argument buffer, rewritten at every step."""

    accepts = staticmethod(lambda node: one_sequence(node) and float32_only(node, [0]))
    host_inputs = (1,)

    def __init__(self, node: NodeInfo, backend) -> None:
        super().__init__(node, backend)
        self.table: np.ndarray | None = None
        self.key = (0, 0)
        self.args = ArgumentBuffer("rope", "p")

    def _table(self, needed: int, rot: int) -> np.ndarray:
        if self.table is None or needed > self.key[0] or rot != self.key[1]:
            cap = max(256, 1 << max(needed - 1, 1).bit_length())
            inv_freq, scale = rope_inv_freq(rot, self.node.attrs)
            angles = np.arange(cap, dtype=np.float64)[:, None] * inv_freq[None, :]
            self.table = device_array((cap, 2, rot // 2), np.float32)
            self.table[:] = np.stack([np.cos(angles) * scale, np.sin(angles) * scale], axis=1)
            self.key = (cap, rot)
        return self.table

    def _rotary_dim(self, d: int) -> int:
        rot = int(self.attr("rotary_dim", 0)) or d
        if rot % 2 or rot > d:
            raise HeteroError(f"{self.node.label()}: rotary_dim {rot} must be even and at most head_dim {d}")
        return rot

    def update(self, inputs) -> bool:
        t, h, d = inputs[0].shape
        past = _past_len(inputs[1])
        self.args.write({"t": t, "heads": h, "dim": d, "rotary_dim": self._rotary_dim(d), "past_len": past})
        return past + t <= self.key[0]  # else the table must grow: a new plan binds the new one

    def plan(self, inputs, outputs):
        x, y = inputs[0], outputs[0]
        t, h, d = x.shape
        self.update(inputs)
        if x.size == 0:
            return []
        table = self._table(_past_len(inputs[1]) + t, self._rotary_dim(d))
        return [dispatch("rope", {"x": x, "y": y, "table": table, "p": self.args}, (groups_for(d, 32), h, t),
                         (32, 1, 1))]


class MetalAttention(MetalKernel):
    """Causal GQA over this node's KV cache: two half arrays [Hkv, max_context, D] allocated at the first run. The
    step's past_len is checked on the host and written to the kernels' argument buffer (shared by kv_append and
    attention_f16kv, one AttentionParams)."""

    host_inputs = (3,)

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        verdict = one_sequence(node) and float32_only(node, [0, 1, 2])
        if verdict and str(node.attr("kv_dtype", "f16")) != "f16":
            return unsupported(f"Attention with kv_dtype {node.attr('kv_dtype')!r} (metal keeps a half KV cache)")
        q = node.inputs[0]
        if verdict and q is not None and q.shape is not None and isinstance(q.shape[-1], int) \
                and q.shape[-1] > ATTN_MAX_DIM:
            return unsupported(f"head_dim {q.shape[-1]} above {ATTN_MAX_DIM}")
        return verdict

    def __init__(self, node: NodeInfo, backend) -> None:
        super().__init__(node, backend)
        self.max_context = int(self.attr("max_context"))
        self.cache: tuple[np.ndarray, np.ndarray] | None = None
        self.filled = 0
        self.args = ArgumentBuffer("attention_f16kv", "p")

    def update(self, inputs) -> bool:
        q, k = inputs[0], inputs[1]
        t, hq, d = q.shape
        hkv = k.shape[1]
        past = _past_len(inputs[3])
        error = cache_range_error(self.node.label(), past, t, self.filled, self.max_context)
        if error is not None:
            raise error
        self.filled = past + t
        self.args.write({"t": t, "q_heads": hq, "kv_heads": hkv, "dim": d, "past_len": past,
                         "context": self.max_context, "scale": float(self.attr("scale", 0.0)) or 1.0 / math.sqrt(d)})
        if self.cache is None or self.cache[0].shape != (hkv, self.max_context, d):
            self.cache = (device_array((hkv, self.max_context, d), np.float16),
                          device_array((hkv, self.max_context, d), np.float16))
            return False
        return True

    def plan(self, inputs, outputs):
        q, k, v, y = inputs[0], inputs[1], inputs[2], outputs[0]
        t, hq, d = q.shape
        hkv = k.shape[1]
        self.update(inputs)
        if t == 0:
            return []
        assert self.cache is not None  # update() allocated it
        k_cache, v_cache = self.cache
        return [
            dispatch("kv_append", {"k": k, "v": v, "k_cache": k_cache, "v_cache": v_cache, "p": self.args},
                     (groups_for(d, 32), hkv, t), (32, 1, 1)),
            dispatch("attention_f16kv", {"q": q, "k_cache": k_cache, "v_cache": v_cache, "out": y, "p": self.args},
                     (hq, t), (128,)),
        ]


MOE_TENSORS = ("gate", "up", "down")


class MetalMoE(MetalKernel):
    """The routed experts on the device: the router's logits (QMatMul's kernels), ``moe_route`` (softmax, top-k),
    ``moe_gate_up`` / ``moe_down`` over each chosen (token, expert) pair and ``moe_combine``; no host round trip for
    the choice. Nodes with a shared expert (inputs 5-8) or per-tensor weight types go to another backend."""

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        if any(i < len(node.inputs) and node.inputs[i] is not None for i in range(5, 9)):
            return unsupported("MoE with a shared expert (inputs 5-8; the metal kernel routes experts only)")
        for name in MOE_TENSORS:
            for attr in ("wtype", "block_size", "symmetric"):
                own = node.attr(f"{name}_{attr}")
                if own is not None and own != node.attr(attr, {"wtype": "f32", "block_size": 32}.get(attr, 1)):
                    return unsupported(f"MoE with its own {name}_{attr} {own!r} (metal reads one weight format)")
        verdict = _known_wtype(node)
        return float32_only(node, [0, 1]) if verdict else verdict

    def plan(self, inputs, outputs):
        x, router, gate, up, down = inputs[:5]
        y = outputs[0]
        assert x is not None and router is not None and gate is not None and up is not None and down is not None
        tokens, hidden = x.shape
        experts, inter = gate.shape[0], gate.shape[1]
        top_k = int(self.attr("top_k"))
        if tokens == 0:
            return []
        be = self.backend
        pairs = tokens * top_k
        logits = be.scratch("moe_logits", tokens * experts, np.float32).reshape(tokens, experts)
        chosen = be.scratch("moe_chosen", pairs, np.uint32)
        weights = be.scratch("moe_weights", pairs, np.float32)
        h = be.scratch("moe_h", pairs * inter, np.float32)
        part = be.scratch("moe_part", pairs * hidden, np.float32)
        p = {"tokens": tokens, "experts": experts, "top_k": top_k, "normalize": int(self.attr("norm_topk_prob", 1)),
             "hidden": hidden, "inter": inter}
        rows = MATVEC_ROWS_PER_GROUP
        return [
            *linear_steps(be, x, router, None, logits, {"wtype": "f32"}),
            dispatch("moe_route", {"logits": logits, "chosen": chosen, "weights": weights, "p": p},
                     (groups_for(tokens, 32),), (32,)),
            dispatch("moe_gate_up", {"x": x, "chosen": chosen, "gate": _bytes(gate), "up": _bytes(up), "h": h,
                                     "w": {**weight_params(self.node.attrs, hidden), "m": 1, "n": inter,
                                           "has_bias": 0}, "p": p},
                     (groups_for(inter, rows), pairs), (32 * rows, 1)),
            dispatch("moe_down", {"h": h, "chosen": chosen, "down": _bytes(down), "part": part,
                                  "w": {**weight_params(self.node.attrs, inter), "m": 1, "n": hidden, "has_bias": 0},
                                  "p": p},
                     (groups_for(hidden, rows), pairs), (32 * rows, 1)),
            dispatch("moe_combine", {"part": part, "weights": weights, "y": y, "p": p},
                     (groups_for(hidden, 32), tokens), (32, 1)),
        ]


KERNELS = {
    ("hetero", "QMatMul"): MetalQMatMul,
    ("hetero", "Embedding"): MetalEmbedding,
    ("hetero", "RMSNorm"): MetalRMSNorm,
    ("hetero", "RotaryEmbedding"): MetalRotary,
    ("hetero", "Attention"): MetalAttention,
    ("hetero", "MoE"): MetalMoE,
}
