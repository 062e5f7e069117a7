"""Neural-network kernels: Softmax, LayerNormalization, Conv (weights packed once), pooling, BatchNormalization."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from hetero.contract import SUPPORTED, Backend, NodeInfo, Support, Tensor, TensorInfo, static_shape, unsupported
from hetero.contract.opforms import activation_known, split_dw_pointwise_attrs

from .. import _native
from .common import (
    Call,
    CallKernel,
    Calls,
    float32_only,
    fused_activation,
    fused_activation_known,
    noop,
    weight_precision,
)


def _rows(shape: Sequence[int], axis: int) -> tuple[int, int]:
    """(outer, inner) sizes when a tensor is seen as a 2-D matrix split before ``axis``."""
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis:], dtype=np.int64))
    return outer, inner


class CpuSoftmax(CallKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        info = node.inputs[0]
        if node.opset >= 13 and (info is None or info.rank is None):
            return unsupported(f"{node.op_type} on a tensor of unknown rank")
        return float32_only(node)

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None:
        shape = static_shape(inputs[0])
        rank = len(shape)
        self.blocks = None
        if self.info.opset >= 13:
            # Over one axis: the last one is a row kernel; any other runs column-wise on (outer, axis, inner).
            axis = self.attr("axis", -1)
            axis = axis + rank if axis < 0 else axis
            if axis != rank - 1:
                outer, rest = _rows(shape, axis)
                n = int(shape[axis])
                self.blocks = (outer, n, rest // n if n else 0)
            axis = rank - 1
        else:  # before opset 13 the input is coerced to 2-D at `axis` (default 1)
            axis = self.attr("axis", 1)
            axis = axis + rank if axis < 0 else axis
        self.rows = _rows(shape, axis)

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call:
        out = outputs[0].buffer
        if out.size == 0:
            return noop
        log = self.node.op_type == "LogSoftmax"
        x = np.ascontiguousarray(inputs[0].numpy())
        if self.blocks is not None:
            return functools.partial(_native.softmax_axis, x.reshape(self.blocks), out.reshape(self.blocks), log=log)
        # positional: a replay's step takes the call (fuse.step_calls leaves calls with keywords apart)
        return functools.partial(_native.softmax, x.reshape(self.rows), out.reshape(self.rows), log)


class CpuLayerNorm(CallKernel):
    scale_at = 1  # the Scale input (Bias after it): hetero.AddLayerNorm's normalised rows are two operands

    @classmethod
    def accepts(cls, node: NodeInfo) -> Support:
        # the rows normalised: x's, or AddLayerNorm's sum, whose shape (the output's) may be known where an
        # operand's is not (a ViT's patch tokens [?, ?, ?] plus position embeddings [1, ?, 384])
        x = node.outputs[0] if cls.scale_at == 2 else node.inputs[0]
        if x is None or x.shape is None:
            return unsupported(f"{node.op_type} on a tensor of unknown rank")
        axis = node.attr("axis", -1)
        axis = axis + len(x.shape) if axis < 0 else axis
        for i in (cls.scale_at, cls.scale_at + 1):
            p = node.inputs[i] if i < len(node.inputs) else None
            if p is not None and (p.shape is None or tuple(p.shape) != tuple(x.shape[axis:])):
                return unsupported(f"{node.op_type} with broadcast scale/bias (cpu: full normalized shape)")
        return float32_only(node)

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None:
        shape = static_shape(outputs[0])  # x's (AddLayerNorm: the broadcast sum's)
        axis = self.attr("axis", -1)
        axis = axis + len(shape) if axis < 0 else axis
        self.rows = _rows(shape, axis)
        self.eps = float(self.attr("epsilon", 1e-5))

    def _scale_bias(self, inputs: Sequence[Tensor | None]) -> tuple[np.ndarray, np.ndarray | None]:
        at = self.scale_at
        scale = np.ascontiguousarray(inputs[at].numpy()).reshape(-1)
        bias = inputs[at + 1] if len(inputs) > at + 1 else None
        return scale, None if bias is None else np.ascontiguousarray(bias.numpy()).reshape(-1)

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls:
        out = outputs[0].buffer
        if out.size == 0:
            return noop
        x = np.ascontiguousarray(inputs[0].numpy()).reshape(self.rows)
        scale, bias = self._scale_bias(inputs)
        mean = outputs[1].buffer.reshape(-1) if len(outputs) > 1 else None
        invstd = outputs[2].buffer.reshape(-1) if len(outputs) > 2 else None
        return functools.partial(_native.layer_norm, x, scale, bias, out.reshape(self.rows), self.eps, mean, invstd)


class CpuAddLayerNorm(CpuLayerNorm):
    """hetero.AddLayerNorm: LayerNormalization(a + b), and a + b as output 1 where the node has one. Operands of the
    output's shape: the native layer_norm's rows of x + skip (the Add's vector add into an L1 row, or into output 1's
    row, then the same row kernel: the bits of the Add then the LayerNorm); operands that broadcast: the Add's pass
    into a buffer (output 1 where there is one), then the LayerNorm's."""

    scale_at = 2

    @classmethod
    def accepts(cls, node: NodeInfo) -> Support:
        a, b = node.inputs[0], node.inputs[1]
        if a is None or b is None or a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
            return unsupported("AddLayerNorm with operands of different or unknown ranks")
        return super().accepts(node)

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls:
        out = outputs[0].buffer
        if out.size == 0:
            return noop
        a, b = inputs[0].numpy(), inputs[1].numpy()
        scale, bias = self._scale_bias(inputs)
        # the sum as output 1 (a pre-norm block's residual): written by the same row pass
        sum_out = outputs[1].buffer if len(outputs) > 1 else None
        # positional: a replay's step takes the call (fuse.step_calls leaves calls with keywords apart)
        if a.shape == b.shape == out.shape:
            x = np.ascontiguousarray(a).reshape(self.rows)
            skip = np.ascontiguousarray(b).reshape(self.rows)
            return functools.partial(_native.layer_norm, x, scale, bias, out.reshape(self.rows), self.eps, None,
                                     None, skip, None if sum_out is None else sum_out.reshape(self.rows))
        total = np.empty(out.shape, np.float32) if sum_out is None else sum_out
        return [functools.partial(_native.binary, "add", np.broadcast_to(a, out.shape), np.broadcast_to(b, out.shape),
                                  total),
                functools.partial(_native.layer_norm, total.reshape(self.rows), scale, bias, out.reshape(self.rows),
                                  self.eps)]


