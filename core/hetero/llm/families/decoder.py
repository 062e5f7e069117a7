"""The Qwen-style decoder as a hetero Graph: embedding, N x (attention + MLP or MoE), final norm, LM head.

Graph inputs: ``input_ids`` (int64 ``[T]``) and ``past_len`` (int64 scalar: tokens already in the KV caches).
Output: ``logits`` (float32 ``[min(T, VERIFY_ROWS), vocab]``: the last tokens' rows, so a speculative verify step of
up to ``VERIFY_ROWS`` tokens gets every row in one pass while a long prefill chunk pays the LM head for only that
many; ``[T, vocab]`` with ``all_logits``).
The families differ only in switches (QKV bias, q/k norm, routed experts) and tensor names, given by a ``Naming``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from ...contract import dtypes
from ...contract.errors import ModelFormatError
from ...contract.graph import HETERO_DOMAIN, Graph, Node
from ...contract.quant import FLOAT_WTYPES, QuantFormat, dequantize, quantize, weight_format
from ...contract.tensor import TensorInfo
from ...progress import Progress
from ..config import LlmConfig
from ..weights import Weight, WeightSource

INPUT_IDS, PAST_LEN, LOGITS = "input_ids", "past_len", "logits"
LAST_TOKENS = "last_tokens"  # the node keeping the LM head's rows (hetero.llm.batch gathers them instead)
VERIFY_ROWS = 16  # logits rows of the last tokens of a step (hetero.llm.speculative verifies up to this many)


@dataclass(frozen=True)
class Naming:
    """Hugging Face tensor names of one family (``{i}``: layer index, ``{e}``: expert index)."""

    embed: str = "model.embed_tokens.weight"
    final_norm: str = "model.norm.weight"
    lm_head: str = "lm_head.weight"
    layer: str = "model.layers.{i}."
    input_norm: str = "input_layernorm.weight"
    post_norm: str = "post_attention_layernorm.weight"
    attn: str = "self_attn.{p}_proj.{kind}"
    q_norm: str = "self_attn.q_norm.weight"
    k_norm: str = "self_attn.k_norm.weight"
    mlp: str = "mlp.{p}_proj.weight"
    router: str = "mlp.gate.weight"
    expert: str = "mlp.experts.{e}.{p}_proj.weight"
    fused_gate_up: str = "mlp.experts.gate_up_proj"
    fused_down: str = "mlp.experts.down_proj"


class _Builder:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def const(self, name: str, array: np.ndarray) -> str:
        self.graph.initializers[name] = array
        return name

    def node(self, op_type: str, inputs: list[str], name: str, attrs: dict | None = None, *,
             domain: str = HETERO_DOMAIN) -> str:
        out = name
        self.graph.nodes.append(Node(op_type, inputs, [out], dict(attrs or {}), name=name, domain=domain))
        return out

    def linear(self, x: str, weight: Weight, wname: str, name: str, bias: str = "") -> str:
        self.const(wname, weight.array)
        return self.node("QMatMul", [x, wname, bias] if bias else [x, wname], name, weight.attrs)


def build_decoder(cfg: LlmConfig, weights: WeightSource, naming: Naming, *, context: int, all_logits: bool = False,
                  progress: bool = False, layer: Callable[..., str] | None = None) -> Graph:
    """``layer``: the per-layer builder (default: attention + MLP/MoE; the hybrid families pass their own), called
    as ``layer(builder, cfg, weights, naming, index, hidden, shapes, context)`` -> the layer's output name."""
    layer_fn = layer or _layer
    graph = Graph(inputs=[INPUT_IDS, PAST_LEN], outputs=[LOGITS], name=f"{cfg.family}_decoder",
                  opsets={"": 21, HETERO_DOMAIN: 1})
    graph.values[INPUT_IDS] = TensorInfo(dtypes.int64, (None,))
    graph.values[PAST_LEN] = TensorInfo(dtypes.int64, ())
    b = _Builder(graph)
    embed = weights.linear(naming.embed, cfg.vocab_size, cfg.hidden_size)
    b.const(naming.embed, embed.array)
    h = b.node("Embedding", [INPUT_IDS, naming.embed], "embed", {**embed.attrs, "dim": cfg.hidden_size})
    shapes = {
        heads: b.const(f"shape_heads_{heads}", np.array([-1, heads, cfg.head_dim], dtype=np.int64))
        for heads in {cfg.num_heads, cfg.num_kv_heads}
    }
    with Progress(f"building {cfg.family}", cfg.num_layers, enabled=progress) as bar:
        for i in range(cfg.num_layers):
            h = layer_fn(b, cfg, weights, naming, i, h, shapes, context)
            bar.update(1, f"layer {i + 1}/{cfg.num_layers}")
    if not all_logits:
        # Slice clamps: a step of T < VERIFY_ROWS tokens keeps all T rows (a decode step: its one row)
        start = b.const("last_index", np.array([-VERIFY_ROWS], dtype=np.int64))
        end = b.const("last_index_end", np.array([np.iinfo(np.int64).max], dtype=np.int64))
        axes = b.const("last_index_axes", np.array([0], dtype=np.int64))
        h = b.node("Slice", [h, start, end, axes], LAST_TOKENS, domain="")
    norm = b.const(naming.final_norm, weights.vector(naming.final_norm, cfg.hidden_size))
    h = b.node("RMSNorm", [h, norm], "final_norm", {"epsilon": cfg.rms_norm_eps,
                                                    **({"offset": cfg.norm_offset} if cfg.norm_offset else {})})
    if cfg.tie_word_embeddings or not weights.has(naming.lm_head):
        if not cfg.tie_word_embeddings:
            raise ModelFormatError(f"tensor {naming.lm_head!r} is missing and the config does not tie embeddings "
                                   "(key 'tie_word_embeddings')")
        head_name, head = naming.embed, embed  # tied: the LM head reads the embedding table
    else:
        head_name, head = naming.lm_head, weights.linear(naming.lm_head, cfg.vocab_size, cfg.hidden_size)
    b.linear(h, head, head_name, LOGITS)
    weights.finish()
    return graph


