"""ai.onnx.ml tree ensembles (TreeEnsemble opset 5, TreeEnsembleRegressor / TreeEnsembleClassifier opset 3) on
hand-made random forests, against onnxruntime (one intra-op thread: it then adds the trees in model order, as hetero
does, so sums match bit for bit) and onnx.reference where that reference implements the case.

Every comparison mode (LEQ / LT / GTE / GT / EQ / NEQ / MEMBER), missing values tracking true and false, every
aggregate, every post transform, multi-target leaves, base values, single-leaf trees, float / double / int inputs and
the classifier's label output (int64 and string labels, binary with one weight column). Thresholds and inputs come
from a grid of halves so that the equality modes and the boundaries are hit, plus NaNs.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import hetero

ort = pytest.importorskip("onnxruntime")

MODES = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]
N_FEATURES = 6


@dataclass
class Tree:
    """Interior nodes (mode, feature, threshold, mtt, true child, false child; children < 0 are leaves -1 - k)
    and leaves (a list of (target, weight) per leaf)."""

    nodes: list[tuple[int, int, float, int, int, int]]
    leaves: list[list[tuple[int, float]]]
    members: dict[int, list[float]]


def random_tree(rng: np.random.Generator, depth: int, modes: list[int], n_targets: int, votes: int,
                positive: bool = False) -> Tree:
    tree = Tree([], [], {})

    def grow(level: int) -> int:
        if level >= depth or (level > 0 and rng.random() < 0.25):
            k = len(tree.leaves)
            picks = rng.choice(n_targets, size=min(votes, n_targets), replace=False)
            weights = rng.uniform(0, 1, picks.size) if positive else rng.normal(0, 1, picks.size)
            tree.leaves.append([(int(t), float(w)) for t, w in zip(picks, weights, strict=True)])
            return -1 - k
        i = len(tree.nodes)
        tree.nodes.append((0, 0, 0.0, 0, 0, 0))
        mode = int(rng.choice(modes))
        if mode == 6:
            tree.members[i] = sorted({float(v) for v in rng.integers(-2, 3, 3)})  # onnxruntime: integers only
        node = (mode, int(rng.integers(N_FEATURES)), float(rng.integers(-4, 5) / 2), int(rng.integers(2)),
                grow(level + 1), grow(level + 1))
        tree.nodes[i] = node
        return i

    if depth == 0:
        grow(depth)  # a single leaf
    else:
        grow(0)
    return tree


def rows(rng: np.random.Generator, n: int, dtype: type = np.float32, integers: bool = False) -> np.ndarray:
    """``integers``: whole numbers only, where BRANCH_MEMBER is compared with onnxruntime (which truncates the
    feature to an integer before the set lookup; the spec and onnx.reference test the float itself)."""
    x = (rng.integers(-5, 6, (n, N_FEATURES)) / (1 if integers else 2)).astype(np.float64)
    if np.dtype(dtype).kind == "f":
        x += 0 if integers else rng.choice([0, 0, 0, 0.25], x.shape)
        x[rng.random(x.shape) < 0.08] = np.nan
    return x.astype(dtype)


def v5_model(trees: list[Tree], n_targets: int, dtype: type, aggregate: int = 1, post: int = 0) -> bytes:
    feat, split, mode, mtt, tid, fid, tleaf, fleaf, roots, ltarget, lweight, members = ([] for _ in range(12))
    n_leaf = 0
    for tree in trees:
        base = len(feat)
        if not tree.nodes:  # a single leaf: a root whose two branches name it
            roots.append(base)
            feat.append(0); split.append(0.0); mode.append(0); mtt.append(0)  # noqa: E702
            tid.append(n_leaf); fid.append(n_leaf); tleaf.append(1); fleaf.append(1)  # noqa: E702
        else:
            roots.append(base)
            for i, (m, f, t, mt, tc, fc) in enumerate(tree.nodes):
                feat.append(f); split.append(t); mode.append(m); mtt.append(mt)  # noqa: E702
                for child, ids, leafs in ((tc, tid, tleaf), (fc, fid, fleaf)):
                    ids.append(n_leaf + (-1 - child) if child < 0 else base + child)
                    leafs.append(int(child < 0))
                if m == 6:
                    members += [*tree.members[i], np.nan]
        for leaf in tree.leaves:
            (target, weight), = leaf  # opset 5: one weight per leaf
            ltarget.append(target); lweight.append(weight)  # noqa: E702
        n_leaf += len(tree.leaves)
    np_t = np.dtype(dtype)
    attrs = dict(nodes_featureids=feat, nodes_splits=numpy_helper.from_array(np.array(split, np_t), "s"),
                 nodes_modes=numpy_helper.from_array(np.array(mode, np.uint8), "m"),
                 nodes_missing_value_tracks_true=mtt, nodes_truenodeids=tid, nodes_falsenodeids=fid,
                 nodes_trueleafs=tleaf, nodes_falseleafs=fleaf, tree_roots=roots, leaf_targetids=ltarget,
                 leaf_weights=numpy_helper.from_array(np.array(lweight, np_t), "w"), n_targets=n_targets,
                 aggregate_function=aggregate, post_transform=post)
    if members:
        attrs["membership_values"] = numpy_helper.from_array(np.array(members, np_t), "mv")
    elem = helper.np_dtype_to_tensor_dtype(np_t)
    node = helper.make_node("TreeEnsemble", ["X"], ["Y"], domain="ai.onnx.ml", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", elem, [None, N_FEATURES])],
                              [helper.make_tensor_value_info("Y", elem, [None, n_targets])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("ai.onnx.ml", 5)])
    model.ir_version = 10
    return model.SerializeToString()


def legacy_model(trees: list[Tree], n_targets: int, x_type: int, classifier: bool, *, aggregate: str = "SUM",
                 post: str = "NONE", base: list[float] | None = None, as_tensor: bool = False,
                 labels: list[int] | list[str] | None = None) -> bytes:
    treeids, nodeids, feat, values, modes, tids, fids, mtt = ([] for _ in range(8))
    wt, wn, wi, ww = ([] for _ in range(4))
    for t, tree in enumerate(trees):
        n_inner = len(tree.nodes)

        def nid(child: int, n_inner: int = n_inner) -> int:
            return n_inner + (-1 - child) if child < 0 else child

        for i, (m, f, th, mt, tc, fc) in enumerate(tree.nodes):
            treeids.append(t); nodeids.append(i); feat.append(f); values.append(th)  # noqa: E702
            modes.append(MODES[m]); tids.append(nid(tc)); fids.append(nid(fc)); mtt.append(mt)  # noqa: E702
        for k, leaf in enumerate(tree.leaves):
            treeids.append(t); nodeids.append(n_inner + k); feat.append(0); values.append(0.0)  # noqa: E702
            modes.append("LEAF"); tids.append(0); fids.append(0); mtt.append(0)  # noqa: E702
            for target, weight in leaf:
                wt.append(t); wn.append(n_inner + k); wi.append(target); ww.append(weight)  # noqa: E702
    prefix = "class" if classifier else "target"
    attrs: dict[str, object] = dict(nodes_treeids=treeids, nodes_nodeids=nodeids, nodes_featureids=feat,
                                    nodes_modes=modes, nodes_truenodeids=tids, nodes_falsenodeids=fids,
                                    nodes_missing_value_tracks_true=mtt, post_transform=post)
    attrs[f"{prefix}_treeids"], attrs[f"{prefix}_nodeids"], attrs[f"{prefix}_ids"] = wt, wn, wi
    if as_tensor:
        attrs["nodes_values_as_tensor"] = numpy_helper.from_array(np.array(values, np.float64), "v")
        attrs[f"{prefix}_weights_as_tensor"] = numpy_helper.from_array(np.array(ww, np.float64), "w")
        if base is not None:
            attrs["base_values_as_tensor"] = numpy_helper.from_array(np.array(base, np.float64), "b")
    else:
        attrs["nodes_values"], attrs[f"{prefix}_weights"] = values, ww
        if base is not None:
            attrs["base_values"] = base
    outputs = []
    if classifier:
        assert labels is not None
        is_str = isinstance(labels[0], str)
        attrs["classlabels_strings" if is_str else "classlabels_int64s"] = labels
        outputs.append(helper.make_tensor_value_info("label", TensorProto.STRING if is_str else TensorProto.INT64,
                                                     [None]))
        outputs.append(helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, len(labels)]))
        node = helper.make_node("TreeEnsembleClassifier", ["X"], ["label", "Y"], domain="ai.onnx.ml", **attrs)
    else:
        attrs["n_targets"], attrs["aggregate_function"] = n_targets, aggregate
        outputs.append(helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, n_targets]))
        node = helper.make_node("TreeEnsembleRegressor", ["X"], ["Y"], domain="ai.onnx.ml", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", x_type, [None, N_FEATURES])],
                              outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 10
    return model.SerializeToString()


def ort_run(model: bytes, x: np.ndarray) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # trees added in model order
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    return session.run(None, {"X": x})


def hetero_run(model: bytes, x: np.ndarray, backend: str = "reference") -> list[np.ndarray]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hetero.HeteroWarning)
        session = hetero.Session(model, backends=[backend], on_fallback="silent")
    out = session.run({"X": x})
    return [np.asarray(v) for v in out.values()]


def forest(seed: int, n_trees: int, modes: list[int], n_targets: int = 1, votes: int = 1, depth: int = 4,
           positive: bool = False) -> list[Tree]:
    rng = np.random.default_rng(seed)
    trees = [random_tree(rng, int(rng.integers(0, depth + 1)) if i % 5 else depth, modes, n_targets, votes,
                         positive) for i in range(n_trees)]
    trees.append(random_tree(rng, 0, modes, n_targets, votes, positive))  # a single-leaf tree
    return trees


def assert_matches(got: np.ndarray, want: np.ndarray, exact: bool) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    if exact:
        np.testing.assert_array_equal(got, want)
    else:  # onnxruntime's vectorised exp / logistic differ from numpy's in the last bits
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mode", range(7))
def test_tree_ensemble_each_mode(dtype: type, mode: int) -> None:
    trees = forest(mode, 12, [mode, 0], n_targets=2)
    model = v5_model(trees, 2, dtype)
    x = rows(np.random.default_rng(10 + mode), 97, dtype, integers=mode == 6)
    assert_matches(hetero_run(model, x)[0], ort_run(model, x)[0], exact=True)


@pytest.mark.parametrize("aggregate", range(4))
@pytest.mark.parametrize("post", range(5))
def test_tree_ensemble_aggregate_and_post_transform(aggregate: int, post: int) -> None:
    for n_targets in (1, 3):
        trees = forest(aggregate * 10 + post, 9, list(range(7)), n_targets=n_targets)
        model = v5_model(trees, n_targets, np.float32, aggregate, post)
        x = rows(np.random.default_rng(post), 64, integers=True)
        if post == 4:  # probit of values inside (0, 1), where it is defined
            trees = _scaled(trees, 0.02)
        model = v5_model(trees, n_targets, np.float32, aggregate, post)
        # onnxruntime 1.32 reads TreeEnsemble's post_transform 1 as LOGISTIC and 2 as SOFTMAX (its older ops'
        # numbering); the spec (and hetero) has 1 = SOFTMAX, 2 = LOGISTIC: compared with the model ort reads
        # alike.
        ort_model = v5_model(trees, n_targets, np.float32, aggregate, {1: 2, 2: 1}.get(post, post))
        exact = post == 0 or (n_targets == 1 and post != 4)  # one target: only PROBIT is applied (as ort does)
        assert_matches(hetero_run(model, x)[0], ort_run(ort_model, x)[0], exact=exact)


def _scaled(trees: list[Tree], factor: float) -> list[Tree]:
    return [Tree(t.nodes, [[(k, 0.5 / len(trees) + factor * w) for k, w in leaf] for leaf in t.leaves], t.members)
            for t in trees]


def test_tree_ensemble_against_onnx_reference() -> None:
    """onnx.reference's TreeEnsemble (which applies no post transform) on sums and averages, BRANCH_MEMBER on
    fractional features included. Without single-leaf trees: onnx 1.19's reference reads such a tree's weight at
    the root's node index instead of its leaf index; and with no 0 in a member set: its set reader stops at a
    falsy member (0.0) as if it were the NaN that ends the set."""
    from onnx.reference import ReferenceEvaluator

    for aggregate in (0, 1):
        trees = [Tree(t.nodes, t.leaves, {i: [v for v in m if v] or [1.0] for i, m in t.members.items()})
                 for t in forest(aggregate, 10, list(range(7)), n_targets=2) if t.nodes]
        model = v5_model(trees, 2, np.float64, aggregate)
        x = rows(np.random.default_rng(5), 40, np.float64)
        want = ReferenceEvaluator(model).run(None, {"X": x})[0]
        np.testing.assert_allclose(hetero_run(model, x)[0], want, rtol=1e-12, atol=1e-12)


def test_tree_ensemble_one_row_and_float16() -> None:
    trees = forest(3, 7, [0, 1, 2, 3], n_targets=2)
    model = v5_model(trees, 2, np.float32)
    x = rows(np.random.default_rng(1), 1)
    assert_matches(hetero_run(model, x)[0], ort_run(model, x)[0], exact=True)
    # float16: compared and summed in float32, the result rounded to float16 (onnxruntime has no float16 kernel)
    half = v5_model(trees, 2, np.float16)
    got = hetero_run(half, x.astype(np.float16))[0]
    want = ort_run(model, x.astype(np.float16).astype(np.float32))[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("aggregate", ["SUM", "AVERAGE", "MIN", "MAX"])
@pytest.mark.parametrize("x_type", [TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64])
def test_regressor(aggregate: str, x_type: int) -> None:
    trees = forest(7, 11, list(range(6)), n_targets=3, votes=2)
    x = rows(np.random.default_rng(3), 50, {TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64,
                                            TensorProto.INT64: np.int64}[x_type])
    for as_tensor in ((False, True) if x_type == TensorProto.DOUBLE else (False,)):  # ort: tensors with double X
        model = legacy_model(trees, 3, x_type, False, aggregate=aggregate, base=[0.5, -1.0, 2.0],
                             as_tensor=as_tensor)
        if x_type == TensorProto.INT64:  # onnxruntime has no int64 kernel: as float features, which hetero uses
            want = ort_run(legacy_model(trees, 3, TensorProto.FLOAT, False, aggregate=aggregate,
                                        base=[0.5, -1.0, 2.0]), x.astype(np.float32))[0]
        else:
            want = ort_run(model, x)[0]
        assert_matches(hetero_run(model, x)[0], want, exact=True)


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"])
def test_regressor_post_transform(post: str) -> None:
    trees = forest(8, 6, [0, 2], n_targets=4, votes=2)
    model = legacy_model(trees, 4, TensorProto.FLOAT, False, post=post)
    x = rows(np.random.default_rng(4), 33)
    assert_matches(hetero_run(model, x)[0], ort_run(model, x)[0], exact=post == "NONE")


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"])
@pytest.mark.parametrize("labels", [[3, 5, 9], ["cat", "dog", "eel", "fox"]])
def test_classifier_multiclass(post: str, labels: list[int] | list[str]) -> None:
    trees = forest(9, 10, list(range(6)), n_targets=len(labels), votes=len(labels))
    model = legacy_model(trees, len(labels), TensorProto.FLOAT, True, post=post, labels=labels,
                         base=[0.1 * i for i in range(len(labels))])
    x = rows(np.random.default_rng(6), 45)
    got, want = hetero_run(model, x), ort_run(model, x)
    assert_matches(got[1], want[1], exact=post == "NONE")
    np.testing.assert_array_equal(got[0], np.asarray(want[0], dtype=got[0].dtype))


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "PROBIT"])
@pytest.mark.parametrize("positive", [True, False])
def test_classifier_binary_one_column(post: str, positive: bool) -> None:
    """Binary with one weight column (what GBM / LightGBM exports give): onnxruntime's [1 - p, p] or [-s, s]."""
    trees = forest(11, 8, [0, 1], n_targets=1, positive=positive)
    if positive or post == "PROBIT":
        trees = _scaled(trees, 0.02)
    model = legacy_model(trees, 1, TensorProto.FLOAT, True, post=post, labels=[0, 1])
    x = rows(np.random.default_rng(8), 40)
    got, want = hetero_run(model, x), ort_run(model, x)
    np.testing.assert_array_equal(got[0], want[0])
    if post == "PROBIT":  # onnxruntime writes one probit score, the second column is whatever its buffer held
        assert_matches(got[1][:, 0], want[1][:, 0], exact=False)
    else:
        assert_matches(got[1], want[1], exact=post == "NONE")