def _pads_nd(node_attrs: dict, spatial_in: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
             dilations: Sequence[int]) -> tuple[list[int], list[int]]:
    """Explicit (begin, end) pads per spatial axis, resolving auto_pad like the ONNX spec does."""
    rank = len(spatial_in)
    auto_pad = node_attrs.get("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads_begin, pads_end = [], []
        for size, k, s, d in zip(spatial_in, kernel, strides, dilations, strict=True):
            out = -(-size // s)
            total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
            small, big = total // 2, total - total // 2
            pads_begin.append(big if auto_pad == "SAME_LOWER" else small)
            pads_end.append(small if auto_pad == "SAME_LOWER" else big)
        return pads_begin, pads_end
    if auto_pad == "VALID":
        return [0] * rank, [0] * rank
    pads = [int(p) for p in node_attrs.get("pads", [0] * (2 * rank))]
    return pads[:rank], pads[rank:]


def _window_2d(node_attrs: dict, spatial_in: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
               dilations: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """A 1-D or 2-D window as the native 2-D kernels take it: explicit (top, left, bottom, right) pads, then the
    kernel, strides and dilations; a 1-D one ([N, C, L]) as H = 1 with no padding along it, W = L."""
    begin, end = _pads_nd(node_attrs, spatial_in, kernel, strides, dilations)
    if len(spatial_in) == 1:
        return (0, begin[0], 0, end[0]), (1, kernel[0]), (1, strides[0]), (1, dilations[0])
    return (begin[0], begin[1], end[0], end[1]), tuple(kernel), tuple(strides), tuple(dilations)


def _spatial_2d(node: NodeInfo) -> Support:
    x = node.inputs[0]
    if x is None or x.rank != 4:
        return unsupported(f"{node.op_type} on rank {None if x is None else x.rank} (cpu: 2-D spatial, NCHW)")
    return float32_only(node)


class CpuConv(CallKernel):
    """2-D convolution on the native packed kernels; a 1-D one ([N, C, L]) runs as 2-D with H = 1."""

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        weight = node.constants.get(1)
        if weight is None:
            return unsupported("Conv with weights computed at run time (cpu packs constant weights)")
        # The input's rank equals the weight's (ONNX), which is known even where shape inference lost the input's.
        if weight.ndim not in (3, 4):
            return unsupported(f"Conv with {weight.ndim - 2} spatial dims (cpu: 1-D and 2-D)")
        verdict = float32_only(node)
        return fused_activation_known(node) if verdict else verdict

    def __init__(self, node: NodeInfo, backend: Backend) -> None:
        super().__init__(node, backend)
        weight = np.ascontiguousarray(node.constants[1], dtype=np.float32)
        self.one_d = weight.ndim == 3
        self.group = int(self.attr("group", 1))
        self.kernel_shape = tuple(weight.shape[2:])
        self.strides = tuple(self.attr("strides", [1] * len(self.kernel_shape)))
        self.dilations = tuple(self.attr("dilations", [1] * len(self.kernel_shape)))
        if self.one_d:
            weight = weight[:, :, None, :]
        self.packed = _native.prepack_conv(np.ascontiguousarray(weight), self.group, weight_precision(backend))
        self.weight, self.precision = weight, weight_precision(backend)
        self.full_width: object = None  # the 1x1 conv's packed weight where a 1 x W conv spans the whole width
        bias = node.constants.get(2)
        self.bias = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
        self.activation = fused_activation(self.node.attrs)

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None:
        spatial = static_shape(inputs[0])[2:]
        self.pads, _, self.native_strides, self.native_dilations = _window_2d(
            self.node.attrs, spatial, self.kernel_shape, self.strides, self.dilations)
        # A 1 x W conv over the whole unpadded width (madmom's beat TCN: 16 -> 16, 1 x 8 on 2996 x 8) leaves one
        # output column, so the im2col copies runs of one float (1.44 ms; onnxruntime 0.12). The input transposed
        # to [N, C, W, H] is [N, C * W, H, 1], on which it is a 1x1 conv over C * W channels (0.59 ms with the
        # transpose). Only for Conv itself: ConvResidual's output stage is its own.
        kh, kw = self.weight.shape[2:]
        self.full_width = None
        if type(self) is CpuConv and not self.one_d and self.group == 1 and kh == 1 and kw > 1 \
                and spatial[1] == kw and self.pads[1] == self.pads[3] == 0:
            co, ci = self.weight.shape[:2]
            self.full_width = _native.prepack_conv(np.ascontiguousarray(self.weight.reshape(co, ci * kw, 1, 1)), 1,
                                                   self.precision)

    def _bias_and_input(self, inputs: Sequence[Tensor | None]) -> tuple[np.ndarray | None, np.ndarray]:
        """The bias (the constant one, else input 2's as float32) and X, contiguous."""
        bias = self.bias
        if bias is None and len(inputs) > 2 and inputs[2] is not None:
            bias = np.ascontiguousarray(inputs[2].numpy(), dtype=np.float32)
        return bias, np.ascontiguousarray(inputs[0].numpy())

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls:
        out = outputs[0].buffer
        if out.size == 0:
            return noop
        bias, x = self._bias_and_input(inputs)
        if self.one_d:
            x, out = x[:, :, None, :], out[:, :, None, :]
        act, alpha, beta = self.activation
        if self.full_width is not None and x.shape[3] == self.weight.shape[3]:
            n, c, h, w = x.shape
            columns = np.empty((n, c, w, h), np.float32)
            wide = columns.reshape(n, c * w, h, 1)
            pads = (self.pads[0], 0, self.pads[2], 0)
            return [functools.partial(np.copyto, columns, x.transpose(0, 1, 3, 2)),
                    functools.partial(_native.conv2d_packed, wide, self.full_width, bias, out,
                                      (self.native_strides[0], 1), pads, (1, 1), act, alpha, beta)]
        # positional: pybind11 matches keyword arguments by name at every call (~2 us, a conv's cost in silero-vad)
        return functools.partial(_native.conv2d_packed, x, self.packed, bias, out, self.native_strides, self.pads,
                                 self.native_dilations, act, alpha, beta)

    def bind(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls | None:
        """A bias computed at run time is bound only where it needs no conversion (a float32 buffer as it is)."""
        if self.bias is None and len(inputs) > 2 and inputs[2] is not None and inputs[2].numpy().dtype != np.float32:
            return None
        return super().bind(inputs, outputs)


class CpuConvInputShift(CpuConv):
    """hetero.ConvInputShift: the conv of X + ``shift`` (``conv2d_packed``'s input_shift: a depthwise conv adds it on
    its padded plane copy; other paths run on X + shift made in one pass)."""

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        weight = node.constants.get(1)
        if weight is not None and weight.ndim != 4:
            return unsupported("ConvInputShift with a 1-D conv (cpu: 2-D)")
        return CpuConv.accepts(node)

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call:
        out = outputs[0].buffer
        if out.size == 0:
            return noop
        bias, x = self._bias_and_input(inputs)
        act, alpha, beta = self.activation
        return functools.partial(_native.conv2d_packed, x, self.packed, bias, out, self.native_strides, self.pads,
                                 self.native_dilations, act, alpha, beta, None, float(self.attr("shift")))


class CpuConvResidual(CpuConv):
    """hetero.ConvResidual: the conv with Z (input 3) added in its output stage before the Relu (``conv2d_packed``'s
    residual: in the 1x1 paths' blocks while they are in cache, else one pass after the conv)."""

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        verdict = CpuConv.accepts(node)
        if verdict and node.attr("activation", "") not in ("", "Relu"):
            return unsupported(f"ConvResidual with activation {node.attr('activation')!r} (cpu: none or Relu)")
        return verdict

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call:
        out = outputs[0].buffer
        if out.size == 0:
            return noop
        bias, x = self._bias_and_input(inputs)
        res = np.ascontiguousarray(inputs[3].numpy())
        if res.shape != out.shape:  # a dynamic batch the pass could not compare: Z of batch 1 (the Add broadcast it)
            res = np.ascontiguousarray(np.broadcast_to(res, out.shape))
        if self.one_d:
            x, out, res = x[:, :, None, :], out[:, :, None, :], res[:, :, None, :]
        act, alpha, beta = self.activation
        return functools.partial(_native.conv2d_packed, x, self.packed, bias, out, self.native_strides, self.pads,
                                 self.native_dilations, act, alpha, beta, res)

    def bind(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls | None:
        """Z is bound only where it is read in place (the output's shape)."""
        if inputs[3] is None or inputs[3].numpy().shape != outputs[0].buffer.shape:
            return None
        return super().bind(inputs, outputs)


class CpuDwPointwiseConv(CallKernel):
    """hetero.DwPointwiseConv: the depthwise conv and its 1x1 conv in one native call (``dw_pointwise``: one pass over
    bands of rows where the pair gains, else the two convs in turn inside the call)."""

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        if node.constants.get(1) is None or node.constants.get(3) is None:
            return unsupported("DwPointwiseConv with weights computed at run time (cpu packs constant weights)")
        for i in (2, 4):
            if i < len(node.node.inputs) and node.node.inputs[i] and node.constants.get(i) is None:
                return unsupported("DwPointwiseConv with a bias computed at run time")
        x = node.inputs[0]
        if x is None or x.rank != 4:
            return unsupported("DwPointwiseConv on a non-4-D input (cpu: NCHW)")
        dw_attrs, pw_attrs = split_dw_pointwise_attrs(node.node.attrs)
        for attrs in (dw_attrs, pw_attrs):
            if not activation_known(attrs):
                return unsupported(f"fused activation {attrs.get('activation')}")
        return float32_only(node)

    def __init__(self, node: NodeInfo, backend: Backend) -> None:
        super().__init__(node, backend)
        dw_attrs, pw_attrs = split_dw_pointwise_attrs(node.node.attrs)
        w = np.ascontiguousarray(node.constants[1], dtype=np.float32)
        w2 = np.ascontiguousarray(node.constants[3], dtype=np.float32)
        precision = weight_precision(backend)
        self.dw_attrs = dw_attrs
        self.kernel_shape = tuple(w.shape[2:])
        self.strides = tuple(dw_attrs.get("strides", [1, 1]))
        self.dilations = tuple(dw_attrs.get("dilations", [1, 1]))
        self.dw_packed = _native.prepack_conv(w, int(dw_attrs.get("group", 1)), precision)
        self.pw_packed = _native.prepack_conv(w2, 1, precision)
        self.biases = [None if node.constants.get(i) is None else np.ascontiguousarray(node.constants[i], np.float32)
                       for i in (2, 4)]
        self.activations = fused_activation(dw_attrs), fused_activation(pw_attrs)

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None:
        spatial = static_shape(inputs[0])[2:]
        self.pads, _, self.native_strides, self.native_dilations = _window_2d(
            self.dw_attrs, spatial, self.kernel_shape, self.strides, self.dilations)

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call:
        out = outputs[0].buffer
        if out.size == 0:
            return noop
        x = np.ascontiguousarray(inputs[0].numpy())
        (act, alpha, beta), (act2, alpha2, beta2) = self.activations
        # positional, as CpuConv's call
        return functools.partial(_native.dw_pointwise, x, self.dw_packed, self.biases[0], self.pw_packed,
                                 self.biases[1], out, self.native_strides, self.pads, self.native_dilations, act,
                                 alpha, beta, act2, alpha2, beta2)


def _spatial_1d_or_2d(node: NodeInfo) -> Support:
    x = node.inputs[0]
    if x is None or x.rank not in (3, 4):
        return unsupported(f"{node.op_type} on rank {None if x is None else x.rank} (cpu: 1-D and 2-D, NCHW)")
    return float32_only(node)


class CpuPool(CallKernel):
    """MaxPool / AveragePool on the native 2-D kernels; a 1-D one ([N, C, L]: a PyTorch MaxPool1d, atspm-detector's
    TCN stem) runs as 2-D with H = 1, as CpuConv does (it ran through numpy at each call: 3 ms of a 4 ms model)."""

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        verdict = _spatial_1d_or_2d(node)
        if not verdict:
            return verdict
        if len(node.node.outputs) > 1 and node.node.outputs[1]:
            return unsupported("MaxPool with the Indices output")
        if node.attr("storage_order", 0):
            return unsupported("MaxPool with storage_order=1")
        return SUPPORTED

    def __init__(self, node: NodeInfo, backend: Backend) -> None:
        super().__init__(node, backend)
        self.kernel_shape = tuple(self.attr("kernel_shape"))
        rank = len(self.kernel_shape)
        self.strides = tuple(self.attr("strides", [1] * rank))
        self.dilations = tuple(self.attr("dilations", [1] * rank))

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None:
        spatial = static_shape(inputs[0])[2:]
        self.one_d = len(spatial) == 1
        self.pads, *native = _window_2d(self.node.attrs, spatial, self.kernel_shape, self.strides, self.dilations)
        self.native = tuple(native)

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call:
        out = outputs[0].buffer
        if out.size == 0:
            return noop
        x = np.ascontiguousarray(inputs[0].numpy())
        if self.one_d:
            x, out = x[:, :, None, :], out[:, :, None, :]
        kernel_shape, strides, dilations = self.native
        if self.node.op_type == "MaxPool":
            return functools.partial(_native.max_pool2d, x, out, kernel_shape, strides, self.pads, dilations)
        return functools.partial(_native.avg_pool2d, x, out, kernel_shape, strides, self.pads,
                                 bool(self.attr("count_include_pad", 0)))


class CpuAvgPool(CpuPool):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        if any(int(d) != 1 for d in node.attr("dilations", [])):
            return unsupported("AveragePool with dilations")
        return _spatial_1d_or_2d(node)


class CpuGlobalAvgPool(CallKernel):
    accepts = staticmethod(_spatial_2d)

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call:
        out = outputs[0].buffer
        if out.size == 0:
            return noop
        return functools.partial(_native.global_avg_pool, np.ascontiguousarray(inputs[0].numpy()), out)


class CpuBatchNorm(CallKernel):
    """Inference-mode BatchNormalization as one per-channel scale and shift (folded from the statistics once)."""

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        if node.attr("training_mode", 0) or len([o for o in node.node.outputs if o]) > 1:
            return unsupported("BatchNormalization in training mode")
        if not all(i in node.constants for i in (1, 2, 3, 4)):
            return unsupported("BatchNormalization with statistics computed at run time")
        x = node.inputs[0]
        if x is None or x.rank is None or x.rank < 2:
            return unsupported("BatchNormalization on a tensor of unknown rank or rank < 2")
        return float32_only(node)

    def __init__(self, node: NodeInfo, backend: Backend) -> None:
        super().__init__(node, backend)
        scale, bias, mean, var = (np.asarray(node.constants[i], dtype=np.float64) for i in (1, 2, 3, 4))
        mul = scale / np.sqrt(var + float(self.attr("epsilon", 1e-5)))
        self.mul = mul.astype(np.float32)
        self.add = (bias - mean * mul).astype(np.float32)

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None:
        rank = len(static_shape(inputs[0]))
        shape = (1, -1) + (1,) * (rank - 2)
        self.mul_view, self.add_view = self.mul.reshape(shape), self.add.reshape(shape)

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls:
        out = outputs[0].buffer
        if out.size == 0:
            return noop
        x = inputs[0].numpy()
        if x.flags.c_contiguous:  # one pass: x * mul[c] + add[c] (openWakeWord's BatchNormalization after a ReLU)
            return functools.partial(_native.channel_affine, x, self.mul, self.add, out)
        return [functools.partial(_native.binary, "mul", x, np.broadcast_to(self.mul_view, out.shape), out),
                functools.partial(_native.binary, "add", out, np.broadcast_to(self.add_view, out.shape), out)]


KERNELS = {
    ("", "Softmax"): CpuSoftmax,
    ("", "LogSoftmax"): CpuSoftmax,
    ("", "LayerNormalization"): CpuLayerNorm,
    ("hetero", "AddLayerNorm"): CpuAddLayerNorm,
    ("", "Conv"): CpuConv,
    ("hetero", "FusedConv"): CpuConv,
    ("hetero", "ConvInputShift"): CpuConvInputShift,
    ("hetero", "ConvResidual"): CpuConvResidual,
    ("hetero", "DwPointwiseConv"): CpuDwPointwiseConv,
    ("", "MaxPool"): CpuPool,
    ("", "AveragePool"): CpuAvgPool,
    ("", "GlobalAveragePool"): CpuGlobalAvgPool,
    ("", "BatchNormalization"): CpuBatchNorm,
}
