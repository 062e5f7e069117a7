"""The cpu backend's native tree-ensemble kernel (src/trees.cpp) against hetero's numpy reference, bit for bit: every
comparison mode, missing values, aggregate and post transform, the older regressor / classifier ops, float and double
features, and the row counts that take each path (one row and fewer rows than threads: leaves found per tree chunk;
more: row blocks of 32 with a tail; on AVX-512, double LEQ / LT forests walk a block's rows as vector lanes), on 1
and 2 threads, the replayed second run included."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto
from test_ml_trees import forest, legacy_model, rows, v5_model

import hetero

native = pytest.importorskip("hetero_cpu._native", reason="the hetero-cpu native extension is not built")

ROWS = (1, 3, 17, 200)


def _session(model: bytes, backend: str, threads: int | None = None) -> hetero.Session:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hetero.HeteroWarning)
        return hetero.Session(model, backends=[backend], threads=threads, on_fallback="silent")


def _same(model: bytes, xs: list[np.ndarray]) -> None:
    ref = _session(model, "reference")
    for threads in (1, 2):
        cpu = _session(model, "cpu", threads)
        placed = {p.backend for p in cpu.placement.nodes}
        assert placed == {"cpu"}, cpu.placement.fallback_summary()
        for x in xs:
            want = ref.run({"X": x})
            for _ in range(2):  # the second run replays the bound call
                got = cpu.run({"X": x})
                for name, value in want.items():
                    np.testing.assert_array_equal(got[name], value, err_msg=f"{name}, {x.shape}, {threads} threads")
                    assert got[name].dtype == value.dtype


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("modes", [[0], [1], [2, 3], [4, 5], [6, 0], list(range(7))])
def test_tree_ensemble_modes(dtype: type, modes: list[int]) -> None:
    trees = forest(sum(modes), 23, modes, n_targets=3)
    _same(v5_model(trees, 3, dtype), [rows(np.random.default_rng(n), n, dtype) for n in ROWS])


@pytest.mark.parametrize("aggregate", range(4))
@pytest.mark.parametrize("post", range(5))
def test_tree_ensemble_aggregates_and_post_transforms(aggregate: int, post: int) -> None:
    for n_targets in (1, 4):
        trees = forest(aggregate + 5 * post, 9, list(range(7)), n_targets=n_targets)
        _same(v5_model(trees, n_targets, np.float32, aggregate, post),
              [rows(np.random.default_rng(n), n) for n in (1, 17)])


def test_tree_ensemble_float16_features() -> None:
    trees = forest(4, 9, [0, 2], n_targets=2)
    _same(v5_model(trees, 2, np.float16), [rows(np.random.default_rng(n), n, np.float16) for n in (1, 17)])


@pytest.mark.parametrize("x_type, dtype", [(TensorProto.FLOAT, np.float32), (TensorProto.DOUBLE, np.float64),
                                           (TensorProto.INT64, np.int64)])
@pytest.mark.parametrize("aggregate", ["SUM", "AVERAGE", "MIN", "MAX"])
def test_regressor(x_type: int, dtype: type, aggregate: str) -> None:
    trees = forest(7, 11, list(range(6)), n_targets=3, votes=2)
    model = legacy_model(trees, 3, x_type, False, aggregate=aggregate, base=[0.5, -1.0, 2.0])
    _same(model, [rows(np.random.default_rng(n), n, dtype) for n in ROWS])


@pytest.mark.parametrize("labels", [[3, 5, 9], ["cat", "dog"], [0, 1]])
@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX"])
def test_classifier(labels: list[int] | list[str], post: str) -> None:
    for votes, positive in ((len(labels), True), (1, False)):  # every class weighted; one column (binary: GBM)
        trees = forest(9, 10, list(range(6)), n_targets=1 if votes == 1 else len(labels), votes=votes,
                       positive=positive)
        model = legacy_model(trees, len(labels), TensorProto.FLOAT, True, post=post, labels=labels)
        _same(model, [rows(np.random.default_rng(n), n) for n in ROWS])


@pytest.mark.parametrize("labels", [[3, 5, 9], [0, 1]])
def test_classifier_runs_scan_no_leaf_array(labels: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's classifier rules use the forest's cached class columns and weight sign: np.unique over every leaf pair
    per run cost a 10k-tree LightGBM classifier (luscinia) 35 ms of a 52 ms one-row run. After the first run (which
    may fill the caches) np.unique and the full-array sign test must not run again, and the outputs stay the
    reference's."""
    for votes, positive in ((len(labels), True), (1, True), (1, False)):
        trees = forest(11, 10, list(range(6)), n_targets=1 if votes == 1 else len(labels), votes=votes,
                       positive=positive)
        model = legacy_model(trees, len(labels), TensorProto.FLOAT, True, post="NONE", labels=labels)
        x = rows(np.random.default_rng(3), 5)
        want = _session(model, "reference").run({"X": x})
        cpu = _session(model, "cpu", 1)
        first = cpu.run({"X": x})
        with monkeypatch.context() as m:
            m.setattr(np, "unique", lambda *a, **k: pytest.fail("np.unique in a tree classifier's run"))
            for _ in range(2):
                got = cpu.run({"X": x})
                for name, value in want.items():
                    np.testing.assert_array_equal(got[name], value, err_msg=name)
                    np.testing.assert_array_equal(first[name], value, err_msg=name)


