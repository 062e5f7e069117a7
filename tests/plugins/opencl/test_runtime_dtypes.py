"""Values whose dtype is known only at run time (an If whose branches declare no output type) reach the opencl
kernels with their real dtype: the kernel is rebuilt for it, or refuses it with a BackendError naming the node —
never a variant chosen for the load-time guess (float32), which wrote past its buffers (issue 19)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import hetero
from hetero.contract.errors import BackendError

from .conftest import needs_device

pytestmark = needs_device

DTYPES = {"float16": TensorProto.FLOAT16, "uint8": TensorProto.UINT8, "int64": TensorProto.INT64,
          "float32": TensorProto.FLOAT}
# (op, extra nodes' inputs / attributes): each reads the untyped value "h" and writes "y".
OPS = {
    "Relu": [helper.make_node("Relu", ["h"], ["y"], name="op")],
    "Add": [helper.make_node("Add", ["h", "h"], ["y"], name="op")],
    "Concat": [helper.make_node("Concat", ["h", "h"], ["y"], name="op", axis=1)],
    "Slice": [helper.make_node("Slice", ["h", "starts", "ends", "axes"], ["y"], name="op")],
    "Gather": [helper.make_node("Gather", ["h", "idx"], ["y"], name="op", axis=1)],
    "Transpose": [helper.make_node("Transpose", ["h"], ["y"], name="op", perm=[1, 0])],
    "Expand": [helper.make_node("Expand", ["h", "shape"], ["y"], name="op")],
}
VALID = {"Relu": ("float16", "int64", "float32")}  # ONNX Relu takes no uint8


def untyped_if_model(dtype: str, op: str) -> onnx.ModelProto:
    """cond ? Cast(x, dtype) : Cast(x + 1, dtype), with the branch outputs and the If output left untyped."""
    to = DTYPES[dtype]
    then_g = helper.make_graph([helper.make_node("Cast", ["x"], ["t"], to=to)], "then", [],
                               [onnx.ValueInfoProto(name="t")])
    else_g = helper.make_graph([helper.make_node("Add", ["x", "one"], ["x1"]),
                                helper.make_node("Cast", ["x1"], ["e"], to=to)], "else", [],
                               [onnx.ValueInfoProto(name="e")])
    consts = [
        helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
        helper.make_tensor("starts", TensorProto.INT64, [1], [1]),
        helper.make_tensor("ends", TensorProto.INT64, [1], [1000]),
        helper.make_tensor("axes", TensorProto.INT64, [1], [1]),
        helper.make_tensor("idx", TensorProto.INT64, [3], [4, 0, -1]),
        helper.make_tensor("shape", TensorProto.INT64, [3], [2, 3, 5]),
    ]
    nodes = [helper.make_node("If", ["cond"], ["h"], name="if", then_branch=then_g, else_branch=else_g), *OPS[op]]
    graph = helper.make_graph(
        nodes, "untyped_if",
        [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
        [onnx.ValueInfoProto(name="y")], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


CASES = [(d, op) for op in OPS for d in DTYPES if d in VALID.get(op, DTYPES)]


@pytest.mark.parametrize(("dtype", "op"), CASES, ids=[f"{op}-{d}" for d, op in CASES])
def test_untyped_if_output_runs_with_its_real_dtype(dtype: str, op: str) -> None:
    model = untyped_if_model(dtype, op)
    x = (np.arange(15, dtype=np.float32).reshape(3, 5) * 3.5 - 20).astype(np.float32)
    if DTYPES[dtype] == TensorProto.UINT8:
        x = np.abs(x)
    feeds_then = {"cond": np.array(True), "x": x}
    feeds_else = {"cond": np.array(False), "x": x}
    want = [hetero.Session(model, backends=["reference"]).run(f)["y"] for f in (feeds_then, feeds_else)]
    session = hetero.Session(model, backends=["opencl"], on_fallback="silent")
    placed = {p.name: p.backend for p in session.placement.nodes}
    assert placed["op"] == "opencl"  # placed on the load-time guess, float32
    for feeds, expected in zip((feeds_then, feeds_else, feeds_then), [*want, want[0]], strict=True):
        try:
            got = session.run(feeds)["y"]
        except BackendError as exc:  # refused with the node named: fine, as long as nothing was corrupted
            assert "'op'" in exc.message and dtype in exc.message
            continue
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)


def test_refusal_names_the_node_and_the_dtypes() -> None:
    """Relu on int64 has no opencl kernel: the guard refuses it (the load-time guess float32 had one)."""
    session = hetero.Session(untyped_if_model("int64", "Relu"), backends=["opencl"], on_fallback="silent")
    with pytest.raises(BackendError, match=r"node 'op' \(Relu\) gets int64 -> int64 at run time"):
        session.run({"cond": np.array(True), "x": np.ones((3, 5), np.float32)})
