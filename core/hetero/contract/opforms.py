"""How kernels read op attributes: the forms every backend (and the numpy reference) reads the same way, once.

* ONNX's elementwise unary ops: a snake_case op name and two float parameters. Each ONNX op maps to (kernel op name,
  attribute feeding ``alpha``, its default, attribute feeding ``beta``, its default). A backend registers the ONNX
  ops whose kernel op names it implements.
* the activation a fused Conv / MatMul node carries (``activation_params``); a DwPointwiseConv's two convs'
  attributes (``split_dw_pointwise_attrs``);
* the rotary embedding's frequencies and scale (``rope_inv_freq``);
* the gated delta rule's ``mode`` values (``GATED_DELTA_MODES``) and its attributes with their defaults
  (``GatedDeltaAttrs``);
* the dims a ``Shape`` node returns (``shape_range``);
* a step of several sequences: per-row positions and slots, cut into one-sequence runs (``slot_runs``);
* Resize's source coordinate of each output (``source_coords``, float64) and nearest index (``nearest_indices``);
* DynamicQuantizeLSTM's 8-bit weights in the LSTM layout with their per-column scales (``dq_lstm_weights``);
* ai.onnx.ml LabelEncoder's keys, values, default and output type (``label_table``) and its lookup dict, built once
  per node (``label_lookup``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from . import dtypes
from .errors import HeteroError
from .tensor import static_shape

if TYPE_CHECKING:
    from .registry import OpContext

# ONNX op -> (kernel op, alpha attribute, its default, beta attribute, its default)
UNARY_FORMS: dict[str, tuple[str, str | None, float, str | None, float]] = {
    "Relu": ("relu", None, 0.0, None, 0.0),
    "LeakyRelu": ("leaky_relu", "alpha", 0.01, None, 0.0),
    "Elu": ("elu", "alpha", 1.0, None, 0.0),
    "Selu": ("selu", "alpha", 1.6732632423543772, "gamma", 1.0507009873554805),
    "Celu": ("celu", "alpha", 1.0, None, 0.0),
    "Sigmoid": ("sigmoid", None, 0.0, None, 0.0),
    "HardSigmoid": ("hard_sigmoid", "alpha", 0.2, "beta", 0.5),
    "HardSwish": ("hard_swish", None, 0.0, None, 0.0),
    "Tanh": ("tanh", None, 0.0, None, 0.0),
    "Softplus": ("softplus", None, 0.0, None, 0.0),
    "Softsign": ("softsign", None, 0.0, None, 0.0),
    "Exp": ("exp", None, 0.0, None, 0.0),
    "Log": ("log", None, 0.0, None, 0.0),
    "Sqrt": ("sqrt", None, 0.0, None, 0.0),
    "Neg": ("neg", None, 0.0, None, 0.0),
    "Abs": ("abs", None, 0.0, None, 0.0),
    "Reciprocal": ("reciprocal", None, 0.0, None, 0.0),
    "Erf": ("erf", None, 0.0, None, 0.0),
    "Floor": ("floor", None, 0.0, None, 0.0),
    "Ceil": ("ceil", None, 0.0, None, 0.0),
    "Round": ("round", None, 0.0, None, 0.0),
    "Sin": ("sin", None, 0.0, None, 0.0),
    "Cos": ("cos", None, 0.0, None, 0.0),
    "Tan": ("tan", None, 0.0, None, 0.0),
    "Mish": ("mish", None, 0.0, None, 0.0),
    "Sign": ("sign", None, 0.0, None, 0.0),
    "ThresholdedRelu": ("thresholded_relu", "alpha", 1.0, None, 0.0),
}


def unary_params(op_type: str, attrs: dict[str, Any]) -> tuple[str, float, float]:
    """(kernel op, alpha, beta) for an ONNX unary node; Gelu picks "gelu" or "gelu_tanh" by ``approximate``."""
    if op_type == "Gelu":
        return ("gelu_tanh" if attrs.get("approximate", "none") == "tanh" else "gelu"), 0.0, 0.0
    name, alpha_key, alpha, beta_key, beta = UNARY_FORMS[op_type]
    return (name, float(attrs.get(alpha_key, alpha)) if alpha_key else alpha,
            float(attrs.get(beta_key, beta)) if beta_key else beta)


# For kernels: each fused activation as a snake_case unary op with its (alpha, beta) attributes and defaults.
_KERNEL_FORM: dict[str, tuple[str, str | None, float, str | None, float]] = {
    "Relu": ("relu", None, 0.0, None, 0.0),
    "Clip": ("clip", "activation_min", float("-inf"), "activation_max", float("inf")),
    "Sigmoid": ("sigmoid", None, 0.0, None, 0.0),
    "Tanh": ("tanh", None, 0.0, None, 0.0),
    "LeakyRelu": ("leaky_relu", "activation_alpha", 0.01, None, 0.0),
    # max(LeakyRelu(x), min): a LeakyRelu and a Max by a constant after it (fold_conv_clamp)
    "LeakyReluMin": ("leaky_relu_min", "activation_alpha", 0.01, "activation_min", float("-inf")),
    "HardSigmoid": ("hard_sigmoid", "activation_alpha", 0.2, "activation_beta", 0.5),
    "HardSwish": ("hard_swish", None, 0.0, None, 0.0),
    "Silu": ("silu", None, 0.0, None, 0.0),
}


def activation_params(attrs: dict) -> tuple[str, float, float] | None:
    """A fused node's activation as a kernel sees it: (unary op, alpha, beta), e.g. ("clip", 0.0, 6.0); None when
    the node has none. Raises KeyError for an activation this table lacks (check ``activation_known`` first)."""
    name = attrs.get("activation", "")
    if not name:
        return None
    op_name, alpha_key, alpha, beta_key, beta = _KERNEL_FORM[name]
    return (op_name, float(attrs.get(alpha_key, alpha)) if alpha_key else alpha,
            float(attrs.get(beta_key, beta)) if beta_key else beta)


def activation_known(attrs: dict) -> bool:
    return attrs.get("activation", "") in ("", *_KERNEL_FORM)


# DwPointwiseConv's attributes that belong to its 1x1 conv (the prefix dropped); the rest are the depthwise conv's.
POINTWISE_PREFIX = "pw_"


def split_dw_pointwise_attrs(attrs: dict) -> tuple[dict, dict]:
    """(the depthwise conv's attributes, the 1x1 conv's) of a hetero.DwPointwiseConv node."""
    pw = {k[len(POINTWISE_PREFIX):]: v for k, v in attrs.items() if k.startswith(POINTWISE_PREFIX)}
    dw = {k: v for k, v in attrs.items() if not k.startswith(POINTWISE_PREFIX)}
    return dw, pw


def rope_inv_freq(rotary_dim: int, attrs: dict) -> tuple[np.ndarray, float]:
    """The rotation frequencies (float64 ``[rotary_dim / 2]``) and the cos/sin scale for the given attributes."""
    theta = float(attrs.get("theta", 10000.0))
    inv_freq = 1.0 / theta ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)
    scaling = attrs.get("scaling", "none")
    factor = float(attrs.get("factor", 1.0))
    if scaling in ("none", "default"):
        return inv_freq, 1.0
    if scaling == "linear":
        return inv_freq / factor, 1.0
    if scaling != "yarn":
        raise HeteroError(f"rope scaling {scaling!r} is not supported (none, linear, yarn)")
    # YaRN: dims that turn many times over the original context keep their frequency (extrapolate), dims that turn
    # less than once are interpolated (divided by factor), with a linear ramp between the two wavelength bounds.
    original = float(attrs.get("original_max_position", 4096))

    def dim_for_turns(turns: float) -> float:
        return rotary_dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_for_turns(float(attrs.get("beta_fast", 32.0))), dim_for_turns(float(attrs.get("beta_slow", 1.0)))
    if int(attrs.get("truncate", 1)):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if high == low:
        high += 1e-3
    ramp = np.clip((np.arange(rotary_dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    keep = 1.0 - ramp  # 1: extrapolate (original frequency), 0: interpolate
    inv_freq = inv_freq / factor * (1 - keep) + inv_freq * keep
    return inv_freq, float(attrs.get("attention_factor", 1.0))


# The GatedDeltaRule op's ``mode`` attribute: how the recurrence runs over a sequence.
GATED_DELTA_MODES = ("auto", "chunked", "recurrent")


@dataclass(frozen=True)
class GatedDeltaAttrs:
    """A GatedDeltaRule node's attributes, defaults filled in (hetero.ops.gated_delta documents them)."""

    k_heads: int
    v_heads: int
    k_dim: int
    v_dim: int
    scale: float  # 0 in the node: 1 / sqrt(k_dim)
    qk_l2norm: bool
    l2norm_eps: float
    norm_eps: float
    silu: bool  # conv_activation
    chunk_size: int
    snapshot_interval: int
    max_snapshots: int  # at least 1
    max_context: int  # 0: unbounded

    @property
    def channels(self) -> int:
        """The packed qkv width: q | k | v."""
        return 2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim

    @staticmethod
    def of(attrs: dict[str, Any]) -> GatedDeltaAttrs:
        dk = int(attrs["k_dim"])
        return GatedDeltaAttrs(
            int(attrs["k_heads"]), int(attrs["v_heads"]), dk, int(attrs["v_dim"]),
            float(attrs.get("scale", 0.0)) or 1.0 / math.sqrt(dk), bool(int(attrs.get("qk_l2norm", 1))),
            float(attrs.get("l2norm_eps", 1e-6)), float(attrs.get("norm_eps", 1e-6)),
            str(attrs.get("conv_activation", "silu")) == "silu", int(attrs.get("chunk_size", 64)),
            int(attrs.get("snapshot_interval", 256)), max(int(attrs.get("max_snapshots", 8)), 1),
            int(attrs.get("max_context", 0)))


