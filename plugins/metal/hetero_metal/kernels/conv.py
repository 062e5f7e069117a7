"""Convolution and pooling on Metal (msl/nn.metal): Conv / FusedConv and MaxPool / AveragePool, 1-D and 2-D, direct
(one output element per thread); GlobalAveragePool / GlobalMaxPool with simdgroup reductions. auto_pad SAME_* is
left to cpu."""

from __future__ import annotations

import numpy as np

from hetero.contract import NodeInfo, Support, unsupported
from hetero.contract.opforms import activation_known, activation_params

from ..plan import dispatch, groups_for
from .common import MetalKernel, float32_only, placeholder
from .elementwise import UNARY
from .nn import row_threads

THREADS = 256


def _text(value: object, default: str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or default)


def spatial_ok(node: NodeInfo, dtype_check: Support | None = None) -> Support:
    verdict = dtype_check if dtype_check is not None else float32_only(node, [0])
    x = node.inputs[0]
    if verdict and x is not None and x.rank not in (None, 3, 4):
        return unsupported(f"{node.op_type} on rank {x.rank} (metal: 1-D and 2-D spatial)")
    if verdict and _text(node.attr("auto_pad"), "NOTSET") not in ("NOTSET", "VALID"):
        return unsupported(f"{node.op_type} with auto_pad {_text(node.attr('auto_pad'), '')}")
    return verdict


def window(attrs: dict, rank: int, kernel: list[int]) -> dict[str, int]:
    """Strides, begin pads and dilations of a 1-D or 2-D window, as 2-D (a 1-D one gets H = 1)."""
    nsp = rank - 2
    strides = list(attrs.get("strides", [1] * nsp))
    dilations = list(attrs.get("dilations", [1] * nsp))
    pads = [0] * (2 * nsp) if _text(attrs.get("auto_pad"), "NOTSET") == "VALID" else \
        list(attrs.get("pads", [0] * (2 * nsp)))
    if nsp == 1:
        strides, dilations, pads, kernel = [1, *strides], [1, *dilations], [0, pads[0], 0, pads[1]], [1, *kernel]
    return {"kh": kernel[0], "kw": kernel[1], "stride_h": strides[0], "stride_w": strides[1], "pad_h": pads[0],
            "pad_w": pads[1], "dil_h": dilations[0], "dil_w": dilations[1], "pad_h_end": pads[2],
            "pad_w_end": pads[3]}


def _as_4d(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    return (shape[0], shape[1], 1, shape[2]) if len(shape) == 3 else (shape[0], shape[1], shape[2], shape[3])


class MetalConv(MetalKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        verdict = spatial_ok(node, float32_only(node))
        if verdict and node.op_type == "FusedConv" and not activation_known(node.node.attrs):
            return unsupported(f"fused activation {node.attr('activation')}")
        return verdict

    def plan(self, inputs, outputs):
        x, w, y = inputs[0], inputs[1], outputs[0]
        bias = inputs[2] if len(inputs) > 2 else None
        if y.size == 0:
            return []
        n, c_in, h, wd = _as_4d(x.shape)
        _, _, oh, ow = _as_4d(y.shape)
        geometry = window(self.node.attrs, x.ndim, list(w.shape[2:]))
        geometry.pop("pad_h_end")
        geometry.pop("pad_w_end")
        act = activation_params(self.node.attrs) if self.node.op_type == "FusedConv" else None
        name, alpha, beta = act or ("identity", 0.0, 0.0)
        return [dispatch("conv2d_f32", {"x": x, "weight": w, "bias": placeholder() if bias is None else bias, "y": y,
                                        "p": {"n": n, "c_in": c_in, "h": h, "w": wd, "c_out": y.shape[1], "oh": oh,
                                              "ow": ow, **geometry, "groups": int(self.attr("group", 1)),
                                              "has_bias": int(bias is not None), "act": UNARY[name],
                                              "act_alpha": alpha, "act_beta": beta}},
                         (groups_for(y.size, THREADS),), (THREADS,))]


class MetalPool(MetalKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        if len([o for o in node.node.outputs[1:] if o]):
            return unsupported("MaxPool with the Indices output")
        if node.attr("storage_order", 0):
            return unsupported("MaxPool with storage_order 1")
        return spatial_ok(node)

    def plan(self, inputs, outputs):
        x, y = inputs[0], outputs[0]
        if y.size == 0:
            return []
        n, c, h, w = _as_4d(x.shape)
        _, _, oh, ow = _as_4d(y.shape)
        return [dispatch("pool2d_f32", {"x": x, "y": y, "p": {
            "planes": n * c, "h": h, "w": w, "oh": oh, "ow": ow,
            **window(self.node.attrs, x.ndim, list(self.attr("kernel_shape"))),
            "is_max": int(self.node.op_type == "MaxPool"),
            "count_include_pad": int(self.attr("count_include_pad", 0))}}, (groups_for(y.size, THREADS),), (THREADS,))]


class MetalGlobalPool(MetalKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        verdict = float32_only(node)
        x = node.inputs[0]
        if verdict and x is not None and x.rank is not None and x.rank < 3:
            return unsupported(f"{node.op_type} on rank {x.rank}")
        return verdict

    def plan(self, inputs, outputs):
        x, y = inputs[0], outputs[0]
        planes = x.shape[0] * x.shape[1]
        n = int(np.prod(x.shape[2:], dtype=np.int64))
        if planes == 0 or n == 0:
            return []
        return [dispatch("global_pool_f32", {"x": x, "y": y, "p": {
            "n": n, "is_max": int(self.node.op_type == "GlobalMaxPool")}}, (planes,), (row_threads(n),))]


KERNELS = {
    ("", "Conv"): MetalConv,
    ("hetero", "FusedConv"): MetalConv,
    ("", "MaxPool"): MetalPool,
    ("", "AveragePool"): MetalPool,
    ("", "GlobalAveragePool"): MetalGlobalPool,
    ("", "GlobalMaxPool"): MetalGlobalPool,
}
