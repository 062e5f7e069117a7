"""Which nodes the RKNN compiler takes: static float32 tensors, the ops of Rockchip's ONNX support list, and the NPU
limits that list states (Conv kernels 1-31, strides 1-7, pads 0-15; pools; Softmax on axis 1...).

The list is rknn-toolkit2's "ONNX OPs supported" document; an op outside it stays on the next backend with the
reason in ``Session.explain()``. A segment the compiler still refuses fails its build with the toolkit's message.
"""

from __future__ import annotations

from collections.abc import Callable

from hetero.contract import SUPPORTED, NodeInfo, Support, dtypes, unsupported
from hetero.contract.graph import HETERO_DOMAIN

# Ops the toolkit converts to NPU layers (its own CPU fallback on the board is not counted as "taken").
_PLAIN = frozenset({
    "Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "Sqrt", "Exp",
    "Relu", "LeakyRelu", "PRelu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Elu", "Softplus", "Clip",
    "Conv", "ConvTranspose", "Gemm", "MatMul", "BatchNormalization", "InstanceNormalization", "LRN",
    "AveragePool", "MaxPool", "GlobalAveragePool", "GlobalMaxPool",
    "Concat", "Split", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "DepthToSpace", "SpaceToDepth",
    "Slice", "Pad", "Resize", "Softmax", "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin",
})
# hetero's fused ops are the standard ops they replaced (the export writes them out again).
_FUSED = frozenset({"FusedConv", "FusedMatMul", "ConvResidual"})
_FUSED_ACTIVATIONS = frozenset({"Relu", "Sigmoid", "Tanh", "HardSwish", "LeakyRelu", "HardSigmoid", "Clip", "Silu"})

# Inputs that must be constants (weights, shapes) for the compiler to take the op.
_CONSTANT_INPUTS: dict[str, tuple[int, ...]] = {
    "Conv": (1, 2), "ConvTranspose": (1, 2), "FusedConv": (1, 2), "Gemm": (1, 2), "PRelu": (1,),
    "BatchNormalization": (1, 2, 3, 4), "InstanceNormalization": (1, 2), "Reshape": (1,), "Squeeze": (1,),
    "Unsqueeze": (1,), "Slice": (1, 2, 3, 4), "Pad": (1, 2, 3), "Resize": (1, 2, 3), "Split": (1,),
    "Clip": (1, 2), "ReduceMean": (1,), "ReduceSum": (1,), "ReduceMax": (1,), "ReduceMin": (1,),
    "FusedMatMul": (1, 2), "ConvResidual": (1, 2),
}


def _within(values: list[int], low: int, high: int) -> bool:
    return all(low <= v <= high for v in values)


def _conv_limits(node: NodeInfo) -> Support:
    weight = node.constants.get(1)
    kernel = list(weight.shape[2:]) if weight is not None else []
    strides = list(node.attr("strides", [1] * len(kernel)))
    pads = list(node.attr("pads", [0] * 2 * len(kernel)))
    if len(kernel) not in (1, 2):
        return unsupported(f"{node.op_type} with a {len(kernel)}-D kernel (the RKNN NPU convolves 1-D and 2-D)")
    if not _within(kernel, 1, 31):
        return unsupported(f"{node.op_type} kernel {kernel} (RKNN NPU limit: 1..31)")
    if node.op_type == "ConvTranspose":
        if any(s not in (2, 4, 8) for s in strides):
            return unsupported(f"ConvTranspose strides {strides} (RKNN NPU limit: 2, 4 or 8)")
    elif not _within(strides, 1, 7):
        return unsupported(f"{node.op_type} strides {strides} (RKNN NPU limit: 1..7)")
    if not _within(pads, 0, 15):
        return unsupported(f"{node.op_type} pads {pads} (RKNN NPU limit: 0..15)")
    return SUPPORTED


def _pool_limits(node: NodeInfo) -> Support:
    if node.attr("auto_pad", "NOTSET") != "NOTSET":
        return unsupported(f"{node.op_type} auto_pad={node.attr('auto_pad')} (RKNN takes NOTSET)")
    if node.attr("ceil_mode", 0):
        return unsupported(f"{node.op_type} ceil_mode=1 (RKNN takes 0)")
    if not _within(list(node.attr("strides", [1])), 1, 8) or not _within(list(node.attr("pads", [0])), 0, 7):
        return unsupported(f"{node.op_type} strides/pads beyond the RKNN NPU limits (1..8 / 0..7)")
    if node.op_type == "MaxPool" and any(d != 1 for d in node.attr("dilations", [1])):
        return unsupported("MaxPool with dilations (RKNN takes 1)")
    if node.op_type == "AveragePool" and not node.attr("count_include_pad", 0) and any(node.attr("pads", [0])):
        return unsupported("AveragePool with pads and count_include_pad=0 (RKNN takes count_include_pad=1)")
    return SUPPORTED


