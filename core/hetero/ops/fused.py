"""Fused ops that graph passes create (domain "hetero"): a producer and its cheap consumers in one kernel.

``FusedConv`` is Conv followed by an activation; ``FusedMatMul`` is MatMul by a 2-D weight, plus a bias row, plus an
activation. Their references are the unfused ops' references composed, so a fused node means exactly what the
nodes it replaced meant.
"""

from __future__ import annotations

import numpy as np

from ..contract import dtypes
from ..contract.graph import HETERO_DOMAIN, Node
from ..contract.opforms import split_dw_pointwise_attrs
from ..contract.registry import OpContext, get, op
from ..contract.tensor import TensorInfo
from .nn import _global_infer
from .shapes import broadcast_infer, broadcast_shapes, input_info, unknown

# activation attribute value -> (ONNX op, the attributes it takes from the fused node)
ACTIVATIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "Relu": ("Relu", ()),
    "Clip": ("Clip", ("min", "max")),
    "Sigmoid": ("Sigmoid", ()),
    "Tanh": ("Tanh", ()),
    "LeakyRelu": ("LeakyRelu", ("alpha",)),
    "LeakyReluMin": ("LeakyRelu", ("alpha",)),  # then Max by ``activation_min``
    "HardSigmoid": ("HardSigmoid", ("alpha", "beta")),
    "HardSwish": ("HardSwish", ()),
    "Silu": ("Silu", ()),  # x * sigmoid(x), matched from the two-node pattern
}


