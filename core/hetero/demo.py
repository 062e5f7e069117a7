"""The built-in example: a small CNN made in code (no download), run on every available backend.

``hetero demo`` prints where each node ran, the time per run, and the largest difference from the numpy reference.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

SEED = 0


def tiny_cnn(batch: int | str = "N", image: int = 32, classes: int = 10, seed: int = SEED) -> Any:
    """An ONNX ModelProto: 3 conv blocks (Conv+BatchNorm+Relu, depthwise, pooling), then Gemm and Softmax."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    weights: list[Any] = []
    nodes: list[Any] = []

    def const(name: str, array: np.ndarray) -> str:
        weights.append(numpy_helper.from_array(array.astype(np.float32), name))
        return name

    def conv(x: str, name: str, c_in: int, c_out: int, k: int, stride: int = 1, group: int = 1) -> str:
        fan_in = c_in // group * k * k
        w = const(f"{name}.w", rng.normal(0, (2 / fan_in) ** 0.5, (c_out, c_in // group, k, k)))
        b = const(f"{name}.b", rng.normal(0, 0.05, c_out))
        nodes.append(helper.make_node("Conv", [x, w, b], [f"{name}.conv"], name=f"{name}.conv", pads=[k // 2] * 4,
                                      strides=[stride, stride], group=group))
        stats = [const(f"{name}.bn.{p}", v) for p, v in (
            ("scale", rng.uniform(0.5, 1.5, c_out)), ("bias", rng.normal(0, 0.1, c_out)),
            ("mean", rng.normal(0, 0.1, c_out)), ("var", rng.uniform(0.5, 1.5, c_out)))]
        nodes.append(helper.make_node("BatchNormalization", [f"{name}.conv", *stats], [f"{name}.bn"],
                                      name=f"{name}.bn"))
        nodes.append(helper.make_node("Relu", [f"{name}.bn"], [f"{name}.out"], name=f"{name}.relu"))
        return f"{name}.out"

    x = conv("image", "stem", 3, 16, 3)
    x = conv(x, "block1.dw", 16, 16, 3, group=16)
    x = conv(x, "block1.pw", 16, 32, 1)
    nodes.append(helper.make_node("MaxPool", [x], ["pool1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]))
    x = conv("pool1", "block2", 32, 64, 3, stride=2)
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["gap"], ["features"], name="flatten"))
    w = const("head.w", rng.normal(0, 0.1, (classes, 64)))
    b = const("head.b", rng.normal(0, 0.1, classes))
    nodes.append(helper.make_node("Gemm", ["features", w, b], ["logits"], name="head", transB=1))
    nodes.append(helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1))
    graph = helper.make_graph(
        nodes, "tiny_cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [batch, 3, image, image])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, classes])],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="hetero.demo")


def run_demo(batch: int = 4, repeats: int = 20, backends: list[str] | None = None, out: Any = print) -> int:
    """Run the CNN on each working backend; returns 0 when every backend matches the reference."""
    import hetero
    from hetero.plugins import statuses
    from hetero.progress import phase

    repeats = max(1, repeats)
    model = tiny_cnn()
    image = np.random.default_rng(1).normal(size=(batch, 3, 32, 32)).astype(np.float32)
    names = backends or [row.name for row in sorted(statuses(), key=lambda r: r.priority) if row.ok]
    expected = hetero.Session(model, backends=["reference"]).run({"image": image})["probs"]
    failures = 0
    for name in names:
        started = time.perf_counter()
        with phase(f"{name}: loading"):
            session = hetero.Session(model, backends=[name], on_fallback="silent")
        load_ms = (time.perf_counter() - started) * 1e3
        times = []
        with phase(f"{name}: first run (planning memory, building device programs)"):
            t0 = time.perf_counter()
            probs = session.run({"image": image})["probs"]
            times.append((time.perf_counter() - t0) * 1e3)
        with phase(f"{name}: {repeats} timed runs"):
            for _ in range(repeats):
                t0 = time.perf_counter()
                probs = session.run({"image": image})["probs"]
                times.append((time.perf_counter() - t0) * 1e3)
        err = float(np.max(np.abs(probs - expected)))
        ok = err <= 1e-4
        failures += not ok
        out(f"\n== backend {name}  (tiny CNN, batch {batch}, 3x32x32)")
        out(session.explain())
        out(f"load {load_ms:.1f} ms; first run {times[0]:.3f} ms; then median {statistics.median(times[1:]):.3f} ms "
            f"over {repeats} runs; max |diff| vs reference {err:.2e} {'OK' if ok else 'MISMATCH'}")
    with phase("onnxruntime"):
        ort_ms = _onnxruntime_median_ms(model, image, repeats)
    if ort_ms is not None:
        out(f"\nonnxruntime (CPU provider, same model and input): run median {ort_ms:.3f} ms")
    return 1 if failures else 0


def _onnxruntime_median_ms(model: Any, image: np.ndarray, repeats: int) -> float | None:
    """A peer for scale, when onnxruntime is installed (it is a test dependency, not a runtime one)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    session.run(None, {"image": image})
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        session.run(None, {"image": image})
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)