def gated_delta_refusal(node_attrs: dict[str, Any], conv_weight_rank: int | None) -> str | None:
    """Why a GatedDeltaRule node is outside what the op defines for kernels (its mode, the conv weight's rank), or
    None."""
    if str(node_attrs.get("mode", "auto")) not in GATED_DELTA_MODES:
        return f"GatedDeltaRule mode {node_attrs.get('mode')!r}"
    if conv_weight_rank not in (None, 2, 3):
        return "GatedDeltaRule conv_weight must be [C, K] or [C, 1, K]"
    return None


def gated_delta_restore_point(snapshots: dict[int, Any], block_pos: int, target: int) -> tuple[int, int]:
    """Rolling a GatedDeltaRule node back to position ``target`` (hetero.ops.gated_delta's policy): drops the
    snapshots after it from ``snapshots`` (in place) and returns (the block-start checkpoint's position, -1 once it
    is after ``target``; the position to restore from: a snapshot's, else the checkpoint's when it is newer, else 0
    for the zero state). The kernel then recomputes the positions from there to ``target``."""
    for position in [p for p in snapshots if p > target]:
        del snapshots[position]
    if block_pos > target:
        block_pos = -1
    base = max(snapshots, default=0)
    return block_pos, block_pos if block_pos > base else base


