"""ONNX opset-27 LinearAttention and CausalConvWithState on opencl (on_fallback="error") against hetero's numpy
reference of the spec (onnx 1.23 ships no node tests for them yet: these stand in for issue #7's conformance cases).
"""

from __future__ import annotations

import numpy as np
import pytest

import hetero
from hetero.contract import TensorInfo, dtypes
from hetero.contract.graph import Graph, Node

from .conftest import needs_device

pytestmark = needs_device
RNG = np.random.default_rng(3)


def rand(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def check(op: str, inputs: list[np.ndarray | None], attrs: dict, n_out: int = 2, atol: float = 1e-4) -> None:
    """One node at opset 27; absent optional inputs are empty names; every output compared."""
    names = [f"in{i}" if a is not None else "" for i, a in enumerate(inputs)]
    feeds = {n: a for n, a in zip(names, inputs, strict=True) if n}
    outs = [f"out{i}" for i in range(n_out)]
    graph = Graph(inputs=list(feeds), outputs=outs, opsets={"": 27}, name="t")
    for name, value in feeds.items():
        graph.values[name] = TensorInfo(dtypes.from_numpy(value.dtype), value.shape)
    graph.nodes.append(Node(op, names, outs, dict(attrs), name="n"))
    got = hetero.Session(graph, backends=["opencl"], on_fallback="error").run(feeds)
    want = hetero.Session(graph, backends=["reference"]).run(feeds)
    for name in outs:
        assert got[name].shape == want[name].shape, name
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=atol, err_msg=f"{op} {name}")


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
@pytest.mark.parametrize("gqa,per_key,shared_beta,past", [
    (False, False, False, False), (True, True, False, True), (True, False, True, False),
])
def test_linear_attention(rule, gqa, per_key, shared_beta, past):
    b, t, hkv, dk, dv = 2, 5, 2, 8, 6
    hq = 2 * hkv if gqa else hkv
    q, k, v = rand(b, t, hq * dk, scale=0.5), rand(b, t, hkv * dk, scale=0.5), rand(b, t, hkv * dv)
    decay = -np.abs(rand(b, t, hkv * dk if per_key else hkv, scale=0.3)) if "gated" in rule else None
    beta = 1 / (1 + np.exp(-rand(b, t, 1 if shared_beta else hkv))) if "delta" in rule else None
    state = rand(b, hkv, dk, dv, scale=0.3) if past else None
    check("LinearAttention", [q, k, v, state, decay, None if beta is None else beta.astype(np.float32)],
          {"q_num_heads": hq, "kv_num_heads": hkv, "update_rule": rule})


def test_linear_attention_scale_and_single_output():
    q, k, v = rand(1, 3, 16), rand(1, 3, 16), rand(1, 3, 8)
    check("LinearAttention", [q, k, v], {"q_num_heads": 2, "kv_num_heads": 2, "update_rule": "linear",
                                         "scale": 0.25}, n_out=1)


@pytest.mark.parametrize("activation", ["none", "silu"])
@pytest.mark.parametrize("bias,past", [(False, False), (True, True)])
def test_causal_conv_with_state(activation, bias, past):
    b, c, length, k = 2, 5, 7, 4
    x, w = rand(b, c, length), rand(c, 1, k)
    check("CausalConvWithState", [x, w, rand(c) if bias else None, rand(b, c, k - 1) if past else None],
          {"activation": activation})


def test_causal_conv_shorter_than_its_state():
    """A single new step (decode): the present state mixes the past and the new value."""
    check("CausalConvWithState", [rand(1, 3, 1), rand(3, 1, 4), None, rand(1, 3, 3)], {"activation": "silu"})
