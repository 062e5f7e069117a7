"""MatMul and Gemm on the native packed GEMM; constant weights are packed once, when the kernel is made.

All three are ``CallKernel``s: a steady-state replay issues their GEMM (and a fused activation) with no Python of
their own. A call that would copy an input first (a broadcast batch, ``transA`` on a packed weight, a scaled ``C``)
runs through ``run`` instead, which may copy.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from hetero.contract import Backend, NodeInfo, Support, Tensor, unsupported

from .. import _native
from .common import (
    Call,
    CallKernel,
    Calls,
    bindable,
    float32_only,
    fused_activation,
    fused_activation_known,
    noop,
    weight_precision,
)


def _empty(a: np.ndarray, out: np.ndarray) -> Call | None:
    """Zero-sized products: nothing to compute (an empty K gives zeros)."""
    if out.size == 0:
        return noop
    if a.size == 0:
        return functools.partial(out.fill, 0)
    return None


def _rows2d(x: np.ndarray) -> np.ndarray:
    """(..., k) as (rows, k): a view of a contiguous array."""
    return np.ascontiguousarray(x).reshape(-1, x.shape[-1])


def _batched(x: np.ndarray, batch: tuple[int, ...], count: int, rows: int, cols: int) -> np.ndarray:
    """(..., rows, cols) as (1 or count, rows, cols), materialising only mixed broadcasts."""
    if int(np.prod(x.shape[:-2], dtype=np.int64)) == 1:
        return np.ascontiguousarray(x).reshape(1, rows, cols)
    if x.shape[:-2] == batch:
        return np.ascontiguousarray(x).reshape(count, rows, cols)
    return np.ascontiguousarray(np.broadcast_to(x, (*batch, rows, cols))).reshape(count, rows, cols)


def _mixed_broadcast(x: np.ndarray, batch: tuple[int, ...]) -> bool:
    """Whether ``_batched`` copies ``x`` (a batch neither 1 nor the full one): a bound call would read a stale copy."""
    return int(np.prod(x.shape[:-2], dtype=np.int64)) != 1 and x.shape[:-2] != batch


def _with_activation(gemm: Call, flat: np.ndarray, activation: tuple[str, float, float]) -> Calls:
    act, alpha, beta = activation
    if act == "none":
        return gemm
    return [gemm, functools.partial(_native.unary, act, flat, flat, alpha, beta)]


class CpuMatMul(CallKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        return float32_only(node)

    def __init__(self, node: NodeInfo, backend: Backend) -> None:
        super().__init__(node, backend)
        weight = node.constants.get(1)
        # A constant 2-D right operand is a weight matrix: pack it once in the micro-kernel's layout.
        self.packed = _native.pack_b(np.ascontiguousarray(weight, dtype=np.float32), False, True,
                                     weight_precision(backend)) if (weight is not None and weight.ndim == 2) else None

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls:
        a, b = inputs[0].numpy(), inputs[1].numpy()
        out = outputs[0].buffer
        empty = _empty(a, out)
        if empty is not None:
            return empty
        if a.ndim == 1:
            a = a[None, :]
        if self.packed is not None:
            return functools.partial(_native.gemm_packed, _rows2d(a), self.packed, out.reshape(-1, self.packed.n))
        if b.ndim == 1:
            b = b[:, None]
        m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        count = int(np.prod(batch, dtype=np.int64))
        return functools.partial(_native.matmul, _batched(a, batch, count, m, k), _batched(b, batch, count, k, n),
                                 out.reshape(count, m, n))

    def bind(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls | None:
        if self.packed is None:
            a, b = inputs[0].numpy(), inputs[1].numpy()
            if a.ndim >= 2 and b.ndim >= 2:
                batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
                if _mixed_broadcast(a, batch) or _mixed_broadcast(b, batch):
                    return None
        return super().bind(inputs, outputs)


class CpuFusedMatMul(CpuMatMul):
    """MatMul by a packed constant weight with the bias in the GEMM epilogue, then the activation in place."""

    in_epilogue = False  # the activation on each block of C in the GEMM's epilogue instead of a pass afterwards

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        if 1 not in node.constants:
            return unsupported("FusedMatMul with weights computed at run time")
        verdict = float32_only(node)
        return fused_activation_known(node) if verdict else verdict

    def __init__(self, node: NodeInfo, backend: Backend) -> None:
        super().__init__(node, backend)
        bias = node.constants.get(2)
        self.bias = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
        self.activation = fused_activation(self.node.attrs)

    def _bias(self, inputs: Sequence[Tensor | None]) -> np.ndarray | None:
        if self.bias is None and len(inputs) > 2 and inputs[2] is not None:
            return np.ascontiguousarray(inputs[2].numpy(), dtype=np.float32)
        return self.bias

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls:
        a = inputs[0].numpy()
        out = outputs[0].buffer
        if out.size == 0:
            return noop
        bias = self._bias(inputs)
        flat = out.reshape(-1, self.packed.n)
        if a.size == 0:
            fill = functools.partial(flat.fill, 0) if bias is None else functools.partial(np.copyto, flat, bias)
            return _with_activation(fill, flat, self.activation)
        # positional arguments throughout: pybind11 matches keywords by name at every call
        if self.in_epilogue:
            return functools.partial(_native.gemm_packed, _rows2d(a), self.packed, flat, 1.0, 0.0, bias,
                                     *self.activation)
        gemm = functools.partial(_native.gemm_packed, _rows2d(a), self.packed, flat, 1.0, 0.0, bias)
        return _with_activation(gemm, flat, self.activation)

    def bind(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls | None:
        if self.bias is None and len(inputs) > 2 and inputs[2] is not None and inputs[2].numpy().dtype != np.float32:
            return None  # a converted bias would be this run's copy
        # the weight input is never read (the packed copy is): a view of it (a transposed constant) may be strided
        bias = inputs[2] if self.bias is None and len(inputs) > 2 else None
        if not bindable(*(t.buffer for t in (inputs[0], bias, outputs[0]) if t is not None)):
            return None
        return self.calls(inputs, outputs)


class CpuMatMulGelu(CpuFusedMatMul):
    """hetero.MatMulGelu: FusedMatMul with the GELU (the erf form, or the tanh one) in the GEMM's epilogue, on each
    block of C while it is in cache; the native Gelu's own row function, so the bits of the FusedMatMul then Gelu."""

    in_epilogue = True

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        if node.attr("approximate", "none") not in ("none", "tanh"):
            return unsupported(f"MatMulGelu approximate={node.attr('approximate')!r}")
        return CpuFusedMatMul.accepts(node)

    def __init__(self, node: NodeInfo, backend: Backend) -> None:
        super().__init__(node, backend)
        self.activation = ("gelu_tanh" if self.attr("approximate", "none") == "tanh" else "gelu", 0.0, 0.0)