def layer_norm_broadcast(node: Any) -> str | None:
    """Why a LayerNormalization node (a ``NodeInfo``) cannot run on a kernel that reads scale and bias as whole
    ``x_shape[axis:]`` rows: a scale or bias that broadcasts into them. None when both have the rows' shape or a
    shape is not known before run time."""
    inputs = node.inputs
    x, scale = inputs[0], inputs[1] if len(inputs) > 1 else None
    if x is None or scale is None or not (x.is_static and scale.is_static):
        return None
    x_shape = static_shape(x)
    axis = int(node.attr("axis", -1))
    rows = x_shape[axis + len(x_shape) if axis < 0 else axis:]
    if static_shape(scale) != rows:
        return "LayerNormalization with a broadcast scale"
    bias = inputs[2] if len(inputs) > 2 else None
    if bias is not None and bias.is_static and static_shape(bias) != rows:
        return "LayerNormalization with a broadcast bias"
    return None


def cache_range_error(label: str, past: int, t: int, filled: int, max_context: int) -> HeteroError | None:
    """What is wrong with an Attention step of ``t`` new tokens after ``past`` cached ones, when the cache holds
    ``filled`` positions of ``max_context``: the error every backend raises, or None when the step fits."""
    if past < 0 or past > filled:
        return HeteroError(f"{label}: past_len {past} is outside the {filled} cached positions")
    if past + t > max_context:
        return HeteroError(f"{label}: {past} cached + {t} new tokens exceed the context of {max_context} tokens",
                           hint="load the model with a larger context")
    return None


