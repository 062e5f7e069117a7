"""The HTP op table (hetero_hexagon.support), verified by trying: every claimed op compiles for QNN's HTP with the
CPU fallback disabled and matches onnxruntime's CPU within fp16 tolerance, and what the table refuses QNN refuses."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import hetero
from hetero.contract import BackendError, FallbackError
from hetero.testing import cases as conformance_cases

support = pytest.importorskip("hetero_hexagon.support")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime (the oracle) is not installed")

# fp16 on the HTP: |hexagon - onnxruntime| <= ATOL + RTOL * |onnxruntime|. Measured worst over these cases on QNN
# 2.51's simulator: 1e-2 relative to (|ref| + 1) (Softplus); these bounds leave 2x margin.
ATOL, RTOL = 2e-2, 2e-2
X = (1, 4, 6, 6)


def _single(op: str, inputs: list[str], weights: dict[str, np.ndarray] | None = None, opset: int = 17, **attrs):
    graph = helper.make_graph(
        [helper.make_node(op, inputs, ["y"], name=op.lower(), **attrs)], op,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(X))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (weights or {}).items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _extra_cases():
    """Ops of the table that hetero.testing.cases does not cover, with the attributes a CNN uses."""
    rng = np.random.default_rng(0)
    ones, zeros = np.ones(4, np.float32), np.zeros(4, np.float32)
    models = {
        "BatchNormalization": _single("BatchNormalization", ["x", "s", "b", "m", "v"],
                                      {"s": ones, "b": zeros, "m": zeros + 0.1, "v": ones * 2}),
        "ConvTranspose": _single("ConvTranspose", ["x", "w"], {"w": rng.normal(size=(4, 2, 3, 3)).astype(np.float32)}),
        "DepthToSpace": _single("DepthToSpace", ["x"], blocksize=2),
        "SpaceToDepth": _single("SpaceToDepth", ["x"], blocksize=2),
        "Expand": _single("Expand", ["x", "s"], {"s": np.array([2, 4, 6, 6], np.int64)}),
        "Flatten": _single("Flatten", ["x"]),
        "GlobalMaxPool": _single("GlobalMaxPool", ["x"]),
        "InstanceNormalization": _single("InstanceNormalization", ["x", "s", "b"], {"s": ones, "b": zeros}),
        "LogSoftmax": _single("LogSoftmax", ["x"], axis=1),
        "Pad": _single("Pad", ["x", "p"], {"p": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)}),
        "PRelu": _single("PRelu", ["x", "s"], {"s": np.full((4, 1, 1), 0.2, np.float32)}),
        "Reciprocal": _single("Reciprocal", ["x"]),
        "ReduceMax": _single("ReduceMax", ["x"], keepdims=1, axes=[1]),
        "ReduceMin": _single("ReduceMin", ["x"], keepdims=1, axes=[1]),
        "ReduceSum": _single("ReduceSum", ["x", "a"], {"a": np.array([1], np.int64)}),
        "Resize": _single("Resize", ["x", "", "s"], {"s": np.array([1, 1, 2, 2], np.float32)}, mode="linear"),
        "Squeeze": _single("Squeeze", ["x", "a"], {"a": np.array([0], np.int64)}),
        "Unsqueeze": _single("Unsqueeze", ["x", "a"], {"a": np.array([0], np.int64)}),
        "Tile": _single("Tile", ["x", "r"], {"r": np.array([1, 1, 2, 1], np.int64)}),
        "Atan": _single("Atan", ["x"]), "Cos": _single("Cos", ["x"]), "Sin": _single("Sin", ["x"]),
        "Elu": _single("Elu", ["x"]), "Selu": _single("Selu", ["x"]), "HardSigmoid": _single("HardSigmoid", ["x"]),
        "Floor": _single("Floor", ["x"]), "Round": _single("Round", ["x"]), "Sign": _single("Sign", ["x"]),
    }
    x = rng.normal(size=X).astype(np.float32) + 0.05  # Reciprocal: keep away from exact zero
    return [(op, model, {"x": x}) for op, model in models.items()]


def _all_cases():
    found = [(c.op, conformance_cases.build_model(c), conformance_cases.make_feeds(c))
             for c in conformance_cases.cases() if c.op in support.ONNX_OPS]
    return found + _extra_cases()


CASES = _all_cases()


def test_every_claimed_op_has_a_case():
    assert set(support.ONNX_OPS) <= {op for op, _, _ in CASES}


@pytest.mark.parametrize(("op", "model", "feeds"), CASES, ids=[f"{op}-{i}" for i, (op, _, _) in enumerate(CASES)])
def test_claimed_op_runs_on_the_htp(hexagon, op, model, feeds):
    try:
        session = hetero.Session(model, backends=["hexagon"], on_fallback="error")
    except FallbackError as refusal:  # a condition of the table refused these attributes: QNN must refuse them too
        assert "not in the HTP op table" not in str(refusal)
        with pytest.raises(BackendError, match="fallback to CPU EP has been explicitly disabled"):
            _compile_directly(model, op)
        return
    got = session.run(feeds)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for name, expected in zip([o.name for o in model.graph.output], want, strict=True):
        actual = got[name]
        assert actual.shape == expected.shape
        if expected.dtype.kind == "f":
            np.testing.assert_allclose(actual, expected, atol=ATOL, rtol=RTOL, err_msg=op)
        else:
            np.testing.assert_array_equal(actual, expected, err_msg=op)


@pytest.mark.parametrize("op", ["Erf", "Softsign"])
def test_what_the_table_refuses_qnn_refuses(hexagon, op):
    assert not support.ONNX_OPS.get(op)
    with pytest.raises(BackendError, match="fallback to CPU EP has been explicitly disabled"):
        _compile_directly(_single(op, ["x"]), op)


def _compile_directly(model, op: str) -> None:
    """Compile for the HTP through the plugin's QNN runtime, without hetero's op table in the way."""
    from hetero_hexagon.qnn import HtpOptions, QnnRuntime

    QnnRuntime.shared().compile(model.SerializeToString(), HtpOptions(), f"a lone {op}")


def test_the_explain_names_the_refusal(hexagon):
    model = _single("Erf", ["x"])
    text = hetero.Session(model, backends=["hexagon", "cpu"], on_fallback="silent").explain()
    assert "hexagon: Erf is not in the HTP op table" in text