def _one_class_a_tree(seed: int, n_trees: int, modes: list[int], n_classes: int, used: int) -> list:
    """A GBM classifier's forest: one (class, weight) pair a leaf, every leaf of tree t naming class t % used."""
    trees = forest(seed, n_trees, modes, n_targets=1, votes=1)
    for t, tree in enumerate(trees):
        tree.leaves = [[(t % used, w) for _, w in leaf] for leaf in tree.leaves]
    return trees


@pytest.mark.parametrize("modes", [[0], [1], list(range(6))])
@pytest.mark.parametrize("base", [None, [0.25, -0.5, 0.0, 1.0]])
def test_classifier_one_class_a_tree_hits_from_the_forest(modes: list[int], base: list[float] | None,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """LightGBM-style classifiers take the walk without a hit mask (the mask is the same for every row: the classes
    that have trees); class 3 has no tree, so its score stays masked out of the argmax. Bit for bit the reference
    at 1 and 2 threads and every row-count path, base values (which set hits) included. The mask the forest gives
    is checked too, and a forest whose leaves mix classes within a tree keeps the walk's mask."""
    from hetero_cpu.kernels import trees as kernel

    masks: list[np.ndarray | None] = []
    real = kernel.row_independent_hits
    monkeypatch.setattr(kernel, "row_independent_hits", lambda f: masks.append(real(f)) or masks[-1])
    for post in ("NONE", "SOFTMAX", "LOGISTIC"):
        trees = _one_class_a_tree(21, 40, modes, 4, 3)
        model = legacy_model(trees, 4, TensorProto.FLOAT, True, post=post, base=base, labels=[7, 8, 9, 10])
        _same(model, [rows(np.random.default_rng(n), n) for n in (*ROWS, 64)])
    assert masks and all(m is not None and m.tolist() == [True, True, True, False] for m in masks)
    masks.clear()
    mixed = forest(21, 40, modes, n_targets=4, votes=1)  # one pair a leaf, but any class: the walk's mask
    _same(legacy_model(mixed, 4, TensorProto.FLOAT, True, base=base, labels=[7, 8, 9, 10]),
          [rows(np.random.default_rng(n), n) for n in ROWS])
    assert masks and all(m is None for m in masks)


def test_native_forest_rejects_mismatched_inputs() -> None:
    from hetero.contract import trees as ml
    from hetero_cpu.kernels.trees import native_forest

    node = hetero.load(v5_model(forest(1, 3, [0]), 1, np.float32)).nodes[0]
    f = native_forest(ml.forest_for(node, np.dtype(np.float32)), with_base=True)
    with pytest.raises(ValueError, match="float32"):
        f.run(np.zeros((2, 6)), np.zeros((2, 1)))
    with pytest.raises(ValueError, match="features"):
        f.run(np.zeros((2, 1), np.float32), np.zeros((2, 1), np.float32))
    out = np.full((0, 1), 7, np.float32)
    f.run(np.zeros((0, 6), np.float32), out)  # no rows: nothing to do


@pytest.mark.parametrize("modes", [[0], [0, 1, 4]])
def test_many_trees_few_rows_split_over_tree_chunks(modes: list[int]) -> None:
    """Enough trees that three rows take both threads (rows x trees x 8 > 2 x 62500, src/trees.cpp): the leaves
    found per tree chunk (four trees side by side where every node is BRANCH_LEQ), then each row summed in tree
    order."""
    trees = forest(5, 6000, modes, n_targets=2, depth=3)
    _same(v5_model(trees, 2, np.float64), [rows(np.random.default_rng(3), 3, np.float64)])


def _isas() -> list[str]:
    """The vector walk (avx512) and the scalar walks (any other ISA of this CPU)."""
    isas = native.available_isas()
    return [isa for isa in ("avx512", "avx2", "generic") if isa in isas][:2]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("modes", [[0], [1]])
def test_vector_walk_row_counts(modes: list[int], dtype: type) -> None:
    """Double and float features through BRANCH_LEQ / LT forests, deep trees: the AVX-512 walk (rows of a block of
    32 as lanes: 1-4 vectors of eight, a partial one at each tail; float values and thresholds compared widened to
    double) against the reference and the scalar walks, on row counts around the lanes and the block, NaN features
    both ways."""
    trees = forest(11 + modes[0], 40, modes, n_targets=3, depth=10)
    model = v5_model(trees, 3, dtype)
    xs = [rows(np.random.default_rng(n), n, dtype) for n in (1, 2, 7, 8, 9, 24, 25, 31, 32, 33, 65, 100)]
    xs[-1][5] = np.nan  # a row of NaN only
    from hetero.contract import trees as ml
    from hetero_cpu.kernels.trees import native_forest

    node = hetero.load(model).nodes[0]
    assert native_forest(ml.forest_for(node, np.dtype(dtype)), with_base=True).vector_layout
    before = native.isa()
    try:
        for isa in _isas():
            native.set_isa(isa)
            _same(model, xs)
    finally:
        native.set_isa(before)


def test_vector_walk_declines_shared_subtrees() -> None:
    """A tree whose subtree A is the false child of two nodes: depth-first numbering cannot put A right after both,
    so the 16-byte layout (false child = next node) is not built and the scalar walk answers."""
    i64 = np.int64
    # 0: x0 <= 0 ? B : A;  1 (B): x1 <= 0 ? leaf 3 : A;  2 (A): x2 <= 0 ? leaf 4 : leaf 5
    f = native.TreeForest(
        np.array([0, 1, 2, 0, 0, 0], i64), np.zeros(6), np.array([0, 0, 0, 7, 7, 7], np.uint8),
        np.array([1, 3, 4, 3, 4, 5], i64), np.array([2, 2, 5, 3, 4, 5], i64), np.zeros(6, np.uint8),
        np.array([0, 0, 0, 0, 1, 2], i64), np.array([0, 0, 0, 1, 1, 1], i64), np.zeros(3, i64),
        np.array([1.0, 2.0, 3.0]), np.array([0], i64), 1, "SUM", np.zeros(0), [])
    x = np.random.default_rng(0).choice([-1.0, 1.0], (40, 3))
    assert not f.vector_layout
    out = np.zeros((40, 1))
    f.run(x, out)
    a = np.where(x[:, 2] <= 0, 2.0, 3.0)
    want = np.where(x[:, 0] <= 0, np.where(x[:, 1] <= 0, 1.0, a), a)
    np.testing.assert_array_equal(out[:, 0], want)


@pytest.mark.parametrize("aggregate", ["SUM", "AVERAGE"])
def test_vector_walk_regressor_base_and_average(aggregate: str) -> None:
    """sklearn's shape of forest (TreeEnsembleRegressor, BRANCH_LEQ, float, one vote per leaf) on the vector walk:
    the average and the base values applied after the walk's sums."""
    trees = forest(21, 30, [0], n_targets=2, depth=7)
    model = legacy_model(trees, 2, TensorProto.FLOAT, False, aggregate=aggregate, base=[0.25, -3.0])
    from hetero.contract import trees as ml
    from hetero_cpu.kernels.trees import native_forest

    node = hetero.load(model).nodes[0]
    assert native_forest(ml.forest_for(node, np.dtype(np.float32)), with_base=True).vector_layout
    _same(model, [rows(np.random.default_rng(n), n, np.float32) for n in (1, 9, 40)])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("modes", [[0], [1]])
def test_few_rows_split_trees_over_threads(modes: list[int], dtype: type) -> None:
    """A one-mode, one-vote forest of 501 trees (over kSplitTrees = 384, src/trees.cpp) on 1-3 rows (fewer than twice
    the threads): at two threads the trees split into two chunks, the second chunk's weights kept and added by the
    caller in tree order; one and three targets, an AVERAGE with base values, NaN features; bit for bit the reference
    and the 1-thread walk (an odd tree count: uneven chunks)."""
    for n_targets, aggregate in ((1, 1), (3, 0)):
        trees = forest(31 + modes[0], 500, modes, n_targets=n_targets, depth=6)
        model = v5_model(trees, n_targets, dtype, aggregate)
        _same(model, [rows(np.random.default_rng(40 + n), n, dtype) for n in (1, 2, 3)])


@pytest.mark.parametrize("n_targets", [1, 3])
def test_one_row_split_with_an_awake_worker(n_targets: int) -> None:
    """row_split with the pool's worker spinning, so that it takes the second chunk while the caller walks the
    first (the kept weights then added in order): every call bit for bit the 1-thread sum. Skipped where the worker
    never got a CPU during the calls (then only the serial order ran, which the test above covers)."""
    from hetero.contract import trees as ml
    from hetero_cpu.kernels.trees import native_forest

    trees = forest(7, 700, [0], n_targets=n_targets, depth=8)
    node = hetero.load(v5_model(trees, n_targets, np.float64)).nodes[0]
    f = native_forest(ml.forest_for(node, np.dtype(np.float64)), with_base=True)
    assert f.n_trees > 384
    # one target: two rows, since one row takes the chained walk (not split) there
    xs = [rows(np.random.default_rng(n), 1 if n_targets > 1 else 2, np.float64) for n in range(16)]
    threads, spin = native.num_threads(), native.pool_spin_us()
    try:
        native.set_num_threads(1)
        want = []
        for x in xs:
            want.append(np.empty((len(x), n_targets)))
            f.run(x, want[-1])
        native.set_pool_spin_us(1_000_000)  # the new pool's worker spins instead of sleeping between calls
        native.set_num_threads(2)
        native.pool_stats_enable(True)
        native.pool_stats(True)
        out = np.empty((len(xs[0]), n_targets))
        for i in range(4000):
            f.run(xs[i % 16], out)
            np.testing.assert_array_equal(out, want[i % 16], err_msg=f"call {i}")
        joins = native.pool_stats(True)["joins"]
    finally:
        native.pool_stats_enable(False)
        native.set_pool_spin_us(spin)
        native.set_num_threads(threads)
    if joins == 0:
        pytest.skip("the pool's worker never joined a call")


def _with_infinite_thresholds(trees: list, seed: int) -> list:
    """LightGBM writes +-inf thresholds (a split that only routes NaN): every sixth interior node gets one."""
    rng = np.random.default_rng(seed)
    for tree in trees:
        for i, (m, f, _, mt, tc, fc) in enumerate(tree.nodes):
            if rng.random() < 1 / 6:
                tree.nodes[i] = (m, f, float(rng.choice([np.inf, -np.inf])), mt, tc, fc)
    return trees


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("modes", [[0], [1]])
@pytest.mark.parametrize("n_trees", [7, 11, 12, 13, 40, 301])
def test_one_row_chained_walk(n_trees: int, modes: list[int], dtype: type) -> None:
    """One row through a one-target, one-mode forest: the chained walk (src/trees.cpp, Forest::chain_sum: 12 trees
    at once, a leaf linking to its lane's next root; NaN routed by a copy of the features with NaN as -inf; leaves
    always true against -inf) bit for bit against the reference, at 1 and 2 threads. Tree counts around the 12
    lanes (fewer: the chain is not built), single-leaf trees, +-inf thresholds (a -inf one under BRANCH_LT: not
    built, since -inf < -inf would send NaN the wrong way), NaN features both ways, rows of NaN / +-inf only, SUM
    and AVERAGE."""
    from hetero.contract import trees as ml
    from hetero_cpu.kernels.trees import native_forest

    trees = forest(50 + n_trees + modes[0], n_trees - 1, modes, n_targets=1, depth=7)  # + one single-leaf tree
    infinite = n_trees in (13, 301)
    if infinite:
        trees = _with_infinite_thresholds(trees, n_trees)
    xs = [rows(np.random.default_rng(60 + n), 1, dtype) for n in range(12)]
    xs += [np.full((1, 6), v, dtype) for v in (np.nan, np.inf, -np.inf)]
    for aggregate in (0, 1):  # AVERAGE, SUM
        model = v5_model(trees, 1, dtype, aggregate)
        node = hetero.load(model).nodes[0]
        f = native_forest(ml.forest_for(node, np.dtype(dtype)), with_base=True)
        assert f.n_trees == n_trees
        assert f.one_row_chain == (n_trees >= 12 and not (infinite and modes == [1])), f.one_row_chain
        _same(model, xs)


def test_one_row_chained_walk_declines() -> None:
    """Forests the chain does not take walk as before: several targets, BRANCH_GTE, a NaN threshold."""
    from hetero.contract import trees as ml
    from hetero_cpu.kernels.trees import native_forest

    def chain(trees: list, n_targets: int = 1) -> bool:
        node = hetero.load(v5_model(trees, n_targets, np.float64)).nodes[0]
        return bool(native_forest(ml.forest_for(node, np.dtype(np.float64)), with_base=True).one_row_chain)

    assert chain(forest(3, 30, [0]))
    assert not chain(forest(3, 30, [0], n_targets=2), 2)
    assert not chain(forest(3, 30, [2]))
    trees = forest(3, 30, [0], depth=3)
    m, f, _, mt, tc, fc = trees[0].nodes[0]
    trees[0].nodes[0] = (m, f, float("nan"), mt, tc, fc)
    assert not chain(trees)
    _same(v5_model(trees, 1, np.float64), [rows(np.random.default_rng(n), 1, np.float64) for n in range(6)])


def test_one_row_chained_walk_two_forests_in_turn() -> None:
    """Two chained forests called in turn on one thread: the second (two features) finds the first's feature values
    (six features) in its leaves' -inf slots of the shared buffer unless it refills them."""
    from hetero.contract import trees as ml
    from hetero_cpu.kernels.trees import native_forest

    wide = forest(70, 40, [0], depth=6)
    narrow = forest(71, 40, [0], depth=6)
    for tree in narrow:
        tree.nodes = [(m, f % 2, t, mt, tc, fc) for m, f, t, mt, tc, fc in tree.nodes]
    fs = []
    for trees in (wide, narrow):
        node = hetero.load(v5_model(trees, 1, np.float64)).nodes[0]
        fs.append(native_forest(ml.forest_for(node, np.dtype(np.float64)), with_base=True))
        assert fs[-1].one_row_chain
    assert fs[1].n_features == 2
    xs = [np.full((1, 6), 1e300)] + [rows(np.random.default_rng(n), 1, np.float64) for n in range(8)]
    threads = native.num_threads()
    try:
        native.set_num_threads(1)
        want = []
        for f in fs:
            block = np.empty((len(xs), 1))
            f.run(np.concatenate(xs), block)  # many rows: not the chained walk
            want.append(block)
        for i, x in enumerate(xs):
            for k, f in enumerate(fs):
                out = np.empty((1, 1))
                f.run(x, out)
                np.testing.assert_array_equal(out[0], want[k][i], err_msg=f"row {i}, forest {k}")
    finally:
        native.set_num_threads(threads)