def test_classifier_binary_two_columns() -> None:
    """Both classes weighted: the scores as onnxruntime's; the label the larger score's, as onnx.reference (the
    spec) has it (onnxruntime 1.32 answers the second label whenever its score is > 0)."""
    from onnx.reference import ReferenceEvaluator

    trees = forest(12, 8, [0], n_targets=2, votes=2, positive=True)
    model = legacy_model(trees, 2, TensorProto.FLOAT, True, labels=["no", "yes"])
    x = rows(np.random.default_rng(9), 40)
    got, want = hetero_run(model, x), ort_run(model, x)
    assert_matches(got[1], want[1], exact=True)
    labels = ReferenceEvaluator(model).run(None, {"X": x})[0]
    assert set(labels) == {"no", "yes"}
    np.testing.assert_array_equal(got[0], np.asarray(labels, dtype=object))


@pytest.mark.parametrize("change, message", [
    (lambda a: a.update(nodes_truenodeids=[5, *a["nodes_truenodeids"][1:]]), "out of range"),
    (lambda a: a.update(nodes_trueleafs=a["nodes_trueleafs"][:-1]), "'nodes_trueleafs' has"),
    (lambda a: a.update(nodes_truenodeids=[0] * len(a["nodes_truenodeids"]),
                        nodes_trueleafs=[0] * len(a["nodes_trueleafs"])), "cycle"),
    (lambda a: a.update(aggregate_function=7), "'aggregate_function' is 7"),
])
def test_bad_attributes_name_the_node_and_attribute(change: Callable[[dict[str, object]], None], message: str) -> None:
    attrs: dict[str, object] = dict(nodes_featureids=[0, 1], nodes_splits=np.array([0.5, 1.0], np.float32),
                                    nodes_modes=np.array([0, 0], np.uint8), nodes_truenodeids=[1, 0],
                                    nodes_falsenodeids=[1, 2], nodes_trueleafs=[0, 1], nodes_falseleafs=[1, 1],
                                    tree_roots=[0], leaf_targetids=[0, 0, 0],
                                    leaf_weights=np.array([1, 2, 3], np.float32))
    change(attrs)
    node = helper.make_node("TreeEnsemble", ["X"], ["Y"], domain="ai.onnx.ml", name="trees",
                            **{k: numpy_helper.from_array(v, k) if isinstance(v, np.ndarray) else v
                               for k, v in attrs.items()})
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 2])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("ai.onnx.ml", 5)])
    with pytest.raises(hetero.HeteroError, match=message) as info:
        hetero_run(model.SerializeToString(), np.zeros((2, 2), np.float32))
    assert "trees" in str(info.value)


