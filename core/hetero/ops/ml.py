"""ai.onnx.ml tree ensembles: the op schemas and references of TreeEnsemble (ml opset 5), TreeEnsembleRegressor and
TreeEnsembleClassifier (1-3). The forest compiler and evaluation live in hetero.contract.trees (backends share it);
its docstring says which onnxruntime behaviours are followed and which are not.
"""

from __future__ import annotations

import numpy as np

from ..contract import dtypes
from ..contract.graph import ML_DOMAIN
from ..contract.registry import OpContext, op
from ..contract.tensor import TensorInfo
from ..contract.trees import Forest, class_labels, classify, features, forest_for, regress
from .shapes import input_info, np_dtype


def _features(ctx: OpContext, forest: Forest) -> np.ndarray:
    return features(ctx.array(0), forest, ctx.node.label())


# ------------------------------------------------------------------------------------------------- schemas

def _rows(ctx: OpContext) -> int | None:
    shape = input_info(ctx, 0).shape
    if shape is None or not shape:
        return None if shape is None else 1
    return shape[0] if len(shape) > 1 else 1


def _tree_ensemble_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    if x.dtype not in (dtypes.float32, dtypes.float64, dtypes.float16):
        raise ctx.fail(f"X must be float, double or float16, got {x.dtype}")
    forest = forest_for(ctx.node, np_dtype(x.dtype))
    return [TensorInfo(x.dtype, (_rows(ctx), forest.n_targets))]


@op("TreeEnsemble", domain=ML_DOMAIN, infer=_tree_ensemble_infer)
def tree_ensemble(ctx: OpContext) -> list[np.ndarray]:
    """ai.onnx.ml TreeEnsemble (opset 5): the sum / average / min / max of the leaf weights each row reaches in each
    tree, per target, then the post transform; computed in the input type (float16 in float32)."""
    x = ctx.array(0)
    forest = forest_for(ctx.node, x.dtype)
    return [regress(forest, _features(ctx, forest)).astype(x.dtype)]


def _x_legacy(ctx: OpContext) -> TensorInfo:
    x = input_info(ctx, 0)
    if x.dtype not in (dtypes.float32, dtypes.float64, dtypes.int64, dtypes.int32):
        raise ctx.fail(f"X must be float, double, int64 or int32, got {x.dtype}")
    return x


def _regressor_infer(ctx: OpContext) -> list[TensorInfo]:
    forest = forest_for(ctx.node, np_dtype(_x_legacy(ctx).dtype))
    return [TensorInfo(dtypes.float32, (_rows(ctx), forest.n_targets))]


@op("TreeEnsembleRegressor", domain=ML_DOMAIN, infer=_regressor_infer)
def tree_ensemble_regressor(ctx: OpContext) -> list[np.ndarray]:
    """ai.onnx.ml TreeEnsembleRegressor (opsets 1-3): leaf votes aggregated per target, base_values added, then the
    post transform; thresholds and sums in double when given as tensors, else float; the output is float."""
    forest = forest_for(ctx.node, ctx.array(0).dtype)
    return [regress(forest, _features(ctx, forest)).astype(np.float32)]


def _classifier_infer(ctx: OpContext) -> list[TensorInfo]:
    forest = forest_for(ctx.node, np_dtype(_x_legacy(ctx).dtype))
    label = dtypes.string if ctx.node.attrs.get("classlabels_strings") is not None else dtypes.int64
    rows = _rows(ctx)
    return [TensorInfo(label, (rows,)), TensorInfo(dtypes.float32, (rows, forest.n_targets))]


@op("TreeEnsembleClassifier", domain=ML_DOMAIN, infer=_classifier_infer)
def tree_ensemble_classifier(ctx: OpContext) -> list[np.ndarray]:
    """ai.onnx.ml TreeEnsembleClassifier (opsets 1-3): class scores from the leaf votes plus base_values, the post
    transform, and the label of the best class (int64 or string); binary models with one weight column follow
    onnxruntime ([1 - p, p] for non-negative weights, else [-s, s]; the logistic of -s and s)."""
    forest = forest_for(ctx.node, ctx.array(0).dtype)
    winner, scores = classify(forest, _features(ctx, forest))
    return [class_labels(ctx.node, winner), scores.astype(np.float32)]
