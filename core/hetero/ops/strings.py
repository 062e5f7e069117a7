"""String ops: StringConcat, StringSplit, RegexFullMatch, StringNormalizer (string tensors are numpy object arrays)."""

from __future__ import annotations

import re

import numpy as np

from ..contract import dtypes
from ..contract.registry import OpContext, op
from ..contract.tensor import TensorInfo
from .shapes import broadcast_infer, input_info, unknown


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _strings(x: np.ndarray) -> np.ndarray:
    return np.vectorize(_text, otypes=[object])(x) if x.size else x.astype(object)


@op("StringConcat", infer=broadcast_infer())
def string_concat(ctx: OpContext) -> list[np.ndarray]:
    """Elementwise concatenation of two string tensors, with numpy broadcasting."""
    a, b = np.broadcast_arrays(_strings(ctx.array(0)), _strings(ctx.array(1)))
    out = np.empty(a.shape, dtype=object)
    for i in np.ndindex(a.shape):
        out[i] = a[i] + b[i]
    return [out]


def _split_one(s: str, delimiter: str, maxsplit: int) -> list[str]:
    if delimiter:
        return s.split(delimiter, maxsplit)
    return s.split(None, maxsplit)  # runs of whitespace, leading / trailing whitespace dropped


def _split_all(ctx: OpContext, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    delimiter = _text(ctx.attr("delimiter", ""))
    maxsplit = ctx.attr("maxsplit", None)
    limit = -1 if maxsplit is None else int(maxsplit)
    parts = [_split_one(_text(s), delimiter, limit) for s in x.reshape(-1)]
    width = max((len(p) for p in parts), default=0)
    y = np.full((len(parts), width), "", dtype=object)
    for i, p in enumerate(parts):
        y[i, : len(p)] = p
    counts = np.array([len(p) for p in parts], dtype=np.int64).reshape(x.shape)
    return y.reshape(*x.shape, width), counts


def _split_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    value = ctx.value(0)
    if value is None:
        rank = None if x.shape is None else len(x.shape) + 1
        return [unknown(dtypes.string, rank), TensorInfo(dtypes.int64, x.shape)]
    y, z = _split_all(ctx, value)
    return [TensorInfo(dtypes.string, y.shape), TensorInfo(dtypes.int64, z.shape)]


@op("StringSplit", infer=_split_infer, data_dependent=True)
def string_split(ctx: OpContext) -> list[np.ndarray]:
    """Split each string on ``delimiter`` (empty delimiters kept) or, without one, on runs of whitespace; at most
    ``maxsplit`` splits. Y pads the substrings with "" to the longest split; Z counts each element's substrings."""
    y, z = _split_all(ctx, ctx.array(0))
    return [y, z]


@op("RegexFullMatch", infer=lambda ctx: [TensorInfo(dtypes.bool_, input_info(ctx, 0).shape)])
def regex_full_match(ctx: OpContext) -> list[np.ndarray]:
    """True where the whole string matches ``pattern`` (RE2 syntax; the common subset Python's re shares)."""
    pattern = re.compile(_text(ctx.attr("pattern")))
    x = ctx.array(0)
    flat = [pattern.fullmatch(_text(s)) is not None for s in x.reshape(-1)]
    return [np.array(flat, dtype=bool).reshape(x.shape)]


def _normalize(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    words = [_text(s) for s in x.reshape(-1)]
    stop = [_text(s) for s in ctx.attr("stopwords", []) or []]
    if stop:
        if ctx.attr("is_case_sensitive", 0):
            drop = set(stop)
            words = [w for w in words if w not in drop]
        else:
            drop = {s.casefold() for s in stop}
            words = [w for w in words if w.casefold() not in drop]
    action = _text(ctx.attr("case_change_action", "NONE")).upper()
    if action == "LOWER":
        words = [w.lower() for w in words]
    elif action == "UPPER":
        words = [w.upper() for w in words]
    if not words:
        words = [""]
    out = np.array(words, dtype=object)
    return out.reshape(1, -1) if x.ndim == 2 else out


def _normalizer_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    if x.shape is not None and len(x.shape) not in (1, 2):
        raise ctx.fail(f"input must be [C] or [1, C], got rank {len(x.shape)}")
    value = ctx.value(0)
    if value is None:
        if not ctx.attr("stopwords", None):
            return [TensorInfo(dtypes.string, x.shape)]
        return [unknown(dtypes.string, None if x.shape is None else len(x.shape))]
    return [TensorInfo(dtypes.string, _normalize(ctx, value).shape)]


@op("StringNormalizer", infer=_normalizer_infer, data_dependent=True)
def string_normalizer(ctx: OpContext) -> list[np.ndarray]:
    """Drop stop words (case-insensitively unless is_case_sensitive), then lower- or upper-case; an input left empty
    gives one empty string ([1] or [1, 1])."""
    return [_normalize(ctx, ctx.array(0))]
