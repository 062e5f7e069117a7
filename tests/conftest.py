"""Shared fixtures: small ONNX models built in code, and which backends this machine has."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import hetero
from hetero import plugins
from hetero.ops import OpSchema, register
from hetero.ops.shapes import same_as_input

# A custom op that only the numpy reference implements: whatever the cpu plugin grows to cover, a node of this op
# must fall back, which makes it the fixture for fallback behaviour.
RARE_DOMAIN = "test.hetero"
register(OpSchema("RareAtan", same_as_input(0), lambda ctx: [np.arctan(ctx.values[0])], domain=RARE_DOMAIN),
         replace=True)


def load_script(path: Path, name: str, *, shared: bool = False) -> ModuleType:
    """A file of the repository that is not a package module (a benchmark, a script, an example), imported under
    ``name`` without putting its folder on sys.path. ``shared``: one module per process, registered in sys.modules
    before it runs (for scripts whose dataclasses or imports look themselves up there, and to load them once)."""
    if shared and name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    if shared:
        sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def backend_ok(name: str) -> tuple[bool, str]:
    row = plugins.status(name)
    if row is None:
        return False, f"backend {name!r} is not installed (pip install ./plugins/{name})"
    return row.ok, f"backend {name!r} is {row.status}: {row.reason}"


@pytest.fixture
def require_cpu() -> None:
    ok, why = backend_ok("cpu")
    if not ok:
        pytest.skip(why)


def make_model(nodes, inputs, outputs, initializers=(), opset: int = 17):
    """A ModelProto from helper-made nodes; inputs/outputs are (name, onnx elem type, shape) triples."""
    graph = helper.make_graph(
        nodes,
        "test",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in initializers],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(RARE_DOMAIN, 1)])


def rare_node(x: str, y: str, name: str):
    """A RareAtan node: runs only on the numpy reference backend."""
    return helper.make_node("RareAtan", [x], [y], name=name, domain=RARE_DOMAIN)


@pytest.fixture
def mlp_model():
    """x[N,8] -> MatMul -> Add -> Relu -> MatMul -> RareAtan -> Softmax. RareAtan has no cpu kernel: it falls back."""
    rng = np.random.default_rng(0)
    w1 = rng.normal(size=(8, 16)).astype(np.float32)
    b1 = rng.normal(size=(16,)).astype(np.float32)
    w2 = rng.normal(size=(16, 4)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"], name="fc1"),
        helper.make_node("Add", ["h0", "b1"], ["h1"], name="bias1"),
        helper.make_node("Relu", ["h1"], ["h2"], name="relu1"),
        helper.make_node("MatMul", ["h2", "w2"], ["h3"], name="fc2"),
        rare_node("h3", "h4", name="atan"),
        helper.make_node("Softmax", ["h4"], ["y"], name="softmax", axis=-1),
    ]
    model = make_model(
        nodes,
        [("x", TensorProto.FLOAT, ["N", 8])],
        [("y", TensorProto.FLOAT, ["N", 4])],
        [("w1", w1), ("b1", b1), ("w2", w2)],
    )

    def expected(x: np.ndarray) -> np.ndarray:
        h = np.arctan(np.maximum(x @ w1 + b1, 0) @ w2)
        e = np.exp(h - h.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    return model, expected


@pytest.fixture(autouse=True, scope="session")
def _quant_cache_outside_the_repo(tmp_path_factory):
    """Quantized-weight caches go to a temporary folder, never into tests/fixtures (HETERO_CACHE_DIR)."""
    import os

    previous = os.environ.get("HETERO_CACHE_DIR")
    os.environ["HETERO_CACHE_DIR"] = str(tmp_path_factory.mktemp("hetero-cache"))
    yield
    if previous is None:
        os.environ.pop("HETERO_CACHE_DIR", None)
    else:
        os.environ["HETERO_CACHE_DIR"] = previous


@pytest.fixture(autouse=True)
def _fresh_plugin_state(monkeypatch):
    """Each test sees the environment's plugins, not a previous test's HETERO_* settings."""
    monkeypatch.delenv("HETERO_BACKENDS", raising=False)
    monkeypatch.delenv("HETERO_PLUGINS", raising=False)


__all__ = ["backend_ok", "hetero", "make_model", "rare_node"]
