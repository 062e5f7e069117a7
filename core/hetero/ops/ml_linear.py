"""ai.onnx.ml preprocessing and linear models, as scikit-learn's converter (skl2onnx) writes them: Scaler, Normalizer,
Binarizer, Imputer, ArrayFeatureExtractor, FeatureVectorizer, OneHotEncoder, LabelEncoder (ml opsets 1-4),
LinearRegressor, LinearClassifier and SVMRegressor. Numpy references (these ops are a few microseconds on a batch of
rows); the cpu backend runs them inside the plugin. Where the spec is loose, onnxruntime's CPU kernels are followed:
outputs in float32 whatever the input type, and the LinearClassifier's one-column binary case (below).
"""

from __future__ import annotations

import numpy as np

from ..contract import dtypes
from ..contract.graph import ML_DOMAIN
from ..contract.opforms import as_text, label_lookup, label_table
from ..contract.registry import OpContext, op
from ..contract.tensor import TensorInfo
from ..contract.trees import post_transform
from .shapes import input_info, unknown

_NUMERIC = (dtypes.float32, dtypes.float64, dtypes.int64, dtypes.int32)


def _floats(ctx: OpContext, name: str, default: list[float] | None = None) -> np.ndarray:
    value = ctx.attr(name, default)
    if value is None:
        raise ctx.fail(f"attribute {name!r} is required")
    return np.asarray(value, dtype=np.float32).reshape(-1)


def _numeric(ctx: OpContext) -> TensorInfo:
    x = input_info(ctx, 0)
    if x.dtype not in _NUMERIC:
        raise ctx.fail(f"X must be float, double, int64 or int32, got {x.dtype}")
    return x


def _rows_cols(x: np.ndarray) -> np.ndarray:
    """The [rows, features] view of X: a vector is one row (as onnxruntime reads it)."""
    return x.reshape(1, -1) if x.ndim <= 1 else x.reshape(-1, x.shape[-1])


def _float_like_input(ctx: OpContext) -> list[TensorInfo]:
    return [TensorInfo(dtypes.float32, _numeric(ctx).shape)]


@op("Scaler", domain=ML_DOMAIN, infer=_float_like_input)
def scaler(ctx: OpContext) -> list[np.ndarray]:
    """(X - offset) * scale per feature (one value, or one per feature of the last axis), in float32."""
    x = ctx.array(0).astype(np.float32)
    offset, scale = _floats(ctx, "offset", [0.0]), _floats(ctx, "scale", [1.0])
    width = x.shape[-1] if x.ndim else 1
    for name, v in (("offset", offset), ("scale", scale)):
        if v.size not in (1, width):
            raise ctx.fail(f"{name} has {v.size} values for {width} features")
    return [((x - offset) * scale).astype(np.float32)]


@op("Normalizer", domain=ML_DOMAIN, infer=_float_like_input)
def normalizer(ctx: OpContext) -> list[np.ndarray]:
    """Each row divided by its MAX (the largest value, not the largest magnitude), L1 or L2 norm, in float32."""
    x = ctx.array(0)
    rows = _rows_cols(x).astype(np.float32)
    norm = as_text(ctx.attr("norm", "MAX"))
    if norm == "MAX":
        d = rows.max(axis=1, keepdims=True)
    elif norm == "L1":
        d = np.abs(rows).sum(axis=1, keepdims=True)
    elif norm == "L2":
        d = np.sqrt((rows * rows).sum(axis=1, keepdims=True))
    else:
        raise ctx.fail(f"norm must be MAX, L1 or L2, got {norm!r}")
    with np.errstate(divide="ignore", invalid="ignore"):
        return [(rows / d).astype(np.float32).reshape(x.shape)]


@op("Binarizer", domain=ML_DOMAIN, infer=lambda ctx: [_numeric(ctx)])
def binarizer(ctx: OpContext) -> list[np.ndarray]:
    """1 where X > threshold, else 0, in X's type (NaN stays NaN, as in onnxruntime)."""
    x = ctx.array(0)
    threshold = float(ctx.attr("threshold", 0.0))
    y = np.where(x > threshold, 1, 0).astype(x.dtype)
    if x.dtype.kind == "f":
        y = np.where(np.isnan(x), x, y)
    return [y]


def _imputer_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    if x.dtype not in _NUMERIC:
        raise ctx.fail(f"X must be float, double, int64 or int32, got {x.dtype}")
    return [x]