def _softmax_limits(node: NodeInfo) -> Support:
    rank = node.inputs[0].rank if node.inputs[0] is not None else None
    axis = node.attr("axis", -1 if node.opset >= 13 else 1)
    if rank is not None and axis < 0:
        axis += rank
    if axis != (rank or 0) - 1 and axis != 1:
        return unsupported(f"Softmax on axis {axis} (RKNN takes axis 1 or the last)")
    return SUPPORTED


def _slice_limits(node: NodeInfo) -> Support:
    steps = node.constants.get(4)
    if steps is not None and any(int(s) != 1 for s in steps.ravel()):
        return unsupported("Slice with steps other than 1 (RKNN NPU limit)")
    return SUPPORTED


def _pad_limits(node: NodeInfo) -> Support:
    if node.attr("mode", "constant") != "constant":
        return unsupported(f"Pad mode={node.attr('mode')} (RKNN takes constant)")
    return SUPPORTED


def _fused_limits(node: NodeInfo) -> Support:
    activation = node.attr("activation")
    if activation is not None and activation not in _FUSED_ACTIVATIONS:
        return unsupported(f"{node.op_type} with activation {activation}")
    return _conv_limits(node) if node.op_type in ("FusedConv", "ConvResidual") else SUPPORTED


_LIMITS: dict[str, Callable[[NodeInfo], Support]] = {
    "Conv": _conv_limits, "ConvTranspose": _conv_limits, "FusedConv": _fused_limits, "FusedMatMul": _fused_limits,
    "ConvResidual": _fused_limits,
    "MaxPool": _pool_limits, "AveragePool": _pool_limits, "Softmax": _softmax_limits, "Slice": _slice_limits,
    "Pad": _pad_limits,
}


# Ops that only move data: a segment of nothing else has no work for the NPU (a worker round trip costs more).
LAYOUT_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Concat", "Split", "Slice",
                        "DepthToSpace", "SpaceToDepth", "Pad"})


def rknn_takes(domain: str, op_type: str) -> bool:
    """Whether the op is in the RKNN NPU's op list at all (``rknn_supports`` then checks each node's limits)."""
    return (domain == "" and op_type in _PLAIN) or (domain == HETERO_DOMAIN and op_type in _FUSED)


def rknn_supports(node: NodeInfo) -> Support:
    """Yes for a node the RKNN compiler takes onto the NPU, else no with the reason ``explain()`` shows."""
    if not rknn_takes(node.domain, node.op_type):
        return unsupported(f"{node.op_type} is not in the RKNN NPU's op list")
    constant_only = _CONSTANT_INPUTS.get(node.op_type, ())
    for i, info in enumerate(node.inputs):
        if info is None:
            continue
        if i in constant_only:
            if i not in node.constants:
                return unsupported(f"{node.op_type} input {i} is computed at run time (RKNN needs it constant)")
            continue
        if not info.is_static:
            return unsupported(f"{node.op_type} input {i} has no static shape ({info}): the RKNN compiler needs "
                               "static shapes")
        if info.dtype != dtypes.float32:
            return unsupported(f"{node.op_type} on {info.dtype} (the rknn backend takes float32 tensors)")
    if not node.inputs or all(i in node.constants or info is None for i, info in enumerate(node.inputs)):
        return unsupported(f"{node.op_type} reads only constants (nothing for the NPU to do)")
    for info in node.outputs:
        if not info.is_static or info.dtype != dtypes.float32:
            return unsupported(f"{node.op_type} output {info} (the rknn backend takes static float32 tensors)")
    check = _LIMITS.get(node.op_type)
    try:
        return check(node) if check is not None else SUPPORTED
    except (TypeError, ValueError, IndexError, AttributeError) as exc:  # a malformed node: the reference names it
        return unsupported(f"{node.op_type}: {type(exc).__name__} in the RKNN limit check: {exc}")
