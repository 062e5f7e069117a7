"""Signal processing: the window generators (Hann, Hamming, Blackman), DFT, STFT and MelWeightMatrix."""

from __future__ import annotations

import numpy as np

from ..contract import dtypes
from ..contract.registry import OpContext, op
from ..contract.tensor import Dim, TensorInfo
from .shapes import input_info, np_dtype, output_dtype_from_attr, unknown


def _window_infer(ctx: OpContext) -> list[TensorInfo]:
    dtype = output_dtype_from_attr(ctx, "output_datatype", dtypes.float32)
    size = ctx.value(0)
    return [unknown(dtype, 1) if size is None else TensorInfo(dtype, (int(np.asarray(size).reshape(-1)[0]),))]


def _window(name: str, coeffs: tuple[float, ...]) -> None:
    def reference(ctx: OpContext) -> list[np.ndarray]:
        size = int(np.asarray(ctx.array(0)).reshape(-1)[0])
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


# -- DFT / STFT ------------------------------------------------------------------------------------------------------
def _scalar(value: np.ndarray | None) -> int | None:
    return None if value is None else int(np.asarray(value).reshape(-1)[0])


def _dft_axis(ctx: OpContext, rank: int) -> int | None:
    """The signal axis: an attribute (default 1) before opset 20, an optional input (default -2) from 20 on."""
    if ctx.opset < 20:
        axis: int | None = int(ctx.attr("axis", 1))
    elif ctx.has_input(2):
        axis = _scalar(ctx.value(2))
    else:
        axis = -2
    if axis is None:
        return None
    if not (-rank <= axis <= -2 or 0 <= axis <= rank - 2):
        raise ctx.fail(f"axis {axis} is out of range for rank {rank} (the last axis holds real/imaginary parts)")
    return axis + rank if axis < 0 else axis


def _dft_length(ctx: OpContext, dim: Dim) -> Dim:
    if ctx.has_input(1):
        return _scalar(ctx.value(1))
    if dim is None:
        return None
    if ctx.attr("onesided", 0) and ctx.attr("inverse", 0):
        return 2 * (dim - 1)
    return dim


def _dft_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    if x.shape is None:
        return [unknown(x.dtype)]
    axis = _dft_axis(ctx, len(x.shape))
    if axis is None:
        return [unknown(x.dtype, len(x.shape))]
    n = _dft_length(ctx, x.shape[axis])
    onesided, inverse = ctx.attr("onesided", 0), ctx.attr("inverse", 0)
    out = list(x.shape)
    if onesided and not inverse:
        out[axis] = None if n is None else n // 2 + 1
    else:
        out[axis] = n
    out[-1] = 1 if onesided and inverse else 2
    return [TensorInfo(x.dtype, tuple(out))]


def _as_complex(x: np.ndarray) -> np.ndarray:
    """(..., 1) real or (..., 2) real/imaginary pairs -> a complex array without the last axis."""
    x = x.astype(np.float64)
    return x[..., 0] + 1j * x[..., 1] if x.shape[-1] == 2 else x[..., 0].astype(np.complex128)