@op("Imputer", domain=ML_DOMAIN, infer=_imputer_infer)
def imputer(ctx: OpContext) -> list[np.ndarray]:
    """Values equal to ``replaced_value_*`` (NaN by default for floats: NaN never equals itself) replaced by
    ``imputed_value_*`` (one value, or one per feature of the last axis)."""
    x = ctx.array(0)
    if x.dtype.kind == "f":
        fill = _floats(ctx, "imputed_value_floats")
        replaced = float(ctx.attr("replaced_value_float", 0.0))
        hit = np.isnan(x) if np.isnan(replaced) else (x == replaced)
    else:
        fill = np.asarray(ctx.attr("imputed_value_int64s"), dtype=np.int64).reshape(-1)
        hit = x == int(ctx.attr("replaced_value_int64", 0))
    width = x.shape[-1] if x.ndim else 1
    if fill.size not in (1, width):
        raise ctx.fail(f"{fill.size} imputed values for {width} features")
    return [np.where(hit, fill.astype(x.dtype), x)]


def _extractor_shape(x_shape: tuple | None, n: int | None) -> tuple | None:
    if x_shape is None:
        return None
    return (1, n) if len(x_shape) <= 1 else (*x_shape[:-1], n)


def _extractor_infer(ctx: OpContext) -> list[TensorInfo]:
    x, y = input_info(ctx, 0), input_info(ctx, 1)
    n: int | None = None
    if y.shape is not None and all(isinstance(d, int) for d in y.shape):
        n = int(np.prod([int(d) for d in y.shape if d is not None], dtype=np.int64))
    return [TensorInfo(x.dtype, _extractor_shape(x.shape, n))]


@op("ArrayFeatureExtractor", domain=ML_DOMAIN, infer=_extractor_infer)
def array_feature_extractor(ctx: OpContext) -> list[np.ndarray]:
    """The features of X's last axis at the indices Y (a vector X gives one row)."""
    x, index = ctx.array(0), ctx.array(1).reshape(-1).astype(np.int64)
    width = x.shape[-1] if x.ndim else 1
    if index.size and (index.min() < 0 or index.max() >= width):
        raise ctx.fail(f"an index of Y is outside [0, {width})")
    x2 = x.reshape(1, -1) if x.ndim <= 1 else x
    return [np.take(x2, index, axis=-1)]


def _vectorizer_infer(ctx: OpContext) -> list[TensorInfo]:
    dims = [int(d) for d in ctx.attr("inputdimensions")]
    first = input_info(ctx, 0).shape
    rows = None if first is None else (1 if len(first) <= 1 else first[0])
    return [TensorInfo(dtypes.float32, (rows, sum(dims)))]


@op("FeatureVectorizer", domain=ML_DOMAIN, infer=_vectorizer_infer)
def feature_vectorizer(ctx: OpContext) -> list[np.ndarray]:
    """The inputs' features side by side in float32, input i taking ``inputdimensions[i]`` columns (cut or
    zero-padded)."""
    dims = [int(d) for d in ctx.attr("inputdimensions")]
    parts = []
    for i, width in enumerate(dims):
        x = ctx.array(i)
        x2 = x.reshape(1, -1) if x.ndim <= 1 else x.reshape(x.shape[0], -1)
        part = np.zeros((x2.shape[0], width), dtype=np.float32)
        take = min(width, x2.shape[1])
        part[:, :take] = x2[:, :take]
        parts.append(part)
    return [np.concatenate(parts, axis=1)]


def _onehot_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    cats = ctx.attr("cats_int64s", None)
    cats = ctx.attr("cats_strings") if cats is None else cats
    return [TensorInfo(dtypes.float32, None if x.shape is None else (*x.shape, len(cats)))]


@op("OneHotEncoder", domain=ML_DOMAIN, infer=_onehot_infer)
def one_hot_encoder(ctx: OpContext) -> list[np.ndarray]:
    """X (ints, floats read as int64, or strings) against the categories: a float32 one-hot vector per element; a
    value outside the categories is all zeros, or an error with ``zeros=0``."""
    x = ctx.array(0)
    ints = ctx.attr("cats_int64s", None)
    cats: dict[object, int]
    keys: list[object]
    if ints is not None:
        cats = {int(c): i for i, c in enumerate(ints)}
        keys = [int(v) for v in x.reshape(-1)]
    else:
        cats = {as_text(c): i for i, c in enumerate(ctx.attr("cats_strings"))}
        keys = [as_text(v) for v in x.reshape(-1)]
    y = np.zeros((len(keys), len(cats)), dtype=np.float32)
    for row, key in enumerate(keys):
        col = cats.get(key)
        if col is not None:
            y[row, col] = 1.0
        elif not int(ctx.attr("zeros", 1)):
            raise ctx.fail(f"value {key!r} is not one of the categories (zeros=0)")
    return [y.reshape(*x.shape, len(cats))]