def shape_range(start: int, end: int | None, rank: int) -> tuple[int, int]:
    """The dims [start, end) a ``Shape`` node returns (opset 15's ``start`` / ``end``: negatives count from the
    back, both clamped into [0, rank], an empty range where end < start)."""
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = rank if end is None else min(max(end + rank if end < 0 else end, 0), rank)
    return start, max(end, start)


# -- several sequences in one step (continuous batching) -------------------------------------------------------------
# A step of a model serving several sequences (``hetero.llm.batch``) carries per-row positions (int64 ``[T]``) where
# a one-sequence step has ``past_len``, and its stateful ops an int64 ``[T]`` ``slots`` input: the sequence (the
# state: KV cache, recurrent state) each row belongs to, one of the node's ``slots`` attribute.
SLOTS_INPUT = {"Attention": 4, "GatedDeltaRule": 10}  # hetero-domain op type -> index of its optional slots input
POSITION_INPUT = {"RotaryEmbedding": 1, "Attention": 3, "GatedDeltaRule": 4}  # op type -> its past_len input


@dataclass(frozen=True)
class SlotRun:
    """Rows ``[start, end)`` of a step: tokens of one sequence (``slot``) at positions ``position ..``."""

    slot: int
    start: int
    end: int
    position: int


def per_row_positions(op_type: str, inputs: Sequence[Any]) -> bool:
    """Whether a node (its op type and input infos) takes one position per row or a slots input: the form of a step of
    several sequences, which a backend that implements only the one-sequence form must refuse."""
    slots = SLOTS_INPUT.get(op_type)
    if slots is not None and slots < len(inputs) and inputs[slots] is not None:
        return True
    index = POSITION_INPUT.get(op_type)
    if index is None or index >= len(inputs) or inputs[index] is None:
        return False
    shape = inputs[index].shape
    return shape is None or shape not in ((), (1,))


def one_sequence(node: Any) -> Any:
    """A backend's answer (``Support``) for a kernel implementing only the one-sequence form of a stateful LLM op:
    refused for a step of several sequences (``per_row_positions``), which then runs on a backend that has it."""
    from .backend import SUPPORTED, unsupported  # backend imports nothing of this module; kept local all the same

    if per_row_positions(node.node.op_type, node.inputs):
        return unsupported(f"{node.node.op_type} of several sequences (per-row positions / slots): one sequence only")
    return SUPPORTED


def slot_runs(label: str, positions: np.ndarray, slots: np.ndarray | None, count: int) -> tuple[SlotRun, ...]:
    """The rows of a step cut into runs of one sequence each: consecutive rows of the same slot whose positions follow
    on one another (``slots`` None: all rows are slot 0). Each run is then an ordinary one-sequence step of its slot,
    done in row order. Every stateful node of a step asks with the same rows: the answer is cached by value."""
    pos = np.ascontiguousarray(positions, dtype=np.int64).reshape(-1)
    slot = None if slots is None else np.ascontiguousarray(slots, dtype=np.int64).reshape(-1)
    runs = _slot_runs(pos.tobytes(), b"" if slot is None else slot.tobytes(), slot is None, count)
    if isinstance(runs, str):
        raise HeteroError(f"{label}: {runs}")
    return runs


@functools.lru_cache(maxsize=64)
def _slot_runs(pos_bytes: bytes, slot_bytes: bytes, one: bool, count: int) -> tuple[SlotRun, ...] | str:
    """``slot_runs`` on the rows' bytes: the runs, or what is wrong (plain Python: a few rows)."""
    pos = np.frombuffer(pos_bytes, dtype=np.int64).tolist()
    slot = [0] * len(pos) if one else np.frombuffer(slot_bytes, dtype=np.int64).tolist()
    if len(slot) != len(pos):
        return f"{len(slot)} slots for {len(pos)} positions; expected one per row"
    runs: list[SlotRun] = []
    start = 0
    for i, (s, p) in enumerate(zip(slot, pos, strict=True)):
        if not 0 <= s < count:
            return f"slot {s} is not one of the node's {count} slot(s)"
        if p < 0:
            return f"position {p} is negative"
        if i and (s != slot[i - 1] or p != pos[i - 1] + 1):
            runs.append(SlotRun(slot[start], start, i, pos[start]))
            start = i
    if pos:
        runs.append(SlotRun(slot[start], start, len(pos), pos[start]))
    return tuple(runs)


