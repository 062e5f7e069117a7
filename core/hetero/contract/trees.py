"""ai.onnx.ml tree ensembles (TreeEnsemble, ml opset 5; TreeEnsembleRegressor / TreeEnsembleClassifier, 1-3): the
forest compiler and its numpy evaluation, shared by the reference (hetero.ops.ml, which registers the ops) and the
backends' kernels.

All three are compiled once per node (cached) into one flat :class:`Forest`: interior nodes and leaves in one array,
each leaf a run of (target, weight) pairs. The reference walks every (row, tree) pair one level per step with array
indexing, then adds the leaf weights tree by tree in model order, in the accumulation type (what onnxruntime does
per row: the order decides the float rounding, so the native kernel adds in the same order and matches bit for bit).

Where ONNX's text is vague, onnxruntime's behaviour is followed (the oracle the real-model tests use):
- a comparison is ``x OP threshold or (missing_tracks_true and isnan(x))`` for every mode (so NaN != t is true);
- MIN / MAX over a target no leaf reached gives 0 (+ base value), not +-inf;
- a single-target regressor applies only PROBIT as post_transform (onnxruntime ignores the others there);
- a binary classifier with one weight column writes [1 - p, p] for non-negative weights, else [-s, s];
  logistic(-s), logistic(s) under LOGISTIC; probit(s), 0 under PROBIT.
Not followed: onnxruntime 1.32 reads TreeEnsemble's post_transform 1 as LOGISTIC and 2 as SOFTMAX (the spec: 1 is
SOFTMAX); it truncates a BRANCH_MEMBER feature to an integer first; and a two-class classifier with both columns
weighted gets onnxruntime's label 1 whenever its score is > 0, where hetero takes the larger score (as the spec and
onnx.reference).
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import HeteroError
from .graph import Node

# Node modes, as TreeEnsemble (opset 5) numbers them; LEAF is hetero's own marker for a leaf in the flat array.
LEQ, LT, GTE, GT, EQ, NEQ, MEMBER, LEAF = range(8)
_MODE_NAMES = {"BRANCH_LEQ": LEQ, "BRANCH_LT": LT, "BRANCH_GTE": GTE, "BRANCH_GT": GT, "BRANCH_EQ": EQ,
               "BRANCH_NEQ": NEQ, "LEAF": LEAF}
AGGREGATES = ("AVERAGE", "SUM", "MIN", "MAX")  # TreeEnsemble's numbering
POST_TRANSFORMS = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")


@dataclass
class Forest:
    """A tree ensemble in flat form. Node arrays have one entry per interior node and per leaf."""

    feature: np.ndarray  # int64; 0 at leaves
    threshold: np.ndarray  # the threshold type (float32 / float64)
    mode: np.ndarray  # uint8, LEQ..MEMBER or LEAF
    true_child: np.ndarray  # int64 node index (a leaf points at itself)
    false_child: np.ndarray
    missing_true: np.ndarray  # bool
    leaf_start: np.ndarray  # int64: first (target, weight) pair of a leaf
    leaf_count: np.ndarray  # int64: how many pairs (0 for interior nodes)
    targets: np.ndarray  # int64 [pairs]
    weights: np.ndarray  # accumulation type [pairs]
    roots: np.ndarray  # int64 [trees], in summation order
    n_targets: int
    aggregate: str
    post_transform: str
    base_values: np.ndarray | None  # accumulation type [n_targets]
    acc: np.dtype
    depth: int  # the longest root-to-leaf path, in edges
    members: dict[int, np.ndarray] = field(default_factory=dict)  # MEMBER node -> its set (sorted)
    n_features: int = 0  # the smallest feature count the forest reads (max feature id + 1)

    @property
    def n_trees(self) -> int:
        return int(self.roots.size)

    # Once per forest, not per run: a LightGBM classifier has millions of leaf pairs, and np.unique over them cost
    # more than the walk itself (luscinia's 10k trees: 35 ms of a 52 ms run at one row).
    @functools.cached_property
    def used_targets(self) -> np.ndarray:
        return np.unique(self.targets)

    @functools.cached_property
    def positive_weights(self) -> bool:
        return bool(np.all(self.weights >= 0))


# ------------------------------------------------------------------------------------------------- compiling

def _fail(node_label: str, message: str) -> HeteroError:
    return HeteroError(f"{node_label}: {message}")


def _ints(label: str, attrs: dict[str, Any], name: str, length: int | None = None) -> np.ndarray | None:
    value = attrs.get(name)
    if value is None:
        return None
    out = np.asarray(value, dtype=np.int64).reshape(-1)
    if length is not None and out.size != length:
        raise _fail(label, f"attribute {name!r} has {out.size} entries where the node attributes have {length}")
    return out


def _floats(label: str, attrs: dict[str, Any], name: str, dtype: np.dtype, length: int | None = None
            ) -> np.ndarray | None:
    tensor = attrs.get(f"{name}_as_tensor")
    value = tensor if tensor is not None else attrs.get(name)
    if value is None:
        return None
    out = np.asarray(value).reshape(-1).astype(dtype)
    if length is not None and out.size != length:
        raise _fail(label, f"attribute {name!r} has {out.size} entries where {length} are needed")
    return out


def _named(label: str, value: Any, names: tuple[str, ...], attr: str, default: str) -> str:
    if value is None:
        return default
    if isinstance(value, (int, np.integer)):
        if not 0 <= int(value) < len(names):
            raise _fail(label, f"attribute {attr!r} is {value}; expected 0..{len(names) - 1} ({', '.join(names)})")
        return names[int(value)]
    text = value.decode() if isinstance(value, bytes) else str(value)
    if text not in names:
        raise _fail(label, f"attribute {attr!r} is {text!r}; expected one of {', '.join(names)}")
    return text


def _check_children(label: str, children: np.ndarray, limit: int, attr: str) -> None:
    bad = np.flatnonzero((children < 0) | (children >= limit))
    if bad.size:
        raise _fail(label, f"attribute {attr!r} entry {int(bad[0])} is {int(children[bad[0]])}, out of range "
                    f"[0, {limit})")


def _depth(label: str, roots: np.ndarray, mode: np.ndarray, tc: np.ndarray, fc: np.ndarray) -> int:
    """The longest path from a root to a leaf (all trees at once, a level per step); a cycle is an error."""
    frontier = np.unique(roots)
    depth = 0
    limit = mode.size
    while True:
        inner = frontier[mode[frontier] != LEAF]
        if inner.size == 0:
            return depth
        depth += 1
        if depth > limit:
            raise _fail(label, "the tree nodes form a cycle (a path from a root never reaches a leaf)")
        frontier = np.unique(np.concatenate([tc[inner], fc[inner]]))


def _compile_v5(label: str, attrs: dict[str, Any], x_dtype: np.dtype) -> Forest:
    acc = np.dtype(np.float32) if x_dtype == np.float16 else np.dtype(x_dtype)
    feature = _ints(label, attrs, "nodes_featureids")
    if feature is None:
        raise _fail(label, "attribute 'nodes_featureids' is missing")
    n = feature.size
    modes_attr = attrs.get("nodes_modes")
    if modes_attr is None:
        raise _fail(label, "attribute 'nodes_modes' is missing")
    modes = np.asarray(modes_attr).reshape(-1).astype(np.int64)
    if modes.size != n:
        raise _fail(label, f"attribute 'nodes_modes' has {modes.size} entries where 'nodes_featureids' has {n}")
    if modes.size and (modes.min() < 0 or modes.max() > MEMBER):
        raise _fail(label, f"attribute 'nodes_modes' holds {int(modes.max())}; modes are 0 (BRANCH_LEQ) .. "
                    "6 (BRANCH_MEMBER)")
    splits = np.asarray(attrs.get("nodes_splits", np.zeros(0))).reshape(-1)
    if splits.size != n:
        raise _fail(label, f"attribute 'nodes_splits' has {splits.size} entries where 'nodes_featureids' has {n}")
    tnode = _ints(label, attrs, "nodes_truenodeids", n)
    fnode = _ints(label, attrs, "nodes_falsenodeids", n)
    tleaf = _ints(label, attrs, "nodes_trueleafs", n)
    fleaf = _ints(label, attrs, "nodes_falseleafs", n)
    for name, arr in (("nodes_truenodeids", tnode), ("nodes_falsenodeids", fnode), ("nodes_trueleafs", tleaf),
                      ("nodes_falseleafs", fleaf)):
        if arr is None:
            raise _fail(label, f"attribute {name!r} is missing")
    assert tnode is not None and fnode is not None and tleaf is not None and fleaf is not None
    mtt = _ints(label, attrs, "nodes_missing_value_tracks_true", n)
    leaf_targets = _ints(label, attrs, "leaf_targetids")
    if leaf_targets is None or attrs.get("leaf_weights") is None:
        raise _fail(label, "attributes 'leaf_targetids' and 'leaf_weights' are required")
    leaf_weights = np.asarray(attrs["leaf_weights"]).reshape(-1).astype(acc)
    n_leaves = leaf_targets.size
    if leaf_weights.size != n_leaves:
        raise _fail(label, f"attribute 'leaf_weights' has {leaf_weights.size} entries where 'leaf_targetids' has "
                    f"{n_leaves}")
    roots_in = _ints(label, attrs, "tree_roots")
    if roots_in is None or roots_in.size == 0:
        raise _fail(label, "attribute 'tree_roots' is missing or empty")
    _check_children(label, roots_in, n, "tree_roots")
    tleaf_b, fleaf_b = tleaf.astype(bool), fleaf.astype(bool)
    for name, ids, is_leaf in (("nodes_truenodeids", tnode, tleaf_b), ("nodes_falsenodeids", fnode, fleaf_b)):
        _check_children(label, ids[is_leaf], n_leaves, name + " (a leaf index)")
        _check_children(label, ids[~is_leaf], n, name)
    n_targets = int(attrs.get("n_targets", int(leaf_targets.max()) + 1 if n_leaves else 1))
    _check_children(label, leaf_targets, n_targets, "leaf_targetids")

    total = n + n_leaves  # interior nodes, then one flat node per leaf
    true_child = np.where(tleaf_b, tnode + n, tnode)
    false_child = np.where(fleaf_b, fnode + n, fnode)
    # A single-leaf tree: its root's two branches name the same leaf; the root is that leaf.
    lone = tleaf_b[roots_in] & fleaf_b[roots_in] & (tnode[roots_in] == fnode[roots_in])
    roots = np.where(lone, true_child[roots_in], roots_in)
    mode = np.concatenate([modes, np.full(n_leaves, LEAF)]).astype(np.uint8)
    members: dict[int, np.ndarray] = {}
    member_nodes = np.flatnonzero(modes == MEMBER)
    if member_nodes.size:
        values = attrs.get("membership_values")
        if values is None:
            raise _fail(label, "BRANCH_MEMBER nodes need the attribute 'membership_values'")
        values = np.asarray(values).reshape(-1).astype(np.float64)
        cuts = np.flatnonzero(np.isnan(values))
        if cuts.size != member_nodes.size:
            raise _fail(label, f"attribute 'membership_values' holds {cuts.size} NaN-ended sets for "
                        f"{member_nodes.size} BRANCH_MEMBER nodes")
        start = 0
        for node, cut in zip(member_nodes, cuts, strict=True):
            members[int(node)] = np.unique(values[start:cut]).astype(acc)
            start = int(cut) + 1
    forest = Forest(
        feature=np.concatenate([feature, np.zeros(n_leaves, np.int64)]),
        threshold=np.concatenate([splits.astype(acc), np.zeros(n_leaves, acc)]),
        mode=mode,
        true_child=np.concatenate([true_child, np.arange(n, total)]),
        false_child=np.concatenate([false_child, np.arange(n, total)]),
        missing_true=np.concatenate([(mtt if mtt is not None else np.zeros(n, np.int64)) != 0,
                                     np.zeros(n_leaves, bool)]),
        leaf_start=np.concatenate([np.zeros(n, np.int64), np.arange(n_leaves)]),
        leaf_count=np.concatenate([np.zeros(n, np.int64), np.ones(n_leaves, np.int64)]),
        targets=leaf_targets, weights=leaf_weights, roots=roots.astype(np.int64), n_targets=n_targets,
        aggregate=_named(label, attrs.get("aggregate_function", 1), AGGREGATES, "aggregate_function", "SUM"),
        post_transform=_named(label, attrs.get("post_transform", 0), POST_TRANSFORMS, "post_transform", "NONE"),
        base_values=None, acc=acc, depth=0, members=members)
    return _finish(label, forest)


class _NodeIndex:
    """(tree id, node id) -> flat node index for the legacy attributes, by sorting and binary search: a dict of
    tuples took ~25 s to build and query on a 4.8M-node LightGBM export (luscinia), against onnxruntime's 8 s load."""

    def __init__(self, trees: np.ndarray, nodes: np.ndarray) -> None:
        self.trees, self.nodes = trees.astype(np.int64), nodes.astype(np.int64)
        self.order = np.lexsort((self.nodes, self.trees))  # stable: equal keys keep model order
        self.sorted_trees, self.sorted_nodes = self.trees[self.order], self.nodes[self.order]
        # One sorted int64 key per pair: (rank of the tree id, rank of the node id) among the ids the model has.
        # Ranks, not the ids, so any int64 ids fit (the key stays below size**2); a query whose id the model
        # lacks lands on some neighbour, which find's final comparison rejects.
        self.tree_ids, self.node_ids = np.unique(self.sorted_trees), np.unique(self.sorted_nodes)
        self.width = np.int64(self.node_ids.size)
        self.keyed = (np.searchsorted(self.tree_ids, self.sorted_trees) * self.width
                      + np.searchsorted(self.node_ids, self.sorted_nodes))

    def first_repeat(self) -> int | None:
        """The first node (in model order) whose key an earlier node already has, or None."""
        same = (self.sorted_trees[1:] == self.sorted_trees[:-1]) & (self.sorted_nodes[1:] == self.sorted_nodes[:-1])
        return int(self.order[1:][same].min()) if same.any() else None

    def find(self, trees: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        """The flat index of each (tree, node) pair; -1 where the model has no such node."""
        trees, nodes = np.asarray(trees, np.int64), np.asarray(nodes, np.int64)
        out = np.full(trees.shape, -1, np.int64)
        size = self.sorted_nodes.size
        if size == 0 or trees.size == 0:
            return out
        q = (np.minimum(np.searchsorted(self.tree_ids, trees), self.tree_ids.size - 1) * self.width
             + np.minimum(np.searchsorted(self.node_ids, nodes), self.node_ids.size - 1))
        pos = np.minimum(np.searchsorted(self.keyed, q), size - 1)
        ok = (self.sorted_trees[pos] == trees) & (self.sorted_nodes[pos] == nodes)
        out[ok] = self.order[pos[ok]]
        return out


def _compile_legacy(label: str, attrs: dict[str, Any], classifier: bool, x_dtype: np.dtype) -> Forest:
    prefix = "class" if classifier else "target"
    tree_ids = _ints(label, attrs, "nodes_treeids")
    if tree_ids is None:
        raise _fail(label, "attribute 'nodes_treeids' is missing")
    n = tree_ids.size
    node_ids = _ints(label, attrs, "nodes_nodeids", n)
    feature = _ints(label, attrs, "nodes_featureids", n)
    tnode = _ints(label, attrs, "nodes_truenodeids", n)
    fnode = _ints(label, attrs, "nodes_falsenodeids", n)
    names = attrs.get("nodes_modes")
    if node_ids is None or feature is None or tnode is None or fnode is None or names is None:
        raise _fail(label, "attributes nodes_nodeids / nodes_featureids / nodes_truenodeids / nodes_falsenodeids / "
                    "nodes_modes are required")
    if len(names) != n:
        raise _fail(label, f"attribute 'nodes_modes' has {len(names)} entries where 'nodes_treeids' has {n}")
    try:
        mode = np.array([_MODE_NAMES[m.decode() if isinstance(m, bytes) else m] for m in names], np.uint8)
    except KeyError as exc:
        raise _fail(label, f"attribute 'nodes_modes' holds {exc.args[0]!r}; expected one of "
                    f"{', '.join(_MODE_NAMES)}") from None
    # onnxruntime's threshold (and accumulation) type: double for double inputs, float for the others.
    acc = np.dtype(np.float64) if x_dtype == np.float64 else np.dtype(np.float32)
    thresholds = _floats(label, attrs, "nodes_values", acc, n)
    if thresholds is None:
        thresholds = np.zeros(n, acc)
    mtt = _ints(label, attrs, "nodes_missing_value_tracks_true")
    if mtt is not None and mtt.size not in (0, n):
        raise _fail(label, f"attribute 'nodes_missing_value_tracks_true' has {mtt.size} entries where "
                    f"'nodes_treeids' has {n}")
    index = _NodeIndex(tree_ids, node_ids)
    twice = index.first_repeat()
    if twice is not None:
        raise _fail(label, f"node (tree {int(tree_ids[twice])}, id {int(node_ids[twice])}) appears twice in "
                    "'nodes_nodeids'")
    # Trees in order of first appearance, each rooted at its first node (onnxruntime's reading).
    _, first = np.unique(tree_ids, return_index=True)
    roots = np.sort(first)
    inner = mode != LEAF

    def child(ids: np.ndarray, attr: str) -> np.ndarray:
        out = np.arange(n, dtype=np.int64)
        at = np.flatnonzero(inner)
        found = index.find(tree_ids[at], ids[at])
        if np.any(found < 0):
            i = int(at[np.argmax(found < 0)])
            raise _fail(label, f"attribute {attr!r}: node (tree {int(tree_ids[i])}, id {int(node_ids[i])}) "
                        f"points at node id {int(ids[i])}, which that tree does not have")
        out[at] = found
        return out

    true_child = child(tnode, "nodes_truenodeids")
    false_child = child(fnode, "nodes_falsenodeids")
    w_tree = _ints(label, attrs, f"{prefix}_treeids")
    w_node = _ints(label, attrs, f"{prefix}_nodeids")
    w_target = _ints(label, attrs, f"{prefix}_ids")
    if w_tree is None or w_node is None or w_target is None:
        w_tree = w_node = w_target = np.zeros(0, np.int64)
    if not (w_tree.size == w_node.size == w_target.size):
        raise _fail(label, f"attributes {prefix}_treeids / {prefix}_nodeids / {prefix}_ids have "
                    f"{w_tree.size} / {w_node.size} / {w_target.size} entries; they must be equal")
    weights = _floats(label, attrs, f"{prefix}_weights", acc, w_tree.size)
    if weights is None:
        weights = np.zeros(w_tree.size, acc)
    owner = index.find(w_tree, w_node)
    if np.any(owner < 0):
        k = int(np.argmax(owner < 0))
        raise _fail(label, f"attribute '{prefix}_nodeids' entry {k} names node (tree {int(w_tree[k])}, id "
                    f"{int(w_node[k])}), which the model does not have")
    order = np.argsort(owner, kind="stable")  # each leaf's weights contiguous, in model order
    counts = np.bincount(owner, minlength=n).astype(np.int64)
    counts[inner] = 0  # weights on interior nodes are never reached
    starts = np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=n))[:-1]]).astype(np.int64)
    if classifier:
        ints, strings = attrs.get("classlabels_int64s"), attrs.get("classlabels_strings")
        if (ints is None) == (strings is None):
            raise _fail(label, "exactly one of 'classlabels_int64s' and 'classlabels_strings' must be given")
        n_targets = len(ints) if ints is not None else len(strings or [])
    else:
        n_targets = int(attrs.get("n_targets", int(w_target.max()) + 1 if w_target.size else 1))
    _check_children(label, w_target, max(n_targets, 1), f"{prefix}_ids")
    base = _floats(label, attrs, "base_values", acc)
    if base is not None and base.size == 0:
        base = None
    if base is not None and not classifier and base.size != n_targets:
        raise _fail(label, f"attribute 'base_values' has {base.size} entries for {n_targets} targets")
    if base is not None and classifier and base.size not in (1, 2, n_targets):
        raise _fail(label, f"attribute 'base_values' has {base.size} entries for {n_targets} classes")
    forest = Forest(
        feature=np.where(inner, feature, 0), threshold=thresholds, mode=mode,
        true_child=true_child, false_child=false_child,
        missing_true=(mtt != 0) & inner if mtt is not None and mtt.size else np.zeros(n, bool),
        leaf_start=starts, leaf_count=counts, targets=w_target[order], weights=weights[order],
        roots=roots.astype(np.int64), n_targets=n_targets,
        aggregate=_named(label, attrs.get("aggregate_function"), AGGREGATES, "aggregate_function", "SUM"),
        post_transform=_named(label, attrs.get("post_transform"), POST_TRANSFORMS, "post_transform", "NONE"),
        base_values=base, acc=acc, depth=0)
    return _finish(label, forest)


