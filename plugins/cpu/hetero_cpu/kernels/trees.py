"""ai.onnx.ml tree ensembles (TreeEnsemble, TreeEnsembleRegressor, TreeEnsembleClassifier) on the native walk of
src/trees.cpp: the forest hetero.contract.trees compiles is copied once into the native node array; each run walks
the rows through the trees and sums the leaf weights there (bit for bit the reference's sums). Post transforms other
than NONE, the classifier's labels and float16 features go through the shared numpy code (a few values per row).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from hetero.contract import SUPPORTED, NodeInfo, Support, Tensor, TensorInfo, dtypes, unsupported
from hetero.contract import trees as ml
from hetero.contract.graph import ML_DOMAIN

from .. import _native
from .common import Calls, CpuKernel, bindable

_FEATURES = {"TreeEnsemble": (dtypes.float32, dtypes.float64, dtypes.float16),
             "TreeEnsembleRegressor": (dtypes.float32, dtypes.float64, dtypes.int64, dtypes.int32),
             "TreeEnsembleClassifier": (dtypes.float32, dtypes.float64, dtypes.int64, dtypes.int32)}


def native_forest(forest: ml.Forest, with_base: bool) -> _native.TreeForest:
    base = forest.base_values if with_base and forest.base_values is not None else np.zeros(0, forest.acc)
    return _native.TreeForest(
        forest.feature, forest.threshold, forest.mode, forest.true_child, forest.false_child,
        forest.missing_true.astype(np.uint8), forest.leaf_start, forest.leaf_count, forest.targets, forest.weights,
        forest.roots, forest.n_targets, forest.aggregate, base,
        [(node, values) for node, values in forest.members.items()])


class CpuTreeEnsemble(CpuKernel):
    """The three tree-ensemble ops: the native forest is built at prepare, for the features' type."""

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        x = node.inputs[0]
        if x is None or x.dtype not in _FEATURES[node.op_type]:
            return unsupported(f"{node.op_type} on {None if x is None else x.dtype} features")
        if x.shape is not None and len(x.shape) not in (1, 2):
            return unsupported(f"{node.op_type} on {len(x.shape)}-D features")
        return SUPPORTED

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None:
        x = inputs[0]
        assert x is not None and x.dtype.np_dtype is not None
        self.forest = ml.forest_for(self.node, x.dtype.np_dtype)
        self.classifier = self.node.op_type == "TreeEnsembleClassifier"
        # Regressors add their base values natively; the classifier's binary rules need the raw sums.
        self.native = native_forest(self.forest, with_base=not self.classifier)
        self.direct = not self.classifier and not ml.regression_needs_post(self.forest)

    def _x(self, x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(ml.features(x, self.forest, self.node.label()))

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        assert inputs[0] is not None
        x = self._x(inputs[0].numpy())
        out = outputs[-1].buffer
        if self.direct and out.dtype == x.dtype and out.flags.c_contiguous:
            self.native.run(x, out.reshape(x.shape[0], -1))
            return
        scores = np.empty((x.shape[0], self.forest.n_targets), self.forest.acc)
        if not self.classifier:
            self.native.run(x, scores)
            np.copyto(out, ml.regression_post(self.forest, scores).reshape(out.shape), casting="unsafe")
            return
        hit = np.empty(scores.shape, np.uint8)
        self.native.run(x, scores, hit)
        winner, z = ml.classify_scores(self.forest, scores, hit.astype(bool))
        np.copyto(outputs[0].buffer, ml.class_labels(self.node, winner).reshape(outputs[0].buffer.shape),
                  casting="unsafe")
        np.copyto(out, z.reshape(out.shape), casting="unsafe")

    def bind(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls | None:
        """The replay's call: only where the features need no conversion and the sums are the output."""
        assert inputs[0] is not None
        x, out = inputs[0].numpy(), outputs[-1].buffer
        if (not self.direct or x.ndim != 2 or x.dtype != self.forest.acc or out.dtype != x.dtype
                or not bindable(x, out)):
            return None
        return functools.partial(_native.tree_ensemble, self.native, x, out)


KERNELS = {(ML_DOMAIN, name): CpuTreeEnsemble for name in _FEATURES}
