"""One test per ONNX node case: run the model through hetero.Session and compare with the expected outputs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import hetero
from hetero.contract import registry

from .cases import NodeCase
from .conftest import NOT_SUPPORTED

pytestmark = pytest.mark.conformance

# (rtol, atol) per output dtype. ONNX cases that declare looser tolerances of their own get those.
DEFAULT_TOLERANCE: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-9),
    "float32": (1e-4, 1e-5),
    "float16": (1e-3, 1e-3),
    "bfloat16": (1.6e-2, 1e-2),  # ~2 ulps of bfloat16's 8-bit mantissa, as float16's row is ~1 ulp of its 11 bits
}
# Backends whose kernels use other algorithms (fused multiply-add, lower-precision accumulation) may relax these.
BACKEND_TOLERANCE: dict[str, dict[str, tuple[float, float]]] = {
    "reference": {},
    "cpu": {"float32": (1e-4, 1e-4)},
    "opencl": {"float32": (1e-3, 1e-4), "float16": (1e-2, 1e-2)},
    "metal": {"float32": (1e-3, 1e-4), "float16": (1e-2, 1e-2)},
}
ONNX_DEFAULT_RTOL, ONNX_DEFAULT_ATOL = 1e-3, 1e-7


def _ops(graph: Any) -> set[tuple[str, str]]:
    import onnx

    found = set()
    for node in graph.node:
        found.add((node.domain if node.domain != "ai.onnx" else "", node.op_type))
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                found |= _ops(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    found |= _ops(g)
    return found


def _model(case: NodeCase) -> Any:
    import onnx

    model = onnx.ModelProto()
    model.ParseFromString(case.model)
    return model


def _unknown_ops(model: Any) -> list[str]:
    local = {(f.domain, f.name) for f in model.functions}
    used = _ops(model.graph)
    for f in model.functions:
        used |= {(n.domain, n.op_type) for n in f.node}
    return sorted(
        f"{d or 'ai.onnx'}::{name}" for d, name in used - local if registry.find(d, name) is None
    )


def _array(tagged: tuple[str, Any], what: str) -> np.ndarray:
    kind, value = tagged
    if kind == "tensor":  # a serialized TensorProto: how the cache keeps types numpy has no name for (float8, ...)
        import onnx
        from onnx import numpy_helper

        proto = onnx.TensorProto()
        proto.ParseFromString(value)
        return numpy_helper.to_array(proto)
    if kind != "array":
        pytest.fail(f"{what} is a {kind} value, which this harness can only feed as a numpy array", pytrace=False)
    return value


def tolerance(backend: str, dtype: np.dtype, case: NodeCase) -> tuple[float, float]:
    rtol, atol = DEFAULT_TOLERANCE.get(dtype.name, (0.0, 0.0))
    relaxed = BACKEND_TOLERANCE.get(backend, {}).get(dtype.name)
    if relaxed is not None:
        rtol, atol = max(rtol, relaxed[0]), max(atol, relaxed[1])
    if (case.rtol, case.atol) != (ONNX_DEFAULT_RTOL, ONNX_DEFAULT_ATOL):
        rtol, atol = max(rtol, case.rtol), max(atol, case.atol)
    return rtol, atol


def test_node(node_case: NodeCase, backend: str, request: pytest.FixtureRequest) -> None:
    model = _model(node_case)
    unknown = _unknown_ops(model)
    if unknown:
        pytest.skip(f"{NOT_SUPPORTED}: hetero has no schema for {', '.join(unknown)}")
    initializers = {t.name for t in model.graph.initializer}
    input_names = [vi.name for vi in model.graph.input if vi.name not in initializers]
    output_names = [vi.name for vi in model.graph.output]
    feeds = {
        name: _array(value, f"input {name!r}")
        for name, value in zip(input_names, node_case.inputs, strict=False)
    }
    expected = [_array(value, f"output {name!r}") for name, value in zip(output_names, node_case.outputs,
                                                                           strict=True)]
    try:
        session = hetero.Session(model, backends=[backend], on_fallback="error")
    except hetero.FallbackError as exc:  # the backend declines some node: not a failure of what it claims
        pytest.skip(f"{NOT_SUPPORTED}: {backend} declines {exc.message.splitlines()[1].strip()}")
    # For the summary: did every node run on the backend's own kernels (not numpy inside it)?
    native = bool(session.placement.nodes) and all(p.implementation != "numpy" for p in session.placement.nodes)
    request.node.user_properties.append(("native", native))
    results = session.run(feeds)
    for name, want in zip(output_names, expected, strict=True):
        got = results[name]
        assert got.shape == want.shape, f"output {name!r}: shape {got.shape}, expected {want.shape}"
        if want.dtype.kind in "OSU":
            assert got.dtype.kind in "OSU", f"output {name!r}: dtype {got.dtype}, expected strings"
            np.testing.assert_array_equal(got.astype(str), want.astype(str), err_msg=f"output {name!r}")
            continue
        assert got.dtype == want.dtype, f"output {name!r}: dtype {got.dtype}, expected {want.dtype}"
        # Tolerance by the declared type (bfloat16 has its own row; float8/4 and int4/2 have none: exact).
        rtol, atol = tolerance(backend, want.dtype, node_case)
        if want.dtype.isbuiltin != 1:  # ml_dtypes (bfloat16, float8, float4, int4, int2): compare the values widened
            got, want = got.astype(np.float64), want.astype(np.float64)
        if want.dtype.kind in "fc":
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"output {name!r}")
        else:
            np.testing.assert_array_equal(got, want, err_msg=f"output {name!r}")
