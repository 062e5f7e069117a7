"""ScatterElements on the cpu backend's native kernel (``_native.scatter_elements``, a graph network's messages summed
into their atoms), against numpy's ufunc.at (which applies repeated indices one after another) and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import hetero
from conftest import make_model

native = pytest.importorskip("hetero_cpu._native", reason="the hetero-cpu native extension is not built")

_UFUNCS = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _reference(data: np.ndarray, idx: np.ndarray, updates: np.ndarray, axis: int, reduction: str) -> np.ndarray:
    out = data.copy()
    coords = list(np.indices(idx.shape))
    coords[axis] = idx % data.shape[axis]
    key = tuple(c.reshape(-1) for c in coords)
    if reduction == "none":
        out[key] = updates.reshape(-1)
    else:
        _UFUNCS[reduction].at(out, key, updates.reshape(-1))
    return out


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_native_against_ufunc_at(axis: int, reduction: str) -> None:
    rng = np.random.default_rng(abs(axis) * 7 + len(reduction))
    data = rng.standard_normal((5, 6, 7)).astype(np.float32)
    ishape = [4, 5, 6]  # shorter than data on the other axes; longer along the scatter axis: repeated indices
    ishape[axis % 3] = 13
    idx = rng.integers(-data.shape[axis], data.shape[axis], ishape)
    updates = rng.standard_normal(ishape).astype(np.float32)
    if reduction == "none":  # one writer per position: the result does not depend on the order
        idx = np.argsort(rng.random(ishape), axis=axis)[tuple(slice(0, s) for s in ishape)] % data.shape[axis]
    out = np.full_like(data, np.nan)
    native.scatter_elements(data, idx, updates, axis, reduction, out)
    np.testing.assert_array_equal(out, _reference(data, idx, updates, axis, reduction))


def test_native_in_place_and_nan() -> None:
    data = np.array([[1.0, np.nan], [2.0, 3.0]], np.float32)
    idx = np.array([[1, 0], [1, 0]], np.int64)
    updates = np.array([[np.nan, 5.0], [4.0, 1.0]], np.float32)
    for reduction in ("max", "min"):  # NaN wins, as numpy's maximum / minimum propagate it
        out = data.copy()
        native.scatter_elements(out, idx, updates, 0, reduction, out)  # out is data: no copy first
        np.testing.assert_array_equal(out, _reference(data, idx, updates, 0, reduction))


def test_native_errors_write_nothing() -> None:
    data = np.zeros((3, 2), np.float32)
    out = np.full_like(data, 7.0)
    with pytest.raises(Exception, match="out of range"):
        native.scatter_elements(data, np.array([[0, 3]], np.int64), np.ones((1, 2), np.float32), 0, "add", out)
    assert (out == 7.0).all()
    with pytest.raises(Exception, match="int64"):
        native.scatter_elements(data, np.array([[0, 1]], np.int32), np.ones((1, 2), np.float32), 0, "add", out)
    with pytest.raises(Exception, match="reduction"):
        native.scatter_elements(data, np.array([[0, 1]], np.int64), np.ones((1, 2), np.float32), 0, "sum", out)


def _message_passing_model(index_type: int) -> bytes:
    """PyG's scatter-add as PyTorch exports it: edge indices expanded over the features, summed into the nodes."""
    nodes = [
        helper.make_node("Gather", ["h", "src"], ["msg_in"], axis=0),
        helper.make_node("Mul", ["msg_in", "w"], ["msg"]),
        helper.make_node("Unsqueeze", ["dst", "one"], ["dst1"]),
        helper.make_node("Shape", ["msg"], ["msg_shape"]),
        helper.make_node("Expand", ["dst1", "msg_shape"], ["dst_e"]),
        helper.make_node("Cast", ["dst_e"], ["dst_i"], to=index_type),
        helper.make_node("ScatterElements", ["h", "dst_i", "msg"], ["agg"], axis=0, reduction="add"),
        helper.make_node("ScatterElements", ["agg", "dst_i", "msg"], ["top"], axis=0, reduction="max"),
    ]
    model = make_model(nodes, [("h", TensorProto.FLOAT, ["N", 16]), ("src", TensorProto.INT64, ["E"]),
                               ("dst", TensorProto.INT64, ["E"]), ("w", TensorProto.FLOAT, ["E", 1])],
                       [("agg", TensorProto.FLOAT, ["N", 16]), ("top", TensorProto.FLOAT, ["N", 16])],
                       [("one", np.array([1], np.int64))], opset=18)
    return model.SerializeToString()


@pytest.mark.parametrize("index_type", [TensorProto.INT64, TensorProto.INT32])
def test_session_against_onnxruntime(index_type: int) -> None:
    ort = pytest.importorskip("onnxruntime")
    model = _message_passing_model(index_type)
    session = hetero.Session(model, backends=["cpu"], on_fallback="error")
    reference = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(index_type)
    for _ in range(3):  # the later runs replay the recorded program on new edges
        n, e = 20, 90
        feeds = {"h": rng.standard_normal((n, 16)).astype(np.float32), "src": rng.integers(0, n, e),
                 "dst": rng.integers(-n, n, e), "w": rng.standard_normal((e, 1)).astype(np.float32)}
        got, want = session.run(feeds), dict(zip(["agg", "top"], reference.run(None, feeds), strict=True))
        for name in ("agg", "top"):
            np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-6)
    kinds = {n.op_type: type(k).__name__ for n, k in session.kernels()}
    assert kinds["ScatterElements"] == "CpuScatterElements"
