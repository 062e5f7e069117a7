"""onnxruntime's habits on a Session: get_inputs / get_outputs with symbolic dims, run(output_names, feeds),
get_providers, backends as a comma-separated string, option keys checked, opsets newer than hetero knows."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper

import hetero
from conftest import make_model


def _model(opset: int = 17):
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Shape", ["x"], ["s"])]
    return make_model(nodes, [("x", TensorProto.FLOAT, ["batch", 3])],
                      [("y", TensorProto.FLOAT, ["batch", 3]), ("s", TensorProto.INT64, [2])], opset=opset)


def test_inputs_and_outputs_keep_symbolic_dims():
    session = hetero.Session(_model(), backends=["reference"])
    (x,) = session.get_inputs()
    assert (x.name, x.type, x.shape) == ("x", "tensor(float)", ["batch", 3])
    y, s = session.get_outputs()
    assert (y.name, y.type, y.shape) == ("y", "tensor(float)", ["batch", 3])
    assert (s.name, s.type, s.shape) == ("s", "tensor(int64)", [2])


def test_run_in_both_forms():
    session = hetero.Session(_model(), backends=["reference"])
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    ours = session.run({"x": x})
    assert set(ours) == {"y", "s"}
    y, s = session.run(None, {"x": x})  # onnxruntime: a list, every output in model order
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    np.testing.assert_array_equal(s, [2, 3])
    (only,) = session.run(["s"], {"x": x})
    np.testing.assert_array_equal(only, [2, 3])
    assert list(session.run({"x": x}, ["y"])) == ["y"]
    with pytest.raises(hetero.InputError, match="run\\(feeds\\)"):
        session.run(["y"], ["x"])
    with pytest.raises(hetero.InputError, match="'x' is not an output"):
        session.run(["x"], {"x": x})


def test_providers_and_a_comma_separated_string():
    session = hetero.Session(_model(), backends="cpu, reference", on_fallback="silent")
    assert session.get_providers() == ["cpu", "reference"]


def test_unknown_option_keys_are_refused_naming_the_known_ones():
    with pytest.raises(hetero.HeteroError, match=r"unknown session option\(s\) \['thread'\]; known: .*'threads'"):
        hetero.Session(_model(), backends=["cpu"], options={"thread": 2})
    session = hetero.Session(_model(), backends=["cpu"], options={"threads": 1}, on_fallback="silent")
    assert session.get_providers()[0] == "cpu"


def test_an_opset_newer_than_hetero_knows_warns_naming_it():
    with pytest.warns(hetero.HeteroWarning, match="ai.onnx opset 99"):
        hetero.Session(_model(opset=99), backends=["reference"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hetero.Session(_model(opset=21), backends=["reference"])