class CpuGemm(CallKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        return float32_only(node)

    def __init__(self, node: NodeInfo, backend: Backend) -> None:
        super().__init__(node, backend)
        self.trans_a = bool(self.attr("transA", 0))
        self.trans_b = bool(self.attr("transB", 0))
        self.alpha = float(self.attr("alpha", 1.0))
        self.beta = float(self.attr("beta", 1.0))
        weight = node.constants.get(1)
        self.packed = (
            _native.pack_b(np.ascontiguousarray(weight, dtype=np.float32), self.trans_b, True,
                           weight_precision(backend))
            if weight is not None
            else None
        )
        bias = node.constants.get(2)
        self.bias = None if bias is None else np.ascontiguousarray(bias * self.beta, dtype=np.float32)

    def _runtime_bias(self, inputs: Sequence[Tensor | None]) -> np.ndarray | None:
        if self.bias is None and len(inputs) > 2 and inputs[2] is not None:
            c = inputs[2].numpy()
            return np.ascontiguousarray(c if self.beta == 1.0 else c * self.beta, dtype=np.float32)
        return self.bias

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls:
        a = inputs[0].numpy()
        out = outputs[0].buffer
        if out.size == 0:
            return noop
        if a.size == 0:
            c = inputs[2] if len(inputs) > 2 else None
            if c is None:
                return functools.partial(out.fill, 0)
            return functools.partial(np.multiply, self.beta, c.numpy(), out=out)
        bias = self._runtime_bias(inputs)
        if self.packed is not None:
            a_op = np.ascontiguousarray(a.T) if self.trans_a else a
            return functools.partial(_native.gemm_packed, a_op, self.packed, out, self.alpha, 0.0, bias)
        return functools.partial(_native.gemm, a, inputs[1].numpy(), out, self.trans_a, self.trans_b, self.alpha,
                                 0.0, bias)

    def bind(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls | None:
        runtime_c = self.bias is None and len(inputs) > 2 and inputs[2] is not None
        if runtime_c and (self.beta != 1.0 or inputs[2].numpy().dtype != np.float32):
            return None  # the bias handed to the GEMM would be this run's scaled copy
        if self.packed is not None and self.trans_a:
            return None  # the GEMM reads a transposed copy of A
        return super().bind(inputs, outputs)


class CpuConvNHWC(CallKernel):
    """``hetero::ConvNHWC`` with a kernel of one row (a Keras Conv1D, ``ir.passes.conv1d_channels_last``): in the
    channels-last input the window of output position t is k runs of C consecutive values (one run of k * C for
    dilation 1), so the conv is one product of every window of every row by the weights, packed once as
    [(tap, channel), Cout], written straight into the channels-last output with the bias and the activation in its
    epilogue. The windows are read in place (groups of overlapping rows of the input; copied into rows
    first only for a dilated conv): deepcut's 12 convs as cblk NCHW convs, 130 GFLOP/s, become bf16x3 GEMMs
    at ~290 (precision "normal"), and the Transposes on both sides go."""

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        weight = node.constants.get(1)
        if weight is None or weight.ndim != 4 or weight.shape[2] != 1:
            return unsupported("ConvNHWC without constant [Cout, C, 1, k] weights")
        if len(node.node.inputs) > 2 and node.node.inputs[2] and 2 not in node.constants:
            return unsupported("ConvNHWC with a bias computed at run time")
        attrs = node.node.attrs
        if int(attrs.get("group", 1)) != 1 or any(int(p) for p in attrs.get("pads", [0, 0, 0, 0])) \
                or attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID", b"NOTSET", b"VALID"):
            return unsupported("ConvNHWC with groups or padding")
        if int(attrs.get("strides", [1, 1])[0]) != 1:
            return unsupported("ConvNHWC with a stride along H (the kernel reads every row)")
        verdict = float32_only(node)
        return fused_activation_known(node) if verdict else verdict

    def __init__(self, node: NodeInfo, backend: Backend) -> None:
        super().__init__(node, backend)
        weight = np.asarray(node.constants[1], dtype=np.float32)
        cout, c, _, k = weight.shape
        self.taps, self.cout = k, cout
        # row j * C + c of B is tap j of input channel c: the order of a window's values in the channels-last input
        self.packed = _native.pack_b(np.ascontiguousarray(weight[:, :, 0, :].transpose(2, 1, 0).reshape(k * c, cout)),
                                     False, True, weight_precision(backend))
        bias = node.constants.get(2)
        self.bias = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
        self.stride = int(self.attr("strides", [1, 1])[1])
        self.dilation = int(self.attr("dilations", [1, 1])[1])
        self.activation = fused_activation(self.node.attrs)

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls:
        x = np.ascontiguousarray(inputs[0].numpy())
        out = outputs[0].buffer
        if out.size == 0:
            return noop
        n, h, _, c = x.shape
        length = out.shape[2]
        rows = out.reshape(-1, self.cout)
        if x.size == 0:
            return functools.partial(rows.fill, 0) if self.bias is None else functools.partial(np.copyto, rows,
                                                                                                 self.bias)
        copies: list[Call] = []
        if self.taps == 1 and self.stride == 1:
            windows = x.reshape(-1, c)
        elif self.dilation == 1 or self.taps == 1:
            # each row of positions (n * h of them) has windows that are runs of k * C values stride * C apart: the
            # product reads them in place, as groups of overlapping rows of the input (its A packing copies them
            # anyway; deepcut's window copies were ~0.2 ms a run at 1 thread)
            windows = np.lib.stride_tricks.as_strided(x, (n * h, length, self.taps * c),
                                                      (x.strides[1], self.stride * c * x.itemsize, x.itemsize),
                                                      writeable=False)
        else:
            item = x.itemsize
            view = np.lib.stride_tricks.as_strided(
                x, (n, h, length, self.taps, c),
                (x.strides[0], x.strides[1], self.stride * c * item, self.dilation * c * item, item))
            # this binding's own rows: a replay reuses them at every run (runs of one session do not overlap)
            windows = np.empty((n * h * length, self.taps * c), np.float32)
            copies.append(functools.partial(_native.copy, view, windows.reshape(view.shape)))
        # the activation in the GEMM's epilogue: each block of rows while it is still in cache (with the bias, ReLU
        # is one add-and-max pass), not a pass of its own over the whole output
        gemm = functools.partial(_native.gemm_packed, windows, self.packed, rows, 1.0, 0.0, self.bias,
                                 *self.activation)
        return [*copies, gemm]


class CpuFusedAttention(CallKernel):
    """``hetero::FusedAttention`` on the native kernel: Q, K, V, the mask and the output are handed over as strided
    views (the perms absorbed from the graph's Transposes; batch, head and mask broadcasting as stride 0), never
    copied."""

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        if [int(p) for p in node.attr("out_perm", [0, 1, 2, 3])][3] != 3:
            return unsupported("FusedAttention whose out_perm moves the last axis (the kernel writes rows of dv)")
        return float32_only(node)

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls:
        q, k, v = (np.transpose(inputs[i].buffer, [int(p) for p in self.attr(name, [0, 1, 2, 3])])
                   for i, name in enumerate(("q_perm", "k_perm", "v_perm")))
        m = inputs[3].buffer if len(inputs) > 3 and inputs[3] is not None else None
        m = None if m is None else m.reshape((1,) * (4 - m.ndim) + m.shape)
        # the shapes the written-out MatMul, Add and MatMul broadcast to: [B, H, S, T] scores, [B, H, S, dv] out
        scores = np.broadcast_shapes((*np.broadcast_shapes(q.shape[:2], k.shape[:2]), q.shape[2], k.shape[3]),
                                     m.shape if m is not None else ())
        b, h, s, t = (*np.broadcast_shapes(scores[:2], v.shape[:2]), *scores[2:])
        views = (np.broadcast_to(q, (b, h, s, q.shape[3])), np.broadcast_to(k, (b, h, k.shape[2], t)),
                 np.broadcast_to(v, (b, h, t, v.shape[3])), None if m is None else np.broadcast_to(m, (b, h, s, t)))
        # the output buffer seen in the [B, H, S, dv] order: out_perm's inverse
        out = np.transpose(outputs[0].buffer, np.argsort([int(p) for p in self.attr("out_perm", [0, 1, 2, 3])]))
        return functools.partial(_native.fused_attention, *views, out, float(self.attr("scale", 1.0)),
                                 float(self.attr("divisor", 1.0)), bool(self.attr("nan_to_zero", 0)),
                                 float(self.attr("q_scale", 1.0)), float(self.attr("k_scale", 1.0)))
