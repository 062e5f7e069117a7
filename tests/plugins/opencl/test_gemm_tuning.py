"""The tiled GEMM's tilings (hetero_opencl.kernels.gemm.CONFIGS): each one computes the same products, and the
device's choice per shape class is measured once and cached on disk per device and driver (tuning.json)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import hetero

from .conftest import needs_device

gemm_mod = pytest.importorskip("hetero_opencl.kernels.gemm", reason="hetero-opencl is not installed")
pytestmark = needs_device
RNG = np.random.default_rng(2)


def _matmul_model(m: int, k: int, n: int):
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "g",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k]),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, [k, n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_shape_classes():
    assert gemm_mod.shape_class(8, 4096, 4096) == "skinny"
    assert gemm_mod.shape_class(512, 508, 1280) == "square"
    assert gemm_mod.shape_class(64, 64, 4096) == "deep"


@pytest.mark.parametrize("index", range(len(gemm_mod.CONFIGS)))
def test_every_tiling_computes_the_same_product(index):
    """A batched product with tile edges on every axis, a transposed A, a broadcast bias, alpha / beta and a fused
    activation: the epilogue and the edge handling of each tiling."""
    config = gemm_mod.CONFIGS[index]
    session = hetero.Session(_matmul_model(2, 2, 2), backends=["opencl"], on_fallback="error")
    session.run({"a": np.ones((2, 2), np.float32), "b": np.ones((2, 2), np.float32)})
    ((_, kernel),) = session.kernels()  # a real opencl kernel object: launches through the device's runtime
    if config.threads > kernel.rt.max_wg:
        pytest.skip(f"{config} exceeds this device's work-group limit ({kernel.rt.max_wg})")
    batch, m, k, n = 2, 37, 21, 45
    a = RNG.standard_normal((batch, k, m)).astype(np.float32)  # stored transposed: A[b] = a[b].T
    b = RNG.standard_normal((batch, k, n)).astype(np.float32)
    bias = RNG.standard_normal((m, 1)).astype(np.float32)
    be = kernel.be
    a_dev, b_dev, bias_dev = be.upload(a), be.upload(b), be.upload(bias)
    y_dev = be.upload(np.zeros((batch, m, n), np.float32))
    offs = kernel.meta("offs-test", [v for i in range(batch) for v in (i * k * m, i * k * n)])
    gemm_mod.gemm(kernel, a_dev.buffer, b_dev.buffer, y_dev.buffer, m, n, k, (1, m, n, 1), offs, batch,
                  alpha=0.5, beta=2.0, bias=bias_dev.buffer, bias_strides=(0, 1, 0), act=(1, 0.0, 0.0),  # relu
                  config=config)
    want = np.maximum(0.5 * np.einsum("bkm,bkn->bmn", a, b) + 2.0 * bias, 0)
    np.testing.assert_allclose(be.download(y_dev), want, rtol=1e-5, atol=1e-5)


SCRIPT = """
import json, sys, numpy as np, hetero, onnx
m, k, n = (int(v) for v in sys.argv[1:4])
model = onnx.load_from_string(bytes.fromhex(sys.stdin.read()))
session = hetero.Session(model, backends=["opencl"], on_fallback="error")
a, b = np.random.default_rng(0).random((m, k), np.float32), np.random.default_rng(1).random((k, n), np.float32)
y = session.run({"a": a, "b": b})["y"]
print(json.dumps({"dir": str(session.backends[0].rt.cache_dir), "err": float(np.abs(y - a @ b).max())}))
"""


def _run(cache: Path, m: int, k: int, n: int) -> dict:
    env = {**os.environ, "HETERO_CACHE_DIR": str(cache)}
    env.pop("HETERO_OPENCL_TUNE", None)
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(m), str(k), str(n)], input=_matmul_model(m, k, n)
                         .SerializeToString().hex(), capture_output=True, text=True, env=env, timeout=600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_choice_is_measured_once_and_cached(tmp_path: Path):
    small = _run(tmp_path, 8, 8, 8)  # too small to time: the default tiling, nothing recorded
    tuning = Path(small["dir"]) / "tuning.json"
    assert not any(k.startswith("gemm/") for k in (json.loads(tuning.read_text()) if tuning.is_file() else {}))
    first = _run(tmp_path, 160, 160, 192)  # 4.9M multiply-adds: tuned
    table = json.loads(tuning.read_text())
    key = f"gemm/{gemm_mod.TUNING_VERSION}/square"
    assert table[key] in range(len(gemm_mod.CONFIGS))
    stamp = tuning.stat().st_mtime_ns
    second = _run(tmp_path, 160, 160, 192)  # a second process reads the choice: the file is not rewritten
    assert tuning.stat().st_mtime_ns == stamp and json.loads(tuning.read_text()) == table
    assert max(small["err"], first["err"], second["err"]) < 1e-3
