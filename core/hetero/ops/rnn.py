"""Recurrent layers: RNN, GRU and LSTM (forward, reverse or bidirectional; sequence_lens; layout 0 or 1)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..contract.graph import MICROSOFT_DOMAIN
from ..contract.opforms import dq_lstm_weights
from ..contract.registry import OpContext, op
from ..contract.tensor import Dim, TensorInfo
from .shapes import expect_shape, input_info, unknown

Activation = Callable[[np.ndarray], np.ndarray]

# Activations that take (alpha, beta) from activation_alpha / activation_beta, in order, and their defaults.
_PARAMS: dict[str, tuple[float | None, float | None]] = {
    "affine": (1.0, 0.0), "leakyrelu": (0.01, None), "thresholdedrelu": (1.0, None), "scaledtanh": (1.0, 1.0),
    "hardsigmoid": (0.2, 0.5), "elu": (1.0, None),
}


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1 + np.tanh(0.5 * x))  # overflow-free form of 1 / (1 + exp(-x))


def _activation(name: str, alpha: float | None, beta: float | None) -> Activation:
    key = name.lower()

    def a(default: float) -> float:  # unset: the default of the ONNX op of the same name
        return default if alpha is None else alpha

    def b(default: float) -> float:
        return default if beta is None else beta

    table: dict[str, Activation] = {
        "relu": lambda x: np.maximum(x, 0),
        "tanh": np.tanh,
        "sigmoid": _sigmoid,
        "affine": lambda x: a(1.0) * x + b(0.0),
        "leakyrelu": lambda x: np.where(x >= 0, x, a(0.01) * x),
        "thresholdedrelu": lambda x: np.where(x > a(1.0), x, 0),
        "scaledtanh": lambda x: a(1.0) * np.tanh(b(1.0) * x),
        "hardsigmoid": lambda x: np.clip(a(0.2) * x + b(0.5), 0, 1),
        "elu": lambda x: np.where(x >= 0, x, a(1.0) * (np.exp(x) - 1)),
        "softsign": lambda x: x / (1 + np.abs(x)),
        "softplus": lambda x: np.logaddexp(0, x),
    }
    if key not in table:
        raise ValueError(f"unknown RNN activation {name!r}")
    return table[key]


def _activations(ctx: OpContext, defaults: list[str], n_dirs: int) -> list[list[Activation]]:
    """Per direction, the activation functions (f, g[, h])."""
    names = list(ctx.attr("activations", None) or defaults * n_dirs)
    alphas = list(ctx.attr("activation_alpha", None) or [])
    betas = list(ctx.attr("activation_beta", None) or [])
    fns = []
    for name in names:
        alpha, beta = _PARAMS.get(name.lower(), (None, None))
        if alpha is not None and alphas:
            alpha = alphas.pop(0)
        if beta is not None and betas:
            beta = betas.pop(0)
        fns.append(_activation(name, alpha, beta))
    per = len(defaults)
    return [fns[d * per : (d + 1) * per] for d in range(n_dirs)]


def _n_dirs(ctx: OpContext) -> int:
    return 2 if ctx.attr("direction", "forward") == "bidirectional" else 1


def _rnn_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    hidden = ctx.attr("hidden_size", None)
    if hidden is None:
        r = input_info(ctx, 2).shape
        hidden = None if r is None else r[-1]
    dirs = _n_dirs(ctx)
    if x.shape is None:
        return [unknown(x.dtype, 4), unknown(x.dtype, 3), unknown(x.dtype, 3)]
    layout = ctx.attr("layout", 0)
    if len(x.shape) != 3:
        raise ctx.fail(f"X must be 3-D, got shape {list(x.shape)}")
    seq, batch = (x.shape[1], x.shape[0]) if layout else (x.shape[0], x.shape[1])
    _check_weights(ctx, dirs, hidden, batch, x.shape[2])
    y: tuple[Dim, ...] = (batch, seq, dirs, hidden) if layout else (seq, dirs, batch, hidden)
    state: tuple[Dim, ...] = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    return [TensorInfo(x.dtype, y), TensorInfo(x.dtype, state), TensorInfo(x.dtype, state)]


def _check_weights(ctx: OpContext, dirs: int, hidden: Dim, batch: Dim, features: Dim) -> None:
    """W, R, B, sequence_lens, the initial states and P agree with X, hidden_size and the direction count."""
    gates = _GATES[ctx.node.op_type]
    rows = None if hidden is None else gates * hidden
    if hidden is not None and hidden < 1:
        raise ctx.fail(f"hidden_size {hidden} must be positive")
    expect_shape(ctx, "W", input_info(ctx, 1).shape, (dirs, rows, features))
    expect_shape(ctx, "R", input_info(ctx, 2).shape, (dirs, rows, hidden))
    state = (batch, dirs, hidden) if ctx.attr("layout", 0) else (dirs, batch, hidden)
    optional = {3: ("B", (dirs, None if rows is None else 2 * rows)), 4: ("sequence_lens", (batch,)),
                5: ("initial_h", state), 6: ("initial_c", state), 7: ("P", (dirs, None if hidden is None
                                                                            else 3 * hidden))}
    for index, (name, want) in optional.items():
        if ctx.has_input(index) and (index < 6 or gates == 4):
            expect_shape(ctx, name, input_info(ctx, index).shape, want)


_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


Cell = Callable[[np.ndarray, list[np.ndarray], int], list[np.ndarray]]


def _run(ctx: OpContext, n_gates: int, n_states: int, make_cell: Callable[[int, np.ndarray, np.ndarray, np.ndarray,
                                                                                 list[Activation]], Cell],
         defaults: list[str], weights: tuple[np.ndarray, np.ndarray] | None = None) -> list[np.ndarray]:
    """The shared driver: layouts, directions, sequence lengths and initial states; ``make_cell`` does one step.

    ``weights``: W and R in the ONNX layout ([dirs, gates * hidden, input], [dirs, gates * hidden, hidden]) when they
    are not inputs 1 and 2 as they stand (the quantized contrib op)."""
    x = ctx.array(0)
    layout = ctx.attr("layout", 0)
    x64 = np.swapaxes(x, 0, 1) if layout else x  # -> (seq, batch, input)
    x64 = x64.astype(np.float64)
    seq, batch = x64.shape[:2]
    w, r = weights if weights is not None else (ctx.array(1), ctx.array(2))
    w, r = w.astype(np.float64), r.astype(np.float64)
    hidden = r.shape[-1]
    dirs = _n_dirs(ctx)
    b = ctx.array(3).astype(np.float64) if ctx.has_input(3) else np.zeros((dirs, 2 * n_gates * hidden))
    lens = ctx.array(4).astype(np.int64) if ctx.has_input(4) else np.full(batch, seq, dtype=np.int64)
    states0 = []
    for k in range(n_states):
        idx = 5 + k
        if ctx.has_input(idx):
            s = ctx.array(idx).astype(np.float64)
            states0.append(np.swapaxes(s, 0, 1) if layout else s)
        else:
            states0.append(np.zeros((dirs, batch, hidden)))
    acts = _activations(ctx, defaults, dirs)
    reverse_all = ctx.attr("direction", "forward") == "reverse"
    step_valid = np.arange(seq)[:, None] < lens[None, :]  # (seq, batch)
    y = np.zeros((seq, dirs, batch, hidden))
    finals = [np.zeros((dirs, batch, hidden)) for _ in range(n_states)]
    for d in range(dirs):
        backward = reverse_all or d == 1
        xs = _reverse_valid(x64, lens) if backward else x64
        cell = make_cell(d, w[d], r[d], b[d], acts[d])
        states = [s[d] for s in states0]
        for t in range(seq):
            new = cell(xs[t], states, t)
            valid = step_valid[t][:, None]
            states = [np.where(valid, n, s) for n, s in zip(new, states, strict=True)]
            y[t, d] = np.where(valid, states[0], 0)
        if backward:
            y[:, d] = _reverse_valid(y[:, d], lens)
        for k in range(n_states):
            finals[k][d] = states[k]
    outs = [np.transpose(y, (2, 0, 1, 3)), *[np.swapaxes(f, 0, 1) for f in finals]] if layout else [y, *finals]
    return [o.astype(x.dtype) for o in outs]


def _reverse_valid(xs: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Reverse each batch entry's first lens[b] steps (axis 0 is time, axis 1 batch)."""
    out = xs.copy()
    for bi, n in enumerate(lens):
        out[:n, bi] = xs[:n, bi][::-1]
    return out


