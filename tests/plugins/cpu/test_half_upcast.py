"""float16 nodes on the cpu run their float32 kernels between casts (hetero_cpu.kernels.half), not numpy's emulated
half arithmetic: the outputs are float16, within half precision of a float64 computation of the same graph rounded
where the graph rounds (each node's output), and of onnxruntime's (its CPU provider also runs them in float32)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import hetero
from conftest import make_model

pytest.importorskip("hetero_cpu._native", reason="the hetero-cpu native extension is not built")


def _half_model():
    """A Keras mixed-precision Conv1D block as tf2onnx writes it (slovorez): Conv (1 x k over [N, C, 1, T]), bias Add,
    Relu, a 1x1 Conv, bias Add, Softmax over the classes; then a MatMul and a Cast to float32 (native)."""
    rng = np.random.default_rng(0)
    h = np.float16
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[0, 1, 0, 1]),
        helper.make_node("Add", ["c1", "b1"], ["a1"]),
        helper.make_node("Relu", ["a1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"]),
        helper.make_node("Add", ["c2", "b2"], ["a2"]),
        helper.make_node("Softmax", ["a2"], ["y"], axis=1),
        helper.make_node("Reshape", ["r1", "flat"], ["rf"]),
        helper.make_node("MatMul", ["rf", "w3"], ["m"]),
        helper.make_node("Cast", ["m"], ["z"], to=TensorProto.FLOAT),
    ]
    inits = [("w1", (rng.normal(size=(12, 8, 1, 3)) * 0.3).astype(h)), ("b1", rng.normal(size=(1, 12, 1, 1)).astype(h)),
             ("w2", (rng.normal(size=(5, 12, 1, 1)) * 0.3).astype(h)), ("b2", rng.normal(size=(1, 5, 1, 1)).astype(h)),
             ("flat", np.array([-1, 12 * 9], np.int64)), ("w3", (rng.normal(size=(12 * 9, 7)) * 0.1).astype(h))]
    return make_model(nodes, [("x", TensorProto.FLOAT16, [3, 8, 1, 9])],
                      [("y", TensorProto.FLOAT16, None), ("z", TensorProto.FLOAT, None)], inits, opset=17)


def _float64_reference(x: np.ndarray, inits: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The graph in float64, each node's output rounded to float16 as the graph stores it."""
    def r(a: np.ndarray) -> np.ndarray:
        return a.astype(np.float16).astype(np.float64)

    f = {k: v.astype(np.float64) for k, v in inits.items() if v.dtype == np.float16}
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (0, 0), (1, 1)))
    c1 = r(sum(np.einsum("nct,oc->not", xp[:, :, 0, k:k + 9], f["w1"][:, :, 0, k]) for k in range(3))[:, :, None])
    r1 = r(np.maximum(r(c1 + f["b1"]), 0))
    a2 = r(r(np.einsum("ncxt,oc->noxt", r1, f["w2"][:, :, 0, 0])) + f["b2"])
    e = np.exp(a2 - a2.max(axis=1, keepdims=True))
    y = r(e / e.sum(axis=1, keepdims=True))
    z = r(r1.reshape(3, -1) @ f["w3"])
    return {"y": y, "z": z}


def test_half_nodes_run_the_float32_kernels():
    model = _half_model()
    session = hetero.Session(model, backends=["cpu"], on_fallback="error")
    kinds = {n.op_type: type(k).__name__ for n, k in session.kernels()}
    assert all(kinds[op] == "HalfUpcast" for op in ("Conv", "Add", "Relu", "Softmax", "MatMul")), kinds
    assert "CpuNumpyKernel" not in kinds.values(), kinds
    inits = {i.name: np.frombuffer(i.raw_data, np.float16).reshape(tuple(i.dims)) if i.data_type == TensorProto.FLOAT16
             else None for i in model.graph.initializer}
    for seed in (1, 2):  # the second run replays
        x = np.random.default_rng(seed).normal(size=(3, 8, 1, 9)).astype(np.float16)
        got = session.run({"x": x})
        assert got["y"].dtype == np.float16 and got["z"].dtype == np.float32
        want = _float64_reference(x, {k: v for k, v in inits.items() if v is not None})
        for name in ("y", "z"):  # a float16 ulp or two of the rounded float64 graph
            np.testing.assert_allclose(got[name].astype(np.float64), want[name], rtol=2e-3, atol=2e-3, err_msg=name)


def test_half_nodes_agree_with_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    model = _half_model()
    x = np.random.default_rng(3).normal(size=(3, 8, 1, 9)).astype(np.float16)
    want = dict(zip(["y", "z"], ort.InferenceSession(model.SerializeToString(),
                                                     providers=["CPUExecutionProvider"]).run(None, {"x": x}),
                    strict=True))
    got = hetero.Session(model, backends=["cpu"]).run({"x": x})
    for name in ("y", "z"):
        np.testing.assert_allclose(got[name].astype(np.float32), want[name].astype(np.float32), rtol=2e-3, atol=2e-3)
