"""``lower_contrib_ops``: onnxruntime's contrib ops (com.microsoft) rewritten into the standard ONNX nodes they mean,
the first of the default passes, so that a file saved after onnxruntime's optimizer (issue 17) meets the same fusion
passes (fuse_matmul_bias, fuse_conv_activation, fuse_attention, ...) and native kernels as the model it was made
from, instead of running its fused contrib nodes on the numpy references of ``hetero.ops.contrib``. Also ai.onnx.ml's
Scaler on float32 (scikit-learn exports), as the Sub / Mul it means.

A node is lowered only in the forms whose meaning the standard nodes reproduce exactly (see each ``_lower_*``);
anything else (attention with a past or a causal mask, packed QKV / KV MultiHeadAttention, ...) stays as it is and
runs on its reference. The new values get their infos from the ops' own shape inference, so the passes after
this one see ranks and dtypes as they would in the written-out model.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..contract import dtypes, registry
from ..contract.graph import HETERO_DOMAIN, MICROSOFT_DOMAIN, ML_DOMAIN, Graph, Node
from ..contract.registry import OpContext
from ..contract.tensor import TensorInfo

Lowering = Callable[["_Builder", Node], bool]


class _Builder:
    """Emits the replacement nodes of one contrib node (in order, in its place) with fresh value names."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.nodes: list[Node] = []
        self.prefix = ""
        self.cache: dict[tuple, str] = {}  # values several contrib nodes can share (an Attention mask bias)
        # mask_index outputs of EmbedLayerNormalization: one valid length per batch row ([B], never [2B])
        self.row_lengths = {n.outputs[1] for n in graph.nodes if n.domain == MICROSOFT_DOMAIN and
                            n.op_type == "EmbedLayerNormalization" and len(n.outputs) > 1 and n.outputs[1]}

    def start(self, node: Node) -> None:
        self.nodes = []
        self.prefix = f"{node.name or node.outputs[0]}/lowered"

    def const(self, name: str, value: np.ndarray) -> str:
        full = f"{self.prefix}/{name}"
        array = np.array(value, order="C")  # a copy; ascontiguousarray would make a 0-d scalar 1-d
        self.graph.initializers[full] = array
        self.graph.values[full] = TensorInfo(dtypes.from_numpy(array.dtype), array.shape)
        return full

    def add(self, op_type: str, inputs: list[str], attrs: dict | None = None, out: str | None = None,
            n_out: int = 1) -> str:
        """Appends ``op_type(inputs)``; returns its (first) output, ``out`` when given."""
        index = len(self.nodes)
        outputs = [out] if out is not None else [f"{self.prefix}/{op_type}{index}_{i}" for i in range(n_out)]
        self.nodes.append(Node(op_type, inputs, outputs, dict(attrs or {}), name=f"{self.prefix}/{op_type}{index}"))
        return outputs[0]


def _info(graph: Graph, name: str) -> TensorInfo | None:
    return graph.values.get(name) if name else None


def _consumed(graph: Graph, name: str) -> bool:
    return bool(name) and (name in graph.outputs or bool(graph.consumers().get(name)))


def _float32(graph: Graph, name: str) -> bool:
    info = _info(graph, name)
    return info is not None and info.dtype == dtypes.float32


def _present(node: Node, index: int) -> str:
    return node.inputs[index] if index < len(node.inputs) else ""


# ------------------------------------------------------------------------------------------------ the lowerings

