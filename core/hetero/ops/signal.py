"""Signal-processing helpers: the window generators (Hann, Hamming, Blackman)."""

from __future__ import annotations

import numpy as np

from .. import dtypes
from ..tensor import TensorInfo
from .registry import OpContext, op
from .shapes import np_dtype, output_dtype_from_attr, unknown


def _window_infer(ctx: OpContext) -> list[TensorInfo]:
    dtype = output_dtype_from_attr(ctx, "output_datatype", dtypes.float32)
    size = ctx.value(0)
    return [unknown(dtype, 1) if size is None else TensorInfo(dtype, (int(np.asarray(size).reshape(-1)[0]),))]


def _window(name: str, coeffs: tuple[float, ...]) -> None:
    def reference(ctx: OpContext) -> list[np.ndarray]:
        size = int(np.asarray(ctx.values[0]).reshape(-1)[0])
        # Periodic windows have period `size`; symmetric ones end where they start (period size - 1).
        period = size if ctx.attr("periodic", 1) else size - 1
        n = np.arange(size, dtype=np.float64)
        w = np.zeros(size)
        for k, c in enumerate(coeffs):
            w += (-1) ** k * c * np.cos(2 * np.pi * k * n / max(period, 1))
        return [w.astype(np_dtype(_window_infer(ctx)[0].dtype))]

    reference.__doc__ = f"{name}: a cosine-sum window of the given length."
    op(name, infer=_window_infer, value_inputs=(0,))(reference)


_window("HannWindow", (0.5, 0.5))
_window("HammingWindow", (25 / 46, 1 - 25 / 46))
_window("BlackmanWindow", (0.42, 0.5, 0.08))