def _finish(label: str, forest: Forest) -> Forest:
    inner = forest.mode != LEAF
    if np.any(forest.feature[inner] < 0):
        raise _fail(label, f"attribute 'nodes_featureids' holds {int(forest.feature[inner].min())}; feature ids "
                    "are >= 0")
    forest.n_features = int(forest.feature[inner].max()) + 1 if inner.any() else 0
    forest.depth = _depth(label, forest.roots, forest.mode, forest.true_child, forest.false_child)
    return forest


_CACHE: OrderedDict[int, tuple[dict[str, Any], str, Forest]] = OrderedDict()
_CACHE_LOCK = threading.Lock()


def forest_for(node: Node, x_dtype: np.dtype) -> Forest:
    """The node's forest for features of ``x_dtype``, compiled once (the cache holds the attrs dict, so its id is
    not reused meanwhile)."""
    attrs = node.attrs
    kind = f"{node.op_type}:{np.dtype(x_dtype).str}"
    with _CACHE_LOCK:
        hit = _CACHE.get(id(attrs))
        if hit is not None and hit[0] is attrs and hit[1] == kind:
            _CACHE.move_to_end(id(attrs))
            return hit[2]
    label = node.label()
    if node.op_type == "TreeEnsemble":
        forest = _compile_v5(label, attrs, np.dtype(x_dtype))
    else:
        forest = _compile_legacy(label, attrs, node.op_type == "TreeEnsembleClassifier", np.dtype(x_dtype))
    with _CACHE_LOCK:
        _CACHE[id(attrs)] = (attrs, kind, forest)
        while len(_CACHE) > 64:
            _CACHE.popitem(last=False)
    return forest