def _from_complex(c: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return np.stack([c.real, c.imag], axis=-1).astype(dtype)


@op("DFT", infer=_dft_infer, value_inputs=(1, 2))
def dft(ctx: OpContext) -> list[np.ndarray]:
    """Discrete Fourier transform along one signal axis: full complex (onesided=0), real-to-complex one-sided
    (onesided=1), their inverses (scaled by 1/N); dft_length pads with zeros or truncates the signal."""
    x = ctx.array(0)
    axis = _dft_axis(ctx, x.ndim)
    assert axis is not None
    n = _dft_length(ctx, x.shape[axis])
    onesided, inverse = bool(ctx.attr("onesided", 0)), bool(ctx.attr("inverse", 0))
    c = _as_complex(x)
    if onesided and inverse:
        return [np.fft.irfft(c, n=n, axis=axis)[..., None].astype(x.dtype)]
    if onesided:
        if x.shape[-1] != 1:
            raise ctx.fail("a one-sided forward DFT needs a real input (last dim 1)")
        return [_from_complex(np.fft.rfft(c.real, n=n, axis=axis), x.dtype)]
    transform = np.fft.ifft if inverse else np.fft.fft
    return [_from_complex(transform(c, n=n, axis=axis), x.dtype)]


def _stft_frame_length(ctx: OpContext, signal_length: Dim) -> Dim:
    if ctx.has_input(3):
        return _scalar(ctx.value(3))
    if ctx.has_input(2):
        w = input_info(ctx, 2).shape
        return None if w is None else w[0]
    return signal_length


def _stft_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    if x.shape is None or len(x.shape) != 3:
        if x.shape is not None:
            raise ctx.fail(f"signal must be 3-D (batch, length, 1 or 2), got rank {len(x.shape)}")
        return [unknown(x.dtype, 4)]
    step = _scalar(ctx.value(1))
    length = _stft_frame_length(ctx, x.shape[1])
    n = x.shape[1]
    frames = None if step is None or length is None or n is None else (n - length) // step + 1
    onesided = ctx.attr("onesided", 1) and x.shape[2] == 1
    bins = None if length is None else (length // 2 + 1 if onesided else length)
    return [TensorInfo(x.dtype, (x.shape[0], frames, bins, 2))]


@op("STFT", infer=_stft_infer, value_inputs=(1, 3))
def stft(ctx: OpContext) -> list[np.ndarray]:
    """Short-time Fourier transform: frames of frame_length every frame_step samples, each multiplied by the window
    (rectangular by default) and transformed (one-sided for real signals unless onesided=0)."""
    x = ctx.array(0)
    step = int(_scalar(ctx.array(1)) or 0)
    length = int(_stft_frame_length(ctx, x.shape[1]) or 0)
    window = ctx.array(2).astype(np.float64) if ctx.has_input(2) else np.ones(length)
    if window.shape[0] != length:
        raise ctx.fail(f"window has {window.shape[0]} values, frame_length is {length}")
    c = _as_complex(x)  # (batch, signal_length)
    frames = (x.shape[1] - length) // step + 1
    starts = np.arange(frames) * step
    windows = c[:, starts[:, None] + np.arange(length)[None, :]] * window  # (batch, frames, length)
    if ctx.attr("onesided", 1) and x.shape[2] == 1:
        spectrum = np.fft.rfft(windows.real, axis=-1)
    else:
        spectrum = np.fft.fft(windows, axis=-1)
    return [_from_complex(spectrum, x.dtype)]


# -- MelWeightMatrix -------------------------------------------------------------------------------------------------
def _mel_infer(ctx: OpContext) -> list[TensorInfo]:
    dtype = output_dtype_from_attr(ctx, "output_datatype", dtypes.float32)
    mels, n = _scalar(ctx.value(0)), _scalar(ctx.value(1))
    return [TensorInfo(dtype, (None if n is None else n // 2 + 1, mels))]


@op("MelWeightMatrix", infer=_mel_infer, value_inputs=(0, 1))
def mel_weight_matrix(ctx: OpContext) -> list[np.ndarray]:
    """Triangular mel filterbank (peak 1.0) of shape (dft_length // 2 + 1, num_mel_bins).

    The num_mel_bins + 2 edges are evenly spaced on the mel scale mel(f) = 2595 * log10(1 + f / 700) from
    lower_edge_hertz to upper_edge_hertz, and mapped to spectrogram bins floor((dft_length + 1) * f / sample_rate);
    band i rises linearly from edge i to edge i + 1 and falls to edge i + 2.
    """
    mels, n = int(_scalar(ctx.array(0)) or 0), int(_scalar(ctx.array(1)) or 0)
    rate = float(np.asarray(ctx.array(2)).reshape(-1)[0])
    low, high = (float(np.asarray(v).reshape(-1)[0]) for v in ctx.values[3:5])
    bins = n // 2 + 1

    def to_mel(f: np.ndarray | float) -> np.ndarray:
        return 2595 * np.log10(1 + np.asarray(f) / 700)

    edges_mel = np.linspace(to_mel(low), to_mel(high), mels + 2)
    edges_hz = 700 * (10 ** (edges_mel / 2595) - 1)
    edges = np.floor((n + 1) * edges_hz / rate).astype(np.int64)
    out = np.zeros((bins, mels))
    for i in range(mels):
        left, center, right = edges[i], edges[i + 1], edges[i + 2]
        if center == left:
            center += 1
        if right == center:
            right += 1
        for k in range(left, center):
            if 0 <= k < bins:
                out[k, i] = (k - left) / (center - left)
        for k in range(center, right):
            if 0 <= k < bins:
                out[k, i] = (right - k) / (right - center)
    return [out.astype(np_dtype(_mel_infer(ctx)[0].dtype))]
