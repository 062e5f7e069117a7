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


def row_independent_hits(forest: ml.Forest) -> np.ndarray | None:
    """The classifier's hit mask [n_targets] when it is the same for every row, else None.

    It is when every leaf holds exactly one (target, weight) pair and all leaves of a tree name the same target
    (LightGBM's and most GBM exports: one class a tree): each tree then adds to its class whatever leaf a row
    reaches. Asking the native walk for the mask takes it off its one-pair sum paths (the AVX-512 vector walk, the
    chained one-row walk), which cost luscinia's 10k-tree classifier 1.65x onnxruntime at 256 rows."""
    n = forest.mode.size
    owner = np.full(n, -1, np.int64)
    owner[forest.roots] = np.arange(forest.roots.size)
    frontier = forest.roots
    for _ in range(forest.depth + 1):
        frontier = frontier[forest.mode[frontier] != ml.LEAF]
        if frontier.size == 0:
            break
        for child in (forest.true_child[frontier], forest.false_child[frontier]):
            if np.any((owner[child] >= 0) & (owner[child] != owner[frontier])):
                return None  # a subtree shared by two trees
            owner[child] = owner[frontier]
        frontier = np.concatenate([forest.true_child[frontier], forest.false_child[frontier]])
    leaves = np.flatnonzero((owner >= 0) & (forest.mode == ml.LEAF))
    if leaves.size == 0 or np.any(forest.leaf_count[leaves] != 1):
        return None
    target = forest.targets[forest.leaf_start[leaves]]
    first = np.full(forest.roots.size, -1, np.int64)
    first[owner[leaves]] = target  # any one leaf's target per tree; then every leaf must agree with it
    if np.any(first[owner[leaves]] != target) or np.any(first < 0):
        return None
    hit = np.zeros(forest.n_targets, bool)
    hit[first] = True
    return hit


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
        self.hit = row_independent_hits(self.forest) if self.classifier else None

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
        if self.hit is not None:  # no mask asked of the walk: it may take the one-pair sum paths
            self.native.run(x, scores)
            hits = np.repeat(self.hit[None], x.shape[0], axis=0)
        else:
            hit = np.empty(scores.shape, np.uint8)
            self.native.run(x, scores, hit)
            hits = hit.astype(bool)
        winner, z = ml.classify_scores(self.forest, scores, hits)
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