# ------------------------------------------------------------------------------------------------- evaluating

def leaves(forest: Forest, x: np.ndarray) -> np.ndarray:
    """The leaf (flat node index) each row reaches in each tree: [rows, trees]. ``x`` is [rows, features] in a
    type the thresholds compare against exactly (numpy promotes float32 thresholds to float64 for double rows)."""
    rows = np.arange(x.shape[0])[:, None]
    idx = np.broadcast_to(forest.roots, (x.shape[0], forest.n_trees)).copy()
    present = set(np.unique(forest.mode).tolist())
    for _ in range(forest.depth):
        mode = forest.mode[idx]
        active = mode != LEAF
        if not active.any():
            break
        v = x[rows, forest.feature[idx]]
        t = forest.threshold[idx]
        with np.errstate(invalid="ignore"):
            cond = np.zeros(idx.shape, bool)
            for m, fn in ((LEQ, np.less_equal), (LT, np.less), (GTE, np.greater_equal), (GT, np.greater),
                          (EQ, np.equal), (NEQ, np.not_equal)):
                if m in present:
                    sel = mode == m
                    cond[sel] = fn(v[sel], t[sel])
            if MEMBER in present:
                for node, values in forest.members.items():
                    sel = idx == node
                    if sel.any():
                        cond[sel] = np.isin(v[sel], values)
        cond |= forest.missing_true[idx] & np.isnan(v)
        idx = np.where(active, np.where(cond, forest.true_child[idx], forest.false_child[idx]), idx)
    return idx


