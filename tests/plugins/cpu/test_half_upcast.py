"""float16 nodes on the cpu run their float32 kernels between casts (hetero_cpu.kernels.half), not numpy's emulated
half arithmetic: the outputs are float16, within half precision of a float64 computation of the same graph rounded
where the graph rounds (each node's output), and of onnxruntime's (its CPU provider also runs them in float32). With
the passes on, float16_chains_to_float32 keeps a chain of such nodes in float32 between its first input and its last
output (as onnxruntime does): the outputs are then within half an ulp of float16 of a float64 graph rounded at the
chain's ends only."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import hetero
from conftest import make_model
from hetero.contract import dtypes
from hetero.ir import passes
from hetero.runtime.infer import fold_and_infer

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
    # optimize=False: no float16_chains_to_float32 (which turns this graph's chain into float32 nodes), so each
    # float16 node runs as a HalfUpcast and rounds its output as the graph says
    model = _half_model()
    session = hetero.Session(model, backends=["cpu"], on_fallback="error", optimize=False)
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


def _inits(model) -> dict[str, np.ndarray]:
    return {i.name: np.frombuffer(i.raw_data, np.float16).reshape(tuple(i.dims)) for i in model.graph.initializer
            if i.data_type == TensorProto.FLOAT16}


def _float64_unrounded(x: np.ndarray, f: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """_half_model's graph in float64, rounded to float16 only where a value leaves the float16 chain."""
    f = {k: v.astype(np.float64) for k, v in f.items()}
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (0, 0), (1, 1)))
    c1 = sum(np.einsum("nct,oc->not", xp[:, :, 0, k:k + 9], f["w1"][:, :, 0, k]) for k in range(3))[:, :, None]
    r1 = np.maximum(c1 + f["b1"], 0)
    a2 = np.einsum("ncxt,oc->noxt", r1, f["w2"][:, :, 0, 0]) + f["b2"]
    e = np.exp(a2 - a2.max(axis=1, keepdims=True))
    return {"y": e / e.sum(axis=1, keepdims=True), "z": r1.reshape(3, -1) @ f["w3"]}


def test_half_chain_kept_in_float32():
    """The chain runs as float32 nodes (fused: FusedConv), graph outputs keep their float16 type, and each output is
    the float64 graph's value rounded once where it leaves as float16 (half an ulp of float16, plus float32's own
    error), not at all where a Cast to float32 reads it."""
    model = _half_model()
    session = hetero.Session(model, backends=["cpu"], on_fallback="error")
    assert session.rewrites["float16_chains_to_float32"] == 8  # all but the Cast
    kinds = [type(k).__name__ for _, k in session.kernels()]
    assert "HalfUpcast" not in kinds and "CpuNumpyKernel" not in kinds, kinds
    assert session.graph.values["y"].dtype == dtypes.float16 and session.graph.values["z"].dtype == dtypes.float32
    inits = _inits(model)
    for seed in (1, 2):  # the second run replays
        x = np.random.default_rng(seed).normal(size=(3, 8, 1, 9)).astype(np.float16)
        got = session.run({"x": x})
        assert got["y"].dtype == np.float16 and got["z"].dtype == np.float32
        want = _float64_unrounded(x, inits)
        # y leaves as float16: rounded once; z's Cast to float32 reads the float32 MatMul: float32's error only
        ulp = np.spacing(np.abs(want["y"]).astype(np.float16)).astype(np.float64)
        assert np.all(np.abs(got["y"] - want["y"]) <= 0.5 * ulp + 1e-6), "y"
        np.testing.assert_allclose(got["z"], want["z"], rtol=1e-5, atol=1e-6, err_msg="z")


def test_half_chain_closer_to_onnxruntime():
    """onnxruntime's CPU provider keeps the chain in float32 too: with the pass hetero's outputs agree with its
    outputs to float32 precision where they leave as float32, and within a float16 ulp where they leave as float16
    (the per-node rounding of HalfUpcast alone: 2-3 ulps on y, 2-13 on z)."""
    ort = pytest.importorskip("onnxruntime")
    model = _half_model()
    x = np.random.default_rng(3).normal(size=(3, 8, 1, 9)).astype(np.float16)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = hetero.Session(model, backends=["cpu"]).run({"x": x})
    # y: within a float16 ulp (equal here); z (a Cast to float32 of the float16 MatMul, whose float16 round trip
    # both drop): float32 agreement, a twentieth of a float16 ulp (per-node rounding: 2-13 ulps off on z)
    for name, w, bound in zip(["y", "z"], want, [1.0, 0.05], strict=True):
        w64 = w.astype(np.float64)
        ulp = np.spacing(np.abs(w64).astype(np.float16)).astype(np.float64)
        assert np.all(np.abs(got[name].astype(np.float64) - w64) <= bound * ulp), name


