"""An attention whose products are quantized (a QDQ encoder's, MiniLM's) keeps ``Div -> Add(mask) -> Softmax`` after
fuse_attention: ``fuse_scaled_masked_softmax`` makes them one ``hetero.ScaledMaskedSoftmax``, whose cpu kernel
(native ``scaled_masked_softmax``) scales, masks and softmaxes each row in registers. Bit for bit against the three
native kernels on every ISA at 1 and 2 threads (row lengths of 1 to 9 vectors and their tails, masks per batch, per
row, one value a row, a full-shape mask, -inf / large negative mask values), the pass against the unfused session,
the reference backend and onnxruntime, and the near misses it leaves alone."""

from __future__ import annotations

import numpy as np
import pytest

import hetero
from hetero.ir import passes

_native = pytest.importorskip("hetero_cpu._native")
onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from hetero_cpu.kernels.quant import _row_offsets  # noqa: E402


def _unfused(x: np.ndarray, divisor: float, mask: np.ndarray) -> np.ndarray:
    """The Div, Add and Softmax kernels one after the other (the nodes the pass replaces)."""
    d = np.empty_like(x)
    _native.binary("div", x, np.broadcast_to(np.float32(divisor), x.shape), d)
    s = np.empty_like(x)
    _native.binary("add", d, np.broadcast_to(mask, x.shape), s)
    y = np.empty_like(x)
    _native.softmax(s.reshape(-1, x.shape[-1]), y.reshape(-1, x.shape[-1]))
    return y


@pytest.mark.parametrize("shape, mask_shape", [((2, 3, 5, 64), (2, 1, 1, 64)), ((2, 3, 5, 70), (2, 1, 1, 70)),
                                               ((1, 2, 3, 1), (1, 1, 1, 1)), ((3, 7, 17), (3, 7, 17)),
                                               ((2, 4, 9, 128), (2, 1, 9, 128)), ((2, 4, 9, 144), (2, 1, 1, 144)),
                                               ((2, 2, 6, 33), (2, 2, 6, 1)), ((5, 16), (16,)), ((4, 200), (4, 1))])
@pytest.mark.parametrize("divisor", [8.0, 1.0, 5.656854])
def test_scaled_masked_softmax_is_div_add_softmax(isa, threads, shape, mask_shape, divisor):
    rng = np.random.default_rng(shape[-1] + len(shape))
    x = (rng.standard_normal(shape) * 6).astype(np.float32)
    mask = np.where(rng.random(mask_shape) < 0.3, np.float32(-10000.0), np.float32(0.0)).astype(np.float32)
    if mask.size > 2:
        mask.reshape(-1)[1] = -np.inf
        mask.reshape(-1)[2] = np.finfo(np.float32).min
    rows = _row_offsets(mask.shape, shape[:-1])
    out = np.full(shape, np.nan, np.float32)
    _native.scaled_masked_softmax(x, divisor, mask, rows, mask.shape[-1] == shape[-1] and shape[-1] != 1, out)
    np.testing.assert_array_equal(out.view(np.int32), _unfused(x, divisor, mask).view(np.int32))
    # in place too (out is x)
    y = x.copy()
    _native.scaled_masked_softmax(y, divisor, mask, rows, mask.shape[-1] == shape[-1] and shape[-1] != 1, y)
    np.testing.assert_array_equal(y.view(np.int32), out.view(np.int32))


def test_scaled_masked_softmax_refusals():
    x = np.zeros((2, 4), np.float32)
    with pytest.raises(Exception, match="mask_rows"):
        _native.scaled_masked_softmax(x, 1.0, np.zeros(4, np.float32), np.zeros(3, np.int64), True, x)
    with pytest.raises(Exception, match="out of range"):
        _native.scaled_masked_softmax(x, 1.0, np.zeros(4, np.float32), np.array([0, 4], np.int64), True, x)


