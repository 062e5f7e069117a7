"""The Qwen decoder on the HTP the way Qualcomm's own runtimes run LLMs there: static-shape ONNX graphs of a chunk of
T tokens (T = N for prefill, 1 for decode) with the KV cache as graph inputs and the chunk's new keys and values as
graph outputs; the host keeps the cache and writes the new entries at their positions.

One graph, ``T`` tokens against a cache of ``C`` positions:

    inputs   ids int64[T], cos / sin float32[T, head_dim] (rotate-half tables of the chunk's positions),
             mask float32[T, C + T] (0 where a query may look, -1e4 elsewhere: cache slots past the length, later
             tokens of the chunk, padding), past_k_<l> / past_v_<l> float32[kv_heads, C, head_dim] per layer
    outputs  logits float32[T, vocab], k_<l> / v_<l> float32[kv_heads, T, head_dim]

Standard ONNX ops only (Gather, MatMul, ReduceMean, Sqrt, Reciprocal, Slice, Concat, Softmax, Sigmoid...), all in
the HTP table, so QNN compiles the whole step; fp16 on the HTP, and with quantized weights (``llm_quant``) every
linear layer a QDQ MatMul (uint16 activations, int8 / int4 block weights). Qwen2 / Qwen3-shaped dense models (q/k
norms when the weights have them, q/k/v biases when they have them), plain RoPE.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hetero.contract import UnsupportedOp

from .llm_quant import activation_scale, block_weight, embedding_table, int4_tensor

MASKED = -1e4  # large enough to vanish in softmax, small enough for fp16
DENSE_TYPES = ("qwen2", "qwen3")


@dataclass(frozen=True)
class DecoderShape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    vocab: int
    eps: float
    rope_theta: float

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> DecoderShape:
        """The shape of a dense Qwen2 / Qwen3 config.json with plain RoPE; anything else is an UnsupportedOp."""
        if cfg.get("model_type") not in DENSE_TYPES:
            raise UnsupportedOp(f"config.json model_type {cfg.get('model_type')!r}: the HTP decoder graphs cover "
                                f"the dense {DENSE_TYPES} only")
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind != "default":
            raise UnsupportedOp(f"config.json rope_type {kind!r}: the HTP decoder graphs' tables are plain RoPE "
                                "only (no yarn / linear / dynamic scaling)")
        if float(cfg.get("partial_rotary_factor", 1.0)) != 1.0 or cfg.get("num_experts"):
            raise UnsupportedOp("config.json partial_rotary_factor / num_experts: the HTP decoder graphs rotate "
                                "whole heads of dense models only")
        heads = int(cfg["num_attention_heads"])
        return cls(hidden=int(cfg["hidden_size"]), heads=heads, kv_heads=int(cfg.get("num_key_value_heads", heads)),
                   head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
                   layers=int(cfg["num_hidden_layers"]), vocab=int(cfg["vocab_size"]),
                   eps=float(cfg.get("rms_norm_eps", 1e-6)),
                   rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))))


class _Builder:
    """Collects the nodes and initializers of one graph. ``mode`` fp16 writes float linear layers and records each
    one's input and output value (``probes``, what calibration measures); q8 / q4 write them as QDQ MatMuls with
    the calibrated magnitudes ``ranges``."""

    def __init__(self, mode: str = "fp16", ranges: dict[str, float] | None = None) -> None:
        self.nodes: list[Any] = []
        self.weights: dict[str, np.ndarray] = {}
        self.packed: list[Any] = []  # int4 initializers (TensorProto: numpy has no int4)
        self.count = 0
        self.mode, self.ranges = mode, ranges or {}
        self.probes: dict[str, str] = {}  # "<layer>.in" / "<layer>.out" -> value name
        self._qdq: dict[str, str] = {}  # value -> its uint16 quantize-dequantize

    def op(self, op_type: str, inputs: list[str], **attrs: Any) -> str:
        from onnx import helper

        self.count += 1
        out = f"{op_type.lower()}_{self.count}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def const(self, name: str, value: np.ndarray) -> str:
        self.weights[name] = np.ascontiguousarray(value)
        return name

    def ints(self, *values: int) -> str:
        return self.const(f"i64_{'_'.join(map(str, values)).replace('-', 'm')}", np.array(values, np.int64))

    def rms_norm(self, x: str, weight: str, eps: float) -> str:
        mean = self.op("ReduceMean", [self.op("Mul", [x, x]), self.ints(-1)], keepdims=1)
        eps_const = self.const(f"eps_{eps}", np.float32(eps))
        scale = self.op("Reciprocal", [self.op("Sqrt", [self.op("Add", [mean, eps_const])])])
        return self.op("Mul", [self.op("Mul", [x, scale]), weight])

    def linear(self, x: str, w: np.ndarray, name: str, bias: np.ndarray | None = None) -> str:
        if self.mode == "fp16":
            y = self.op("MatMul", [x, self.const(name, w.T.astype(np.float32))])
            self.probes[f"{name}.in"], self.probes[f"{name}.out"] = x, y
        else:
            y = self.qdq(self.op("MatMul", [self.qdq(x, f"{name}.in"), self.block_weight(w, name)]), f"{name}.out")
        return y if bias is None else self.op("Add", [y, self.const(f"{name}.bias", bias.astype(np.float32))])

    def block_weight(self, w: np.ndarray, name: str) -> str:
        """``w[N, K]`` as DequantizeLinear of hetero's block format (int8 / int4, one scale per 32 along K)."""
        from onnx import numpy_helper

        q, scales = block_weight(w, self.mode)
        zeros = np.zeros_like(scales, np.int8)
        if self.mode == "q4":
            self.packed += [int4_tensor(f"{name}.q", q), int4_tensor(f"{name}.zero", zeros)]
        else:
            self.packed += [numpy_helper.from_array(q, f"{name}.q"), numpy_helper.from_array(zeros, f"{name}.zero")]
        scale = self.const(f"{name}.scale", scales)
        return self.op("DequantizeLinear", [f"{name}.q", scale, f"{name}.zero"], axis=0, block_size=32)

    def qdq(self, x: str, probe: str) -> str:
        """``x`` through uint16 QuantizeLinear / DequantizeLinear with the calibrated magnitude of ``probe``."""
        if x not in self._qdq:
            if probe not in self.ranges:
                raise ValueError(f"no calibrated range for {probe}")
            scale = self.const(f"{probe}.act_scale", np.array(activation_scale(self.ranges[probe])))
            zero = self.const("act_zero", np.array(32768, np.uint16))
            self._qdq[x] = self.op("DequantizeLinear", [self.op("QuantizeLinear", [x, scale, zero]), scale, zero])
        return self._qdq[x]


