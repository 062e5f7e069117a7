"""ai.onnx.ml ZipMap, the last node of every scikit-learn classifier that skl2onnx / onnxmltools export with default
options: hetero runs it only as a graph output no node reads, building onnxruntime's list of one {label: float} dict
per row from the [N, C] probabilities. Checked against onnxruntime with int64 and string labels, 1 and N rows, the
label output beside it, one output asked for alone, onnxruntime's list form, repeated runs (the replay's fast path)
and two threads; a ZipMap that another node reads, or that is no graph output, is refused at load."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import hetero
from concurrency import run_in_threads
from hetero.contract.errors import HeteroError

ort = pytest.importorskip("onnxruntime")

_INT_LABELS = [3, 7, -2]
_STR_LABELS = ["cat", "dog", "émeu"]


def classifier(op: str = "LinearClassifier", strings: bool = False, extra: str | None = None,
               zipmap_output: bool = True) -> bytes:
    """X[N, 4] -> ``op`` (3 classes) -> label, probabilities -> ZipMap -> output_probability, as skl2onnx writes
    them. ``extra``: a node that reads the ZipMap's output (a graph the frontend must refuse)."""
    int_key = "classlabels_ints" if op == "LinearClassifier" else "classlabels_int64s"
    labels: dict[str, object] = {"classlabels_strings": _STR_LABELS} if strings else {int_key: _INT_LABELS}
    if op == "LinearClassifier":
        rng = np.random.default_rng(0)
        first = helper.make_node(op, ["X"], ["label", "probabilities"], domain="ai.onnx.ml",
                                 coefficients=rng.standard_normal(12).tolist(), intercepts=[0.1, -0.2, 0.3],
                                 post_transform="SOFTMAX", **labels)
    else:  # two one-split trees
        first = helper.make_node(
            op, ["X"], ["label", "probabilities"], domain="ai.onnx.ml",
            nodes_treeids=[0, 0, 0, 1, 1, 1], nodes_nodeids=[0, 1, 2, 0, 1, 2], nodes_featureids=[0, 0, 0, 2, 0, 0],
            nodes_values=[0.5, 0, 0, 0.25, 0, 0], nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"] * 2,
            nodes_truenodeids=[1, 0, 0, 1, 0, 0], nodes_falsenodeids=[2, 0, 0, 2, 0, 0],
            class_treeids=[0, 0, 1, 1], class_nodeids=[1, 2, 1, 2], class_ids=[0, 2, 1, 2],
            class_weights=[0.6, 0.4, 0.3, 0.7], post_transform="NONE", **labels)
    key = TensorProto.STRING if strings else TensorProto.INT64
    zipped = helper.make_node("ZipMap", ["probabilities"], ["output_probability"], domain="ai.onnx.ml",
                              **({"classlabels_strings": _STR_LABELS} if strings
                                 else {"classlabels_int64s": _INT_LABELS}))
    seq = helper.make_sequence_type_proto(helper.make_map_type_proto(key, helper.make_tensor_type_proto(
        TensorProto.FLOAT, [])))
    nodes = [first, zipped]
    outputs = [helper.make_tensor_value_info("label", key, [None])]
    if zipmap_output:
        outputs.append(helper.make_value_info("output_probability", seq))
    if extra is not None:
        nodes.append(helper.make_node(extra, ["output_probability"], ["n"]))
        outputs.append(helper.make_tensor_value_info("n", TensorProto.INT64, []))
    if not zipmap_output and extra is None:
        outputs.append(helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, 3]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 4])],
                              outputs)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)])
    m.ir_version = 8
    return m.SerializeToString()


def same(got: list[dict[object, float]], want: list[dict[object, float]]) -> None:
    assert type(got) is list and len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert type(g) is dict and list(g) == list(w)  # onnxruntime's labels and order (sorted), its key types
        assert all(type(k) is type(kw) for k, kw in zip(g, w, strict=True))
        assert all(type(v) is float for v in g.values())
        np.testing.assert_allclose(list(g.values()), list(w.values()), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("strings", [False, True])
@pytest.mark.parametrize("op", ["LinearClassifier", "TreeEnsembleClassifier"])
def test_zipmap_matches_onnxruntime(op: str, strings: bool, rows: int) -> None:
    blob = classifier(op, strings)
    x = np.random.default_rng(rows).random((rows, 4), dtype=np.float32)
    want_label, want = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"X": x})
    session = hetero.Session(blob, backends="cpu", on_fallback="silent")
    assert session.output_names == ["label", "output_probability"]
    infos = session.get_outputs()
    key = "string" if strings else "int64"
    assert [(i.name, i.type) for i in infos] == [("label", f"tensor({'string' if strings else 'int64'})"),
                                                 ("output_probability", f"seq(map({key},tensor(float)))")]
    for _ in range(3):  # the later runs take the replay's fast path
        got = session.run({"X": x})
        assert list(got) == ["label", "output_probability"]
        np.testing.assert_array_equal(got["label"], want_label)
        same(got["output_probability"], want)
        alone = session.run({"X": x}, outputs=["output_probability"])
        assert list(alone) == ["output_probability"]
        same(alone["output_probability"], want)
        label, listed = session.run(None, {"X": x})  # onnxruntime's list form
        np.testing.assert_array_equal(label, want_label)
        same(listed, want)
        [only] = session.run(["output_probability"], {"X": x})
        same(only, want)
        np.testing.assert_array_equal(session.run({"X": x}, outputs=["label"])["label"], want_label)


def test_zipmap_probabilities_also_an_output() -> None:
    """The ZipMap's input asked for beside it (hetero's graph outputs it in the ZipMap's place): one run gives
    both, the array in the model's class order, the dicts in onnxruntime's."""
    blob = classifier()
    x = np.random.default_rng(1).random((4, 4), dtype=np.float32)
    session = hetero.Session(blob, backends="cpu", on_fallback="silent")
    want = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(["output_probability"], {"X": x})[0]
    got = session.run({"X": x}, outputs=["output_probability", "probabilities"])
    same(got["output_probability"], want)
    np.testing.assert_allclose(got["probabilities"], [[d[k] for k in _INT_LABELS] for d in want], rtol=1e-5)


def test_zipmap_two_threads() -> None:
    blob = classifier(strings=True)
    session = hetero.Session(blob, backends="cpu", on_fallback="silent")
    reference = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    xs = [np.random.default_rng(i).random((i + 1, 4), dtype=np.float32) for i in range(2)]

    def work(i: int) -> bool:
        for _ in range(20):
            same(session.run({"X": xs[i]})["output_probability"], reference.run(None, {"X": xs[i]})[1])
        return True

    assert run_in_threads(work, 2) == [True, True]


def test_zipmap_read_by_a_node_is_refused() -> None:
    with pytest.raises(HeteroError, match=r"ZipMap_1.*read by another node"):
        hetero.Session(classifier(extra="SequenceLength"), backends="cpu", on_fallback="silent")


def test_zipmap_not_an_output_is_refused() -> None:
    with pytest.raises(HeteroError, match=r"ZipMap_1.*not a graph output"):
        hetero.Session(classifier(zipmap_output=False), backends="cpu", on_fallback="silent")


def test_cli_run_prints_a_zipmap_output(tmp_path, capsys) -> None:
    from hetero.cli import main

    path = tmp_path / "classifier.onnx"
    path.write_bytes(classifier(strings=True))
    assert main(["run", str(path), "-b", "cpu", "--random-inputs", "-r", "1", "--save-outputs",
                 str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "output_probability: seq(map) of" in out and "'cat':" in out
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["label.npy"]
