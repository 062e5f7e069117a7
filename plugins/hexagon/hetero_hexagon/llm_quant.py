"""Quantized weights for the HTP decoder graphs, the way Qualcomm's runtimes run LLMs on the HTP: every linear layer
is a QDQ MatMul with 16-bit activations and 8- or 4-bit block weights (A16W8 / A16W4), the rest of the graph (norms,
RoPE, attention, SwiGLU) stays float and runs in fp16 — one mixed-precision graph, no CPU fallback.

What QNN 2.51's HTP takes (tried on its simulator with the fallback disabled): a MatMul whose activation input and
output are uint16 QDQ and whose weight is ``DequantizeLinear`` of int8 or int4 with per-channel or block-wise
scales (``block_size`` along K); it refuses a per-channel or block-wise weight ``DequantizeLinear`` feeding a float
MatMul (weight-only quantization), so the activations are quantized too.

The weights are hetero's own block formats (``hetero.contract.quant``: ``q8`` int8 and ``q4`` int4, symmetric,
block 32, one f16 scale per block — byte-identical to GGUF's Q8_0 / Q4_0), so the HTP computes with exactly the
weights hetero's cpu backend uses when the model is loaded with the same ``quant``. The activations' uint16 scales
are static: a calibration run of the float graph (onnxruntime's CPU, in the QNN worker) records each linear
layer's input and output magnitude.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hetero.contract import UnsupportedOp
from hetero.contract.quant import QuantFormat, dequantize, parse_quant, quantize

WEIGHT_MODES = ("fp16", "q8", "q4")  # fp16: float weights run in fp16; q8 / q4: hetero's block-32 formats
ACTIVATION_MARGIN = 2.0  # calibrated |max| x this is the uint16 range: decode steps may exceed the calibration's
UINT16_HALF = 32768


def weight_mode(spec: str | None) -> str:
    """``fp16`` for float weights (None), else the hetero quant spec as the HTP graphs take it (``q8``, ``q4``:
    symmetric, block 32); other specs are an UnsupportedOp naming what is taken."""
    if spec in (None, "fp16", "f16", "f32"):
        return "fp16"
    fmt = parse_quant(spec)
    if fmt is None or not fmt.symmetric or fmt.block_size != 32:
        raise UnsupportedOp(f"quant {spec!r}: the HTP decoder graphs take q8 or q4 (symmetric, block 32: hetero's "
                            "default formats, GGUF's Q8_0 / Q4_0) or float weights")
    return fmt.wtype


def block_format(mode: str) -> QuantFormat:
    return QuantFormat(bits=8 if mode == "q8" else 4, block_size=32, symmetric=True)


def embedding_table(w: np.ndarray, mode: str) -> np.ndarray:
    """The float32 embedding table the Gather reads: in q8 / q4, the values of hetero's quantized table (as the cpu
    backend's quantized embedding gives them), stored float because the HTP's Gather reads no block format."""
    w = np.asarray(w, np.float32)
    if mode == "fp16":
        return w
    fmt = block_format(mode)
    return dequantize(quantize(w, fmt), fmt, w.shape[1]).reshape(w.shape).astype(np.float32)


def block_weight(w: np.ndarray, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """``w[N, K]`` (a linear layer's weight, output rows first) in hetero's ``mode`` format as the HTP's
    ``DequantizeLinear`` reads it: signed integers ``[K, N]`` (MatMul's weight layout) and float32 scales
    ``[K / 32, N]`` (blocks along K)."""
    fmt = block_format(mode)
    n, k = w.shape
    if k % fmt.block_size:
        raise UnsupportedOp(f"a linear layer with {k} inputs: the HTP's block weights need a multiple of "
                            f"{fmt.block_size}")
    blocks = quantize(np.asarray(w, np.float32), fmt).reshape(n, k // fmt.block_size, fmt.block_bytes)
    scales = blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)  # [N, K / B]
    payload = blocks[..., 2:]
    if fmt.bits == 8:
        q = payload.view(np.int8)
    else:  # byte j: element j in the low nibble, j + 16 in the high one; stored value q + 8
        q = np.concatenate([payload & 0x0F, payload >> 4], axis=-1).astype(np.int8) - 8
    return np.ascontiguousarray(q.reshape(n, k).T), np.ascontiguousarray(scales.T)


def int4_tensor(name: str, values: np.ndarray) -> Any:
    """An ONNX INT4 initializer (two values a byte, low nibble first) of the int8 ``values`` in -8..7."""
    from onnx import TensorProto, helper

    flat = values.astype(np.int8).ravel()
    if flat.size % 2:
        flat = np.append(flat, np.int8(0))
    packed = ((flat[0::2].astype(np.uint8) & 0x0F) | ((flat[1::2].astype(np.uint8) & 0x0F) << 4)).tobytes()
    return helper.make_tensor(name, TensorProto.INT4, values.shape, packed, raw=True)


def activation_scale(absmax: float) -> np.float32:
    """The uint16 scale (zero point 32768) of an activation whose calibrated magnitude is ``absmax``."""
    return np.float32(max(absmax, 1e-6) * ACTIVATION_MARGIN / (UINT16_HALF - 1))
