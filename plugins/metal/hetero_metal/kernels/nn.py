"""Matrix products and row normalisations on Metal: MatMul, Gemm and FusedMatMul on simdgroup_matrix tiles
(msl/matmul.metal), Softmax / LogSoftmax, LayerNormalization (msl/norm.metal)."""

from __future__ import annotations

import numpy as np

from hetero.contract import NodeInfo, Support, dtypes, unsupported
from hetero.contract.opforms import activation_known, activation_params, layer_norm_broadcast

from ..plan import Dispatch, dispatch
from .common import MetalKernel, dtype_check, float32_only, placeholder
from .elementwise import UNARY

TILE = 32
MATMUL_THREADS = 128
ROW_THREADS = 256
_MATMUL_KERNELS = {"float32": "matmul_f32", "float16": "matmul_f16"}


def matmul_dispatch(a: np.ndarray, b: np.ndarray, c: np.ndarray, m: int, n: int, k: int,
                    strides: tuple[int, int, int, int], batch_offsets: np.ndarray, *, kernel: str = "matmul_f32",
                    bias: np.ndarray | None = None, bias_strides: tuple[int, int] = (0, 0), alpha: float = 1.0,
                    beta: float = 1.0, activation: tuple[str, float, float] | None = None) -> Dispatch:
    """C[batch] = alpha * A B + beta * bias over 32x32 output tiles; strides (a_row, a_col, b_row, b_col) and
    batch_offsets ``uint32[batches, 3]`` (A, B, C element offsets) place the operands."""
    batches = batch_offsets.shape[0]
    act, act_alpha, act_beta = activation or ("identity", 0.0, 0.0)
    return dispatch(kernel, {
        "a": a, "b": b, "bias": placeholder() if bias is None else bias, "c": c,
        "batch_offsets": np.ascontiguousarray(batch_offsets, dtype=np.uint32),
        "p": {"m": m, "n": n, "k": k, "a_row": strides[0], "a_col": strides[1], "b_row": strides[2],
              "b_col": strides[3], "alpha": alpha, "beta": beta, "has_bias": int(bias is not None),
              "bias_row": bias_strides[0], "bias_col": bias_strides[1], "act": UNARY[act], "act_alpha": act_alpha,
              "act_beta": act_beta},
    }, (-(-n // TILE), -(-m // TILE), batches), (MATMUL_THREADS,))


def _batch_offsets(batch_shape: tuple[int, ...], shape: tuple[int, ...], matrix: int) -> np.ndarray:
    """Element offsets of each output batch's matrix in an operand with batch dims ``shape`` (broadcast)."""
    count = int(np.prod(shape, dtype=np.int64))
    index = np.arange(count, dtype=np.int64).reshape(shape)
    return (np.broadcast_to(index, batch_shape).reshape(-1) * matrix).astype(np.int64)


class MetalMatMul(MetalKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        return dtype_check(node, (dtypes.float32, dtypes.float16))

    def plan(self, inputs, outputs):
        a, b, y = inputs[0], inputs[1], outputs[0]
        if y.size == 0:
            return []
        a2 = a.reshape(1, -1) if a.ndim == 1 else a
        b2 = b.reshape(-1, 1) if b.ndim == 1 else b
        m, k = a2.shape[-2:]
        n = b2.shape[-1]
        if k == 0:
            y[...] = 0
            return []
        batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
        offsets = np.stack([
            _batch_offsets(batch, a2.shape[:-2], m * k),
            _batch_offsets(batch, b2.shape[:-2], k * n),
            np.arange(int(np.prod(batch, dtype=np.int64)), dtype=np.int64) * m * n,
        ], axis=1)
        if offsets.max(initial=0) + m * k + k * n >= 2**32:
            raise ValueError("MatMul operands past 2^32 elements")
        return [matmul_dispatch(a2, b2, y, m, n, k, (k, 1, n, 1), offsets.astype(np.uint32),
                                kernel=_MATMUL_KERNELS[str(a.dtype)])]


class MetalFusedMatMul(MetalKernel):
    """x @ W (W 2-D) + bias row, then the activation, in the GEMM epilogue."""

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        verdict = float32_only(node)
        w = node.inputs[1] if len(node.inputs) > 1 else None
        if verdict and w is not None and w.rank not in (None, 2):
            return unsupported("FusedMatMul with a weight that is not 2-D")
        if verdict and not activation_known(node.node.attrs):
            return unsupported(f"fused activation {node.attr('activation')}")
        return verdict

    def plan(self, inputs, outputs):
        x, w, y = inputs[0], inputs[1], outputs[0]
        bias = inputs[2] if len(inputs) > 2 else None
        k, n = w.shape
        m = y.size // n if n else 0
        if m == 0:
            return []
        return [matmul_dispatch(x, w, y, m, n, k, (k, 1, n, 1), np.zeros((1, 3), np.uint32), bias=bias,
                                bias_strides=(0, 1), activation=activation_params(self.node.attrs))]


class MetalGemm(MetalKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        return float32_only(node)

    def plan(self, inputs, outputs):
        a, b, y = inputs[0], inputs[1], outputs[0]
        c = inputs[2] if len(inputs) > 2 else None
        if y.size == 0:
            return []
        ta, tb = int(self.attr("transA", 0)), int(self.attr("transB", 0))
        m, n = y.shape
        k = a.shape[0] if ta else a.shape[1]
        a_strides = (1, m) if ta else (k, 1)
        b_strides = (1, k) if tb else (n, 1)
        bias_strides = (0, 0)
        if c is not None:
            view = np.broadcast_to(c, (m, n))
            bias_strides = (view.strides[0] // 4, view.strides[1] // 4)
        return [matmul_dispatch(a, b, y, m, n, k, (*a_strides, *b_strides), np.zeros((1, 3), np.uint32), bias=c,
                                bias_strides=bias_strides, alpha=float(self.attr("alpha", 1.0)),
                                beta=float(self.attr("beta", 1.0)))]


def row_threads(n: int) -> int:
    """Threads of a one-row threadgroup: whole simdgroups, no more than the row needs, at most 256."""
    return min(ROW_THREADS, max(32, -(-n // 32) * 32))


class MetalSoftmax(MetalKernel):
    accepts = staticmethod(float32_only)

    def plan(self, inputs, outputs):
        x, y = inputs[0], outputs[0]
        if y.size == 0:
            return []
        shape = x.shape
        legacy = self.info.opset < 13
        axis = int(self.attr("axis", 1 if legacy else -1))
        axis += len(shape) if axis < 0 else 0
        outer = int(np.prod(shape[:axis], dtype=np.int64))
        if legacy:
            n, inner = int(np.prod(shape[axis:], dtype=np.int64)), 1
        else:
            n, inner = shape[axis], int(np.prod(shape[axis + 1:], dtype=np.int64))
        return [dispatch("softmax_f32", {
            "x": x, "y": y, "p": {"n": n, "inner": inner, "log_softmax": int(self.node.op_type == "LogSoftmax")},
        }, (outer * inner,), (row_threads(n),))]


class MetalLayerNorm(MetalKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        if len([o for o in node.node.outputs[1:] if o]) == 1:
            return unsupported("LayerNormalization with one of Mean / InvStdDev (the kernel writes both or none)")
        verdict = float32_only(node)
        reason = layer_norm_broadcast(node) if verdict else None
        return unsupported(reason) if reason else verdict

    def plan(self, inputs, outputs):
        x, scale = inputs[0], inputs[1]
        bias = inputs[2] if len(inputs) > 2 else None
        axis = int(self.attr("axis", -1))
        axis += x.ndim if axis < 0 else 0
        rows, n = int(np.prod(x.shape[:axis], dtype=np.int64)), int(np.prod(x.shape[axis:], dtype=np.int64))
        if x.size == 0:
            return []
        stats = len(outputs) >= 3
        return [dispatch("layernorm_f32", {
            "x": x, "scale": scale, "bias": placeholder() if bias is None else bias, "y": outputs[0],
            "mean_out": outputs[1] if stats else placeholder(), "inv_std_out": outputs[2] if stats else placeholder(),
            "p": {"n": n, "epsilon": float(self.attr("epsilon", 1e-5)), "offset": 0.0,
                  "has_bias": int(bias is not None), "save_stats": int(stats)},
        }, (rows,), (row_threads(n),))]


KERNELS = {
    ("", "MatMul"): MetalMatMul,
    ("", "Gemm"): MetalGemm,
    ("hetero", "FusedMatMul"): MetalFusedMatMul,
    ("", "Softmax"): MetalSoftmax,
    ("", "LogSoftmax"): MetalSoftmax,
    ("", "LayerNormalization"): MetalLayerNorm,
}
