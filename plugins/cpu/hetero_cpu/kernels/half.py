"""float16 nodes on the float32 kernels: inputs cast up, the float32 kernel, outputs cast down (rounded to half once).

The cpu has no float16 arithmetic kernels: a float16 Conv / MatMul / Softmax ran on numpy's emulated half arithmetic
(slovorez's Keras mixed-precision CNN: 4.3x onnxruntime). onnxruntime's CPU provider runs such nodes in float32
between Casts as well (its InsertCastTransformer); each output here is rounded to float16 as the node writes it, so
the next node reads the float16 value the model's graph says it reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from hetero.contract import Kernel, NodeInfo, Tensor, TensorInfo, dtypes
from hetero.contract.opforms import HALF_UPCAST_OPS

from .. import _native

# The ops whose float32 kernel computes the float16 node's result: arithmetic and layers, not Cast / movement ops
# (those run natively). The same set float16_chains_to_float32 keeps in float32 between the casts it adds.
UPCAST_OPS = HALF_UPCAST_OPS


def to_float32(a: np.ndarray) -> np.ndarray:
    """A float16 array as float32: the native conversion (F16C / AVX-512, numpy's astype bit for bit; numpy's own
    loop emulates it at ~3-10 ns a value) where the array is contiguous."""
    if not a.flags.c_contiguous:
        return a.astype(np.float32)
    out = np.empty(a.shape, np.float32)
    _native.half_to_float(a, out)
    return out


def store_half(out: np.ndarray, a: np.ndarray) -> None:
    """out[...] = a (float32) rounded to float16 (to nearest even), natively where both are contiguous."""
    if out.flags.c_contiguous and a.flags.c_contiguous and out.shape == a.shape:
        _native.float_to_half(a, out)
    else:
        np.copyto(out, a, casting="same_kind")


def _up(info: TensorInfo | None) -> TensorInfo | None:
    return dataclasses.replace(info, dtype=dtypes.float32) if info is not None and info.dtype == dtypes.float16 \
        else info


def _up_all(infos: Sequence[TensorInfo]) -> list[TensorInfo]:
    return [dataclasses.replace(i, dtype=dtypes.float32) if i.dtype == dtypes.float16 else i for i in infos]


def float32_form(node: NodeInfo) -> NodeInfo | None:
    """The node with its float16 tensors and constants as float32, where the op is in UPCAST_OPS and it has one;
    else None."""
    if node.domain != "" or node.op_type not in UPCAST_OPS:
        return None
    infos = [*node.inputs, *node.outputs]
    if not any(i is not None and i.dtype == dtypes.float16 for i in infos):
        return None
    constants = {i: (v.astype(np.float32) if v.dtype == np.float16 else v) for i, v in node.constants.items()}
    return NodeInfo(node.node, [_up(i) for i in node.inputs], _up_all(node.outputs), constants, node.opset)


class HalfUpcast:
    """A float16 node run by the float32 kernel ``inner`` (made for ``float32_form(node)``)."""

    def __init__(self, node: NodeInfo, inner: Kernel) -> None:
        self.info = node
        self.inner = inner
        self.half_in = [i is not None and i.dtype == dtypes.float16 for i in node.inputs]
        self.half_out = [o.dtype == dtypes.float16 for o in node.outputs]

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None:
        self.inner.prepare([_up(i) for i in inputs], _up_all(outputs))

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        ins: list[Tensor | None] = []
        for t, half in zip(inputs, self.half_in, strict=False):
            ins.append(Tensor.from_numpy(to_float32(t.numpy())) if t is not None and half else t)
        outs = [Tensor(np.empty(o.shape, np.float32), o.shape, dtypes.float32) if half else o
                for o, half in zip(outputs, self.half_out, strict=True)]
        self.inner.run(ins, outs)
        for o, t, half in zip(outputs, outs, self.half_out, strict=True):
            if half:
                store_half(o.buffer, t.buffer)