def _layer(b: _Builder, cfg: LlmConfig, w: WeightSource, nm: Naming, i: int, h: str, shapes: dict[int, str],
           context: int) -> str:
    p = nm.layer.format(i=i)
    eps = {"epsilon": cfg.rms_norm_eps}
    x = b.node("RMSNorm", [h, b.const(p + nm.input_norm, w.vector(p + nm.input_norm, cfg.hidden_size))],
               f"{p}input_norm", eps)
    heads = {"q": cfg.num_heads, "k": cfg.num_kv_heads, "v": cfg.num_kv_heads}
    proj: dict[str, str] = {}
    for name, n in heads.items():
        wname = p + nm.attn.format(p=name, kind="weight")
        bias = ""
        if cfg.qkv_bias:
            bname = p + nm.attn.format(p=name, kind="bias")
            bias = b.const(bname, w.vector(bname, n * cfg.head_dim))
        flat = b.linear(x, w.linear(wname, n * cfg.head_dim, cfg.hidden_size), wname, f"{p}{name}_proj", bias)
        proj[name] = b.node("Reshape", [flat, shapes[n]], f"{p}{name}_heads", domain="")
    if cfg.qk_norm:
        for name, key in (("q", nm.q_norm), ("k", nm.k_norm)):
            weight = b.const(p + key, w.vector(p + key, cfg.head_dim))
            proj[name] = b.node("RMSNorm", [proj[name], weight], f"{p}{name}_norm", eps)
    rope = cfg.rope.attrs()
    q = b.node("RotaryEmbedding", [proj["q"], PAST_LEN], f"{p}q_rope", rope)
    k = b.node("RotaryEmbedding", [proj["k"], PAST_LEN], f"{p}k_rope", rope)
    attn = b.node("Attention", [q, k, proj["v"], PAST_LEN], f"{p}attention", {"max_context": context})
    oname = p + nm.attn.format(p="o", kind="weight")
    obias = ""
    if cfg.o_bias:
        bname = p + nm.attn.format(p="o", kind="bias")
        obias = b.const(bname, w.vector(bname, cfg.hidden_size))
    o = b.linear(attn, w.linear(oname, cfg.hidden_size, cfg.num_heads * cfg.head_dim), oname, f"{p}o_proj", obias)
    h = b.node("Add", [h, o], f"{p}attn_residual", domain="")
    x = b.node("RMSNorm", [h, b.const(p + nm.post_norm, w.vector(p + nm.post_norm, cfg.hidden_size))],
               f"{p}post_norm", eps)
    mlp = _moe(b, cfg, w, nm, p, x) if cfg.is_moe_layer(i) else _mlp(b, cfg, w, nm, p, x)
    return b.node("Add", [h, mlp], f"{p}mlp_residual", domain="")


def _mlp(b: _Builder, cfg: LlmConfig, w: WeightSource, nm: Naming, p: str, x: str) -> str:
    names = {k: p + nm.mlp.format(p=k) for k in ("gate", "up", "down")}
    gate = b.linear(x, w.linear(names["gate"], cfg.intermediate_size, cfg.hidden_size), names["gate"], f"{p}gate_proj")
    up = b.linear(x, w.linear(names["up"], cfg.intermediate_size, cfg.hidden_size), names["up"], f"{p}up_proj")
    act = b.node("SwiGLU", [gate, up], f"{p}swiglu")
    return b.linear(act, w.linear(names["down"], cfg.hidden_size, cfg.intermediate_size), names["down"],
                    f"{p}down_proj")


