"""Times every tiling of the OpenCL GEMM (hetero_opencl.kernels.gemm.CONFIGS) on a few product shapes and checks
each result against numpy: the numbers behind the tuning notes in docs/opencl.md.

    HETERO_OPENCL_TUNE=0 python plugins/opencl/tools/bench_gemm.py [MxKxN ...]

Each line: the mean of 3 runs after a warm-up. On PoCL the device is the host CPU: indicative only.
"""

from __future__ import annotations

import sys
import time

import numpy as np
from hetero_opencl.kernels.gemm import CONFIGS, gemm
from onnx import TensorProto, helper

import hetero

SHAPES = ((512, 1280, 508), (64, 576, 1600), (16, 1024, 1024))  # magika's conv, a PP-OCR-like conv, an LLM prefill


def _kernel(m: int, k: int, n: int):
    """A real opencl MatMul kernel object (its runtime, backend and launch helpers), from a one-node session."""
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "g",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k]),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, [k, n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])])
    session = hetero.Session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                             backends=["opencl"], on_fallback="error")
    ((_, kernel),) = session.kernels()
    return kernel


def _time(kernel, a, b, y, m: int, k: int, n: int, offs, config) -> float:
    """Seconds per product with this tiling: the mean of 3 runs after a warm-up."""
    for repeat in range(4):
        if repeat == 1:
            kernel.be.synchronize()
            start = time.perf_counter()
        gemm(kernel, a, b, y, m, n, k, (k, 1, n, 1), offs, config=config)
    kernel.be.synchronize()
    return (time.perf_counter() - start) / 3


def main(shapes: list[tuple[int, ...]]) -> None:  # each M, K, N
    rng = np.random.default_rng(0)
    for m, k, n in shapes:
        kernel = _kernel(m, k, n)
        be = kernel.be
        a, b = rng.random((m, k), np.float32), rng.random((k, n), np.float32)
        a_dev, b_dev, y_dev = be.upload(a), be.upload(b), be.upload(np.zeros((m, n), np.float32))
        offs = kernel.meta("offs", (0, 0))
        want = a @ b
        for config in CONFIGS:
            if config.threads > kernel.rt.max_wg:
                continue
            seconds = _time(kernel, a_dev.buffer, b_dev.buffer, y_dev.buffer, m, k, n, offs, config)
            err = float(np.abs(be.download(y_dev) - want).max())
            print(f"{m}x{k} @ {k}x{n}  {config!s:28s} {seconds * 1e3:8.1f} ms  {2 * m * n * k / seconds / 1e9:6.2f} "
                  f"GFLOP/s  max err {err:.2g}", flush=True)


if __name__ == "__main__":
    main([tuple(int(v) for v in arg.split("x")) for arg in sys.argv[1:]] or list(SHAPES))