def _clip(ctx: OpContext) -> Callable[[np.ndarray], np.ndarray]:
    limit = ctx.attr("clip", None)
    return (lambda v: v) if limit is None else (lambda v: np.clip(v, -limit, limit))


@op("RNN", infer=_rnn_infer)
def rnn(ctx: OpContext) -> list[np.ndarray]:
    """Simple recurrent layer: H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb)."""
    clip = _clip(ctx)

    def make(d: int, w: np.ndarray, r: np.ndarray, b: np.ndarray, acts: list[Activation]) -> Cell:
        h_n = r.shape[-1]
        bias = b[:h_n] + b[h_n:]
        return lambda xt, states, t: [acts[0](clip(xt @ w.T + states[0] @ r.T + bias))]

    return _run(ctx, 1, 1, make, ["Tanh"])[:2]


@op("GRU", infer=_rnn_infer)
def gru(ctx: OpContext) -> list[np.ndarray]:
    """Gated recurrent unit (gates z, r, h); linear_before_reset applies the reset gate after R_h."""
    clip = _clip(ctx)
    lbr = bool(ctx.attr("linear_before_reset", 0))

    def make(d: int, w: np.ndarray, r: np.ndarray, b: np.ndarray, acts: list[Activation]) -> Cell:
        h_n = r.shape[-1]
        wb, rb = b[: 3 * h_n], b[3 * h_n :]
        wz, wr, wh = np.split(w, 3)
        rz, rr, rh = np.split(r, 3)
        f, g = acts

        def cell(xt: np.ndarray, states: list[np.ndarray], t: int) -> list[np.ndarray]:
            h = states[0]
            z = f(clip(xt @ wz.T + h @ rz.T + wb[:h_n] + rb[:h_n]))
            rg = f(clip(xt @ wr.T + h @ rr.T + wb[h_n : 2 * h_n] + rb[h_n : 2 * h_n]))
            if lbr:
                cand = g(clip(xt @ wh.T + rg * (h @ rh.T + rb[2 * h_n :]) + wb[2 * h_n :]))
            else:
                cand = g(clip(xt @ wh.T + (rg * h) @ rh.T + rb[2 * h_n :] + wb[2 * h_n :]))
            return [(1 - z) * cand + z * h]

        return cell

    return _run(ctx, 3, 1, make, ["Sigmoid", "Tanh"])[:2]


