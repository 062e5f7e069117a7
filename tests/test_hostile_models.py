"""Hostile but small ONNX models (issue 19's campaign, issue 12's silero chunks): each is refused with a HeteroError
naming the node or field, or runs — on every backend here — never a raw exception, a hang or a memory bomb."""

from __future__ import annotations

import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import hetero
from hetero.contract.errors import HeteroError, ModelFormatError, ShapeError
from hetero.frontends.onnx import MAX_SUBGRAPH_DEPTH
from hetero.runtime.infer import MAX_TENSOR_BYTES_ENV


def _available(name: str) -> bool:
    try:
        hetero.Session(_relu_model(), backends=[name])
    except HeteroError:
        return False
    return True


def _relu_model() -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


BACKENDS = [pytest.param(b, marks=pytest.mark.skipif(not _available(b), reason=f"backend {b} is not available here"))
            for b in ("reference", "cpu", "opencl")]


def _model(nodes, inputs, outputs, initializers=(), opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "hostile", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name: str, elem: int = TensorProto.FLOAT, shape=None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


# -- hangs -----------------------------------------------------------------------------------------------------------
def test_reverse_topological_order_loads_in_linear_time() -> None:
    """16,000 nodes listed last-first: Kahn's sort, and no per-node copy of the scope (was > 60 s)."""
    n = 16_000
    nodes = [helper.make_node("Neg", [f"v{i}"], [f"v{i + 1}"], name=f"n{i}") for i in range(n)][::-1]
    model = _model(nodes, [_vi("v0", shape=[4])], [_vi(f"v{n}", shape=[4])])
    start = time.perf_counter()
    graph = hetero.load(model)
    elapsed = time.perf_counter() - start
    assert [node.name for node in graph.nodes[:3]] == ["n0", "n1", "n2"]
    assert elapsed < 20, f"loading took {elapsed:.1f} s"  # ~1 s on a busy 2-core machine


@pytest.mark.parametrize("backend", BACKENDS)
def test_split_num_outputs_must_match_the_outputs(backend: str) -> None:
    node = helper.make_node("Split", ["x"], ["a", "b"], name="split", axis=0, num_outputs=2**62)
    model = _model([node], [_vi("x", shape=[4])], [_vi("a"), _vi("b")], opset=18)
    with pytest.raises(ShapeError, match=r"'split'.*num_outputs=4611686018427387904 does not match"):
        hetero.Session(model, backends=[backend]).run({"x": np.ones(4, np.float32)})


# -- memory bombs ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_constant_of_shape_bomb_is_refused_before_allocating(backend: str, monkeypatch) -> None:
    node = helper.make_node("ConstantOfShape", ["shape"], ["y"], name="bomb")
    model = _model([node], [_vi("shape", TensorProto.INT64, [2])], [_vi("y")])
    session = hetero.Session(model, backends=[backend])
    with pytest.raises(ShapeError, match=r"'bomb'.*1,800,000,000 bytes, above the 1,073,741,824-byte limit"):
        session.run({"shape": np.array([30000, 15000], np.int64)})
    monkeypatch.setenv(MAX_TENSOR_BYTES_ENV, "100")
    with pytest.raises(ShapeError, match="above the 100-byte limit"):
        session.run({"shape": np.array([5, 6], np.int64)})
    monkeypatch.setenv(MAX_TENSOR_BYTES_ENV, "120")
    assert session.run({"shape": np.array([5, 6], np.int64)})["y"].shape == (5, 6)


# -- raw exceptions --------------------------------------------------------------------------------------------------
def _nested_if(depth: int) -> onnx.ModelProto:
    def leaf(name: str) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node("Identity", ["x"], [name])], name, [], [_vi(name)])

    branch = leaf("y")
    for level in range(depth):  # nested in the then-branch only (both would double the size per level)
        out = f"o{level}"
        node = helper.make_node("If", ["c"], [out], name=f"if{level}", then_branch=branch,
                                else_branch=leaf(f"e{level}"))
        branch = helper.make_graph([node], f"level{level}", [], [_vi(out)])
    return _model(list(branch.node), [_vi("c", TensorProto.BOOL, []), _vi("x", shape=[2])],
                  [_vi(branch.node[0].output[0])])


def test_deeply_nested_if_is_refused_naming_the_node() -> None:
    with pytest.raises(ModelFormatError, match=f"at most {MAX_SUBGRAPH_DEPTH} levels"):
        hetero.load(_nested_if(MAX_SUBGRAPH_DEPTH + 4))  # (protobuf itself refuses ~33 levels and more)
    hetero.load(_nested_if(8))  # a few levels load


