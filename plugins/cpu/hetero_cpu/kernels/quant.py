"""Quantized ONNX ops on the native int8 kernels (``src/qlinear*.cpp``): QuantizeLinear / DequantizeLinear (one scale
and zero point), DynamicQuantizeLinear, MatMulInteger, ConvInteger,
the fused MatMulInteger -> Cast -> Mul of dynamically quantized models (``hetero::MatMulIntegerScaled``, made by
``hetero.ir.passes.fuse_matmul_integer_scale``; ``hetero::ConvIntegerScaled`` likewise, with the int32 bias of a
quantized Conv), QLinearMatMul and QLinearConv.

Constant weights are packed once (8-bit panels, column sums and zero points), when the kernel is made. Integer
results are exact; the requantizing ops round like onnxruntime (float32 multiplier ``a_scale * b_scale / y_scale``,
ties to even, saturated). Configurations they decline (weights computed at run time, scales per row of A, 3-D
convolutions) stay on the numpy reference.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from hetero.contract import SUPPORTED, Backend, NodeInfo, Support, Tensor, TensorInfo, dtypes, static_shape, unsupported

from .. import _native
from .common import Call, CallKernel, noop
from .nn import _pads_nd


def _constant_8bit(node: NodeInfo, index: int, what: str, ndim: tuple[int, ...]) -> Support:
    value = node.constants.get(index)
    if value is None:
        return unsupported(f"{node.op_type} with {what} computed at run time (cpu packs constant weights)")
    if value.dtype not in (np.uint8, np.int8) or value.ndim not in ndim:
        return unsupported(f"{node.op_type} {what} of dtype {value.dtype}, rank {value.ndim}")
    return SUPPORTED


def _constant_or_none(node: NodeInfo, index: int) -> np.ndarray | None:
    """A constant optional input (None when absent); a run-time value there makes ``accepts`` refuse first."""
    return node.constants.get(index)


def _single_values(node: NodeInfo, indices: tuple[int, ...]) -> Support:
    """The scales / zero points the native stage takes as one value each (a per-row one stays on the reference)."""
    for i in indices:
        info = node.inputs[i] if i < len(node.inputs) else None
        if info is not None and info.is_static and int(np.prod(static_shape(info), dtype=np.int64)) != 1:
            return unsupported(f"{node.op_type} with input {i} of shape {static_shape(info)} (cpu: one value)")
    return SUPPORTED


def _optional_is_constant(node: NodeInfo, index: int, what: str) -> Support:
    if len(node.node.inputs) > index and node.node.inputs[index] and index not in node.constants:
        return unsupported(f"{node.op_type} with {what} computed at run time")
    return SUPPORTED


class CpuDynamicQuantizeLinear(CallKernel):
    """min / max of x, then x quantized to uint8 with the scale and zero point they give (float32 arithmetic)."""

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        x = node.inputs[0]
        if x is not None and x.dtype != dtypes.float32:
            return unsupported(f"DynamicQuantizeLinear on {x.dtype} (cpu kernels take float32)")
        return SUPPORTED

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call:
        x = np.ascontiguousarray(inputs[0].numpy())
        return functools.partial(_native.dynamic_quantize, x, outputs[0].buffer, outputs[1].buffer,
                                 outputs[2].buffer)


def _per_tensor(node: NodeInfo, x_types: tuple, what: str) -> Support:
    """QuantizeLinear / DequantizeLinear with one scale and zero point, float32 on the float side, 8-bit integers on
    the other (per-axis / blocked parameters, other types and ``precision`` stay on the reference)."""
    x = node.inputs[0]
    if x is not None and x.dtype not in x_types:
        return unsupported(f"{node.op_type} of {x.dtype} (cpu: {what})")
    if node.attr("block_size", 0) or node.attr("precision", 0):
        return unsupported(f"{node.op_type} with block_size / precision (cpu: one scale)")
    scale = node.inputs[1] if len(node.inputs) > 1 else None
    if scale is not None and scale.dtype != dtypes.float32:
        return unsupported(f"{node.op_type} with a {scale.dtype} scale (cpu: float32)")
    for out in node.outputs:
        if out.dtype not in (dtypes.float32, dtypes.uint8, dtypes.int8):
            return unsupported(f"{node.op_type} to {out.dtype} (cpu: float32 / uint8 / int8)")
    return _single_values(node, (1, 2))


class _PerTensorKernel(CallKernel):
    """x -> y with one scale and zero point, by the native function ``convert``."""

    convert = staticmethod(_native.quantize_linear)

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call:
        zp = inputs[2].numpy() if len(inputs) > 2 and inputs[2] is not None else None
        return functools.partial(self.convert, np.ascontiguousarray(inputs[0].numpy()),
                                 np.ascontiguousarray(inputs[1].numpy()), zp, outputs[0].buffer)


class CpuQuantizeLinear(_PerTensorKernel):
    """float32 -> uint8 / int8 with one scale and zero point: round half to even, saturate."""

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        return _per_tensor(node, (dtypes.float32,), "float32 in")


class CpuDequantizeLinear(_PerTensorKernel):
    """uint8 / int8 -> float32 with one scale and zero point."""

    convert = staticmethod(_native.dequantize_linear)

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        return _per_tensor(node, (dtypes.uint8, dtypes.int8), "uint8 / int8 in")


class CpuGeluQuantizeLinear(CallKernel):
    """``hetero::GeluQuantizeLinear``: the Gelu kernel's floats quantized a block at a time while in L1 (native
    ``gelu_quantize``): the same bits as the Gelu and QuantizeLinear kernels."""

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        if node.attr("approximate", "none") not in ("none", "tanh"):
            return unsupported(f"GeluQuantizeLinear approximate={node.attr('approximate')!r}")
        verdict = _per_tensor(node, (dtypes.float32,), "float32 in")
        if verdict and (len(node.inputs) < 3 or node.inputs[2] is None):
            return unsupported("GeluQuantizeLinear without a zero point (cpu: its type names the output's)")
        return verdict

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call:
        out = outputs[0].buffer
        if out.size == 0:
            return noop
        return functools.partial(_native.gelu_quantize, np.ascontiguousarray(inputs[0].numpy()),
                                 np.ascontiguousarray(inputs[1].numpy()), inputs[2].numpy(), out,
                                 self.attr("approximate", "none") == "tanh")


class _PackedBMatMul(CallKernel):
    """A matmul whose B (input ``b``, zero point input ``b_zero_point``) is a constant 2-D 8-bit weight, packed once
    for the native int8 GEMM."""

    b = b_zero_point = 0

    @classmethod
    def _b_is_constant(cls, node: NodeInfo) -> Support:
        verdict = _constant_8bit(node, cls.b, "B", (2,))
        return _optional_is_constant(node, cls.b_zero_point, "b_zero_point") if verdict else verdict

    def __init__(self, node: NodeInfo, backend: Backend) -> None:
        super().__init__(node, backend)
        self.packed = _native.qpack_b(np.ascontiguousarray(node.constants[self.b]),
                                      _constant_or_none(node, self.b_zero_point))


class CpuMatMulInteger(_PackedBMatMul):
    """(A - a_zero_point) @ (B - b_zero_point) in int32, B a constant 2-D weight packed once."""

    b, b_zero_point = 1, 3

    @classmethod
    def accepts(cls, node: NodeInfo) -> Support:
        verdict = cls._b_is_constant(node)
        a = node.inputs[0]
        if verdict and (a is None or a.rank is None or a.rank > 2):  # per-row zero points are rows of a 2-D A
            verdict = _single_values(node, (2,))
        return verdict

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call:
        out = outputs[0].buffer
        if out.size == 0:
            return noop
        a = np.ascontiguousarray(inputs[0].numpy())
        zp = inputs[2].numpy() if len(inputs) > 2 and inputs[2] is not None else None
        return self._gemm(a, zp, inputs, out)

    def _gemm(self, a: np.ndarray, zp: np.ndarray | None, inputs: Sequence[Tensor | None], out: np.ndarray) -> Call:
        return functools.partial(_native.qgemm_i32, a, self.packed, zp, out)


class CpuMatMulIntegerScaled(CpuMatMulInteger):
    """float32(MatMulInteger) * scale [* factor] (one value or one per column each), plus an optional bias row, plus
    an optional addend (a residual): no int32 tensor. An addend of the output's shape is added in the GEMM's output
    stage; one that broadcasts is added after it. With B computed at run time (a QDQ attention's two activations,
    ``fuse_qdq_matmul``): A and B of one rank >= 2 and the same batch dims, one scale and zero point each, no bias
    or addend; each batch's B packed at each call (K x N bytes, small next to its M x K x N GEMM)."""

    @classmethod
    def accepts(cls, node: NodeInfo) -> Support:
        verdict = super().accepts(node) if 1 in node.constants else cls._runtime_b_accepts(node)
        if verdict and len(node.node.inputs) > 8 and node.node.inputs[8]:
            # fuse_matmul_integer_fake_quant's Q / DQ by one constant scale and zero point, and its bias row
            for index in (8, 9, 10):
                if len(node.node.inputs) > index and node.node.inputs[index] and index not in node.constants:
                    return unsupported(f"MatMulIntegerScaled with input {index} computed (cpu)")
            q_scale, q_zp = node.constants[8], node.constants.get(9)
            if q_scale.dtype != np.float32 or q_scale.size != 1 or q_zp is None or q_zp.size != 1 or \
                    q_zp.dtype not in (np.uint8, np.int8):
                return unsupported("MatMulIntegerScaled: q_scale float32 and q_zero_point 8-bit, one value each (cpu)")
            q_bias = node.constants.get(10)
            if q_bias is not None and (q_bias.dtype != np.float32 or q_bias.ndim != 1):
                return unsupported("MatMulIntegerScaled: q_bias a float32 row (cpu)")
        return verdict

    @staticmethod
    def _runtime_b_accepts(node: NodeInfo) -> Support:
        a, b = node.inputs[0], node.inputs[1]
        if a is None or b is None or a.dtype not in (dtypes.uint8, dtypes.int8) or \
                b.dtype not in (dtypes.uint8, dtypes.int8):
            return unsupported("MatMulIntegerScaled: 8-bit A and B (cpu)")
        if a.rank is None or a.rank != b.rank or a.rank < 2:
            return unsupported("MatMulIntegerScaled with B at run time: A and B of one rank >= 2 (cpu)")
        if any(node.node.inputs[5:6]) or any(node.node.inputs[7:8]):
            return unsupported("MatMulIntegerScaled with B at run time: no bias or addend (cpu)")
        for index in (2, 3, 4, 6):
            if len(node.node.inputs) > index and node.node.inputs[index] and index not in node.constants:
                return unsupported(f"MatMulIntegerScaled with B at run time: input {index} computed (cpu)")
        return _single_values(node, (2, 3, 4, 6))

    def __init__(self, node: NodeInfo, backend: Backend) -> None:
        if 1 in node.constants:
            super().__init__(node, backend)
        else:
            CallKernel.__init__(self, node, backend)
            self.packed = None

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call:
        call = self._product(inputs, outputs)
        if len(inputs) <= 8 or inputs[8] is None or outputs[0].buffer.size == 0:
            return call
        # the output's Q / DQ (and bias) on the product just written, while it is in cache
        out = outputs[0].buffer
        q_scale = np.ascontiguousarray(inputs[8].numpy(), np.float32).reshape(1)
        q_zp = np.ascontiguousarray(inputs[9].numpy()).reshape(1)
        q_bias = np.ascontiguousarray(inputs[10].numpy()) if len(inputs) > 10 and inputs[10] is not None else None
        fake_quant = functools.partial(_native.fake_quant, out, q_scale, q_zp, q_bias)

        def product_then_fake_quant() -> None:
            call()
            fake_quant()

        return product_then_fake_quant

    def _product(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call:
        if self.packed is not None:
            return super().calls(inputs, outputs)
        out = outputs[0].buffer
        if out.size == 0:
            return noop
        a, b = inputs[0].numpy(), inputs[1].numpy()
        azp = inputs[2].numpy() if len(inputs) > 2 and inputs[2] is not None else None
        bzp = inputs[3].numpy() if len(inputs) > 3 and inputs[3] is not None else None
        scale = np.ascontiguousarray(inputs[4].numpy(), np.float32).reshape(1)
        factor = np.ascontiguousarray(inputs[6].numpy(), np.float32).reshape(1) if len(inputs) > 6 and \
            inputs[6] is not None else None
        if a.shape[:-2] != b.shape[:-2] or not (a.flags.c_contiguous and b.flags.c_contiguous):
            # batch dims that broadcast (shapes known only now): the reference's arithmetic in numpy
            def broadcast() -> None:
                acc = np.matmul(a.astype(np.int32) - (0 if azp is None else azp.astype(np.int32)),
                                b.astype(np.int32) - (0 if bzp is None else bzp.astype(np.int32)))
                s = scale if factor is None else scale * factor
                out[...] = acc.astype(np.float32) * s

            return broadcast
        # every batch's B packed and multiplied in one native call (the batches split over the threads): the int8
        # GEMM even for MiniLM's 64 x 32 x 64 heads, which a Python loop of pack + GEMM calls per head lost on
        return functools.partial(_native.qgemm_batched_f32, a, b, azp, bzp, scale, factor, out)

    def _gemm(self, a: np.ndarray, zp: np.ndarray | None, inputs: Sequence[Tensor | None], out: np.ndarray) -> Call:
        scale = np.ascontiguousarray(inputs[4].numpy())
        bias = inputs[5].numpy() if len(inputs) > 5 and inputs[5] is not None else None
        factor = np.ascontiguousarray(inputs[6].numpy()) if len(inputs) > 6 and inputs[6] is not None else None
        addend = inputs[7].numpy() if len(inputs) > 7 and inputs[7] is not None else None
        shape = (*a.shape[:-1], out.shape[-1])  # the product's
        # the bound call reads the addend's memory at every run: a contiguous copy made here would go stale, so a
        # strided addend is added after the GEMM, as one that broadcasts
        if addend is None or (addend.shape == out.shape == shape and addend.flags.c_contiguous):
            return functools.partial(_native.qgemm_f32, a, self.packed, zp, scale, bias, out, factor, addend)
        product = np.empty(shape, np.float32)
        gemm = functools.partial(_native.qgemm_f32, a, self.packed, zp, scale, bias, product, factor)

        def gemm_then_add() -> None:
            gemm()
            np.add(product, addend, out=out)

        return gemm_then_add


def _requant_params(inputs: Sequence[Tensor | None], scale_a: int, scale_b: int, y: int) -> tuple[np.ndarray, ...]:
    return tuple(np.ascontiguousarray(inputs[i].numpy()) for i in (scale_a, scale_b, y, y + 1))


class CpuQLinearMatMul(_PackedBMatMul):
    """Quantized A @ constant quantized B, requantized to y_scale / y_zero_point."""

    b, b_zero_point = 3, 5

    @classmethod
    def accepts(cls, node: NodeInfo) -> Support:
        verdict = cls._b_is_constant(node)
        return _single_values(node, (1, 2, 6, 7)) if verdict else verdict

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call:
        out = outputs[0].buffer
        if out.size == 0:
            return noop
        a = np.ascontiguousarray(inputs[0].numpy())
        a_s, b_s, y_s, y_zp = _requant_params(inputs, 1, 4, 6)
        return functools.partial(_native.qgemm_requant, a, self.packed, inputs[2].numpy(), a_s, b_s, y_s, y_zp, out)


class _PackedConv(CallKernel):
    """A 2-D 8-bit convolution (1-D as H = 1) whose weight (input ``w``, zero point input ``w_zero_point``) is a
    constant packed once per group: im2col padded with x's zero point, the int8 GEMM per group, into NCHW."""

    w = w_zero_point = 0

    @classmethod
    def _w_is_constant(cls, node: NodeInfo) -> Support:
        verdict = _constant_8bit(node, cls.w, "w", (3, 4))
        return _optional_is_constant(node, cls.w_zero_point, "w_zero_point") if verdict else verdict

    def __init__(self, node: NodeInfo, backend: Backend) -> None:
        super().__init__(node, backend)
        weight = np.ascontiguousarray(node.constants[self.w])
        self.one_d = weight.ndim == 3
        if self.one_d:
            weight = np.ascontiguousarray(weight[:, :, None, :])
        self.kernel_shape = tuple(node.constants[self.w].shape[2:])
        self.strides = tuple(self.attr("strides", [1] * len(self.kernel_shape)))
        self.dilations = tuple(self.attr("dilations", [1] * len(self.kernel_shape)))
        self.weights = _native.qconv_pack(weight, _constant_or_none(node, self.w_zero_point),
                                          int(self.attr("group", 1)))

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None:
        spatial = static_shape(inputs[0])[2:]
        begin, end = _pads_nd(self.node.attrs, spatial, self.kernel_shape, self.strides, self.dilations)
        if self.one_d:
            self.pads = (0, begin[0], 0, end[0])
            self.native = ((1, self.strides[0]), (1, self.dilations[0]))
        else:
            self.pads = (begin[0], begin[1], end[0], end[1])
            self.native = (self.strides, self.dilations)

    def _operands(self, inputs: Sequence[Tensor | None], out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """x and the output as the native 2-D conv sees them (a 1-D conv's with H = 1)."""
        x = np.ascontiguousarray(inputs[0].numpy())
        return (x[:, :, None, :], out[:, :, None, :]) if self.one_d else (x, out)


class CpuQLinearConv(_PackedConv):
    """QLinearConv: the int32 bias added, requantized to y_scale / y_zero_point."""

    w, w_zero_point = 3, 5

    @classmethod
    def accepts(cls, node: NodeInfo) -> Support:
        verdict = cls._w_is_constant(node)
        if verdict:
            verdict = _optional_is_constant(node, 8, "bias")
        return _single_values(node, (1, 2, 6, 7)) if verdict else verdict

    def __init__(self, node: NodeInfo, backend: Backend) -> None:
        super().__init__(node, backend)
        bias = _constant_or_none(node, 8)
        self.bias = None if bias is None else np.ascontiguousarray(bias, dtype=np.int32)

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call:
        out = outputs[0].buffer
        if out.size == 0:
            return noop
        x, out = self._operands(inputs, out)
        x_s, w_s, y_s, y_zp = _requant_params(inputs, 1, 4, 6)
        strides, dilations = self.native
        return functools.partial(_native.qconv, x, self.weights, inputs[2].numpy(), x_s, w_s, y_s, y_zp, self.bias,
                                 strides, self.pads, dilations, out)


class CpuConvInteger(_PackedConv):
    """ConvInteger (dynamically quantized CNNs: DynamicQuantizeLinear -> ConvInteger -> Cast -> Mul): the exact int32
    sums, as the reference's."""

    w, w_zero_point = 1, 3

    @classmethod
    def accepts(cls, node: NodeInfo) -> Support:
        verdict = cls._w_is_constant(node)
        return _single_values(node, (2,)) if verdict else verdict

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call:
        out = outputs[0].buffer
        if out.size == 0:
            return noop
        x, out = self._operands(inputs, out)
        zp = inputs[2].numpy() if len(inputs) > 2 and inputs[2] is not None else None
        return self._conv(x, zp, inputs, out)

    def _conv(self, x: np.ndarray, zp: np.ndarray | None, inputs: Sequence[Tensor | None], out: np.ndarray) -> Call:
        strides, dilations = self.native
        return functools.partial(_native.qconv_i32, x, self.weights, zp, strides, self.pads, dilations, out)


class CpuConvIntegerScaled(CpuConvInteger):
    """``hetero::ConvIntegerScaled``: the int32 bias (one per channel, computed at run time) added and the scale
    applied in the conv's output stage; float32 out, the unfused nodes' values."""

    @classmethod
    def accepts(cls, node: NodeInfo) -> Support:
        verdict = super().accepts(node)
        if not verdict:
            return verdict
        verdict = _single_values(node, (4,))
        factor = _constant_or_none(node, 6)
        channels = node.constants[cls.w].shape[0]
        if verdict and len(node.inputs) > 6 and node.inputs[6] is not None and \
                (factor is None or factor.size not in (1, channels)):  # one per output channel: a QDQ model's
            return unsupported(f"ConvIntegerScaled: factor must be a constant of 1 or {channels} values (cpu)")
        return verdict

    def _conv(self, x: np.ndarray, zp: np.ndarray | None, inputs: Sequence[Tensor | None], out: np.ndarray) -> Call:
        scale = inputs[4].numpy()
        bias = inputs[5].numpy() if len(inputs) > 5 and inputs[5] is not None else None
        factor = inputs[6].numpy() if len(inputs) > 6 and inputs[6] is not None else None
        strides, dilations = self.native
        return functools.partial(_native.qconv_f32, x, self.weights, zp, scale, factor, bias, strides, self.pads,
                                 dilations, out)


# Unary ops BroadcastUnaryMatMul takes, and those among them that never decrease (the native kernel then predicts
# DynamicQuantizeLinear's range from the operands' column extremes instead of a first pass over every row).
_CHAIN_UNARY = {"": "", "Tanh": "tanh", "Sigmoid": "sigmoid", "Relu": "relu"}
_CHAIN_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul"}


def _row_offsets(shape: tuple[int, ...], lead: tuple[int, ...]) -> np.ndarray:
    """Element offsets of an operand's rows (its last axis) for every row of the broadcast leading axes ``lead``."""
    own = (1,) * (len(lead) + 1 - len(shape)) + tuple(shape[:-1]) if shape else (1,) * len(lead)
    rows = np.arange(int(np.prod(own, dtype=np.int64)), dtype=np.int64).reshape(own)
    width = shape[-1] if shape else 1
    return np.ascontiguousarray(np.broadcast_to(rows, lead).reshape(-1) * width)


class CpuBroadcastUnaryMatMul(CallKernel):
    """``hetero::BroadcastUnaryMatMul`` (``src/chain_dot.cpp``): each output row's operand rows combined, the unary
    applied and the product taken in L1, the quantized chain's rows through the int8 GEMM a block at a time; the
    broadcast tensor is never written. Same values as the unfused kernels."""

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        if node.attr("binary", "Add") not in _CHAIN_BINARY or node.attr("unary", "") not in _CHAIN_UNARY:
            return unsupported(f"BroadcastUnaryMatMul of {node.attr('binary')} / {node.attr('unary')}")
        for i in (0, 1):
            x = node.inputs[i]
            if x is None or x.dtype != dtypes.float32 or x.rank is None:
                return unsupported("BroadcastUnaryMatMul: float32 operands of known rank (cpu)")
        if node.attr("quantized", 0):
            verdict = _constant_8bit(node, 2, "W", (2,))
            for index, what in ((3, "w_zero_point"), (4, "w_scale"), (5, "bias")):
                if verdict:
                    verdict = _optional_is_constant(node, index, what)
            return verdict
        w = node.constants.get(2)
        if w is None or w.dtype != np.float32 or w.ndim != 2:
            return unsupported("BroadcastUnaryMatMul: a constant float32 2-D W (cpu)")
        return _optional_is_constant(node, 5, "bias")

    def __init__(self, node: NodeInfo, backend: Backend) -> None:
        super().__init__(node, backend)
        w = np.asarray(node.constants[2])
        self.k = int(w.shape[0])
        self.op = _CHAIN_BINARY[self.attr("binary", "Add")]
        self.unary = _CHAIN_UNARY[self.attr("unary", "")]
        bias = _constant_or_none(node, 5)
        self.bias = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32).reshape(-1)
        if self.attr("quantized", 0):
            self.weights = _native.qpack_b(np.ascontiguousarray(w), _constant_or_none(node, 3))
            scale = _constant_or_none(node, 4)
            self.w_scale = None if scale is None else np.ascontiguousarray(scale, dtype=np.float32).reshape(-1)
        else:  # W^T: each column's D values contiguous for the row dots
            self.weights, self.w_scale = np.ascontiguousarray(w.T), None
        self.rows: dict[tuple, tuple[np.ndarray, np.ndarray, bool]] = {}

    def _rows(self, a: tuple[int, ...], b: tuple[int, ...],
              out: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, bool]:
        """Row offsets of a and b per output row, and whether every (a row, b row) pair occurs (no leading axis
        where both have more than one row): then, for Add / Sub and a non-decreasing unary, the quantized range
        follows from the operands' extremes (checked natively)."""
        key = (a, b, out)
        found = self.rows.get(key)
        if found is None:
            lead = out[:-1]
            pa = (1,) * (len(lead) + 1 - len(a)) + a[:-1] if a else (1,) * len(lead)
            pb = (1,) * (len(lead) + 1 - len(b)) + b[:-1] if b else (1,) * len(lead)
            outer = all(x == 1 or y == 1 for x, y in zip(pa, pb, strict=True)) and self.op != "mul"
            found = (_row_offsets(a, lead), _row_offsets(b, lead), outer)
            # a new dict swapped in whole (threads running this kernel read the old one meanwhile); a few shapes
            # (sequence lengths) kept: each holds two int64s per output row
            rows = dict(list(self.rows.items())[-7:])
            rows[key] = found
            self.rows = rows
        return found

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call:
        out = outputs[0].buffer
        if out.size == 0:
            return noop
        a, b = (np.ascontiguousarray(inputs[i].numpy()) for i in (0, 1))
        a_rows, b_rows, outer = self._rows(a.shape, b.shape, out.shape)
        return functools.partial(_native.broadcast_unary_matmul, self.op, self.unary, 0.0, 0.0, a, b, a_rows, b_rows,
                                 self.k, self.weights, self.w_scale, self.bias, outer, out)


KERNELS = {
    ("", "QuantizeLinear"): CpuQuantizeLinear,
    ("", "DequantizeLinear"): CpuDequantizeLinear,
    ("", "DynamicQuantizeLinear"): CpuDynamicQuantizeLinear,
    ("hetero", "GeluQuantizeLinear"): CpuGeluQuantizeLinear,
    ("", "MatMulInteger"): CpuMatMulInteger,
    ("hetero", "MatMulIntegerScaled"): CpuMatMulIntegerScaled,
    ("", "QLinearMatMul"): CpuQLinearMatMul,
    ("", "QLinearConv"): CpuQLinearConv,
    ("", "ConvInteger"): CpuConvInteger,
    ("hetero", "ConvIntegerScaled"): CpuConvIntegerScaled,
    ("hetero", "BroadcastUnaryMatMul"): CpuBroadcastUnaryMatMul,
}