def _lstm_update(gates: np.ndarray, c: np.ndarray, acts: list[Activation], clip: Callable[[np.ndarray], np.ndarray],
                 couple: bool, peep: tuple) -> list[np.ndarray]:
    """One LSTM step from its gate pre-activations (i, o, f, c): the new H and C."""
    f, g, hf = acts
    p_i, p_o, p_f = peep
    gi, go, gf, gc = np.split(gates, 4, axis=-1)
    i = f(clip(gi + p_i * c))
    fg = 1 - i if couple else f(clip(gf + p_f * c))
    c_new = fg * c + i * g(clip(gc))
    o = f(clip(go + p_o * c_new))
    return [o * hf(c_new), c_new]


@op("LSTM", infer=_rnn_infer)
def lstm(ctx: OpContext) -> list[np.ndarray]:
    """Long short-term memory (gates i, o, f, c), optional peepholes P and coupled input/forget gates."""
    clip = _clip(ctx)
    couple = bool(ctx.attr("input_forget", 0))
    peep = ctx.array(7).astype(np.float64) if ctx.has_input(7) else None

    def make(d: int, w: np.ndarray, r: np.ndarray, b: np.ndarray, acts: list[Activation]) -> Cell:
        h_n = r.shape[-1]
        bias = b[: 4 * h_n] + b[4 * h_n :]
        p_i, p_o, p_f = np.split(peep[d], 3) if peep is not None else (0.0, 0.0, 0.0)

        def cell(xt: np.ndarray, states: list[np.ndarray], t: int) -> list[np.ndarray]:
            h, c = states
            return _lstm_update(xt @ w.T + h @ r.T + bias, c, acts, clip, couple, (p_i, p_o, p_f))

        return cell

    return _run(ctx, 4, 2, make, ["Sigmoid", "Tanh", "Tanh"])


# ------------------------------------------------------------------------------- com.microsoft::DynamicQuantizeLSTM