def _lower_fused_matmul(b: _Builder, node: Node) -> bool:
    """alpha * op(A) @ op(B) as Transpose (of a constant B: a transposed copy) / MatMul / Mul by alpha: the
    scaled Q K^T product fuse_attention looks for."""
    attrs = node.attrs
    if attrs.get("transBatchA", 0) or attrs.get("transBatchB", 0) or len(node.inputs) != 2:
        return False
    operands = []
    for name, flag in zip(node.inputs, ("transA", "transB"), strict=True):
        info = _info(b.graph, name)
        if info is None or info.rank is None or info.rank < 2 or not _float32(b.graph, name):
            return False
        if not attrs.get(flag, 0):
            operands.append(name)
        elif name in b.graph.initializers:
            operands.append(b.const(flag, np.swapaxes(np.asarray(b.graph.initializers[name]), -1, -2)))
        else:
            perm = [*range(info.rank - 2), info.rank - 1, info.rank - 2]
            operands.append(b.add("Transpose", [name], {"perm": perm}))
    alpha = float(attrs.get("alpha", 1.0))
    if alpha == 1.0:
        b.add("MatMul", operands, out=node.outputs[0])
    else:
        product = b.add("MatMul", operands)
        b.add("Mul", [product, b.const("alpha", np.array(alpha, np.float32))], out=node.outputs[0])
    return True


# FusedConv activation -> the parameters activation_params holds, in order
_CONV_ACTIVATIONS = {"Relu": (), "Tanh": (), "Sigmoid": (), "LeakyRelu": ("alpha",), "Clip": ("min", "max"),
                     "HardSigmoid": ("alpha", "beta")}


def _lower_fused_conv(b: _Builder, node: Node) -> bool:
    """Conv (+ Z) then the activation node: fuse_conv_activation makes the fused Conv again where its kernel has
    that activation."""
    act = str(node.attrs.get("activation", ""))
    if act not in _CONV_ACTIVATIONS or not _float32(b.graph, node.inputs[0]):
        return False
    params = [float(p) for p in node.attrs.get("activation_params", [])]
    act_attrs = dict(zip(_CONV_ACTIVATIONS[act], params, strict=False))
    conv_attrs = {k: v for k, v in node.attrs.items() if k not in ("activation", "activation_params")}
    y = b.add("Conv", [n for n in node.inputs[:3]], conv_attrs)
    if _present(node, 3):
        y = b.add("Add", [y, node.inputs[3]])
    if act == "Clip":
        low = b.const("min", np.array(act_attrs.get("min", -np.inf), np.float32))
        high = b.const("max", np.array(act_attrs.get("max", np.inf), np.float32))
        b.add("Clip", [y, low, high], out=node.outputs[0])
    else:
        b.add(act, [y], act_attrs, out=node.outputs[0])
    return True


def _sum_of_inputs(b: _Builder, node: Node, indices: tuple[int, ...], out: str | None = None) -> str:
    """Input ``indices[0]`` plus each other present one, left to right (Add nodes)."""
    total = node.inputs[indices[0]]
    present = [i for i in indices[1:] if _present(node, i)]
    for k, i in enumerate(present):
        total = b.add("Add", [total, node.inputs[i]], out=out if k == len(present) - 1 else None)
    return total


def _lower_gelu(approximate: str, with_bias: bool) -> Lowering:
    """Gelu / BiasGelu / FastGelu: the bias Add, then ONNX Gelu (exact, or tanh for FastGelu)."""
    def lower(b: _Builder, node: Node) -> bool:
        if not _float32(b.graph, node.inputs[0]):
            return False
        x = _sum_of_inputs(b, node, (0, 1)) if with_bias else node.inputs[0]
        b.add("Gelu", [x], {"approximate": approximate} if approximate != "none" else {}, out=node.outputs[0])
        return True
    return lower


def _lower_quick_gelu(b: _Builder, node: Node) -> bool:
    """x * Sigmoid(alpha * x) (at alpha 1: the Silu pattern)."""
    x = node.inputs[0]
    if not _float32(b.graph, x):
        return False
    alpha = float(node.attrs.get("alpha", 1.702))
    scaled = x if alpha == 1.0 else b.add("Mul", [x, b.const("alpha", np.array(alpha, np.float32))])
    b.add("Mul", [x, b.add("Sigmoid", [scaled])], out=node.outputs[0])
    return True


def _lower_bias_add(b: _Builder, node: Node) -> bool:
    if len(node.inputs) != 3 or not _float32(b.graph, node.inputs[0]):
        return False
    _sum_of_inputs(b, node, (0, 1, 2), out=node.outputs[0])
    return True