def decoder_graph(shape: DecoderShape, weights: dict[str, np.ndarray], tokens: int, context: int, *,
                  mode: str = "fp16", ranges: dict[str, float] | None = None) -> bytes:
    """The serialized ONNX model of one chunk of ``tokens`` tokens against a ``context``-slot cache; ``mode`` q8 /
    q4 needs ``ranges``, the calibrated magnitude of every linear layer's input and output (``calibration_graph``)."""
    return _decoder(_Builder(mode, ranges), shape, weights, tokens, context, probes=False)


def calibration_graph(shape: DecoderShape, weights: dict[str, np.ndarray], tokens: int,
                      context: int) -> tuple[bytes, dict[str, str]]:
    """The float graph with every linear layer's input and output as extra outputs, and the probe -> output map."""
    builder = _Builder()
    model = _decoder(builder, shape, weights, tokens, context, probes=True)
    return model, builder.probes


def _decoder(b: _Builder, s: DecoderShape, weights: dict[str, np.ndarray], t: int, context: int, *,
             probes: bool) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    half = s.head_dim // 2
    group = s.heads // s.kv_heads
    embed = weights["model.embed_tokens.weight"].astype(np.float32)
    h = b.op("Gather", [b.const("embed", embedding_table(embed, b.mode)), "ids"], axis=0)  # [T, hidden]
    graph_outputs = []

    def heads(x: str, n: int) -> str:  # [T, n * hd] -> [n, T, hd]
        return b.op("Transpose", [b.op("Reshape", [x, b.ints(t, n, s.head_dim)])], perm=[1, 0, 2])

    def rope(x: str) -> str:  # x [n, T, hd]; cos / sin [T, hd] broadcast over heads
        first = b.op("Slice", [x, b.ints(0), b.ints(half), b.ints(-1)])
        second = b.op("Slice", [x, b.ints(half), b.ints(s.head_dim), b.ints(-1)])
        rotated = b.op("Concat", [b.op("Neg", [second]), first], axis=-1)
        return b.op("Add", [b.op("Mul", [x, "cos"]), b.op("Mul", [rotated, "sin"])])

    for layer in range(s.layers):
        p = f"model.layers.{layer}."
        w = {k[len(p):]: v for k, v in weights.items() if k.startswith(p)}
        x = b.rms_norm(h, b.const(f"{p}in_norm", w["input_layernorm.weight"].astype(np.float32)), s.eps)
        proj = {}
        for name, n in (("q", s.heads), ("k", s.kv_heads), ("v", s.kv_heads)):
            flat = b.linear(x, w[f"self_attn.{name}_proj.weight"], f"{p}{name}", w.get(f"self_attn.{name}_proj.bias"))
            y = heads(flat, n)
            if name != "v" and f"self_attn.{name}_norm.weight" in w:
                y = b.rms_norm(y, b.const(f"{p}{name}_norm", w[f"self_attn.{name}_norm.weight"].astype(np.float32)),
                               s.eps)
            proj[name] = rope(y) if name != "v" else y
        graph_outputs += [(proj["k"], f"k_{layer}"), (proj["v"], f"v_{layer}")]
        keys = b.op("Concat", [f"past_k_{layer}", proj["k"]], axis=1)  # [kvh, C + T, hd]
        values = b.op("Concat", [f"past_v_{layer}", proj["v"]], axis=1)

        def grouped(kv: str) -> str:  # [kvh, L, hd] -> [heads, L, hd], each kv head serving `group` query heads
            wide = b.op("Expand", [b.op("Unsqueeze", [kv, b.ints(1)]),
                                   b.ints(s.kv_heads, group, context + t, s.head_dim)])
            return b.op("Reshape", [wide, b.ints(s.heads, context + t, s.head_dim)])

        scores = b.op("MatMul", [proj["q"], b.op("Transpose", [grouped(keys)], perm=[0, 2, 1])])
        scores = b.op("Add", [b.op("Mul", [scores, b.const(f"scale_{layer}", np.float32(s.head_dim ** -0.5))]), "mask"])
        attn = b.op("MatMul", [b.op("Softmax", [scores], axis=-1), grouped(values)])  # [heads, T, hd]
        attn = b.op("Reshape", [b.op("Transpose", [attn], perm=[1, 0, 2]), b.ints(t, s.heads * s.head_dim)])
        h = b.op("Add", [h, b.linear(attn, w["self_attn.o_proj.weight"], f"{p}o")])
        x = b.rms_norm(h, b.const(f"{p}post_norm", w["post_attention_layernorm.weight"].astype(np.float32)), s.eps)
        gate = b.linear(x, w["mlp.gate_proj.weight"], f"{p}gate")
        up = b.linear(x, w["mlp.up_proj.weight"], f"{p}up")
        act = b.op("Mul", [b.op("Mul", [gate, b.op("Sigmoid", [gate])]), up])  # SwiGLU
        h = b.op("Add", [h, b.linear(act, w["mlp.down_proj.weight"], f"{p}down")])
    h = b.rms_norm(h, b.const("final_norm", weights["model.norm.weight"].astype(np.float32)), s.eps)
    head = weights.get("lm_head.weight", embed)
    logits = b.linear(h, head, "lm_head")
    graph_outputs.insert(0, (logits, "logits"))
    for src, dst in graph_outputs:
        b.nodes.append(helper.make_node("Identity", [src], [dst], name=f"out_{dst}"))

    f32 = TensorProto.FLOAT
    kv = [s.kv_heads, context, s.head_dim]
    inputs = [helper.make_tensor_value_info("ids", TensorProto.INT64, [t]),
              helper.make_tensor_value_info("cos", f32, [t, s.head_dim]),
              helper.make_tensor_value_info("sin", f32, [t, s.head_dim]),
              helper.make_tensor_value_info("mask", f32, [t, context + t])]
    inputs += [helper.make_tensor_value_info(f"past_{kind}_{layer}", f32, kv)
               for layer in range(s.layers) for kind in "kv"]
    outputs = [helper.make_tensor_value_info("logits", f32, [t, s.vocab])]
    outputs += [helper.make_tensor_value_info(f"{kind}_{layer}", f32, [s.kv_heads, t, s.head_dim])
                for layer in range(s.layers) for kind in "kv"]
    if probes:
        outputs += [helper.make_tensor_value_info(value, f32, None) for value in dict.fromkeys(b.probes.values())]
    graph = helper.make_graph(b.nodes, f"decoder_t{t}_c{context}", inputs, outputs,
                              [numpy_helper.from_array(v, k) for k, v in sorted(b.weights.items())] + b.packed)
    # opset 21: block-wise DequantizeLinear and INT4 weights
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]).SerializeToString(deterministic=True)