def test_legacy_node_index_matches_a_dict() -> None:
    """The sorted (tree id, node id) index of the legacy attributes against a dict: ids out of order, negative and
    near the int64 limits, trees with gaps, and queries for trees / nodes the model lacks (-1)."""
    from hetero.contract.trees import _NodeIndex
    rng = np.random.default_rng(5)
    big = np.iinfo(np.int64).max
    trees = rng.choice(np.array([-7, 0, 3, 9, big - 1, -big]), 300)
    nodes = rng.choice(np.array([-2, 0, 1, 2, 5, 40, big, -big]), 300)
    key = {}
    for i, k in enumerate(zip(trees.tolist(), nodes.tolist(), strict=True)):
        key.setdefault(k, i)
    keep = np.array(sorted(key.values()))
    index = _NodeIndex(trees[keep], nodes[keep])
    assert index.first_repeat() is None
    qt = np.concatenate([trees, rng.choice(np.array([-8, 1, 4, big]), 50)])
    qn = np.concatenate([nodes, rng.choice(np.array([-1, 3, 6, big - 1]), 50)])
    want = [int(np.flatnonzero(keep == key[k])[0]) if k in key else -1
            for k in zip(qt.tolist(), qn.tolist(), strict=True)]
    np.testing.assert_array_equal(index.find(qt, qn), want)
    # The first repeated node in model order, as the dict walk found it.
    np.testing.assert_equal(_NodeIndex(trees, nodes).first_repeat(),
                            next(i for i, k in enumerate(zip(trees.tolist(), nodes.tolist(), strict=True))
                                 if key[k] != i))
    assert _NodeIndex(np.zeros(0, np.int64), np.zeros(0, np.int64)).find(np.array([1]), np.array([1])).tolist() == [-1]


