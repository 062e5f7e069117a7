"""onnxruntime as an exact int8 reference on every x86 CPU.

onnxruntime's x86 u8 x s8 kernels on CPUs without VNNI (AVX2, and AVX-512 before VNNI) multiply with ``vpmaddubsw``,
which adds two u8 x s8 products into a saturating int16 (its quantization docs call it the saturation issue): with
int8 weights its results there are wrong wherever a pair of products passes 32767 (seen on a Zen 3 host: 6.6 off on
outputs of ~18). Its u8 x u8 kernels widen to int16 first and are exact. So on such a CPU the tests give onnxruntime
the same model with every int8 weight moved to uint8 (q + 128 and zero point + 128): the same integers, so the
same exact sums as onnxruntime computes on a VNNI CPU, and hetero is held to them bit for bit as before.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

# (domain, op) -> (weight input, its zero point input) pairs; "" is the default ONNX domain
WEIGHTS: dict[tuple[str, str], tuple[tuple[int, int], ...]] = {
    ("", "MatMulInteger"): ((1, 3),),
    ("", "ConvInteger"): ((1, 3),),
    ("", "QLinearMatMul"): ((3, 5),),
    ("", "QLinearConv"): ((3, 5),),
    ("", "DequantizeLinear"): ((0, 2),),
    ("com.microsoft", "DynamicQuantizeMatMul"): ((1, 3),),
    ("com.microsoft", "MatMulIntegerToFloat"): ((1, 5),),
    ("com.microsoft", "QGemm"): ((3, 5),),
    ("com.microsoft", "QAttention"): ((1, 7),),
    ("com.microsoft", "DynamicQuantizeLSTM"): ((1, 9), (2, 11)),
}
# the scale beside each weight, whose shape a missing zero point takes
SCALES: dict[tuple[str, str], dict[int, int]] = {
    ("", "QLinearMatMul"): {3: 4}, ("", "QLinearConv"): {3: 4}, ("", "DequantizeLinear"): {0: 1},
    ("com.microsoft", "DynamicQuantizeMatMul"): {1: 2}, ("com.microsoft", "MatMulIntegerToFloat"): {1: 3},
    ("com.microsoft", "QGemm"): {3: 4}, ("com.microsoft", "QAttention"): {1: 4},
    ("com.microsoft", "DynamicQuantizeLSTM"): {1: 8, 2: 10},
}


@functools.cache
def saturates() -> bool:
    """Whether onnxruntime's u8 x s8 products can saturate here: an x86 CPU without a VNNI dot product."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i686", "x86"):
        return False
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False  # not Linux: no way to tell; keep the model as it is
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return not {"avx512_vnni", "avx_vnni", "amx_int8"} & set(flags)


def _shifted(values: np.ndarray) -> np.ndarray:
    return (values.astype(np.int16) + 128).astype(np.uint8)


def exact(model: onnx.ModelProto, feeds: dict[str, np.ndarray] | None = None,
          ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The model (and feeds) onnxruntime computes exactly here: unchanged where it does not saturate; else a copy
    whose int8 weights (initializers or feeds) and their zero points are uint8 + 128."""
    feeds = dict(feeds or {})
    if not saturates():
        return model, feeds
    original = model
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    inputs = {v.name: v for v in graph.input}
    done: dict[str, str] = {}  # int8 name -> its uint8 copy's name

    def to_uint8(name: str) -> str | None:
        if name in done:
            return done[name]
        if name in inits and inits[name].data_type == TensorProto.INT8:
            new = name + "__u8"
            graph.initializer.append(numpy_helper.from_array(_shifted(numpy_helper.to_array(inits[name])), new))
        elif name in feeds and feeds[name].dtype == np.int8 and name in inputs:
            new = name
            feeds[name] = _shifted(feeds[name])
            inputs[name].type.tensor_type.elem_type = TensorProto.UINT8
        else:
            return None  # computed at run time or not int8: left as it is
        done[name] = new
        return new

    for node in graph.node:
        key = (node.domain if node.domain != "ai.onnx" else "", node.op_type)
        for w_at, zp_at in WEIGHTS.get(key, ()):
            if w_at >= len(node.input) or not node.input[w_at]:
                continue
            new_w = to_uint8(node.input[w_at])
            if new_w is None:
                continue
            while len(node.input) <= zp_at:
                node.input.append("")
            if node.input[zp_at]:
                new_zp = to_uint8(node.input[zp_at])
                if new_zp is None:
                    raise ValueError(f"{node.name}: the int8 weight's zero point {node.input[zp_at]!r} is not a "
                                     "constant or a feed")
            else:  # a missing zero point is 0 of the weight's type: 128 once it is uint8, shaped like the scale
                scale_at = SCALES.get(key, {}).get(w_at)
                shape: tuple[int, ...] = ()
                if scale_at is not None and node.input[scale_at] in inits:
                    shape = tuple(inits[node.input[scale_at]].dims)
                new_zp = f"{node.name or node.op_type}_{w_at}__zp_u8"
                graph.initializer.append(numpy_helper.from_array(np.full(shape, 128, np.uint8), new_zp))
            node.input[w_at], node.input[zp_at] = new_w, new_zp
    if not done:
        return original, dict(feeds)
    return model, feeds


def exact_bytes(model: Any) -> Any:
    """A model path or serialized bytes, as onnxruntime should load them here (the same object where it is exact
    already or the model has no int8 weight to move)."""
    if not saturates():
        return model
    proto = onnx.load(str(model)) if not isinstance(model, bytes) else onnx.ModelProto.FromString(model)
    moved, _ = exact(proto)
    return model if moved is proto else moved.SerializeToString()
