"""Runs a few planned dispatches of every kernel family on the Metal device and in the emulator, with the same
inputs, and says whether the device computes what the emulator (checked against numpy by the tests) computes.

GitHub's hosted macOS runners expose a paravirtual GPU that has been seen to return zeros from custom kernels: this
is how the workflow finds out, before it trusts a conformance run on it. Exit status 0: the device agrees;
3: it runs but disagrees (not usable to verify kernels); 4: no Metal device.

    python plugins/metal/tools/device_check.py [--summary FILE]
"""

from __future__ import annotations

import argparse
import copy
import math
import sys

import numpy as np
from hetero_metal.emulator import EmulatorQueue
from hetero_metal.factory import metal_devices
from hetero_metal.kernels.llm import weight_params
from hetero_metal.kernels.nn import matmul_dispatch, row_threads
from hetero_metal.plan import Dispatch, dispatch, groups_for

from hetero.contract import BackendError, BackendUnavailable, quant


def cases() -> dict[str, list[Dispatch]]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(1000).astype(np.float32)
    rows = rng.standard_normal((8, 300)).astype(np.float32)
    a, b = rng.standard_normal((40, 24)).astype(np.float32), rng.standard_normal((24, 36)).astype(np.float32)
    fmt = quant.parse_quant("q4")
    w = quant.quantize(rng.standard_normal((20, 96)).astype(np.float32), fmt)
    xv = rng.standard_normal((1, 96)).astype(np.float32)
    d, context = 64, 16
    q = rng.standard_normal((1, 2, d)).astype(np.float32)
    k_cache = rng.standard_normal((1, context, d)).astype(np.float16)
    v_cache = rng.standard_normal((1, context, d)).astype(np.float16)
    attn = {"t": 1, "q_heads": 2, "kv_heads": 1, "dim": d, "past_len": 9, "context": context,
            "scale": 1 / math.sqrt(d)}
    return {
        "unary_f32 (sigmoid)": [dispatch("unary_f32", {"x": x, "y": np.zeros_like(x), "p": {
            "n": x.size, "op": 6, "alpha": 0.0, "beta": 0.0}}, (groups_for(x.size, 256),), (256,))],
        "softmax_f32 (simd_max/simd_sum)": [dispatch("softmax_f32", {"x": rows, "y": np.zeros_like(rows), "p": {
            "n": 300, "inner": 1, "log_softmax": 0}}, (8,), (row_threads(300),))],
        "matmul_f32 (simdgroup_matrix)": [matmul_dispatch(a, b, np.zeros((40, 36), np.float32), 40, 36, 24,
                                                          (24, 1, 36, 1), np.zeros((1, 3), np.uint32))],
        "qmatvec (q4 blocks)": [dispatch("qmatvec", {"x": xv, "w": w.reshape(-1), "bias": np.zeros(4, np.float32),
                                                     "y": np.zeros((1, 20), np.float32),
                                                     "p": {**weight_params(fmt.attrs(), 96), "m": 1, "n": 20,
                                                           "has_bias": 0}}, (5,), (128,))],
        "attention_f16kv": [dispatch("attention_f16kv", {"q": q, "k_cache": k_cache, "v_cache": v_cache,
                                                         "out": np.zeros((1, 2 * d), np.float32), "p": attn},
                                     (2, 1), (128,))],
    }


def outputs(dispatches: list[Dispatch]) -> list[np.ndarray]:
    return [b for d in dispatches for b in d.buffers.values() if isinstance(b, np.ndarray)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--summary", help="append a markdown table to this file (GitHub's step summary)")
    args = parser.parse_args()
    try:
        from hetero_metal.metal_queue import MetalQueue

        device = metal_devices()[0]
        gpu = MetalQueue(int(device.properties.get("index", 0)))
    except (BackendUnavailable, BackendError) as exc:
        print(f"no Metal device: {exc}")
        return 4
    emulator = EmulatorQueue(seed=1)
    lines = [f"Metal device: {device.name}", "",
             "| kernel | direct: device vs emulator | indirect command buffer, recorded then replayed | verdict |",
             "|---|---|---|---|"]
    agree = True
    for name, planned in cases().items():
        replayed = tuple(copy.deepcopy(planned))
        reference, replayed_reference = copy.deepcopy(planned), copy.deepcopy(replayed)
        emulator.run(reference)
        for _ in range(2):  # the same bound submission twice: recorded into a plan, then the plan replayed
            emulator.commit(replayed_reference, bound=True)
            emulator.wait()
        try:
            gpu.run(planned)
            for _ in range(2):
                gpu.commit(replayed, bound=True)
                gpu.wait()
        except BackendError as exc:
            lines.append(f"| {name} | failed: {exc} | | not verified |")
            agree = False
            continue
        direct, indirect = _diff(planned, reference), _diff(list(replayed), list(replayed_reference))
        ok = direct <= 1e-3 and indirect <= 1e-3
        agree &= ok
        lines.append(f"| {name} | max abs diff {direct:.3g} | max abs diff {indirect:.3g} | "
                     f"{'agrees' if ok else 'DISAGREES'} |")
    lines.append("")
    lines.append("The device computes what the emulator computes: its conformance results count." if agree else
                 "The device does not compute what the emulator computes (a paravirtual GPU?): kernels are NOT "
                 "verified on this machine; the Linux emulator run is the check.")
    print("\n".join(lines))
    if args.summary:
        with open(args.summary, "a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return 0 if agree else 3


def _diff(device: list[Dispatch], emulated: list[Dispatch]) -> float:
    return max(float(np.max(np.abs(g.astype(np.float64) - e.astype(np.float64)), initial=0.0))
               for g, e in zip(outputs(device), outputs(emulated), strict=True))


if __name__ == "__main__":
    sys.exit(main())