def _skip_sum(b: _Builder, node: Node, bias_at: int) -> str:
    """input + skip (+ bias), into the node's input_skip_bias_sum output when that is read."""
    sum_out = node.outputs[3] if len(node.outputs) > 3 and node.outputs[3] else None
    return _sum_of_inputs(b, node, (0, 1, bias_at), out=sum_out)


def _lower_skip_layer_norm(b: _Builder, node: Node) -> bool:
    """Add(s) then LayerNormalization over the last axis (whose Mean / InvStdDev outputs are the node's outputs 1
    and 2, [..., 1] float32 both)."""
    if not _float32(b.graph, node.inputs[0]):
        return False
    total = _skip_sum(b, node, 4)
    outs = list(node.outputs[:3])
    while outs and not outs[-1]:
        outs.pop()
    inputs = [total, node.inputs[2], *([node.inputs[3]] if _present(node, 3) else [])]
    b.nodes.append(Node("LayerNormalization", inputs, outs, {"axis": -1, "epsilon": float(node.attrs.get(
        "epsilon", 1e-12)), "stash_type": 1}, name=f"{b.prefix}/LayerNormalization"))
    return True


def _lower_skip_simplified_layer_norm(b: _Builder, node: Node) -> bool:
    """Add(s) then RMSNorm over the last axis; not when the mean / inverse RMS outputs are read."""
    if not _float32(b.graph, node.inputs[0]) or any(_consumed(b.graph, n) for n in node.outputs[1:3]):
        return False
    total = _skip_sum(b, node, 3)
    _rms_norm(b, total, node.inputs[2], float(node.attrs.get("epsilon", 1e-12)), node.outputs[0])
    return True


def _rms_norm(b: _Builder, x: str, scale: str, epsilon: float, out: str) -> None:
    """RMS normalisation over the last axis as hetero's RMSNorm (what fuse_rms_norm makes of an exported one, with
    a native cpu kernel; ONNX RMSNormalization has none)."""
    b.nodes.append(Node("RMSNorm", [x, scale], [out], {"epsilon": epsilon}, name=f"{b.prefix}/RMSNorm",
                        domain=HETERO_DOMAIN))


def _lower_simplified_layer_norm(b: _Builder, node: Node) -> bool:
    """onnxruntime's SimplifiedLayerNormalization (ONNX domain) as hetero's RMSNorm (over the last axis; else ONNX
    RMSNormalization); not when its inverse RMS output is read."""
    info = _info(b.graph, node.inputs[0])
    axis = int(node.attrs.get("axis", -1))
    if info is None or info.rank is None or not _float32(b.graph, node.inputs[0]) or \
            any(_consumed(b.graph, n) for n in node.outputs[1:]):
        return False
    epsilon = float(node.attrs.get("epsilon", 1e-5))
    if axis in (-1, info.rank - 1):
        _rms_norm(b, node.inputs[0], node.inputs[1], epsilon, node.outputs[0])
    else:
        b.add("RMSNormalization", node.inputs[:2], {"axis": axis, "epsilon": epsilon, "stash_type": 1},
              out=node.outputs[0])
    return True