def source_coords(mode: str, n_in: int, n_out: int, scale: float, roi: tuple[float, float] | None = None,
                  from_scales: bool = False) -> np.ndarray:
    """The input coordinate (float64) of each of the ``n_out`` outputs of one axis under a
    coordinate_transformation_mode. Backends whose float32 division is not correctly rounded (OpenCL drivers may
    give 2.5 ulp) take nearest indices from here: a coordinate a tie away from rounding up must not round up."""
    x = np.arange(n_out, dtype=np.float64)
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        width = n_in * scale
        adjustment = n_out / width if from_scales else 1.0
        offset = n_in / 2 * (1 - adjustment)
        return offset + (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if n_out > 1 else np.zeros_like(x)
    if mode == "align_corners":
        # With scales, the resized length is the fractional n_in * scale, not the rounded output size.
        length = n_in * scale if from_scales else n_out
        return x * (n_in - 1) / (length - 1) if n_out > 1 else np.zeros_like(x)
    if mode == "asymmetric":
        return x / scale
    if mode == "tf_half_pixel_for_nn":
        return (x + 0.5) / scale
    if mode == "tf_crop_and_resize":
        start, end = roi if roi is not None else (0.0, 1.0)
        if n_out > 1:
            return start * (n_in - 1) + x * (end - start) * (n_in - 1) / (n_out - 1)
        return np.full_like(x, 0.5 * (start + end) * (n_in - 1))
    raise ValueError(f"unknown coordinate_transformation_mode {mode!r}")


def nearest_indices(mode: str, coords: np.ndarray, n_in: int) -> np.ndarray:
    """The input index (int64, clamped to the axis) each coordinate takes under a nearest_mode."""
    if mode == "round_prefer_floor":
        idx = np.ceil(coords - 0.5)
    elif mode == "round_prefer_ceil":
        idx = np.floor(coords + 0.5)
    elif mode == "floor":
        idx = np.floor(coords)
    elif mode == "ceil":
        idx = np.ceil(coords)
    else:
        raise ValueError(f"unknown nearest_mode {mode!r}")
    return np.clip(idx, 0, n_in - 1).astype(np.int64)


def dq_lstm_weights(w: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An 8-bit [dirs, K, 4H] weight of com.microsoft::DynamicQuantizeLSTM with its scale and zero point ([dirs]: per
    tensor, [dirs, 4H]: per output channel) -> (the integers less the zero point, [dirs, 4H, K] as float64: ONNX
    LSTM's layout; the per-column scales [dirs, 4H]). Dequantized: ``ints * scales[:, :, None]``."""
    dirs, _, cols = w.shape
    ints = w.astype(np.float64) - np.asarray(zero, np.float64).reshape(dirs, 1, -1)
    scales = np.broadcast_to(np.asarray(scale, np.float64).reshape(dirs, -1), (dirs, cols))
    return np.ascontiguousarray(ints.transpose(0, 2, 1)), np.ascontiguousarray(scales)


# The float16 ops whose float32 form computes the node's result (their float tensors all take the one type T, no
# attribute names an output type): arithmetic and layers. hetero.ir.passes keeps chains of them in float32;
# hetero_cpu.kernels.half runs them on its float32 kernels.
HALF_UPCAST_OPS = frozenset({
    "Conv", "ConvTranspose", "MatMul", "Gemm", "Softmax", "LogSoftmax", "Add", "Sub", "Mul", "Div", "Relu",
    "Sigmoid", "Tanh", "LeakyRelu", "Elu", "Gelu", "Erf", "Exp", "Log", "Sqrt", "Pow", "BatchNormalization",
    "LayerNormalization", "InstanceNormalization", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
    "ReduceMean", "ReduceSum", "ReduceMax", "HardSigmoid", "HardSwish", "Clip", "PRelu", "Resize",
})


def as_text(value: object) -> str:
    """A string attribute's value as text (ONNX string attributes may arrive as bytes)."""
    return value.decode() if isinstance(value, bytes) else str(value)


# LabelEncoder: (keys attribute, values attribute, default attribute, numpy type of that side)
_LABEL_SIDES = {
    "strings": ("string", object),
    "int64s": ("int64", np.int64),
    "floats": ("float", np.float32),
}
_LABEL_DEFAULTS = {"strings": "_Unused", "int64s": -1, "floats": -0.0}


def label_table(ctx: OpContext) -> tuple[list, list, object, np.dtype]:
    """Keys, values, the default and the output type; from keys_tensor / values_tensor (ml opset 4), the typed list
    attributes (2-3) or classes_strings (1)."""
    keys = values = None
    out_type: np.dtype = np.dtype(object)
    default: object = None
    for kind, (_, numpy_type) in _LABEL_SIDES.items():
        if ctx.attr(f"keys_{kind}", None) is not None:
            keys = [as_text(k) if kind == "strings" else k for k in ctx.attr(f"keys_{kind}")]
        if ctx.attr(f"values_{kind}", None) is not None:
            values = [as_text(v) if kind == "strings" else v for v in ctx.attr(f"values_{kind}")]
            out_type = np.dtype(numpy_type)
            default = ctx.attr(f"default_{kind[:-1]}", _LABEL_DEFAULTS[kind])
    if ctx.attr("keys_tensor", None) is not None:
        given_keys = np.asarray(ctx.attr("keys_tensor")).reshape(-1)
        keys = [as_text(k) if isinstance(k, (bytes, str)) else k for k in given_keys]
    if ctx.attr("values_tensor", None) is not None:
        tensor = np.asarray(ctx.attr("values_tensor"))
        values = [as_text(v) if isinstance(v, (bytes, str)) else v for v in tensor.reshape(-1)]
        out_type = tensor.dtype
        given = ctx.attr("default_tensor", None)
        default = np.asarray(given).reshape(-1)[0] if given is not None else (
            "_Unused" if out_type.kind == "O" else -1 if out_type.kind in "iu" else -0.0)
    classes = ctx.attr("classes_strings", None)
    if classes is not None and keys is None:  # ml opset 1: strings <-> their index in classes_strings
        names = [as_text(c) for c in classes]
        x = ctx.inputs[0] if ctx.inputs else None
        if x is None:
            raise ctx.fail("input 0 is required")
        if x.dtype == dtypes.string:
            keys, values, out_type = names, list(range(len(names))), np.dtype(np.int64)
            default = ctx.attr("default_int64", -1)
        else:
            keys, values, out_type = list(range(len(names))), names, np.dtype(object)
            default = ctx.attr("default_string", "_Unused")
    if keys is None or values is None or len(keys) != len(values):
        raise ctx.fail("keys and values must be given, of the same length")
    if isinstance(default, bytes):
        default = default.decode()
    return keys, values, default, out_type


# node -> (the node, its lookup dict, default, output type): built once per node, not at every run (id-keyed, the node
# kept to tell a reused id; bounded)
_LOOKUPS: dict[int, tuple[object, dict, object, np.dtype]] = {}


def label_lookup(ctx: OpContext) -> tuple[dict, object, np.dtype]:
    """LabelEncoder's lookup dict (keys -> values), default and output type, built once per node (the reference
    and the cpu kernel's bound call read the same table)."""
    hit = _LOOKUPS.get(id(ctx.node))
    if hit is not None and hit[0] is ctx.node:
        return hit[1], hit[2], hit[3]
    keys, values, default, out_type = label_table(ctx)
    if len(_LOOKUPS) >= 256:
        _LOOKUPS.clear()
    entry = (ctx.node, dict(zip(keys, values, strict=True)), default, out_type)
    _LOOKUPS[id(ctx.node)] = entry  # a local reference: another thread's clear() cannot take it from under us
    return entry[1], entry[2], entry[3]