def _graph(nodes, inputs, outputs, inits=()):
    g = hetero.load(make_model(nodes, inputs, outputs, list(inits), opset=17))
    fold_and_infer(g)
    return g


def test_chain_pass_leaves_other_patterns_alone():
    h, f = TensorProto.FLOAT16, TensorProto.FLOAT
    # one float16 node alone (nothing to keep in float32 between two nodes)
    g = _graph([helper.make_node("Relu", ["x"], ["y"])], [("x", h, [2, 3])], [("y", h, None)])
    assert passes.float16_chains_to_float32(g) == 0
    # movement ops only: no arithmetic to gain from
    g = _graph([helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]), helper.make_node("Identity", ["t"], ["y"])],
               [("x", h, [2, 3])], [("y", h, None)])
    assert passes.float16_chains_to_float32(g) == 0
    # a node mixing float16 and float32 (Pow by a float32 exponent) is no chain member; float32 graphs untouched
    g = _graph([helper.make_node("Pow", ["x", "e"], ["p"]), helper.make_node("Relu", ["p"], ["y"])],
               [("x", h, [2, 3])], [("y", h, None)], [("e", np.array(2.0, np.float32))])
    assert passes.float16_chains_to_float32(g) == 0
    g = _graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "r"], ["y"])],
               [("x", f, [2, 3])], [("y", f, None)])
    assert passes.float16_chains_to_float32(g) == 0
    # the pass runs only for a backend that computes float16 in float32 anyway
    assert passes.float16_chains_to_float32 not in passes.DEFAULT_PASSES
    assert passes.for_backend(lambda key: True)[0] is not passes.float16_chains_to_float32
    assert passes.for_backend(lambda key: True, float16_via_float32=True)[0] is passes.float16_chains_to_float32


def test_chain_pass_keeps_graph_outputs_float16():
    """A value read inside the chain that is also a graph output (and one read by a node outside the chain) keeps its
    float16 name and type: the chain writes a float32 copy and a Cast makes the float16 value. A Cast to float32 of a
    chain value reads the float32 value (an Identity: no float16 round trip, as onnxruntime drops it too)."""
    h = TensorProto.FLOAT16
    nodes = [helper.make_node("Mul", ["x", "c"], ["m"]), helper.make_node("Relu", ["m"], ["r"]),
             helper.make_node("Add", ["r", "m"], ["y"]), helper.make_node("Cast", ["r"], ["k"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["y"], ["k2"], to=TensorProto.FLOAT), helper.make_node("Neg", ["y"], ["n"])]
    c = np.array([1.5, -2.0, 0.25], np.float16)
    outs = [("m", h, None), ("y", h, None), ("k", TensorProto.FLOAT, None), ("k2", TensorProto.FLOAT, None),
            ("n", h, None)]
    model = make_model(nodes, [("x", h, [4, 3])], outs, [("c", c)], opset=17)
    g = hetero.load(model)
    fold_and_infer(g)
    assert passes.float16_chains_to_float32(g) == 3
    fold_and_infer(g)
    assert [g.values[n].dtype for n in ("m", "y", "k", "k2", "n")] == \
        [dtypes.float16, dtypes.float16, dtypes.float32, dtypes.float32, dtypes.float16]
    casts = {n.outputs[0]: n.inputs[0] for n in g.nodes if n.op_type == "Cast"}
    assert casts == {"x/float32": "x", "m": "m/float32", "y": "y/float32"}  # y: Neg reads it, and a graph output
    ids = {n.outputs[0]: n.inputs[0] for n in g.nodes if n.op_type == "Identity"}
    assert ids == {"k": "r/float32", "k2": "y/float32"}
    assert g.initializers["c/float32"].dtype == np.float32
    x = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float16)
    got = hetero.Session(model, backends=["cpu"], on_fallback="error").run({"x": x})
    m = x.astype(np.float64) * c  # exact in float32 (11-bit by 11-bit products), so every float32 value here is too
    y = np.maximum(m, 0) + m
    want = {"m": m.astype(np.float16), "y": y.astype(np.float16), "k": np.maximum(m, 0).astype(np.float32),
            "k2": y.astype(np.float32), "n": -y.astype(np.float16)}
    for name, w in want.items():
        assert got[name].dtype == w.dtype, name
        np.testing.assert_array_equal(got[name], w, err_msg=name)