def _label_infer(ctx: OpContext) -> list[TensorInfo]:
    _, _, _, out_type = label_table(ctx)
    dtype = dtypes.string if out_type.kind == "O" else dtypes.from_numpy(out_type)
    return [TensorInfo(dtype, input_info(ctx, 0).shape)]


@op("LabelEncoder", domain=ML_DOMAIN, infer=_label_infer)
def label_encoder(ctx: OpContext) -> list[np.ndarray]:
    """Each element of X mapped through keys -> values (strings, int64s or floats), the default where absent."""
    table, default, out_type = label_lookup(ctx)
    x = ctx.array(0)
    get = table.get
    if x.dtype == object or x.dtype.kind in "SU":
        flat = [get(v if type(v) is str else as_text(v), default) for v in x.reshape(-1).tolist()]
    else:
        flat = [get(v, default) for v in x.reshape(-1).tolist()]
    return [np.array(flat, dtype=out_type).reshape(x.shape)]


def _linear(ctx: OpContext, n_out: int) -> np.ndarray:
    """X [rows, C] @ coefficients [n_out, C]^T + intercepts, in float32."""
    x = _rows_cols(ctx.array(0)).astype(np.float32)
    coef = _floats(ctx, "coefficients")
    if coef.size != n_out * x.shape[1]:
        raise ctx.fail(f"{coef.size} coefficients for {n_out} outputs of {x.shape[1]} features")
    scores = x @ coef.reshape(n_out, x.shape[1]).T
    intercepts = ctx.attr("intercepts", None)
    if intercepts is not None:
        scores = scores + np.asarray(intercepts, dtype=np.float32)
    return scores.astype(np.float32)


def _regressor_infer(ctx: OpContext) -> list[TensorInfo]:
    x = _numeric(ctx)
    rows = None if x.shape is None else (1 if len(x.shape) <= 1 else x.shape[0])
    return [TensorInfo(dtypes.float32, (rows, int(ctx.attr("targets", 1))))]


@op("LinearRegressor", domain=ML_DOMAIN, infer=_regressor_infer)
def linear_regressor(ctx: OpContext) -> list[np.ndarray]:
    """X @ coefficients^T + intercepts per target, then the post transform (NONE, SOFTMAX, LOGISTIC, SOFTMAX_ZERO,
    PROBIT), in float32; one target takes PROBIT only (onnxruntime ignores the others there, as for trees)."""
    targets = int(ctx.attr("targets", 1))
    scores = _linear(ctx, targets)
    transform = as_text(ctx.attr("post_transform", "NONE"))
    if targets == 1 and transform != "PROBIT":
        return [scores]
    return [post_transform(scores, transform).astype(np.float32)]


def _classes(ctx: OpContext) -> np.ndarray:
    ints = ctx.attr("classlabels_ints", None)
    if ints is not None:
        return np.asarray(ints, dtype=np.int64)
    names = ctx.attr("classlabels_strings", None)
    if names is None:
        raise ctx.fail("one of classlabels_ints and classlabels_strings must be given")
    return np.array([as_text(s) for s in names], dtype=object)


def _classifier_infer(ctx: OpContext) -> list[TensorInfo]:
    x = _numeric(ctx)
    classes = _classes(ctx)
    rows = None if x.shape is None else (1 if len(x.shape) <= 1 else x.shape[0])
    n_coef = len(ctx.attr("coefficients"))
    width = None if x.shape is None or not isinstance(x.shape[-1], int) else x.shape[-1]
    n_rows = None if width is None else n_coef // max(width, 1)
    # one coefficient row with two labels: onnxruntime writes both classes' scores
    n_scores = 2 if n_rows == 1 and classes.size == 2 else n_rows
    label = dtypes.string if classes.dtype == object else dtypes.int64
    return [TensorInfo(label, (rows,)), TensorInfo(dtypes.float32, (rows, n_scores)) if n_scores is not None
            else unknown(dtypes.float32, 2)]