@pytest.mark.parametrize("change, message", [
    (lambda a: a.update(nodes_nodeids=[0, 1, 1, 3]), r"node \(tree 0, id 1\) appears twice"),
    (lambda a: a.update(nodes_falsenodeids=[9, 0, 0, 0]), r"'nodes_falsenodeids': node \(tree 0, id 0\) points "
                                                          r"at node id 9"),
    (lambda a: a.update(target_nodeids=[1, 2, 7]), r"'target_nodeids' entry 2 names node \(tree 0, id 7\)"),
])
def test_legacy_bad_node_references(change: Callable[[dict[str, object]], None], message: str) -> None:
    attrs: dict[str, object] = dict(nodes_treeids=[0, 0, 0, 0], nodes_nodeids=[0, 1, 2, 3],
                                    nodes_featureids=[0, 1, 0, 0], nodes_values=[0.5, 1.0, 0.0, 0.0],
                                    nodes_modes=["BRANCH_LEQ", "BRANCH_LEQ", "LEAF", "LEAF"],
                                    nodes_truenodeids=[1, 2, 0, 0], nodes_falsenodeids=[3, 3, 0, 0],
                                    target_treeids=[0, 0, 0], target_nodeids=[1, 2, 3], target_ids=[0, 0, 0],
                                    target_weights=[1.0, 2.0, 3.0], n_targets=1)
    change(attrs)
    node = helper.make_node("TreeEnsembleRegressor", ["X"], ["Y"], domain="ai.onnx.ml", name="trees", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 2])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    with pytest.raises(hetero.HeteroError, match=message):
        hetero_run(model.SerializeToString(), np.zeros((2, 2), np.float32))
