"""Which nodes the HTP takes through QNN: a table of ops with their conditions, each entry verified by compiling a
one-node model with CPU fallback disabled on QNN 2.51's HTP simulator (tests/plugins/hexagon/test_qnn_support.py
runs the conformance cases of every claimed op). What the table refuses stays on the next backend, with the reason.
"""

from __future__ import annotations

from collections.abc import Callable

from hetero.contract import SUPPORTED, NodeInfo, Support, dtypes, unsupported
from hetero.contract.graph import HETERO_DOMAIN

MAX_RANK = 5  # the HTP's tensors have at most 5 dims
VALUE_DTYPES = {dtypes.float32, dtypes.float16, dtypes.int32, dtypes.int64, dtypes.bool_}


def _gemm(node: NodeInfo) -> Support:
    # QNN maps Gemm to FullyConnected: scaled products and transposed A are refused (seen on QNN 2.51)
    if node.attr("alpha", 1.0) != 1.0 or node.attr("beta", 1.0) != 1.0 or node.attr("transA", 0):
        return unsupported("Gemm with alpha / beta other than 1 or transA (QNN's FullyConnected has neither)")
    return SUPPORTED


ACTIVATIONS = {"Relu", "Sigmoid", "Tanh", "LeakyRelu", "HardSwish", "HardSigmoid", "Clip", "Silu", "Elu"}


def _fused(node: NodeInfo) -> Support:
    kind = node.attr("activation")
    if kind is not None and kind not in ACTIVATIONS:
        return unsupported(f"{node.op_type} with activation {kind} (the HTP table has {sorted(ACTIVATIONS)})")
    return SUPPORTED


def _always(node: NodeInfo) -> Support:
    return SUPPORTED


def _gelu(node: NodeInfo) -> Support:
    # hetero's passes write a Gelu for a GELU spelled out in elementwise nodes, whatever the model's opset; the
    # segment is exported at that opset, where ONNX has no Gelu before 20
    if node.opset < 20:
        return unsupported(f"Gelu in a model of opset {node.opset} (ONNX has Gelu from opset 20)")
    return SUPPORTED


# op (ONNX domain) -> extra condition. Not here because QNN 2.51's HTP refused them: Erf, Acos, Asin, Softsign,
# ReduceProd (Mish: onnxruntime 1.32 has no schema for it at opset 17).
Check = Callable[[NodeInfo], Support]
ONNX_OPS: dict[str, Check] = {op: _always for op in (
    "Abs", "Add", "Atan", "AveragePool", "BatchNormalization", "Cast", "Clip", "Concat", "Conv", "ConvTranspose",
    "Cos", "DepthToSpace", "Div", "Elu", "Equal", "Exp", "Expand", "Flatten", "Floor", "Gather", "Gelu",
    "GlobalAveragePool", "GlobalMaxPool", "Greater", "HardSigmoid", "HardSwish", "InstanceNormalization",
    "LayerNormalization", "LeakyRelu", "Log", "LogSoftmax", "MatMul", "Max", "MaxPool", "Min", "Mul", "Neg", "Pad",
    "Pow", "PRelu", "Reciprocal", "ReduceMax", "ReduceMean", "ReduceMin", "ReduceSum", "Relu", "Reshape", "Resize",
    "Round", "Selu", "Sigmoid", "Sign", "Sin", "Slice", "Softmax", "Softplus", "SpaceToDepth", "Sqrt", "Squeeze",
    "Sub", "Tanh", "Tile", "Transpose", "Unsqueeze", "Where",
)}
ONNX_OPS["Gemm"] = _gemm
ONNX_OPS["Gelu"] = _gelu
HETERO_OPS: dict[str, Check] = {"FusedConv": _fused, "FusedMatMul": _fused, "ConvResidual": _fused}


def _op_table(domain: str) -> dict[str, Check]:
    return HETERO_OPS if domain == HETERO_DOMAIN else ONNX_OPS if domain == "" else {}


def htp_takes(domain: str, op_type: str) -> bool:
    """Whether the op is in the HTP op table at all (``htp_supports`` then checks each node)."""
    return op_type in _op_table(domain)


def htp_supports(node: NodeInfo) -> Support:
    check = _op_table(node.domain).get(node.op_type)
    if check is None:
        return unsupported(f"{node.op_type} is not in the HTP op table (QNN's HTP refuses it, or it is unverified)")
    for info in [*node.inputs, *node.outputs]:
        if info is None:
            continue
        if info.shape is None or any(not isinstance(d, int) for d in info.shape):
            return unsupported(f"{node.op_type} with a dynamic shape {info.shape} (the HTP compiles static shapes)")
        if len(info.shape) > MAX_RANK:
            return unsupported(f"{node.op_type} on rank {len(info.shape)} (the HTP takes rank <= {MAX_RANK})")
        if info.dtype not in VALUE_DTYPES:
            return unsupported(f"{node.op_type} on {info.dtype.name} (the HTP computes float in fp16 or int8)")
    return check(node)