def aggregate(forest: Forest, reached: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Scores [rows, n_targets] in the accumulation type and whether any leaf fed each one, trees in order."""
    n_rows = reached.shape[0]
    scores = np.zeros((n_rows, forest.n_targets), forest.acc)
    hit = np.zeros((n_rows, forest.n_targets), bool)
    rows = np.arange(n_rows)
    starts, counts = forest.leaf_start[reached], forest.leaf_count[reached]
    most = int(counts.max()) if counts.size else 0
    kind = forest.aggregate
    for tree in range(forest.n_trees):
        for k in range(most):
            sel = counts[:, tree] > k
            if not sel.any():
                continue
            r = rows[sel] if not sel.all() else rows
            pair = starts[r, tree] + k
            tg, w = forest.targets[pair], forest.weights[pair]
            if kind in ("SUM", "AVERAGE"):
                scores[r, tg] += w
            elif kind == "MIN":
                scores[r, tg] = np.where(hit[r, tg], np.minimum(scores[r, tg], w), w)
            else:
                scores[r, tg] = np.where(hit[r, tg], np.maximum(scores[r, tg], w), w)
            hit[r, tg] = True
    if kind == "AVERAGE":
        scores /= forest.acc.type(forest.n_trees)
    return scores, hit


def _logistic(v: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        p = (1 / (1 + np.exp(-np.abs(v)))).astype(v.dtype)
    return np.where(v < 0, 1 - p, p).astype(v.dtype)


def _probit(v: np.ndarray) -> np.ndarray:
    """sqrt(2) * erfinv(2v - 1) with the approximation onnxruntime uses (Winitzki's, a = 0.147)."""
    x = (v * 2 - 1).astype(v.dtype)
    sign = np.where(x < 0, -1, 1).astype(v.dtype)
    with np.errstate(divide="ignore", invalid="ignore"):
        one = (1 - x) * (1 + x)
        log = np.log(one)
        a = (2 / (np.pi * 0.147) + 0.5 * log).astype(v.dtype)
        b = (1 / 0.147 * log).astype(v.dtype)
        r = sign * np.sqrt(-a + np.sqrt(a * a - b))
    return (np.float64(1.41421356) * np.where(one == 0, 0, r)).astype(v.dtype)


def _softmax(v: np.ndarray) -> np.ndarray:
    e = np.exp(v - v.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(v.dtype)


def _softmax_zero(v: np.ndarray) -> np.ndarray:
    """Softmax where exact zeros (|v| <= 1e-7) stay zero-weighted; an all-zero row gives 0.5 everywhere."""
    top = v.max(axis=1, keepdims=True)
    small = (v <= 1e-7) & (v >= -1e-7)
    e = np.where(small, v * np.exp(-top), np.exp(v - top))
    s = e.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(s == 0, 0.5, e / s)
    return out.astype(v.dtype)


def post_transform(v: np.ndarray, name: str) -> np.ndarray:
    if name == "SOFTMAX":
        return _softmax(v)
    if name == "LOGISTIC":
        return _logistic(v)
    if name == "SOFTMAX_ZERO":
        return _softmax_zero(v)
    if name == "PROBIT":
        return _probit(v)
    return v


def regression_post(forest: Forest, scores: np.ndarray) -> np.ndarray:
    """The post transform of a regressor's scores (base values added)."""
    if forest.n_targets == 1:
        return _probit(scores) if forest.post_transform == "PROBIT" else scores
    return post_transform(scores, forest.post_transform)


def regression_needs_post(forest: Forest) -> bool:
    return forest.post_transform != "NONE" and (forest.n_targets > 1 or forest.post_transform == "PROBIT")


def regress(forest: Forest, x: np.ndarray) -> np.ndarray:
    """TreeEnsemble / TreeEnsembleRegressor scores [rows, n_targets] in the accumulation type."""
    scores, _ = aggregate(forest, leaves(forest, x))
    if forest.base_values is not None:
        scores = scores + forest.base_values
    return regression_post(forest, scores)


def features(x: np.ndarray, forest: Forest, label: str) -> np.ndarray:
    """X as [rows, features] in the type the thresholds compare against (ints and float16 converted)."""
    if x.ndim == 1:
        x = x.reshape(1, -1)
    elif x.ndim != 2:
        x = x.reshape(x.shape[0], -1)
    if x.shape[1] < forest.n_features:
        raise _fail(label, f"X has {x.shape[1]} features; the trees read feature {forest.n_features - 1}")
    if x.dtype.kind in "iu":
        x = x.astype(forest.threshold.dtype)  # onnxruntime compares integer features in the threshold type
    elif x.dtype == np.float16:
        x = x.astype(np.float32)
    return x


def classify(forest: Forest, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(index of the winning class per row, scores [rows, classes]) as onnxruntime's tree classifier gives them."""
    return classify_scores(forest, *aggregate(forest, leaves(forest, x)))


def classify_scores(forest: Forest, scores: np.ndarray, hit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``classify`` from the aggregated scores and their hit mask (base values not added yet)."""
    base = forest.base_values
    n_rows = scores.shape[0]
    used = forest.used_targets
    if forest.n_targets > 2 or used.size != 1:
        if base is not None:  # onnxruntime adds the base values it has, first classes first
            k = min(base.size, forest.n_targets)
            scores[:, :k] += base[:k]
            hit[:, :k] = True
        masked = np.where(hit, scores, -np.inf)
        winner = np.argmax(masked, axis=1)
        return winner, post_transform(scores, forest.post_transform)
    # Binary with one weight column: the score of the class the weights name decides.
    s = scores[:, int(used[0])]
    if base is not None:
        s = s + (base[1] if base.size == 2 else base[0])
    positive = forest.positive_weights
    winner = (s > (0.5 if positive else 0)).astype(np.int64)
    out = np.zeros((n_rows, 2), scores.dtype)
    if forest.post_transform == "PROBIT":
        out[:, 0] = _probit(s)  # onnxruntime writes the one probit score first and leaves the second unset
    elif forest.post_transform == "LOGISTIC":
        out[:, 1] = _logistic(s)
        out[:, 0] = _logistic(-s)
    elif positive:
        out[:, 1] = s
        out[:, 0] = 1 - s
    else:
        out[:, 1] = s
        out[:, 0] = -s
    return winner, out


def class_labels(node: Node, winner: np.ndarray) -> np.ndarray:
    """The classifier's label output: its int64 or string label of each row's winning class."""
    ints = node.attrs.get("classlabels_int64s")
    if ints is not None:
        return np.asarray(ints, np.int64)[winner]
    names = np.array([s.decode() if isinstance(s, bytes) else str(s) for s in node.attrs["classlabels_strings"]],
                     dtype=object)
    return names[winner]