def _lower_embed_layer_norm(b: _Builder, node: Node) -> bool:
    """Gathers of the word, position (position_ids, else rows 0..S-1) and segment embeddings, Adds, then
    LayerNormalization; mask_index as ReduceSum over each row of (mask != 0) (not lowered when mask_index is read
    and there is no mask)."""
    ids, word = node.inputs[0], node.inputs[2]
    mask_index_read = len(node.outputs) > 1 and _consumed(b.graph, node.outputs[1])
    if not _float32(b.graph, word) or not _present(node, 5) or not _present(node, 6) or \
            (mask_index_read and not _present(node, 7)):
        return False
    rows = b.add("Gather", [word, ids], {"axis": 0})
    if _present(node, 8):
        position_rows = b.add("Gather", [node.inputs[3], node.inputs[8]], {"axis": 0})
    else:  # rows 0..S-1 of the table: a Slice (the cpu backend has no Range kernel)
        length = b.add("Slice", [b.add("Shape", [ids]), b.const("s1", np.array([1], np.int64)),
                                 b.const("s2", np.array([2], np.int64))])
        position_rows = b.add("Slice", [node.inputs[3], b.const("s0", np.array([0], np.int64)), length,
                                        b.const("rows_axis", np.array([0], np.int64))])
    total = b.add("Add", [rows, position_rows])
    if _present(node, 1) and _present(node, 4):
        total = b.add("Add", [total, b.add("Gather", [node.inputs[4], node.inputs[1]], {"axis": 0})])
    if len(node.outputs) > 2 and node.outputs[2]:
        total = b.add("Identity", [total], out=node.outputs[2])
    b.add("LayerNormalization", [total, node.inputs[5], node.inputs[6]],
          {"axis": -1, "epsilon": float(node.attrs.get("epsilon", 1e-12)), "stash_type": 1}, out=node.outputs[0])
    if mask_index_read:
        # bool, then float32: the cpu backend's ReduceSum kernel is a float one (counts up to 2^24 stay exact)
        nonzero = b.add("Cast", [b.add("Cast", [node.inputs[7]], {"to": 9})], {"to": 1})
        if b.graph.opset("") >= 13:
            count = b.add("ReduceSum", [nonzero, b.const("axes", np.array([1], np.int64))], {"keepdims": 0})
        else:
            count = b.add("ReduceSum", [nonzero], {"axes": [1], "keepdims": 0})
        b.add("Cast", [count], {"to": 6}, out=node.outputs[1])
    return True


def _mask_bias(b: _Builder, node: Node, x: str, filter_value: float, at: int = 3, keys_of: str = "") -> str | None:
    """The additive [B, 1, 1 or S, T] float32 bias of an Attention's mask_index (input ``at``; absent: ""), for 1-D
    [B] valid lengths, 2-D [B, T] or 3-D [B, S, T] 0 / 1 masks; None for the other forms. ``x`` has the batch on
    axis 0, ``keys_of`` (default ``x``) the keys on axis 1. Shared by the attention nodes that read the same mask."""
    mask = _present(node, at)
    # An Attention's keys are its own rows, as many in every layer reading this mask: one bias serves them all.
    key = (mask, filter_value, keys_of)
    keys_of = keys_of or x
    if not mask:
        return ""
    info = _info(b.graph, mask)
    batch = None if info is None or info.shape is None else info.shape[0]
    x_info = _info(b.graph, x)
    known_batch = batch is not None and x_info is not None and x_info.shape is not None and \
        x_info.shape[0] == batch
    if info is None or info.rank not in (1, 2, 3) or (info.rank == 1 and not known_batch and
                                                      mask not in b.row_lengths):
        return None  # a 1-D mask of [2B] (start positions too) or of unknown length: left to the reference
    if key in b.cache:
        return b.cache[key]
    zero = b.const("mask_zero", np.array(0.0, np.float32))
    masked = b.const("mask_filter", np.array(filter_value, np.float32))
    if info.rank == 1:  # key t of row b kept while t < length[b]
        length = b.add("Gather", [b.add("Shape", [keys_of]), b.const("seq_axis", np.array(1, np.int64))],
                       {"axis": 0})
        keys = b.add("Range", [b.const("zero", np.array(0, np.int64)), length, b.const("one", np.array(1, np.int64))])
        lengths = b.add("Reshape", [b.add("Cast", [mask], {"to": 7}),
                                    b.const("lengths_shape", np.array([-1, 1, 1, 1], np.int64))])
        keep = b.add("Less", [keys, lengths])
    elif info.rank == 2:
        keep = b.add("Reshape", [b.add("Cast", [mask], {"to": 9}),
                                 b.const("mask_shape", np.array([0, 1, 1, -1], np.int64))])
    else:  # [B, S, T] -> [B, 1, S, T]
        dims = b.add("Shape", [mask])
        shape = b.add("Concat", [b.add("Slice", [dims, b.const("d0", np.array([0], np.int64)),
                                                 b.const("d1", np.array([1], np.int64))]),
                                 b.const("one_head", np.array([1], np.int64)),
                                 b.add("Slice", [dims, b.const("d1b", np.array([1], np.int64)),
                                                 b.const("d3", np.array([3], np.int64))])], {"axis": 0})
        keep = b.add("Reshape", [b.add("Cast", [mask], {"to": 9}), shape])
    bias = b.add("Where", [keep, zero, masked])
    b.cache[key] = bias
    return bias


