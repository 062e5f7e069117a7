"""The fixed cost of one ``Session.run`` next to onnxruntime's, on tiny models where it is most of the latency.

    python benchmarks/run_overhead.py [--models add,identity,oww_hey_jarvis,silero_vad] [--threads 1]

Three runners, interleaved sample by sample (``onnx_models.time_interleaved``: medians, ``--clock thread`` by
default since at 1 thread both runtimes compute on the calling thread), the load average printed:

- ``hetero``: ``session.run(feeds)``, repeated calls of one signature (the fast path: ``session._FastRun``);
- ``hetero checked``: ``session.run_tensors(feeds)`` and the outputs as numpy arrays, what ``run`` does off the fast
  path (feeds bound to tensors and checked, the segment loop, the program's signature key) before the same replay:
  the fast path's A/B;
- ``onnxruntime``: ``session.run(None, feeds)`` (CPU provider, the same thread count).

``add`` and ``identity`` are one-node models of a [1, 16] float input (pure per-call cost); the others come from
tests/real_models/models.py.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from onnx_models import CLOCKS, MODELS, time_interleaved  # noqa: E402


def tiny_model(op: str) -> tuple[bytes, dict[str, np.ndarray]]:
    """A one-node model y = op(x[, ones]) of a [1, 16] float input, and a feed for it."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])
    ones = [numpy_helper.from_array(np.ones(16, np.float32), "ones")] if op == "Add" else []
    node = helper.make_node(op, ["x", "ones"] if op == "Add" else ["x"], ["y"])
    graph = helper.make_graph([node], op.lower(), [x], [y], ones)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString(), {"x": np.linspace(-1, 1, 16, dtype=np.float32).reshape(1, 16)}


def load(name: str) -> tuple[str | bytes, dict[str, np.ndarray]] | None:
    if name in ("add", "identity"):
        return tiny_model(name.capitalize())
    model = MODELS[name]
    path = model.file()
    return None if path is None else (str(path), model.feeds(model))


def measure(name: str, args: argparse.Namespace) -> str:
    """One table row: the model's fast, checked and onnxruntime call times (outputs checked against onnxruntime's)."""
    import onnx
    import onnxruntime as ort

    import hetero

    found = load(name)
    if found is None:
        return f"| {name} | (package not installed) | | | | |"
    source, feeds = found
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = args.threads, 1
    options.log_severity_level = 3
    peer = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hetero.HeteroWarning)
        model = onnx.load_from_string(source) if isinstance(source, bytes) else source
        session = hetero.Session(model, backends=["cpu"], on_fallback="silent", threads=args.threads)
    names = session.output_names
    want = peer.run(None, feeds)
    for _ in range(3):
        got = session.run(feeds)
    for a, b in zip(want, (got[n] for n in names), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-4)  # the same model computed, not a broken one

    def checked() -> dict[str, np.ndarray]:  # what run() does past the fast path
        return {name: np.asarray(t.numpy()) for name, t in session.run_tensors(feeds).items()}

    ms = time_interleaved({"hetero": functools.partial(session.run, feeds), "checked": checked,
                           "ort": functools.partial(peer.run, None, feeds)},
                          args.repeat, warmup=20, min_sample_s=0.05, clock=CLOCKS[args.clock], settle_s=0.01)
    us = {k: v * 1e3 for k, v in ms.items()}
    return (f"| {name} | {us['hetero']:.1f} | {us['checked']:.1f} | {us['ort']:.1f} | "
            f"{us['hetero'] / us['ort']:.2f} | {us['checked'] / us['ort']:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="add,identity,oww_hey_jarvis,silero_vad")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="thread")
    args = parser.parse_args()
    print(f"clock: {args.clock}, threads {args.threads}; load average before: {os.getloadavg()}")
    print("\n| model | hetero us | hetero checked us | onnxruntime us | hetero/ort | checked/ort |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in args.models.split(","):
        print(measure(name, args), flush=True)
        time.sleep(0.1)
    print(f"\nload average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