def _external_data_model(folder, location: str, dims: list[int]):
    """A model file in ``folder`` whose Add weight ``w`` points at external data ``location`` with ``dims``."""
    tensor = numpy_helper.from_array(np.zeros(4, np.float32), "w")
    tensor.ClearField("raw_data")
    del tensor.dims[:]
    tensor.dims.extend(dims)
    tensor.data_location = TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", location
    model = _model([helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x", shape=[4])], [_vi("y", shape=[4])],
                   [tensor])
    path = folder / "m.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def test_external_data_location_with_nul(tmp_path) -> None:
    with pytest.raises(ModelFormatError, match="NUL character"):
        hetero.load(_external_data_model(tmp_path, "we\0ights.bin", [4]))


def test_external_data_with_overflowing_dims(tmp_path) -> None:
    (tmp_path / "w.bin").write_bytes(b"\0" * 64)
    with pytest.raises(ModelFormatError, match="does not fit"):  # 2**80 elements: wrapped to 0 in int64
        hetero.load(_external_data_model(tmp_path, "w.bin", [2**40, 2**40]))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("k", [-1, 9])
def test_topk_with_a_bad_k(backend: str, k: int) -> None:
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], name="topk")
    model = _model([node], [_vi("x", shape=[2, 4]), _vi("k", TensorProto.INT64, [1])],
                   [_vi("v"), _vi("i", TensorProto.INT64)])
    with pytest.raises(ShapeError, match="'topk'"):
        hetero.Session(model, backends=[backend]).run({"x": np.ones((2, 4), np.float32),
                                                        "k": np.array([k], np.int64)})


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_batch_conv(backend: str) -> None:
    w = numpy_helper.from_array(np.ones((2, 3, 3, 3), np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])
    model = _model([node], [_vi("x", shape=["N", 3, 5, 5])], [_vi("y")], [w])
    y = hetero.Session(model, backends=[backend]).run({"x": np.zeros((0, 3, 5, 5), np.float32)})["y"]
    assert y.shape == (0, 2, 5, 5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_conv_input_shorter_than_the_kernel(backend: str) -> None:
    w = numpy_helper.from_array(np.ones((2, 1, 8), np.float32), "w")
    model = _model([helper.make_node("Conv", ["x", "w"], ["y"], name="stft")], [_vi("x", shape=[1, 1, "T"])],
                   [_vi("y")], [w])
    with pytest.raises(ShapeError, match=r"'stft'.*shorter than the kernel's reach 8"):
        hetero.Session(model, backends=[backend]).run({"x": np.ones((1, 1, 5), np.float32)})


@pytest.mark.parametrize("backend", BACKENDS)
def test_missing_required_input_is_refused_at_load(backend: str) -> None:
    node = helper.make_node("InstanceNormalization", ["x", "", "b"], ["y"], name="norm")
    model = _model([node], [_vi("x", shape=[1, 2, 3]), _vi("b", shape=[2])], [_vi("y")])
    with pytest.raises(ModelFormatError, match=r"'norm' \(InstanceNormalization\) lacks its required input 1"):
        hetero.Session(model, backends=[backend])


# -- uninitialised results -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_batchnorm_inference_with_training_outputs_is_refused(backend: str) -> None:
    stats = [numpy_helper.from_array(np.ones(2, np.float32), n) for n in ("s", "b", "m", "v")]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"], name="bn")
    model = _model([node], [_vi("x", shape=[1, 2, 3])], [_vi("y"), _vi("rm"), _vi("rv")], stats, opset=15)
    with pytest.raises(ShapeError, match=r"'bn'.*training-only outputs \['rm', 'rv'\]"):
        hetero.Session(model, backends=[backend])


@pytest.mark.parametrize("backend", BACKENDS)
def test_linear_attention_heads_must_match_the_inputs(backend: str) -> None:
    """q_num_heads larger than the query's heads: every kernel would read past the query."""
    node = helper.make_node("LinearAttention", ["q", "k", "v"], ["o"], name="la", q_num_heads=8, kv_num_heads=2,
                            update_rule="linear")
    model = _model([node], [_vi("q", shape=[1, 3, 8]), _vi("k", shape=[1, 3, 8]), _vi("v", shape=[1, 3, 8])],
                   [_vi("o")], opset=27)
    feeds = {n: np.ones((1, 3, 8), np.float32) for n in "qkv"}
    with pytest.raises(ShapeError, match=r"'la'.*query has shape \[1, 3, 8\]; expected \[1, 3, 32\]"):
        hetero.Session(model, backends=[backend]).run(feeds)


@pytest.mark.parametrize("backend", BACKENDS)
def test_lstm_with_empty_weights_is_refused(backend: str) -> None:
    w = numpy_helper.from_array(np.zeros((1, 0, 3), np.float32), "w")
    r = numpy_helper.from_array(np.zeros((1, 0, 4), np.float32), "r")
    node = helper.make_node("LSTM", ["x", "w", "r"], ["y"], name="lstm", hidden_size=4)
    model = _model([node], [_vi("x", shape=[2, 1, 3])], [_vi("y")], [w, r])
    with pytest.raises(ShapeError, match=r"'lstm'.*W has shape \[1, 0, 3\]; expected \[1, 16, 3\]"):
        hetero.Session(model, backends=[backend]).run({"x": np.ones((2, 1, 3), np.float32)})


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("samples", [100, 1])
def test_silero_chunk_shorter_than_its_stft_window(backend: str, samples: int) -> None:
    """Issue 12: a 100-sample chunk gave a bare AssertionError (cpu LSTM), a 1-sample chunk "negative dimensions are
    not allowed"; both are now the STFT Conv's ShapeError."""
    from real_models.conftest import model_path

    session = hetero.Session(str(model_path("silero_vad")), backends=[backend], on_fallback="silent")
    feeds = {"input": np.zeros((1, samples), np.float32), "state": np.zeros((2, 1, 128), np.float32),
             "sr": np.array(16000, np.int64)}
    with pytest.raises(ShapeError, match=r"Conv node '.*stft/Conv': spatial axis 0 of size \d+ .* shorter than"):
        session.run(feeds)
