"""Whole-graph (NPU-style) backends and copies between memory domains, with a simulated device backend.

The simulated device keeps its tensors in private byte buffers (its own memory domain), so every value that crosses
between it and host backends must go through the session's copies, and any missing copy shows up as a failure.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pytest
from onnx import TensorProto, helper

import hetero
from conftest import make_model, rare_node
from hetero import plugins
from hetero.contract import Backend, Device, Factory, NodeInfo, Segment, Support, Tensor, dtypes, unsupported
from hetero.contract.graph import Graph
from hetero.runtime.evaluate import run_graph


class _DeviceBuffer:
    """Device memory stand-in: bytes the host cannot read except through download()."""

    def __init__(self, data: bytes) -> None:
        self.data = data


class SimNpu(Backend):
    name: ClassVar[str] = "simnpu"
    memory_domain: ClassVar[str] = "simnpu"
    claims: ClassVar[set[str]] = {"MatMul", "Add", "Relu"}

    def __init__(self, device: Device, options: dict[str, Any] | None = None) -> None:
        super().__init__(device, options)
        self.uploads = 0
        self.downloads = 0
        self.compiled: list[Graph] = []

    def supports(self, node: NodeInfo) -> Support:
        if node.op_type in self.claims:
            return Support(True)
        return unsupported(f"simnpu does not run {node.op_type}")

    def compile(self, segment: Segment):
        """The whole segment as one program (the simulated device evaluates its graph)."""
        self.compiled.append(segment.graph)
        return _SimProgram(self, segment.graph)

    def upload(self, array: np.ndarray, kind: str = "arena") -> Tensor:
        self.uploads += 1
        array = np.ascontiguousarray(array)
        return Tensor(_DeviceBuffer(array.tobytes()), array.shape, dtypes.from_numpy(array.dtype), self)

    def download(self, tensor: Tensor) -> np.ndarray:
        self.downloads += 1
        np_dtype = tensor.dtype.np_dtype
        return np.frombuffer(tensor.buffer.data, dtype=np_dtype).reshape(tensor.shape).copy()


class _SimProgram:
    def __init__(self, npu: SimNpu, graph: Graph) -> None:
        self.npu, self.graph = npu, graph

    def run(self, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
        for name, tensor in inputs.items():
            assert tensor.backend is self.npu, f"{name} reached the device without a copy"
        outs = run_graph(self.graph, {n: self.npu.download(t) for n, t in inputs.items()})
        return {n: self.npu.upload(v) for n, v in zip(self.graph.outputs, outs, strict=True)}


class SimNpuFactory(Factory):
    name: ClassVar[str] = "simnpu"
    priority: ClassVar[int] = 10

    def probe(self) -> list[Device]:
        return [Device("sim-npu-0", kind="npu", vendor="tests")]

    def create(self, device: Device, options: dict[str, Any] | None = None) -> SimNpu:
        backend = SimNpu(device, options)
        SimNpuFactory.last = backend
        return backend


@pytest.fixture
def simnpu():
    registry = plugins.load_plugins()
    row = plugins.PluginStatus("simnpu", "simnpu", "tests", "0", plugins.OK,
                               devices=SimNpuFactory().probe(), factory=SimNpuFactory(), priority=10)
    registry.statuses.append(row)
    yield
    registry.statuses.remove(row)


def _model():
    rng = np.random.default_rng(0)
    w1 = rng.normal(size=(4, 6)).astype(np.float32)
    w2 = rng.normal(size=(6, 3)).astype(np.float32)
    b = rng.normal(size=(6,)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
        helper.make_node("Add", ["a", "b"], ["c"], name="add"),
        helper.make_node("Relu", ["c"], ["d"], name="relu"),
        rare_node("d", "e", name="atan"),  # not claimed: runs on the host
        helper.make_node("MatMul", ["e", "w2"], ["y"], name="mm2"),
    ]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [2, 4])], [("y", TensorProto.FLOAT, [2, 3])],
                       [("w1", w1), ("w2", w2), ("b", b)])
    return model, lambda x: np.arctan(np.maximum(x @ w1 + b, 0)) @ w2


def test_segments_are_compiled_and_copies_inserted(simnpu):
    model, expected = _model()
    session = hetero.Session(model, backends=["simnpu", "reference"], on_fallback="error", optimize=False)
    npu = SimNpuFactory.last
    assert [[n.name for n in g.nodes] for g in npu.compiled] == [["mm1", "add", "relu"], ["mm2"]]
    assert {p.name: p.backend for p in session.placement.nodes} == {
        "mm1": "simnpu", "add": "simnpu", "relu": "simnpu", "atan": "reference", "mm2": "simnpu"}
    copies = {(c.value, c.src, c.dst) for c in session.placement.copies}
    assert copies == {("x", "host", "simnpu"), ("d", "simnpu", "reference"), ("e", "reference", "simnpu"),
                      ("y", "simnpu", "host")}
    x = np.random.default_rng(1).normal(size=(2, 4)).astype(np.float32)
    np.testing.assert_allclose(session.run({"x": x})["y"], expected(x), rtol=1e-5, atol=1e-6)
    assert "d: simnpu -> reference" in session.explain()


def test_run_tensors_leaves_outputs_on_device(simnpu):
    model, expected = _model()
    session = hetero.Session(model, backends=["simnpu", "reference"], optimize=False)
    x = np.ones((2, 4), np.float32)
    out = session.run_tensors({"x": x})["y"]
    assert out.backend is SimNpuFactory.last and not out.is_host
    np.testing.assert_allclose(out.numpy(), expected(x), rtol=1e-5, atol=1e-6)


def test_automatic_selection_prefers_priority_and_warns_on_fallback(simnpu):
    model, _ = _model()
    with pytest.warns(hetero.HeteroWarning, match=r"1/5 nodes on reference: RareAtan×1"):
        session = hetero.Session(model, optimize=False)
    assert session.backends[0].name == "simnpu"


def test_supports_refusal_reason_is_reported(simnpu):
    model = make_model([rare_node("x", "y", name="only")],
                       [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])])
    session = hetero.Session(model, backends=["simnpu", "reference"], on_fallback="silent")
    assert session.placement.nodes[0].refusals == {"simnpu": "simnpu does not run RareAtan"}