def _model(div_first: bool = True, divisor: np.ndarray | None = None, axis: int = -1, mask_shape: list | None = None,
           extra_output: str = "", op: str = "Div"):
    """x [b, 3, 5, 64] / c + mask [b, 1, 1, 64] -> Softmax."""
    divisor = np.array(8.0, np.float32) if divisor is None else divisor
    nodes = [helper.make_node(op, ["x", "c"], ["d"]),
             helper.make_node("Add", ["d", "m"] if div_first else ["m", "d"], ["s"]),
             helper.make_node("Softmax", ["s"], ["y"], axis=axis)]
    mask_shape = mask_shape or ["b", 1, 1, 64]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_output:
        outputs.append(helper.make_tensor_value_info(extra_output, TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "scores", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 3, 5, 64]),
                                                helper.make_tensor_value_info("m", TensorProto.FLOAT, mask_shape)],
                              outputs, [numpy_helper.from_array(divisor, "c")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(batch: int = 2, mask_shape: tuple | None = None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch)
    mask_shape = mask_shape or (batch, 1, 1, 64)
    return {"x": (rng.standard_normal((batch, 3, 5, 64)) * 8).astype(np.float32),
            "m": np.where(rng.random(mask_shape) < 0.25, -10000.0, 0.0).astype(np.float32)}


def _without_pass(model: object) -> hetero.Session:
    with passes.leaving_out("fuse_scaled_masked_softmax"):
        return hetero.Session(model.SerializeToString(), backends=["cpu"], on_fallback="error")


@pytest.mark.parametrize("div_first", [True, False])
def test_scaled_masked_softmax_pass_same_bits_as_the_unfused_nodes(threads, div_first):
    model = _model(div_first)
    session = hetero.Session(model.SerializeToString(), backends=["cpu"], on_fallback="error")
    assert session.rewrites["fuse_scaled_masked_softmax"] == 1
    assert [n.op_type for n in session.graph.nodes] == ["ScaledMaskedSoftmax"]
    unfused = _without_pass(model)
    assert [n.op_type for n in unfused.graph.nodes] == ["Div", "Add", "Softmax"]
    for batch in (1, 2, 3):
        feeds = _feeds(batch)
        want = unfused.run(feeds)["y"]
        for _ in range(2):  # the second run replays the bound calls
            np.testing.assert_array_equal(session.run(feeds)["y"].view(np.int32), want.view(np.int32))
    feeds = _feeds()
    reference = hetero.Session(model.SerializeToString(), backends=["reference"])
    assert reference.rewrites["fuse_scaled_masked_softmax"] == 1
    np.testing.assert_allclose(reference.run(feeds)["y"], session.run(feeds)["y"], rtol=1e-5, atol=1e-7)
    ort = pytest.importorskip("onnxruntime")
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(session.run(feeds)["y"], want, rtol=1e-5, atol=1e-7)


def test_scaled_masked_softmax_pass_with_a_mask_the_native_path_declines():
    """A mask of x's whole shape but strided in memory is read by the numpy reference: still the right values."""
    model = _model(mask_shape=["b", 3, 5, 64])
    session = hetero.Session(model.SerializeToString(), backends=["cpu"], on_fallback="error")
    assert session.rewrites["fuse_scaled_masked_softmax"] == 1
    feeds = _feeds(2, (2, 3, 5, 64))
    np.testing.assert_array_equal(session.run(feeds)["y"], _without_pass(model).run(feeds)["y"])


@pytest.mark.parametrize("near_miss", ["sum_read_elsewhere", "scaled_read_elsewhere", "two_divisors", "not_last_axis",
                                       "mul_not_div", "wider_mask"])
def test_scaled_masked_softmax_pass_leaves_near_misses_alone(near_miss):
    model, feeds = {
        "sum_read_elsewhere": lambda: (_model(extra_output="s"), _feeds()),
        "scaled_read_elsewhere": lambda: (_model(extra_output="d"), _feeds()),
        "two_divisors": lambda: (_model(divisor=np.array([8.0, 4.0] * 32, np.float32)), _feeds()),
        "not_last_axis": lambda: (_model(axis=2), _feeds()),
        "mul_not_div": lambda: (_model(op="Mul", divisor=np.array(0.125, np.float32)), _feeds()),
        "wider_mask": lambda: (_model(mask_shape=[2, "b", 3, 5, 64]), {**_feeds(), "m": np.zeros((2, 2, 3, 5, 64),
                                                                                            np.float32)}),
    }[near_miss]()
    session = hetero.Session(model.SerializeToString(), backends=["cpu"])
    assert session.rewrites["fuse_scaled_masked_softmax"] == 0
    assert "ScaledMaskedSoftmax" not in [n.op_type for n in session.graph.nodes]
    want = hetero.Session(model.SerializeToString(), backends=["reference"], optimize=False).run(feeds)
    got = session.run(feeds)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-7)
