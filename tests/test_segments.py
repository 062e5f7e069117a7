"""Segments: the placed graph cut into maximal same-backend runs, one program each, and the copies between memory
domains decided once at construction: what ``explain()`` lists is what a run copies."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from test_partition import SimNpuFactory, simnpu  # noqa: F401  (the fixture)
from test_partition import _model as npu_model

import hetero
from conftest import make_model, rare_node
from hetero.runtime import session as session_module
from hetero.runtime.executor import KernelProgram


def _alternating():
    """Relu (cpu) -> RareAtan (reference only) -> Relu (cpu) -> RareAtan -> Exp (cpu): five runs of one node."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="r1"),
        rare_node("a", "b", name="t1"),
        helper.make_node("Relu", ["b"], ["c"], name="r2"),
        rare_node("c", "d", name="t2"),
        helper.make_node("Exp", ["d"], ["y"], name="e"),
    ]
    return make_model(nodes, [("x", TensorProto.FLOAT, [2, 3])], [("y", TensorProto.FLOAT, [2, 3])])


def test_segments_are_maximal_same_backend_runs():
    session = hetero.Session(_alternating(), backends=["cpu"], on_fallback="silent", optimize=False)
    segments = [p.segment for p in session.programs]
    assert [[info.node.name for info in s.nodes] for s in segments] == [["r1"], ["t1"], ["r2"], ["t2"], ["e"]]
    assert [s.graph.inputs for s in segments] == [["x"], ["a"], ["b"], ["c"], ["d"]]
    assert segments[-1].returned == frozenset({"y"})
    x = np.random.default_rng(0).normal(size=(2, 3)).astype(np.float32)
    for _ in range(3):  # interpreted, planned, replayed
        np.testing.assert_allclose(session.run({"x": x})["y"],
                                   np.exp(np.arctan(np.maximum(np.arctan(np.maximum(x, 0)), 0))), rtol=1e-6)
    # cpu and the reference share host memory: no copy anywhere
    assert session.placement.copies == [] and "copies: none" in session.explain()
    assert all(p.replay is not None for p in session.programs)


def test_one_backend_is_one_segment():
    session = hetero.Session(_alternating(), backends=["reference"], optimize=False)
    assert len(session.programs) == 1 and isinstance(session.programs[0], KernelProgram)
    assert "segments: 1" in session.explain()


def test_edge_copies_are_the_planned_ones(simnpu, monkeypatch):  # noqa: F811
    model, expected = npu_model()
    session = hetero.Session(model, backends=["simnpu", "reference"], on_fallback="error", optimize=False)
    planned = [(c.value, c.dst) for c in session.placement.copies]
    assert planned == [("x", "simnpu"), ("d", "reference"), ("e", "simnpu"), ("y", "host")]
    lines = session.explain().split("copies:")[1].strip().splitlines()
    assert [line.strip() for line in lines] == [f"{c.value}: {c.src} -> {c.dst}" for c in session.placement.copies]
    moved: list[str] = []
    original = session_module._move

    def recording(tensor, backend):
        moved.append(backend.name)
        return original(tensor, backend)

    monkeypatch.setattr(session_module, "_move", recording)
    x = np.random.default_rng(2).normal(size=(2, 4)).astype(np.float32)
    for _ in range(3):
        moved.clear()
        np.testing.assert_allclose(session.run({"x": x})["y"], expected(x), rtol=1e-5, atol=1e-6)
        # every copy between segments is a planned one, made once per run (the graph output is downloaded by run)
        assert moved == [dst for _, dst in planned if dst != "host"]


def test_whole_graph_backend_compiles_its_segments(simnpu):  # noqa: F811
    model, _ = npu_model()
    session = hetero.Session(model, backends=["simnpu", "reference"], optimize=False)
    npu = SimNpuFactory.last
    assert [g.name for g in npu.compiled] == ["simnpu_segment0", "simnpu_segment2"]
    assert [type(p).__name__ for p in session.programs] == ["_SimProgram", "KernelProgram", "_SimProgram"]


def test_a_value_read_by_two_later_segments_is_copied_once(simnpu):  # noqa: F811
    rng = np.random.default_rng(3)
    w = rng.normal(size=(4, 4)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),  # simnpu
        rare_node("a", "b", name="t1"),  # reference reads a
        helper.make_node("Relu", ["b"], ["c"], name="relu"),  # simnpu
        rare_node("a", "d", name="t2"),  # reference reads a again
        helper.make_node("Add", ["c", "d"], ["y"], name="add"),  # simnpu
    ]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [2, 4])], [("y", TensorProto.FLOAT, [2, 4])], [("w", w)])
    session = hetero.Session(model, backends=["simnpu", "reference"], on_fallback="silent", optimize=False)
    assert [(c.value, c.dst) for c in session.placement.copies] == [
        ("x", "simnpu"), ("a", "reference"), ("b", "simnpu"), ("d", "simnpu"), ("y", "host")]
    x = rng.normal(size=(2, 4)).astype(np.float32)
    a = x @ w
    np.testing.assert_allclose(session.run({"x": x})["y"], np.maximum(np.arctan(a), 0) + np.arctan(a), rtol=1e-5)


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_kernels_lists_every_segments_kernels(backend):
    session = hetero.Session(_alternating(), backends=[backend], on_fallback="silent", optimize=False)
    assert [node.name for node, _ in session.kernels()] == ["r1", "t1", "r2", "t2", "e"]


def test_each_segment_plans_its_own_arena():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r1"), helper.make_node("Relu", ["a"], ["b"], name="r2"),
             rare_node("b", "c", name="t1"),
             helper.make_node("Relu", ["c"], ["d"], name="r3"), helper.make_node("Exp", ["d"], ["y"], name="e")]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [2, 3])], [("y", TensorProto.FLOAT, [2, 3])])
    session = hetero.Session(model, backends=["cpu"], on_fallback="silent", optimize=False)
    x = np.random.default_rng(1).normal(size=(2, 3)).astype(np.float32)
    for _ in range(2):  # the second run is planned
        session.run({"x": x})
    plans = session.memory_plans
    # a value another segment reads lives in its producer's arena (host domains: no copy at the edge)
    assert [(name, set(plan.offsets)) for name, plan in plans] == [("cpu", {"a", "b"}), ("reference", {"c"}),
                                                                  ("cpu", {"d"})]
    assert session.memory_plan is plans[0][1]