def apply_activation(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    name = ctx.attr("activation", "")
    if not name:
        return x
    if name == "Silu":
        return (x / (1 + np.exp(-x.astype(np.float64)))).astype(x.dtype)
    op_type, params = ACTIVATIONS[name]
    attrs = {p: ctx.node.attrs[f"activation_{p}"] for p in params if f"activation_{p}" in ctx.node.attrs}
    inner = Node(op_type, ["x"], ["y"], attrs, name=f"{ctx.node.name}/{op_type}")
    info = TensorInfo(ctx.inputs[0].dtype, x.shape) if ctx.inputs[0] is not None else None
    y = get("", op_type).reference(OpContext(inner, [info], [x], ctx.opset))[0]
    return np.maximum(y, np.asarray(ctx.attr("activation_min", -np.inf), y.dtype)) if name == "LeakyReluMin" else y


def _conv_infer(ctx: OpContext) -> list[TensorInfo]:
    return get("", "Conv").infer(ctx)


@op("FusedConv", domain=HETERO_DOMAIN, infer=_conv_infer)
def fused_conv(ctx: OpContext) -> list[np.ndarray]:
    """Conv (all of its attributes) followed by the activation named by ``activation``."""
    (y,) = get("", "Conv").reference(ctx)
    return [apply_activation(ctx, y)]


@op("ConvInputShift", domain=HETERO_DOMAIN, infer=_conv_infer)
def conv_input_shift(ctx: OpContext) -> list[np.ndarray]:
    """``FusedConv`` (its attributes) of X + ``shift`` (a float, added in X's float32 as the Add it replaces did;
    the zero padding is not shifted): a scalar Add before a padded depthwise conv
    (``ir.passes.fold_conv_input_shift``)."""
    x = ctx.array(0)
    shifted = (x + np.asarray(ctx.attr("shift"), x.dtype)).astype(x.dtype, copy=False)
    return fused_conv(OpContext(ctx.node, ctx.inputs, [shifted, *ctx.values[1:]], ctx.opset))


@op("ConvResidual", domain=HETERO_DOMAIN, infer=_conv_infer)
def conv_residual(ctx: OpContext) -> list[np.ndarray]:
    """Conv (inputs X, W, optional B; its attributes), plus Z (input 3, the output's shape), then the activation
    named by ``activation`` (none or Relu): a residual block's conv, shortcut Add and Relu
    (``ir.passes.fuse_conv_residual``), the sum in float32 as the Add computed it."""
    conv_ctx = OpContext(ctx.node, ctx.inputs[:3], ctx.values[:3], ctx.opset)
    (y,) = get("", "Conv").reference(conv_ctx)
    return [apply_activation(ctx, (y + ctx.array(3).astype(y.dtype)).astype(y.dtype))]


@op("GroupNorm", domain=HETERO_DOMAIN, infer=lambda ctx: [input_info(ctx, 0)])
def group_norm(ctx: OpContext) -> list[np.ndarray]:
    """GroupNormalization with per-channel scale and bias, then the activation named by ``activation`` (none or
    Silu): the chain Reshape [N, G, -1], InstanceNormalization (unit scale, zero bias), Reshape back, Mul by a
    per-channel scale, Add of a per-channel bias (and x * Sigmoid(x)) that exporters write for GroupNorm.

    Inputs: x (float32 [N, C, ...]), scale and bias (float32 [C]). Attributes: ``num_groups``, ``epsilon``."""
    x, scale, bias = ctx.array(0), ctx.array(1), ctx.array(2)
    groups, eps = int(ctx.attr("num_groups")), float(ctx.attr("epsilon", 1e-5))
    n, c = x.shape[0], x.shape[1]
    xg = x.astype(np.float64).reshape(n, groups, -1)
    mean = xg.mean(axis=-1, keepdims=True)
    var = xg.var(axis=-1, keepdims=True)
    y = ((xg - mean) / np.sqrt(var + eps)).reshape(x.shape)
    per_channel = (1, c) + (1,) * (x.ndim - 2)
    y = y * scale.astype(np.float64).reshape(per_channel) + bias.astype(np.float64).reshape(per_channel)
    return [apply_activation(ctx, y.astype(np.float32))]


def _nchw_context(ctx: OpContext) -> OpContext:
    """``ctx`` with input 0 (NHWC) seen as the NCHW tensor a Conv takes."""
    x = ctx.inputs[0]
    info = None if x is None else TensorInfo(x.dtype, None if x.shape is None else
                                             tuple(x.shape[i] for i in (0, 3, 1, 2)))
    values = list(ctx.values)
    if values and values[0] is not None:
        values[0] = np.transpose(values[0], (0, 3, 1, 2))
    return OpContext(ctx.node, [info, *ctx.inputs[1:]], values, ctx.opset)


def _conv_nhwc_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    if x.shape is None or len(x.shape) != 4:
        return [unknown(x.dtype, 4)]
    (y,) = get("", "Conv").infer(_nchw_context(ctx))
    return [y if y.shape is None else TensorInfo(y.dtype, tuple(y.shape[i] for i in (0, 2, 3, 1)))]


@op("ConvNHWC", domain=HETERO_DOMAIN, infer=_conv_nhwc_infer)
def conv_nhwc(ctx: OpContext) -> list[np.ndarray]:
    """``FusedConv`` (a 2-D Conv and the optional activation) on a channels-last input [N, H, W, C], its output
    channels-last too ([N, Ho, Wo, Cout]): what a Keras Conv1D export's Transpose, Conv, Squeeze and Transpose back
    compute, without the two transposes (``ir.passes.conv1d_channels_last``)."""
    (y,) = fused_conv(_nchw_context(ctx))
    return [np.ascontiguousarray(np.transpose(y, (0, 2, 3, 1)))]


def _matmul_infer(ctx: OpContext) -> list[TensorInfo]:
    return get("", "MatMul").infer(ctx)


@op("FusedMatMul", domain=HETERO_DOMAIN, infer=_matmul_infer)
def fused_matmul(ctx: OpContext) -> list[np.ndarray]:
    """x @ W (W 2-D), plus the optional bias row (input 2), then the optional activation."""
    x, w = ctx.array(0), ctx.array(1)
    y = np.matmul(x, w)
    if ctx.has_input(2):
        y = y + ctx.array(2)
    return [apply_activation(ctx, y.astype(x.dtype, copy=False))]


@op("MatMulGelu", domain=HETERO_DOMAIN, infer=_matmul_infer)
def matmul_gelu(ctx: OpContext) -> list[np.ndarray]:
    """``Gelu(x @ W + bias)`` (W 2-D, the bias row optional; the Gelu with its ``approximate`` attribute): a
    transformer's fc1 and its GELU, which ``hetero.ir.passes.fuse_matmul_gelu`` replaces; the references composed."""
    y = _reference(ctx, "FusedMatMul", [ctx.array(0), ctx.array(1), ctx.array(2) if ctx.has_input(2) else None],
                   domain=HETERO_DOMAIN)[0]
    return _reference(ctx, "Gelu", [y], {"approximate": ctx.attr("approximate", "none")})


def _perm(ctx: OpContext, name: str) -> list[int]:
    perm = [int(p) for p in ctx.attr(name, [0, 1, 2, 3])]
    if sorted(perm) != [0, 1, 2, 3]:
        raise ctx.fail(f"{name}={perm} must be a permutation of the four axes")
    return perm


def _attention_infer(ctx: OpContext) -> list[TensorInfo]:
    q, k, v = (input_info(ctx, i) for i in range(3))
    mask = input_info(ctx, 3).shape if ctx.has_input(3) else ()
    if q.shape is None or k.shape is None or v.shape is None or mask is None or \
            not len(q.shape) == len(k.shape) == len(v.shape) == 4:
        return [unknown(q.dtype, 4)]
    qs, ks, vs = ([shape[p] for p in _perm(ctx, name)]
                  for shape, name in ((q.shape, "q_perm"), (k.shape, "k_perm"), (v.shape, "v_perm")))
    batch = broadcast_shapes(ctx, [tuple(qs[:2]), tuple(ks[:2])]) or (None, None)
    scores = broadcast_shapes(ctx, [(*batch, qs[2], ks[3]), mask]) or (None,) * 4  # the mask may broadcast them up
    logical = (*(broadcast_shapes(ctx, [scores[:2], tuple(vs[:2])]) or (None, None)), scores[2], vs[3])
    return [TensorInfo(q.dtype, tuple(logical[p] for p in _perm(ctx, "out_perm")))]


@op("FusedAttention", domain=HETERO_DOMAIN, infer=_attention_infer)
def fused_attention(ctx: OpContext) -> list[np.ndarray]:
    """An exported encoder's attention in one node: ``Transpose(Softmax((Q @ K) * scale / divisor + mask, -1) @ V,
    out_perm)`` with ``Q = Transpose(q, q_perm) * q_scale`` ([B, H, S, d]), ``K = Transpose(k, k_perm) * k_scale``
    ([B, H, d, T]: the MatMul's right operand; the scales are the graph's Mul of each by a scalar, absent: none),
    ``V = Transpose(v, v_perm)`` ([B, H, T, dv]) and the optional additive ``mask`` (input 3), broadcast as the
    written-out Add and MatMuls broadcast; ``scale`` and ``divisor`` default to 1 (what the written-out graph
    multiplied or divided the scores by); ``nan_to_zero`` (PyTorch's export) sets NaN probabilities (a fully masked
    row) to 0. The steps round as the unfused MatMul, Mul / Div, Add, Softmax, MatMul
    and Transpose do."""
    q = np.transpose(ctx.array(0), _perm(ctx, "q_perm"))
    k = np.transpose(ctx.array(1), _perm(ctx, "k_perm"))
    if "q_scale" in ctx.node.attrs:
        q = q * np.float32(ctx.attr("q_scale"))
    if "k_scale" in ctx.node.attrs:
        k = k * np.float32(ctx.attr("k_scale"))
    v = np.transpose(ctx.array(2), _perm(ctx, "v_perm"))
    scores = np.matmul(q, k)
    scale, divisor = ctx.attr("scale", 1.0), ctx.attr("divisor", 1.0)
    if scale != 1.0:
        scores = scores * np.float32(scale)
    if divisor != 1.0:
        scores = scores / np.float32(divisor)
    if ctx.has_input(3):
        scores = scores + ctx.array(3)
    softmax = Node("Softmax", ["x"], ["y"], {"axis": -1}, name=f"{ctx.node.name}/Softmax")
    info = TensorInfo(ctx.inputs[0].dtype, scores.shape) if ctx.inputs[0] is not None else None
    (probs,) = get("", "Softmax").reference(OpContext(softmax, [info], [scores.astype(q.dtype)], 13))
    if ctx.attr("nan_to_zero", 0):
        probs = np.where(np.isnan(probs), np.zeros((), probs.dtype), probs)
    return [np.ascontiguousarray(np.transpose(np.matmul(probs, v), _perm(ctx, "out_perm"))).astype(q.dtype)]


def _reference(ctx: OpContext, op_type: str, arrays: list[np.ndarray | None], attrs: dict | None = None,
               domain: str = "") -> list[np.ndarray]:
    """One unfused op's reference on ``arrays`` (None: an absent optional input)."""
    names = [f"i{i}" if a is not None else "" for i, a in enumerate(arrays)]
    inner = Node(op_type, names, ["y"], attrs or {}, name=f"{ctx.node.name}/{op_type}", domain=domain)
    infos = [TensorInfo(dtypes.from_numpy(a.dtype), a.shape) if a is not None else None for a in arrays]
    return get(domain, op_type).reference(OpContext(inner, infos, list(arrays), ctx.opset))


def _broadcast_matmul_infer(ctx: OpContext) -> list[TensorInfo]:
    a, b, w = (input_info(ctx, i) for i in range(3))
    x = broadcast_shapes(ctx, [a.shape, b.shape])
    if x is None or w.shape is None or len(x) < 2:
        return [unknown(a.dtype, None if x is None else len(x))]
    return [TensorInfo(a.dtype, (*x[:-1], w.shape[1]))]


@op("BroadcastUnaryMatMul", domain=HETERO_DOMAIN, infer=_broadcast_matmul_infer)
def broadcast_unary_matmul(ctx: OpContext) -> list[np.ndarray]:
    """``unary(A <binary> B) @ W`` for A and B that broadcast (additive attention's ``tanh(q[:, None] + k[None]) @
    v``), W a 2-D weight of few columns (input 2): what ``hetero.ir.passes.fuse_broadcast_unary_matmul`` replaces.
    ``binary`` is Add / Sub / Mul, ``unary`` Tanh / Sigmoid / Relu or "" (none). With ``quantized`` = 1 the unary's
    output goes through DynamicQuantizeLinear and W is 8-bit: ``MatMulIntegerScaled(q, W, zero point of q,
    w_zero_point (input 3), scale of q, bias (input 5), w_scale (input 4))``; else W is float and input 5 an optional
    bias row. The unfused ops' references composed, so the fused node computes what they computed."""
    x = _reference(ctx, ctx.attr("binary", "Add"), [ctx.array(0), ctx.array(1)])[0]
    if ctx.attr("unary", ""):
        x = _reference(ctx, ctx.attr("unary", ""), [x])[0]
    w = ctx.array(2)
    optional = [ctx.array(i) if ctx.has_input(i) else None for i in (3, 4, 5)]
    if ctx.attr("quantized", 0):
        q, scale, zp = _reference(ctx, "DynamicQuantizeLinear", [x])
        return _reference(ctx, "MatMulIntegerScaled", [q, w, zp, optional[0], scale, optional[2], optional[1]],
                          domain=HETERO_DOMAIN)
    return _reference(ctx, "FusedMatMul", [x, w, optional[2]], domain=HETERO_DOMAIN)


@op("ConvTransposeRelu", domain=HETERO_DOMAIN, infer=lambda ctx: get("", "ConvTranspose").infer(ctx))
def conv_transpose_relu(ctx: OpContext) -> list[np.ndarray]:
    """``Relu(ConvTranspose(X, W[, B]))`` with all of the ConvTranspose's attributes (a decoder's upsampling, its
    BatchNorm folded in, then ReLU: ``hetero.ir.passes.fuse_conv_transpose_relu``); the two references composed."""
    (y,) = get("", "ConvTranspose").reference(ctx)
    return _reference(ctx, "Relu", [y])


@op("AddRelu", domain=HETERO_DOMAIN, infer=broadcast_infer())
def add_relu(ctx: OpContext) -> list[np.ndarray]:
    """``Relu(A + B)`` (broadcasting): a residual block's Add then Relu, which ``hetero.ir.passes.fuse_add_relu``
    replaces; the two references composed."""
    total = _reference(ctx, "Add", [ctx.array(0), ctx.array(1)])[0]
    return _reference(ctx, "Relu", [total])


def _add_layer_norm_infer(ctx: OpContext) -> list[TensorInfo]:
    a, b = input_info(ctx, 0), input_info(ctx, 1)
    shape = broadcast_shapes(ctx, [a.shape, b.shape])
    info = unknown(a.dtype) if shape is None else TensorInfo(a.dtype, shape)
    return [info] * max(1, len(ctx.node.outputs))  # Y, and the sum where it is an output too


@op("AddLayerNorm", domain=HETERO_DOMAIN, infer=_add_layer_norm_infer)
def add_layer_norm(ctx: OpContext) -> list[np.ndarray]:
    """``LayerNormalization(A + B)`` (A and B of one shape; inputs 2 and 3 the LayerNormalization's Scale and
    optional Bias, its ``axis`` / ``epsilon`` attributes; output 0 its Y, the optional output 1 the sum A + B): a
    transformer's residual Add and its LayerNorm (post-norm, BERT / MiniLM: the sum read by the LayerNorm alone;
    pre-norm, a ViT's: the sum read by the next residual Add too), which ``hetero.ir.passes.fuse_add_layer_norm``
    replaces; the two references composed."""
    total = _reference(ctx, "Add", [ctx.array(0), ctx.array(1)])[0]
    bias = ctx.array(3) if ctx.has_input(3) else None
    y = _reference(ctx, "LayerNormalization", [total, ctx.array(2), bias], dict(ctx.node.attrs))[0]
    return [y, total][:max(1, len(ctx.node.outputs))]


@op("GeluMul", domain=HETERO_DOMAIN, infer=broadcast_infer())
def gelu_mul(ctx: OpContext) -> list[np.ndarray]:
    """``Gelu(A) * B`` (input 0 through Gelu with its ``approximate`` attribute, then Mul by input 1, broadcasting):
    a gated GELU (T5's GeGLU) that ``hetero.ir.passes.fuse_gelu_mul`` replaces; the two references composed."""
    g = _reference(ctx, "Gelu", [ctx.array(0)], {"approximate": ctx.attr("approximate", "none")})[0]
    return _reference(ctx, "Mul", [g, ctx.array(1)])


@op("GeluGlobalMaxPool", domain=HETERO_DOMAIN, infer=_global_infer)
def gelu_global_max_pool(ctx: OpContext) -> list[np.ndarray]:
    """``GlobalMaxPool(Gelu(X))`` (the Gelu with its ``approximate`` attribute): a conv's GELU read by a max pool
    alone (magika), which ``hetero.ir.passes.fuse_gelu_global_max_pool`` replaces; the two references composed. GELU
    falls then rises (its one minimum near -0.75), so a backend may take the larger of the GELUs of each channel's
    min and max instead of the GELU of every value."""
    g = _reference(ctx, "Gelu", [ctx.array(0)], {"approximate": ctx.attr("approximate", "none")})[0]
    return _reference(ctx, "GlobalMaxPool", [g])


def _gelu_quantize_infer(ctx: OpContext) -> list[TensorInfo]:
    return [TensorInfo(input_info(ctx, 2).dtype, input_info(ctx, 0).shape)]


@op("GeluQuantizeLinear", domain=HETERO_DOMAIN, infer=_gelu_quantize_infer)
def gelu_quantize_linear(ctx: OpContext) -> list[np.ndarray]:
    """``QuantizeLinear(Gelu(X), y_scale, y_zero_point)`` (the Gelu with its ``approximate`` attribute; one scale and
    zero point, the zero point's 8-bit type out): a QDQ encoder's fc1 activation quantized for the next product
    (MiniLM's), which ``hetero.ir.passes.fuse_gelu_quantize`` replaces; the two references composed."""
    g = _reference(ctx, "Gelu", [ctx.array(0)], {"approximate": ctx.attr("approximate", "none")})[0]
    return _reference(ctx, "QuantizeLinear", [g, ctx.array(1), ctx.array(2)])


@op("ScaledMaskedSoftmax", domain=HETERO_DOMAIN, infer=broadcast_infer())
def scaled_masked_softmax(ctx: OpContext) -> list[np.ndarray]:
    """``Softmax(X / divisor + mask)`` on the last axis (inputs X, divisor: one value, mask: broadcast to X): an
    attention's scores whose products are quantized (a QDQ encoder's, MiniLM's), which
    ``hetero.ir.passes.fuse_scaled_masked_softmax`` replaces; the three references composed."""
    scaled = _reference(ctx, "Div", [ctx.array(0), ctx.array(1)])[0]
    scores = _reference(ctx, "Add", [scaled, ctx.array(2)])[0]
    return _reference(ctx, "Softmax", [scores], {"axis": -1})


def _embedding_rnn_parts(ctx: OpContext) -> tuple[Node, list[TensorInfo | None], TensorInfo]:
    """The recurrent node inside an ``EmbeddingRNN`` (its op, its attributes, X as input 0), its input infos and
    X's info: the table's rows gathered by the ids, (seq, batch, I) after the Transpose when ``transpose``."""
    table, ids = input_info(ctx, 0), input_info(ctx, 1)
    attrs = {k: v for k, v in ctx.node.attrs.items() if k not in ("rnn", "transpose")}
    inner = Node(ctx.attr("rnn"), ["x", *ctx.node.inputs[2:]], list(ctx.node.outputs), attrs,
                 name=f"{ctx.node.name}/{ctx.attr('rnn')}")
    shape = None
    if ids.shape is not None and table.shape is not None and len(ids.shape) == 2 and len(table.shape) == 2:
        lead = ids.shape[::-1] if ctx.attr("transpose", 0) else ids.shape
        shape = (*lead, table.shape[1])
    x = TensorInfo(table.dtype, shape) if shape is not None else unknown(table.dtype, 3)
    return inner, [x, *ctx.inputs[2:]], x


def _embedding_rnn_infer(ctx: OpContext) -> list[TensorInfo]:
    inner, infos, _ = _embedding_rnn_parts(ctx)
    return get("", inner.op_type).infer(OpContext(inner, infos, [None, *ctx.values[2:]], ctx.opset))


@op("EmbeddingRNN", domain=HETERO_DOMAIN, infer=_embedding_rnn_infer)
def embedding_rnn(ctx: OpContext) -> list[np.ndarray]:
    """A GRU / LSTM (attribute ``rnn``, with that op's attributes) whose X is an embedding table's rows (input 0,
    [V, I]) picked by ids (input 1, 2-D): ``Gather(table, ids, axis=0)``, then ``Transpose(perm=[1, 0, 2])`` when
    ``transpose`` (ids given batch-major), then the recurrent op on inputs 2.. as its inputs 1.. .
    ``hetero.ir.passes.fuse_embedding_rnn`` makes it, so a backend can project the table once instead of each run's
    rows (the romanizer's first GRU). The unfused ops' references composed."""
    x = _reference(ctx, "Gather", [ctx.array(0), ctx.array(1)], {"axis": 0})[0]
    if ctx.attr("transpose", 0):
        x = _reference(ctx, "Transpose", [x], {"perm": [1, 0, 2]})[0]
    inner, infos, _ = _embedding_rnn_parts(ctx)
    rest = [ctx.array(i) if ctx.has_input(i) else None for i in range(2, len(ctx.inputs))]
    infos = [TensorInfo(dtypes.from_numpy(x.dtype), x.shape), *infos[1:]]
    return get("", inner.op_type).reference(OpContext(inner, infos, [x, *rest], ctx.opset))


def _dw_pointwise_infer(ctx: OpContext) -> list[TensorInfo]:
    dw_attrs, _ = split_dw_pointwise_attrs(ctx.node.attrs)
    inner = Node("Conv", ["x", "w"], ["y"], dw_attrs, name=f"{ctx.node.name}/depthwise")
    (mid,) = get("", "Conv").infer(OpContext(inner, ctx.inputs[:2], ctx.values[:2], ctx.opset))
    w = input_info(ctx, 3)
    cout = None if w.shape is None else w.shape[0]
    return [TensorInfo(mid.dtype, None if mid.shape is None else (mid.shape[0], cout, *mid.shape[2:]))]


@op("DwPointwiseConv", domain=HETERO_DOMAIN, infer=_dw_pointwise_infer)
def dw_pointwise_conv(ctx: OpContext) -> list[np.ndarray]:
    """A depthwise FusedConv (inputs X, W, B; its attributes) and the 1x1 stride-1 FusedConv on its output (inputs W2,
    B2; its attributes prefixed ``pw_``), which ``hetero.ir.passes.fuse_dw_pointwise`` makes one node (the CPU runs
    them in one pass over bands of rows); the two references composed."""
    dw_attrs, pw_attrs = split_dw_pointwise_attrs(ctx.node.attrs)
    bias = ctx.array(2) if ctx.has_input(2) else None
    (mid,) = _reference(ctx, "FusedConv", [ctx.array(0), ctx.array(1), bias], dw_attrs, HETERO_DOMAIN)
    bias2 = ctx.array(4) if ctx.has_input(4) else None
    return _reference(ctx, "FusedConv", [mid, ctx.array(3), bias2], pw_attrs, HETERO_DOMAIN)