def _dq_lstm_infer(ctx: OpContext) -> list[TensorInfo]:
    """As LSTM, with W [dirs, input, 4 * hidden] and R [dirs, hidden, 4 * hidden] (transposed, 8-bit) and their
    scales / zero points [dirs] (per tensor) or [dirs, 4 * hidden] (per output channel)."""
    x = input_info(ctx, 0)
    r = input_info(ctx, 2).shape
    hidden = ctx.attr("hidden_size", None)
    if hidden is None:
        hidden = None if r is None else r[1]
    dirs = _n_dirs(ctx)
    if ctx.attr("layout", 0):
        raise ctx.fail("DynamicQuantizeLSTM has no batch-major layout")
    if x.shape is None:
        return [unknown(x.dtype, 4), unknown(x.dtype, 3), unknown(x.dtype, 3)]
    if len(x.shape) != 3:
        raise ctx.fail(f"X must be 3-D, got shape {list(x.shape)}")
    seq, batch, features = x.shape
    rows = None if hidden is None else 4 * hidden
    expect_shape(ctx, "W", input_info(ctx, 1).shape, (dirs, features, rows))
    expect_shape(ctx, "R", r, (dirs, hidden, rows))
    state = (dirs, batch, hidden)
    optional = {3: ("B", (dirs, None if rows is None else 2 * rows)), 4: ("sequence_lens", (batch,)),
                5: ("initial_h", state), 6: ("initial_c", state), 7: ("P", (dirs, None if hidden is None
                                                                            else 3 * hidden))}
    for index, (name, want) in optional.items():
        if ctx.has_input(index):
            expect_shape(ctx, name, input_info(ctx, index).shape, want)
    for index, name in ((8, "W_scale"), (9, "W_zero_point"), (10, "R_scale"), (11, "R_zero_point")):
        shape = input_info(ctx, index).shape
        if shape is not None and len(shape) not in (1, 2):
            raise ctx.fail(f"{name} must be [num_directions] or [num_directions, 4 * hidden_size], got {list(shape)}")
    return [TensorInfo(x.dtype, (seq, dirs, batch, hidden)), TensorInfo(x.dtype, state), TensorInfo(x.dtype, state)]


def quantize_activation(a: np.ndarray) -> tuple[np.ndarray, float]:
    """Dynamic uint8 quantization of a whole float32 matrix as onnxruntime's quantized RNN GEMMs do it: the range
    widened to hold 0, scale (max - min) / 255, the zero point rounded; returns (q - zero_point as float64, scale)."""
    a = np.asarray(a, np.float32)
    lo = np.float32(min(0.0, float(a.min()))) if a.size else np.float32(0)
    hi = np.float32(max(0.0, float(a.max()))) if a.size else np.float32(0)
    scale = np.float32((hi - lo) / np.float32(255)) if hi > lo else np.float32(1)
    zero = float(np.clip(np.rint(-lo / scale), 0, 255))
    q = np.clip(np.rint(a / scale) + zero, 0, 255)  # round half to even, as the float->int conversion does
    return q.astype(np.float64) - zero, float(scale)


@op("DynamicQuantizeLSTM", domain=MICROSOFT_DOMAIN, infer=_dq_lstm_infer)
def dynamic_quantize_lstm(ctx: OpContext) -> list[np.ndarray]:
    """onnxruntime's contrib LSTM with 8-bit weights (gates i, o, f, c): each GEMM's activations quantized to uint8
    on the fly (one scale for all time steps of X, one per step for H), integer products scaled by the activation's
    and the weight's scale; the rest as LSTM, in float."""
    clip = _clip(ctx)
    couple = bool(ctx.attr("input_forget", 0))
    peep = ctx.array(7).astype(np.float64) if ctx.has_input(7) else None
    w_ints, w_scales = dq_lstm_weights(ctx.array(1), ctx.array(8), ctx.array(9))
    r_ints, r_scales = dq_lstm_weights(ctx.array(2), ctx.array(10), ctx.array(11))
    x_ints, x_scale = quantize_activation(ctx.array(0))  # the input GEMM runs once over all steps: one range

    def make(d: int, w: np.ndarray, r: np.ndarray, b: np.ndarray, acts: list[Activation]) -> Cell:
        h_n = r.shape[-1]
        bias = b[: 4 * h_n] + b[4 * h_n :]
        p_i, p_o, p_f = np.split(peep[d], 3) if peep is not None else (0.0, 0.0, 0.0)
        order = _reverse_valid(x_ints, lens) if (reverse_all or d == 1) else x_ints

        def cell(xt: np.ndarray, states: list[np.ndarray], t: int) -> list[np.ndarray]:
            h, c = states
            h_ints, h_scale = quantize_activation(h)
            gates = ((order[t] @ w.T) * (x_scale * w_scales[d]) + (h_ints @ r.T) * (h_scale * r_scales[d])
                     + bias)
            return _lstm_update(gates, c, acts, clip, couple, (p_i, p_o, p_f))

        return cell

    seq, batch = ctx.array(0).shape[:2]
    lens = ctx.array(4).astype(np.int64) if ctx.has_input(4) else np.full(batch, seq, dtype=np.int64)
    reverse_all = ctx.attr("direction", "forward") == "reverse"
    return _run(ctx, 4, 2, make, ["Sigmoid", "Tanh", "Tanh"], weights=(w_ints, r_ints))