def _lower_attention(b: _Builder, node: Node) -> bool:
    """Packed-QKV self-attention with no past, no causal mask and no attention_bias, as an exporter writes it out:
    three MatMul + Add projections (the packed weight cut in three), Reshape to heads, Transposes, Q K^T times the
    scale, plus the mask bias, Softmax, times V, Transpose and Reshape back: fuse_attention's pattern."""
    attrs = node.attrs
    x, w_name = node.inputs[0], node.inputs[1]
    w = b.graph.initializers.get(w_name)
    bias_name = _present(node, 2)
    bias = b.graph.initializers.get(bias_name) if bias_name else None
    if (len(node.inputs) > 4 and any(node.inputs[4:])) or attrs.get("unidirectional", 0) or \
            attrs.get("do_rotary", 0) or attrs.get("past_present_share_buffer", 0) or \
            (len(node.outputs) > 1 and _consumed(b.graph, node.outputs[1])):
        return False
    if w is None or w.ndim != 2 or w.dtype != np.float32 or (bias_name and bias is None) or \
            not _float32(b.graph, x) or (_info(b.graph, x) or TensorInfo(dtypes.float32, None)).rank != 3:
        return False
    heads = int(attrs["num_heads"])
    sizes = attrs.get("qkv_hidden_sizes")
    dq, dk, dv = (int(s) for s in sizes) if sizes else (w.shape[1] // 3,) * 3
    if dq + dk + dv != w.shape[1] or dq != dk or dq % heads or dv % heads:
        return False
    mask = _mask_bias(b, node, x, float(attrs.get("mask_filter_value", -10000.0)))
    if mask is None:
        return False
    cuts = [0, dq, dq + dk, dq + dk + dv]
    projected = []
    for i, label in enumerate("qkv"):
        y = b.add("MatMul", [x, b.const(f"w_{label}", w[:, cuts[i]:cuts[i + 1]])])
        if bias is not None:
            y = b.add("Add", [y, b.const(f"b_{label}", np.asarray(bias)[cuts[i]:cuts[i + 1]])])
        projected.append(y)
    scale = float(attrs.get("scale", 0.0)) or 1.0 / float(np.sqrt(dq // heads))
    _written_attention(b, projected, (dq, dk, dv), heads, scale, mask, node.outputs[0])
    return True


def _written_attention(b: _Builder, qkv: list[str], widths: tuple[int, int, int], heads: int, scale: float,
                       mask: str, out: str) -> None:
    """softmax(Q K^T * scale + mask) V of [B, S, D] projections, written out as an exporter writes it: Reshape to
    heads, Transposes ([0, 2, 1, 3]; K [0, 2, 3, 1]), MatMul, Mul, Add, Softmax, MatMul, Transpose, Reshape to
    [B, S, Dv]: the pattern fuse_attention turns into one FusedAttention."""
    parts = []
    for label, y, width, perm in zip("qkv", qkv, widths, ([0, 2, 1, 3], [0, 2, 3, 1], [0, 2, 1, 3]), strict=True):
        y = b.add("Reshape", [y, b.const(f"{label}_heads", np.array([0, 0, heads, width // heads], np.int64))])
        parts.append(b.add("Transpose", [y], {"perm": perm}))
    scores = b.add("Mul", [b.add("MatMul", parts[:2]), b.const("scale", np.array(scale, np.float32))])
    if mask:
        scores = b.add("Add", [scores, mask])
    context = b.add("MatMul", [b.add("Softmax", [scores], {"axis": -1}), parts[2]])
    merged = b.add("Transpose", [context], {"perm": [0, 2, 1, 3]})
    b.add("Reshape", [merged, b.const("merged", np.array([0, 0, widths[2]], np.int64))], out=out)


def _lower_multi_head_attention(b: _Builder, node: Node) -> bool:
    """MultiHeadAttention of separate 3-D query, key and value (widths known), the optional constant bias, no past,
    not causal; key_padding_mask absent, [B] lengths or [B, T]; attention_bias added to the mask bias: the
    written-out attention of ``_written_attention``."""
    attrs = node.attrs
    q = node.inputs[0]
    k, v = _present(node, 1), _present(node, 2)
    infos = [_info(b.graph, n) for n in (q, k, v)]
    if not k or not v or any(i is None or i.shape is None or len(i.shape) != 3 or i.dtype != dtypes.float32
                             for i in infos) or attrs.get("unidirectional", 0) or \
            any(_present(node, i) for i in range(6, 10)) or any(_consumed(b.graph, n) for n in node.outputs[1:]):
        return False
    widths = [i.shape[2] for i in infos if i is not None and i.shape is not None]
    heads = int(attrs["num_heads"])
    known = [d for d in widths if isinstance(d, int)]
    if len(known) != 3 or known[0] != known[1] or known[0] % heads or known[2] % heads:
        return False
    dq, dk, dv = known
    bias_name = _present(node, 3)
    bias = b.graph.initializers.get(bias_name) if bias_name else None
    if bias_name and (bias is None or np.shape(bias) != (dq + dk + dv,)):
        return False
    mask_info = _info(b.graph, _present(node, 4))
    if mask_info is not None and mask_info.rank == 3:
        return False  # MultiHeadAttention takes no 3-D key_padding_mask
    mask = _mask_bias(b, node, q, float(attrs.get("mask_filter_value", -10000.0)), at=4, keys_of=k)
    if mask is None:
        return False
    if _present(node, 5):
        mask = b.add("Add", [mask, node.inputs[5]]) if mask else node.inputs[5]
    projected = [q, k, v]
    if bias is not None:
        cuts = [0, dq, dq + dk, dq + dk + dv]
        projected = [b.add("Add", [y, b.const(f"b_{label}", np.asarray(bias)[cuts[i]:cuts[i + 1]])])
                     for i, (label, y) in enumerate(zip("qkv", projected, strict=True))]
    scale = float(attrs.get("scale", 0.0)) or 1.0 / float(np.sqrt(dq // heads))
    _written_attention(b, projected, (dq, dk, dv), heads, scale, mask, node.outputs[0])
    return True


def _lower_matmul_integer_to_float(b: _Builder, node: Node) -> bool:
    """MatMulInteger, Cast to float, Mul by a_scale * b_scale, Add of the bias: the chain of onnxruntime's
    quantize_dynamic that fuse_matmul_integer_scale makes one MatMulIntegerScaled."""
    b_info = _info(b.graph, node.inputs[1])
    if b_info is None or b_info.rank != 2 or not _float32(b.graph, node.inputs[2]):
        return False
    zero_points = [_present(node, 4), _present(node, 5)]
    _scaled_integer_product(b, node, node.inputs[0], zero_points[0], node.inputs[2], node.inputs[3],
                            zero_points[1], _present(node, 6))
    return True


def _lower_dynamic_quantize_matmul(b: _Builder, node: Node) -> bool:
    """DynamicQuantizeLinear of A (uint8, its own range), then the chain of ``_lower_matmul_integer_to_float``."""
    b_info = _info(b.graph, node.inputs[1])
    if b_info is None or b_info.rank != 2 or not _float32(b.graph, node.inputs[0]):
        return False
    quantized = b.add("DynamicQuantizeLinear", [node.inputs[0]], n_out=3)
    a_scale, a_zero = quantized[:-2] + "_1", quantized[:-2] + "_2"
    _scaled_integer_product(b, node, quantized, a_zero, a_scale, node.inputs[2], _present(node, 3),
                            _present(node, 4))
    return True


def _scaled_integer_product(b: _Builder, node: Node, a: str, a_zero: str, a_scale: str, b_scale: str, b_zero: str,
                            bias: str) -> None:
    inputs = [a, node.inputs[1], a_zero, b_zero]
    while not inputs[-1]:
        inputs.pop()
    product = b.add("Cast", [b.add("MatMulInteger", inputs)], {"to": 1})
    scaled = b.add("Mul", [product, b.add("Mul", [a_scale, b_scale])], out=None if bias else node.outputs[0])
    if bias:
        b.add("Add", [scaled, bias], out=node.outputs[0])


LOWERINGS: dict[str, Lowering] = {
    "FusedMatMul": _lower_fused_matmul,
    "FusedConv": _lower_fused_conv,
    "Gelu": _lower_gelu("none", with_bias=False),
    "BiasGelu": _lower_gelu("none", with_bias=True),
    "FastGelu": _lower_gelu("tanh", with_bias=True),
    "QuickGelu": _lower_quick_gelu,
    "BiasAdd": _lower_bias_add,
    "SkipLayerNormalization": _lower_skip_layer_norm,
    "SkipSimplifiedLayerNormalization": _lower_skip_simplified_layer_norm,
    "EmbedLayerNormalization": _lower_embed_layer_norm,
    "Attention": _lower_attention,
    "MultiHeadAttention": _lower_multi_head_attention,
    "MatMulIntegerToFloat": _lower_matmul_integer_to_float,
    "DynamicQuantizeMatMul": _lower_dynamic_quantize_matmul,
}


# onnxruntime's optimizer writes this contrib op in the ONNX domain
ONNX_DOMAIN_LOWERINGS: dict[str, Lowering] = {"SimplifiedLayerNormalization": _lower_simplified_layer_norm}


def _lower_scaler(b: _Builder, node: Node) -> bool:
    """ai.onnx.ml Scaler on float32: Sub(X, offset) then Mul by scale, each left out where it is the identity; the
    same float32 arithmetic as its reference, on native elementwise kernels (a scikit-learn StandardScaler in front
    of a model: one numpy node less per run)."""
    x = node.inputs[0]
    info = _info(b.graph, x)
    if not _float32(b.graph, x) or info is None:
        return False
    offset = np.asarray(node.attrs.get("offset", [0.0]), np.float32).reshape(-1)
    scale = np.asarray(node.attrs.get("scale", [1.0]), np.float32).reshape(-1)
    if offset.size > 1 or scale.size > 1:  # per feature: only where X's last axis is known to match (no broadcast)
        width = info.shape[-1] if info.shape else None
        if not isinstance(width, int) or offset.size not in (1, width) or scale.size not in (1, width):
            return False
    if _fold_scaler_into_matmul(b, node, offset, scale):
        b.add("Identity", [x], out=node.outputs[0])
        return True
    y = x
    plain_scale = bool(np.all(scale == 1.0))
    if np.any(offset != 0.0):
        y = b.add("Sub", [y, b.const("offset", offset)], out=node.outputs[0] if plain_scale else None)
    if not plain_scale:
        b.add("Mul", [y, b.const("scale", scale)], out=node.outputs[0])
    elif y == x:
        b.add("Identity", [x], out=node.outputs[0])
    return True


def _only_reader(graph: Graph, name: str) -> Node | None:
    if name in graph.outputs:
        return None
    users = graph.consumers().get(name, [])
    return users[0] if len(users) == 1 and users[0].inputs.count(name) == 1 else None


def _fold_scaler_into_matmul(b: _Builder, node: Node, offset: np.ndarray, scale: np.ndarray) -> bool:
    """A Scaler read (maybe through a Cast to float) by one MatMul of a constant W [C, N] whose product only a
    constant bias Add reads (skl2onnx's MLP and linear models behind a StandardScaler): ((x - o) s) @ W + bias is
    x @ (s W) + (bias - (o s) @ W). W and the bias are rewritten (new constants, the old ones may be shared) and the
    Scaler becomes an Identity: no elementwise pass over the input. The sums are regrouped (float32 rounding of the
    order of |o s| |W| eps, well inside the real-model bounds)."""
    g = b.graph
    reader = _only_reader(g, node.outputs[0])
    if reader is not None and reader.op_key == ("", "Cast") and reader.attrs.get("to") == 1:
        reader = _only_reader(g, reader.outputs[0])
    if reader is None or reader.op_key != ("", "MatMul") or len(reader.inputs) != 2:
        return False
    w = g.initializers.get(reader.inputs[1])
    if w is None or np.ndim(w) != 2 or np.asarray(w).dtype != np.float32 or reader.inputs[0] == reader.inputs[1]:
        return False
    w = np.asarray(w)
    width = w.shape[0]
    if offset.size not in (1, width) or scale.size not in (1, width):
        return False
    add = _only_reader(g, reader.outputs[0])
    if add is None or add.op_key != ("", "Add"):
        return False
    bias_name = add.inputs[1] if add.inputs[0] == reader.outputs[0] else add.inputs[0]
    bias = g.initializers.get(bias_name)
    if bias is None or np.asarray(bias).dtype != np.float32 or np.asarray(bias).shape not in ((w.shape[1],),
                                                                                              (1, w.shape[1])):
        return False
    s = np.broadcast_to(scale, (width,)).astype(np.float64)
    o = np.broadcast_to(offset, (width,)).astype(np.float64)
    w64 = w.astype(np.float64)
    new_w = b.const("weight", (s[:, None] * w64).astype(np.float32))
    new_bias = np.asarray(bias, np.float64) - ((o * s) @ w64).reshape(np.asarray(bias).shape)
    reader.inputs = [reader.inputs[0], new_w]
    new_bias_name = b.const("bias", new_bias.astype(np.float32))
    add.inputs = [new_bias_name if n == bias_name else n for n in add.inputs]
    return True


ML_DOMAIN_LOWERINGS: dict[str, Lowering] = {"Scaler": _lower_scaler}


def _lowering(node: Node) -> Lowering | None:
    if node.domain == MICROSOFT_DOMAIN:
        return LOWERINGS.get(node.op_type)
    if node.domain == ML_DOMAIN:
        return ML_DOMAIN_LOWERINGS.get(node.op_type)
    return ONNX_DOMAIN_LOWERINGS.get(node.op_type) if node.domain == "" else None


def _infer_added(graph: Graph, nodes: list[Node]) -> None:
    """graph.values for the outputs of ``nodes`` (in order), from each op's shape inference."""
    for node in nodes:
        schema = registry.get(node.domain, node.op_type)
        infos = [graph.values.get(n) if n else None for n in node.inputs]
        values = [graph.initializers.get(n) if n else None for n in node.inputs]
        outs = schema.infer(OpContext(node, infos, values, graph.opset(node.domain)))
        for name, info in zip(node.outputs, outs, strict=False):
            if name:
                graph.values[name] = info


def lower_contrib_ops(graph: Graph) -> int:
    """Each com.microsoft node that ``LOWERINGS`` can express in standard ONNX nodes replaced by them (models of
    opset 11 or later: the rewrites use Range and inputs-form Slice / Clip)."""
    if graph.opset("") < 11 or not any(_lowering(n) is not None for n in graph.nodes):
        return 0
    b = _Builder(graph)
    count = 0
    for node in list(graph.nodes):
        lowering = _lowering(node)
        if lowering is None:
            continue
        b.start(node)
        added_consts = set(graph.initializers)
        if not lowering(b, node):
            for name in set(graph.initializers) - added_consts:  # a lowering that gave up mid-way
                del graph.initializers[name]
            continue
        at = graph.nodes.index(node)
        graph.nodes[at:at + 1] = b.nodes
        _infer_added(graph, b.nodes)
        count += 1
    return count
