"""A segment as an ONNX model the RKNN toolkit loads (``hetero.contract.onnx_export``: hetero's fused ops written out
as the standard ops they replaced, its weights, its inputs and outputs with their static shapes).

The opset is lowered to 19 (the newest rknn-toolkit2 2.5 reads) when every op of the segment means the same there;
otherwise the model keeps the graph's opset and the toolkit says whether it reads it.
"""

from __future__ import annotations

from hetero.contract import Segment, onnx_export

RKNN_MAX_OPSET = 19


def _opset(segment: Segment) -> int:
    from onnx import defs

    opset = segment.graph.opset("")
    if opset <= RKNN_MAX_OPSET:
        return opset
    ops = {"Conv", "MatMul", "Add", "Sigmoid", "Mul", "Clip"} | {n.op_type for n in segment.graph.nodes
                                                                 if n.domain == ""}
    for op in ops:
        try:
            if defs.get_schema(op, opset).since_version != defs.get_schema(op, RKNN_MAX_OPSET).since_version:
                return opset
        except defs.SchemaError:
            return opset
    return RKNN_MAX_OPSET


def segment_to_onnx(segment: Segment) -> bytes:
    """The serialized ONNX model of ``segment`` (deterministic: the same segment gives the same bytes)."""
    opset = _opset(segment)
    # ir_version: what the toolkit's onnx 1.18 reads for these opsets
    return onnx_export.segment_to_onnx(segment, producer="hetero-rknn", opset=opset,
                                       ir_version=9 if opset <= 19 else 10)