class KvCache:
    """The host's cache: per layer float32[kv_heads, C, head_dim] keys and values, and how many positions are used."""

    def __init__(self, shape: DecoderShape, context: int) -> None:
        self.shape, self.context, self.length = shape, context, 0
        self.k = [np.zeros((shape.kv_heads, context, shape.head_dim), np.float32) for _ in range(shape.layers)]
        self.v = [np.zeros_like(k) for k in self.k]

    def feeds(self, ids: list[int], tokens: int) -> dict[str, np.ndarray]:
        """The inputs of a ``tokens``-token graph for ``ids`` (padded to ``tokens``) at the current length."""
        s, n, c = self.shape, len(ids), self.context
        if self.length + n > c:
            raise ValueError(f"context of {c} positions is full ({self.length} used, {n} more asked)")
        positions = self.length + np.arange(tokens)
        inv = s.rope_theta ** (-np.arange(s.head_dim // 2) * 2 / s.head_dim)
        angles = np.concatenate([positions[:, None] * inv] * 2, axis=1)
        mask = np.full((tokens, c + tokens), MASKED, np.float32)
        for i in range(tokens):
            mask[i, : self.length] = 0.0
            mask[i, c : c + min(i, n - 1) + 1] = 0.0  # the chunk's own earlier tokens, and itself
        feeds = {"ids": np.array(list(ids) + [0] * (tokens - n), np.int64), "cos": np.cos(angles).astype(np.float32),
                 "sin": np.sin(angles).astype(np.float32), "mask": mask}
        for layer in range(s.layers):
            feeds[f"past_k_{layer}"], feeds[f"past_v_{layer}"] = self.k[layer], self.v[layer]
        return feeds

    def append(self, outputs: dict[str, np.ndarray], n: int) -> None:
        """Write the first ``n`` new positions of a chunk's outputs into the cache."""
        for layer in range(self.shape.layers):
            self.k[layer][:, self.length : self.length + n] = outputs[f"k_{layer}"][:, :n]
            self.v[layer][:, self.length : self.length + n] = outputs[f"v_{layer}"][:, :n]
        self.length += n