def _moe(b: _Builder, cfg: LlmConfig, w: WeightSource, nm: Naming, p: str, x: str) -> str:
    e, inter, hidden = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size
    router = b.const(p + nm.router, w.matrix(p + nm.router, (e, hidden)))

    def stacked(proj: str, rows: int, cols: int, fused: tuple[str, int]) -> Weight:
        names = [p + nm.expert.format(e=j, p=proj) for j in range(e)]
        return w.experts(names, (p + fused[0], fused[1]), rows, cols)

    gate = stacked("gate", inter, hidden, (nm.fused_gate_up, 0))
    up = stacked("up", inter, hidden, (nm.fused_gate_up, 1))
    down = stacked("down", hidden, inter, (nm.fused_down, 0))
    inputs = [x, router]
    for name, weight in (("gate", gate), ("up", up), ("down", down)):
        inputs.append(b.const(f"{p}experts.{name}", weight.array))
    attrs = {**gate.attrs, "top_k": cfg.num_experts_per_tok, "norm_topk_prob": int(cfg.norm_topk_prob)}
    return b.node("MoE", inputs, f"{p}moe", attrs)


def restrict_head(graph: Graph, rows: np.ndarray) -> None:
    """Keep only the LM head rows of the token ids ``rows`` (int64, unique, in range): the ``logits`` output's
    column j is then token ``rows[j]`` (a drafter's argmax over a draft vocabulary, as Eagle-3 drafts; the head
    reads a fraction of its bytes). The sliced rows are a copy; the full table stays only where another node reads
    it (tied embeddings)."""
    node = next(n for n in graph.nodes if n.name == LOGITS)
    weight = node.inputs[1]
    kept = f"{weight}.rows"
    graph.initializers[kept] = np.ascontiguousarray(graph.initializers[weight][rows])
    if len(node.inputs) > 2 and node.inputs[2]:
        bias = node.inputs[2]
        graph.initializers[f"{bias}.rows"] = np.ascontiguousarray(graph.initializers[bias][rows])
        node.inputs[2] = f"{bias}.rows"
    node.inputs[1] = kept
    if not any(weight in n.inputs for n in graph.nodes):
        del graph.initializers[weight]


def requantize(graph: Graph, fmt: QuantFormat, known: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Re-quantize every ``QMatMul`` weight stored in a block format of more bits per weight than ``fmt`` (q5_0,
    q6_k, q8... -> q4) to ``fmt``: fewer bytes read per decode step, at the cost of a second rounding (a draft
    model's weights: the target checks every draft, so only acceptance can suffer). Float weights, MoE experts and
    embedding tables are left as they are. A weight another node also reads (a tied head) is kept for it and the
    matrix gets a re-quantized copy. ``known``: results of an earlier call on the same weights (a cache), used
    where their shapes fit. Returns the re-quantized matrices by their new initializer names."""
    readers: dict[str, int] = {}
    for node in graph.nodes:
        for name in node.inputs:
            readers[name] = readers.get(name, 0) + 1
    done: dict[str, str] = {}
    made: dict[str, np.ndarray] = {}
    for node in graph.nodes:
        wtype = node.attrs.get("wtype")
        if node.op_type != "QMatMul" or not isinstance(wtype, str) or wtype in FLOAT_WTYPES:
            continue
        source = weight_format(wtype, int(node.attrs.get("block_size", 32)), int(node.attrs.get("symmetric", 1)))
        if source is None or source.bits_per_weight <= fmt.bits_per_weight:
            continue
        # the stored rows hold whole blocks: their element count is K rounded up to the source's block, which gives
        # the same number of blocks of ``fmt`` as K only when fmt's block is a multiple of the source's (ggml
        # formats hold whole blocks, K exactly)
        if isinstance(source, QuantFormat) and fmt.block_size % source.block_size:
            continue
        weight = node.inputs[1]
        if weight not in done:
            data = graph.initializers[weight]
            k = data.shape[-1] // source.block_bytes * source.block_size
            name = f"{weight}.{fmt.name}" if readers[weight] > 1 else weight
            cached = (known or {}).get(name)
            shape = (*data.shape[:-1], fmt.row_bytes(k))
            if cached is None or cached.shape != shape or cached.dtype != np.uint8:
                cached = quantize(dequantize(data, source, k), fmt)
            graph.initializers[name] = made[name] = cached
            done[weight] = name
        node.inputs[1] = done[weight]
        for key in ("wtype", "block_size", "symmetric"):
            node.attrs.pop(key, None)
        node.attrs.update(fmt.attrs())
    for weight, name in done.items():
        if name != weight and not any(weight in n.inputs for n in graph.nodes):
            del graph.initializers[weight]
    return made
