"""A segment as the ONNX model the RKNN toolkit loads (``hetero.contract.onnx_export``), at an opset it reads.

rknn-toolkit2 2.5 reads opsets up to 19: the model is lowered to 19 when every op of the segment means the same
there (the same schema version at both opsets); otherwise it keeps the graph's opset and the toolkit says whether it
reads it.
"""

from __future__ import annotations

from hetero.contract import Segment
from hetero.contract.onnx_export import segment_to_onnx as export

RKNN_MAX_OPSET = 19
# What hetero's fused ops are written out as, beside the segment's own ops.
_EXPANSION_OPS = frozenset({"Conv", "MatMul", "Add", "Sigmoid", "Mul", "Clip", "Relu", "Tanh", "HardSwish",
                            "LeakyRelu", "HardSigmoid"})


def _opset(segment: Segment) -> int:
    from onnx import defs

    opset = segment.graph.opset("")
    if opset <= RKNN_MAX_OPSET:
        return opset
    for op in _EXPANSION_OPS | {n.op_type for n in segment.graph.nodes if n.domain == ""}:
        try:
            if defs.get_schema(op, opset).since_version != defs.get_schema(op, RKNN_MAX_OPSET).since_version:
                return opset
        except defs.SchemaError:
            return opset
    return RKNN_MAX_OPSET


def segment_to_onnx(segment: Segment) -> bytes:
    """The serialized ONNX model of ``segment`` for rknn-toolkit2 (deterministic: a cache key's input)."""
    opset = _opset(segment)
    return export(segment, producer="hetero-rknn", opset=opset, ir_version=9 if opset <= 19 else 10)
