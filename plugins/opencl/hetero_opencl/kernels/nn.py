"""Dense and CNN kernels (cl/nn.cl; the tiled GEMM of kernels/gemm.py): MatMul, Gemm, FusedMatMul; Conv / FusedConv
(depthwise direct, 1x1 straight into the GEMM, others through im2col), ConvTranspose (GEMM + col2im); pooling;
BatchNormalization; Softmax; LayerNormalization; Resize."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hetero.contract import SUPPORTED, BackendError, NodeInfo, Support, Tensor, TensorInfo, static_shape, unsupported
from hetero.contract.opforms import layer_norm_broadcast, nearest_indices, source_coords

from .common import (
    ClKernel,
    float32_only,
    fused_activation,
    fused_activation_known,
    pow2_at_most,
    static_rank,
)
from .elementwise import _broadcast_strides
from .gemm import gemm

PROGRAM = "nn.cl"


class ClMatMul(ClKernel):
    accepts = staticmethod(float32_only)

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None:
        a, b = static_shape(inputs[0]), static_shape(inputs[1])
        a2 = (1, *a) if len(a) == 1 else a
        b2 = (*b, 1) if len(b) == 1 else b
        self.m, self.k_, self.n = a2[-2], a2[-1], b2[-1]
        a_batch, b_batch = a2[:-2], b2[:-2]
        batch = np.broadcast_shapes(a_batch, b_batch)
        count = int(np.prod(batch, dtype=np.int64))
        a_idx = np.broadcast_to(np.arange(int(np.prod(a_batch, dtype=np.int64))).reshape(a_batch), batch)
        b_idx = np.broadcast_to(np.arange(int(np.prod(b_batch, dtype=np.int64))).reshape(b_batch), batch)
        offs = np.stack([a_idx.reshape(-1) * self.m * self.k_, b_idx.reshape(-1) * self.k_ * self.n], axis=1)
        self.batch = count
        self.offs_values = offs.reshape(-1).tolist()
        self.strides = (self.k_, 1, self.n, 1)

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        offs = self.meta("offs", self.offs_values)
        gemm(self, inputs[0].buffer, inputs[1].buffer, outputs[0].buffer, self.m, self.n, self.k_,
             self.strides, offs, self.batch)


class ClFusedMatMul(ClKernel):
    """x @ W (W 2-D) + bias row, then the activation, in the GEMM epilogue."""

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        verdict = float32_only(node)
        if verdict and static_rank(node, 1) not in (None, 2):
            return unsupported("FusedMatMul with a weight that is not 2-D")
        return fused_activation_known(node) if verdict else verdict

    def __init__(self, node: NodeInfo, backend) -> None:
        super().__init__(node, backend)
        self.act = fused_activation(self.node.attrs)

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        x, w, y = inputs[0], inputs[1], outputs[0]
        k, n = w.shape
        m = y.size // n if n else 0
        bias = inputs[2].buffer if len(inputs) > 2 and inputs[2] is not None else None
        gemm(self, x.buffer, w.buffer, y.buffer, m, n, k, (k, 1, n, 1), self.meta("offs", (0, 0)),
             bias=bias, bias_strides=(0, 0, 1), act=self.act)


class ClGemm(ClKernel):
    accepts = staticmethod(float32_only)

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        a, b, y = inputs[0], inputs[1], outputs[0]
        m, n = y.shape
        ta, tb = bool(self.attr("transA", 0)), bool(self.attr("transB", 0))
        k = a.shape[0] if ta else a.shape[1]
        sam, sak = (1, m) if ta else (k, 1)
        sbk, sbn = (1, k) if tb else (n, 1)
        c = inputs[2] if len(inputs) > 2 else None
        bias_strides = (0, 0, 0)
        if c is not None:
            _, scm, scn = (0, *_broadcast_strides(c.shape, (m, n)))
            bias_strides = (0, scm, scn)
        gemm(self, a.buffer, b.buffer, y.buffer, m, n, k, (sam, sak, sbk, sbn), self.meta("offs", (0, 0)),
             alpha=float(self.attr("alpha", 1.0)), beta=float(self.attr("beta", 1.0)),
             bias=None if c is None else c.buffer, bias_strides=bias_strides)


def _spatial_pads(node_attrs: dict, in_sp: Sequence[int], out_sp: Sequence[int], kernel: Sequence[int],
                  strides: Sequence[int], dilations: Sequence[int]) -> tuple[list[int], list[int]]:
    """Begin and end pads per spatial axis, resolving auto_pad."""
    nsp = len(in_sp)
    auto = node_attrs.get("auto_pad", "NOTSET")
    if isinstance(auto, bytes):
        auto = auto.decode()
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for i in range(nsp):
            total = max((out_sp[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - in_sp[i], 0)
            small = total // 2
            b = small if auto == "SAME_UPPER" else total - small
            begin.append(b)
            end.append(total - b)
        return begin, end
    if auto == "VALID":
        return [0] * nsp, [0] * nsp
    pads = list(node_attrs.get("pads", [0] * (2 * nsp)))
    return pads[:nsp], pads[nsp:]


def _as_2d(values: Sequence[int], fill: int) -> list[int]:
    values = list(values)
    return [fill, *values] if len(values) == 1 else values


def _spatial_ok(node: NodeInfo, weight: int | None = None) -> Support:
    rank = static_rank(node, 0)
    if rank is None and weight is not None:
        rank = static_rank(node, weight)  # a conv's weight has the input's rank (and is a constant, so known)
    if rank not in (3, 4):
        return unsupported(f"{node.op_type} on rank {rank} (opencl: 1-D and 2-D spatial)")
    return SUPPORTED


class ClConv(ClKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        verdict = float32_only(node)
        if verdict:
            verdict = _spatial_ok(node, weight=1)
        if verdict and node.op_type == "FusedConv":
            verdict = fused_activation_known(node)
        return verdict

    def __init__(self, node: NodeInfo, backend) -> None:
        super().__init__(node, backend)
        self.act = fused_activation(self.node.attrs) if node.op_type == "FusedConv" else (0, 0.0, 0.0)

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None:
        x, w, y = static_shape(inputs[0]), static_shape(inputs[1]), static_shape(outputs[0])
        nsp = len(x) - 2
        kernel = list(w[2:])
        strides = list(self.attr("strides", [1] * nsp))
        dil = list(self.attr("dilations", [1] * nsp))
        begin, _ = _spatial_pads(self.node.attrs, x[2:], y[2:], kernel, strides, dil)
        self.n, self.c = x[0], x[1]
        self.h, self.w = _as_2d(x[2:], 1)
        self.oh, self.ow = _as_2d(y[2:], 1)
        self.kh, self.kw = _as_2d(kernel, 1)
        self.sh, self.sw = _as_2d(strides, 1)
        self.dh, self.dw = _as_2d(dil, 1)
        self.ph, self.pw = _as_2d(begin, 0)
        self.cout = w[0]
        self.group = int(self.attr("group", 1))
        self.depthwise = self.group > 1 and self.group == self.c and self.cout % self.c == 0
        self.pointwise = (self.kh == self.kw == 1 and self.sh == self.sw == 1 and self.ph == self.pw == 0
                          and (self.oh, self.ow) == (self.h, self.w))

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        x, w, y = inputs[0], inputs[1], outputs[0]
        if x.ndim not in (3, 4):
            raise BackendError(f"{self.node.label()}: opencl convolves rank 3 and 4 inputs, got {x.shape}")
        bias = inputs[2] if len(inputs) > 2 else None
        act_code, act_a, act_b = self.act
        if y.size == 0:
            return
        if self.depthwise:
            self.launch(self.k(PROGRAM, "depthwise"), [self.ow, self.oh, self.n * self.cout], None, x.buffer,
                        w.buffer, self.be.dummy if bias is None else bias.buffer, y.buffer, int(bias is not None),
                        self.n, self.c, self.h, self.w, self.cout // self.c, self.kh, self.kw, self.oh, self.ow,
                        self.sh, self.sw, self.ph, self.pw, self.dh, self.dw, act_code, act_a, act_b)
            return
        g = self.group
        cg, m = self.c // g, self.cout // g
        kk = cg * self.kh * self.kw
        p = self.oh * self.ow
        bias_buf = None if bias is None else bias.buffer
        for n in range(self.n):
            x_off = n * self.c * self.h * self.w
            if self.pointwise:
                src, b_base = x.buffer, x_off
            else:
                src, b_base = self.be.scratch("im2col", self.c * self.kh * self.kw * p * 4), 0
                self.launch(self.k(PROGRAM, "im2col"), [p, self.c * self.kh * self.kw], None, x.buffer, src,
                            x_off, self.c, self.h, self.w, self.kh, self.kw, self.oh, self.ow, self.sh, self.sw,
                            self.ph, self.pw, self.dh, self.dw)
            offs = self.meta(f"offs{n}", [v for gi in range(g) for v in (gi * m * kk, b_base + gi * kk * p)])
            gemm(self, w.buffer, src, y.buffer, m, p, kk, (kk, 1, p, 1), offs, g, c_off=n * self.cout * p,
                 bias=bias_buf, bias_strides=(m, 1, 0), act=self.act)


def _transpose_begins(attrs: dict, in_sp: Sequence[int], out_sp: Sequence[int], kernel: Sequence[int],
                      strides: Sequence[int], dilations: Sequence[int]) -> list[int]:
    """Begin pads of ConvTranspose per spatial axis: from ``pads``, or split from the excess over the requested
    output size (``output_shape`` / auto_pad SAME_*), as hetero.ops.nn computes the output shape."""
    n = len(in_sp)
    auto = _text(attrs.get("auto_pad"), "NOTSET")
    if attrs.get("output_shape") is None and auto not in ("SAME_UPPER", "SAME_LOWER"):
        return list(attrs.get("pads") or [0] * (2 * n))[:n]
    out_pad = list(attrs.get("output_padding") or [0] * n)
    begins = []
    for i in range(n):
        full = strides[i] * (in_sp[i] - 1) + out_pad[i] + (kernel[i] - 1) * dilations[i] + 1
        total = full - out_sp[i]
        begins.append(total // 2 if auto == "SAME_UPPER" else total - total // 2)
    return begins


class ClConvTranspose(ClKernel):
    """ConvTranspose, 1-D and 2-D, groups: per image, the tiled GEMM computes W^T @ x for every kernel tap (into a
    scratch buffer), then col2im gathers the taps of each output pixel and adds the bias."""

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        verdict = float32_only(node)
        return _spatial_ok(node, weight=1) if verdict else verdict

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None:
        x, w, y = static_shape(inputs[0]), static_shape(inputs[1]), static_shape(outputs[0])
        nsp = len(x) - 2
        if nsp not in (1, 2):
            raise BackendError(f"{self.node.label()}: opencl ConvTranspose takes rank 3 and 4 inputs, got {x}")
        kernel = list(self.attr("kernel_shape") or w[2:])
        strides = list(self.attr("strides") or [1] * nsp)
        dil = list(self.attr("dilations") or [1] * nsp)
        begin = _transpose_begins(self.node.attrs, x[2:], y[2:], kernel, strides, dil)
        self.n, self.c = x[0], x[1]
        self.h, self.w = _as_2d(x[2:], 1)
        self.oh, self.ow = _as_2d(y[2:], 1)
        self.kh, self.kw = _as_2d(kernel, 1)
        self.sh, self.sw = _as_2d(strides, 1)
        self.dh, self.dw = _as_2d(dil, 1)
        self.ph, self.pw = _as_2d(begin, 0)
        self.group = int(self.attr("group", 1))
        self.mg = w[1]

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        x, w, y = inputs[0], inputs[1], outputs[0]
        bias = inputs[2] if len(inputs) > 2 else None
        if y.size == 0:
            return
        g, mg = self.group, self.mg
        cg = self.c // g
        m, p = mg * self.kh * self.kw, self.h * self.w
        col = self.be.scratch("col2im", g * m * p * 4)
        for n in range(self.n):
            x_off = n * self.c * p
            offs = self.meta(f"offs{n}", [v for gi in range(g) for v in (gi * cg * m, x_off + gi * cg * p)])
            gemm(self, w.buffer, x.buffer, col, m, p, cg, (1, m, p, 1), offs, g)
            self.launch(self.k(PROGRAM, "col2im"), [self.ow, self.oh, g * mg], None, col,
                        self.be.dummy if bias is None else bias.buffer, y.buffer, int(bias is not None),
                        n * g * mg * self.oh * self.ow, g, mg, self.h, self.w, self.kh, self.kw, self.oh, self.ow,
                        self.sh, self.sw, self.ph, self.pw, self.dh, self.dw)


class ClBatchNorm(ClKernel):
    """BatchNormalization in inference mode (what is left of it when no Conv precedes it to fold into)."""

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        if int(node.attr("training_mode", 0)) or len([o for o in node.node.outputs if o]) > 1:
            return unsupported("BatchNormalization in training mode")
        if not int(node.attr("spatial", 1)):
            return unsupported("BatchNormalization with spatial=0 (per-element statistics)")
        verdict = float32_only(node)
        if verdict and (rank := static_rank(node, 0)) is not None and rank < 2:
            return unsupported("BatchNormalization of a rank < 2 input")
        return verdict

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        x, y = inputs[0], outputs[0]
        if y.size == 0:
            return
        c = x.shape[1]
        inner = y.size // (x.shape[0] * c)
        scale, b, mean, var = (t.buffer for t in inputs[1:5])
        self.launch(self.k(PROGRAM, "batchnorm"), [y.size], None, x.buffer, scale, b, mean, var, y.buffer, c,
                    inner, y.size, float(self.attr("epsilon", 1e-5)))


class ClPool(ClKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        verdict = float32_only(node)
        if verdict:
            verdict = _spatial_ok(node)
        if verdict and len([o for o in node.node.outputs if o]) > 1:
            return unsupported("MaxPool with the Indices output")
        if verdict and node.op_type == "MaxPool" and int(node.attr("storage_order", 0)):
            return unsupported("MaxPool storage_order=1")
        return verdict

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None:
        x, y = static_shape(inputs[0]), static_shape(outputs[0])
        nsp = len(x) - 2
        kernel = list(self.attr("kernel_shape"))
        strides = list(self.attr("strides", [1] * nsp))
        dil = list(self.attr("dilations", [1] * nsp))
        begin, end = _spatial_pads(self.node.attrs, x[2:], y[2:], kernel, strides, dil)
        self.nc = x[0] * x[1]
        self.args = [*_as_2d(x[2:], 1), *_as_2d(y[2:], 1), *_as_2d(kernel, 1), *_as_2d(strides, 1),
                     *_as_2d(begin, 0), *_as_2d(end, 0), *_as_2d(dil, 1)]
        if self.node.op_type == "MaxPool":
            self.mode = 0
        else:
            self.mode = 2 if int(self.attr("count_include_pad", 0)) else 1

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        oh, ow = self.args[2:4]
        self.launch(self.k(PROGRAM, "pool2d"), [ow, oh, self.nc], None, inputs[0].buffer, outputs[0].buffer,
                    self.nc, *self.args, self.mode)


class ClGlobalPool(ClKernel):
    accepts = staticmethod(float32_only)

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        x = inputs[0]
        rows = x.shape[0] * x.shape[1]
        p = x.size // rows if rows else 0
        size = pow2_at_most(max(p, 1), 64)
        self.launch(self.k(PROGRAM, "global_pool"), [rows * size], [size], x.buffer, outputs[0].buffer, p,
                    int(self.node.op_type == "GlobalAveragePool"), self.ctx_local(size))

    def ctx_local(self, size: int) -> Any:
        return self.rt.native.Local(size * 4)


class ClSoftmax(ClKernel):
    accepts = staticmethod(float32_only)

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None:
        shape = static_shape(inputs[0])
        rank = len(shape)
        legacy = self.info.opset < 13
        axis = int(self.attr("axis", 1 if legacy else -1))
        axis += rank if axis < 0 else 0
        outer = int(np.prod(shape[:axis], dtype=np.int64))
        if legacy:
            self.outer, self.len, self.inner = outer, int(np.prod(shape[axis:], dtype=np.int64)), 1
        else:
            self.outer, self.len = outer, shape[axis]
            self.inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
        self.log = int(self.node.op_type == "LogSoftmax")

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        x, y = inputs[0].buffer, outputs[0].buffer
        if outputs[0].size == 0:
            return
        if self.inner == 1:
            size = pow2_at_most(self.len, 128)
            self.launch(self.k(PROGRAM, "softmax_rows"), [self.outer * size], [size], x, y, self.len, self.log,
                        self.rt.native.Local(size * 4))
        else:
            self.launch(self.k(PROGRAM, "softmax_strided"), [self.outer * self.inner], None, x, y, self.outer,
                        self.len, self.inner, self.log)


class ClLayerNorm(ClKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        if len([o for o in node.node.outputs[1:] if o]):
            return unsupported("LayerNormalization with the Mean / InvStdDev outputs")
        verdict = float32_only(node)
        reason = layer_norm_broadcast(node) if verdict else None
        return unsupported(reason) if reason else verdict

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None:
        shape = static_shape(inputs[0])
        axis = int(self.attr("axis", -1))
        axis += len(shape) if axis < 0 else 0
        self.rows = int(np.prod(shape[:axis], dtype=np.int64))
        self.d = int(np.prod(shape[axis:], dtype=np.int64))

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        bias = inputs[2] if len(inputs) > 2 else None
        size = pow2_at_most(max(self.d, 1), 128)
        self.launch(self.k(PROGRAM, "layernorm"), [self.rows * size], [size], inputs[0].buffer, inputs[1].buffer,
                    self.be.dummy if bias is None else bias.buffer, outputs[0].buffer, self.d,
                    float(self.attr("epsilon", 1e-5)), int(bias is not None), self.rt.native.Local(size * 4))


_COORD = {"half_pixel": 0, "asymmetric": 1, "align_corners": 2, "pytorch_half_pixel": 3, "tf_half_pixel_for_nn": 4}
_NEAREST = frozenset({"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"})


def _text(value: Any, default: str) -> str:
    if value is None:
        return default
    return value.decode() if isinstance(value, bytes) else str(value)


class ClResize(ClKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        verdict = float32_only(node, [0])
        if not verdict:
            return verdict
        mode = _text(node.attr("mode"), "nearest")
        coord = _text(node.attr("coordinate_transformation_mode"), "asymmetric" if node.opset < 11 else "half_pixel")
        if mode not in ("nearest", "linear"):
            return unsupported(f"Resize mode {mode!r} (opencl: nearest, linear)")
        if coord not in _COORD or (coord == "tf_half_pixel_for_nn" and mode != "nearest"):
            return unsupported(f"Resize coordinate_transformation_mode {coord!r}")
        if _text(node.attr("nearest_mode"), "round_prefer_floor") not in _NEAREST:
            return unsupported(f"Resize nearest_mode {node.attr('nearest_mode')!r}")
        if int(node.attr("antialias", 0)) or int(node.attr("exclude_outside", 0)) or node.attr("axes") is not None:
            return unsupported("Resize with antialias, exclude_outside or axes")
        if _text(node.attr("keep_aspect_ratio_policy"), "stretch") != "stretch":
            return unsupported("Resize keep_aspect_ratio_policy other than stretch")
        x, y = node.inputs[0], node.outputs[0]
        if x is None or x.rank not in (3, 4):
            return unsupported("Resize of other than rank 3 or 4 (opencl resizes the last two axes)")
        if x.is_static and y.is_static and static_shape(x)[:-2] != static_shape(y)[:-2]:
            return unsupported("Resize that scales the batch or channel axes")
        return SUPPORTED

    def __init__(self, node: NodeInfo, backend) -> None:
        super().__init__(node, backend)
        self.mode = 0 if _text(self.attr("mode"), "nearest") == "nearest" else 1
        legacy = self.info.opset < 11
        coord = _text(self.attr("coordinate_transformation_mode"), "asymmetric" if legacy else "half_pixel")
        self.coord_mode, self.coord = coord, _COORD[coord]
        self.nearest_mode = "floor" if legacy else _text(self.attr("nearest_mode"), "round_prefer_floor")

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        x, y = inputs[0], outputs[0]
        h, w = x.shape[-2:]
        oh, ow = y.shape[-2:]
        if tuple(x.shape[:-2]) != tuple(y.shape[:-2]):
            raise BackendError(f"{self.node.label()}: opencl Resize scales only the last two axes")
        index = 1 if self.info.opset < 11 else 2  # Resize-10 takes (X, scales)
        scales = self.host(inputs[index]) if len(inputs) > index and inputs[index] is not None else None
        if scales is not None and scales.size:
            sh, sw = float(scales.reshape(-1)[-2]), float(scales.reshape(-1)[-1])
            lh, lw = h * sh, w * sw
        else:
            sh, sw = oh / h, ow / w
            lh, lw = float(oh), float(ow)
        nc = int(np.prod(x.shape[:-2], dtype=np.int64))
        rows, cols = self.be.dummy, self.be.dummy
        if self.mode == 0:
            rows, cols = (self.meta(axis, nearest_indices(self.nearest_mode, source_coords(
                self.coord_mode, n_in, n_out, scale, from_scales=scales is not None), n_in).tolist())
                for axis, n_in, n_out, scale in (("rows", h, oh, sh), ("cols", w, ow, sw)))
        self.launch(self.k(PROGRAM, "resize2d"), [ow, oh, nc], None, x.buffer, y.buffer, rows, cols, nc, h, w, oh,
                    ow, sh, sw, lh, lw, self.mode, self.coord)


KERNELS = {
    ("", "MatMul"): ClMatMul,
    ("", "Gemm"): ClGemm,
    ("hetero", "FusedMatMul"): ClFusedMatMul,
    ("", "Conv"): ClConv,
    ("", "ConvTranspose"): ClConvTranspose,
    ("", "BatchNormalization"): ClBatchNorm,
    ("hetero", "FusedConv"): ClConv,
    ("", "MaxPool"): ClPool,
    ("", "AveragePool"): ClPool,
    ("", "GlobalAveragePool"): ClGlobalPool,
    ("", "GlobalMaxPool"): ClGlobalPool,
    ("", "Softmax"): ClSoftmax,
    ("", "LogSoftmax"): ClSoftmax,
    ("", "LayerNormalization"): ClLayerNorm,
    ("", "Resize"): ClResize,
}