@op("LinearClassifier", domain=ML_DOMAIN, infer=_classifier_infer)
def linear_classifier(ctx: OpContext) -> list[np.ndarray]:
    """Class scores X @ coefficients^T + intercepts, the post transform, and the label of the best score. With one
    coefficient row (a binary model), as onnxruntime: the label is the second class where the score (after the
    transform) is above 0 (0.5 under LOGISTIC), and with two labels the scores are [1 - s, s] (s after the
    transform: [1 - p, p] under LOGISTIC)."""
    x = _rows_cols(ctx.array(0))
    classes = _classes(ctx)
    n_rows = _floats(ctx, "coefficients").size // max(x.shape[1], 1)
    scores = _linear(ctx, n_rows)
    transform = as_text(ctx.attr("post_transform", "NONE"))
    if n_rows == 1:
        s = post_transform(scores, transform) if transform in ("LOGISTIC", "PROBIT") else scores
        cut = 0.5 if transform == "LOGISTIC" else 0.0
        positive = s[:, 0] > cut
        if classes.size == 2:
            labels = np.where(positive, classes[1], classes[0])
            s = np.concatenate([1.0 - s, s], axis=1)
        else:  # onnxruntime: 1 / 0 without two labels
            labels = np.where(positive, 1, 0).astype(np.int64) if classes.dtype != object else np.where(
                positive, classes[0] if classes.size else "", "")
        return [np.asarray(labels, dtype=classes.dtype), s.astype(np.float32)]
    scores = post_transform(scores, transform)
    winner = scores.argmax(axis=1)
    return [classes[winner] if classes.size == n_rows else winner.astype(np.int64), scores.astype(np.float32)]


def _kernel(name: str, x: np.ndarray, sv: np.ndarray, gamma: float, coef0: float, degree: int) -> np.ndarray:
    """[rows, n_sv] kernel values of an SVM (LIBSVM's LINEAR, POLY, RBF, SIGMOID), in float64 then float32."""
    if name == "RBF":
        d = (x * x).sum(axis=1)[:, None] - 2.0 * (x @ sv.T) + (sv * sv).sum(axis=1)[None, :]
        return np.exp(-gamma * np.maximum(d, 0.0))
    dot = x @ sv.T
    if name == "POLY":
        return (gamma * dot + coef0) ** degree
    if name == "SIGMOID":
        return np.tanh(gamma * dot + coef0)
    return dot


def _svm_regressor_infer(ctx: OpContext) -> list[TensorInfo]:
    x = _numeric(ctx)
    rows = None if x.shape is None else (1 if len(x.shape) <= 1 else x.shape[0])
    return [TensorInfo(dtypes.float32, (rows, 1))]


@op("SVMRegressor", domain=ML_DOMAIN, infer=_svm_regressor_infer)
def svm_regressor(ctx: OpContext) -> list[np.ndarray]:
    """sum_j coefficients[j] K(x, support_vectors[j]) + rho (with n_supports > 0), else the linear x . coefficients +
    rho; ``one_class``: 1 where that score is > 0, else -1. One target, float32 out (PROBIT as the post transform)."""
    x = _rows_cols(ctx.array(0)).astype(np.float64)
    coef = np.asarray(ctx.attr("coefficients"), np.float64).reshape(-1)
    rho = float(np.asarray(ctx.attr("rho", [0.0]), np.float64).reshape(-1)[0])
    n_sv = int(ctx.attr("n_supports", 0))
    if n_sv > 0:
        sv = np.asarray(ctx.attr("support_vectors"), np.float64).reshape(n_sv, -1)
        if sv.shape[1] != x.shape[1] or coef.size != n_sv:
            raise ctx.fail(f"{n_sv} support vectors of {sv.shape[1]} features, {coef.size} coefficients, "
                           f"X has {x.shape[1]} features")
        params = [float(p) for p in ctx.attr("kernel_params", [0.0, 0.0, 0.0])] + [0.0, 0.0, 0.0]
        kind = as_text(ctx.attr("kernel_type", "LINEAR"))
        score = _kernel(kind, x, sv, params[0], params[1], int(params[2])) @ coef + rho
    else:
        if coef.size != x.shape[1]:
            raise ctx.fail(f"{coef.size} coefficients for {x.shape[1]} features")
        score = x @ coef + rho
    if int(ctx.attr("one_class", 0)):
        score = np.where(score > 0, 1.0, -1.0)
    out = score.astype(np.float32)[:, None]
    if as_text(ctx.attr("post_transform", "NONE")) == "PROBIT":
        out = post_transform(out, "PROBIT").astype(np.float32)
    return [out]
