"""Per-node latency of one real ONNX model: hetero's bound calls in its steady-state replay next to onnxruntime's
profiler, grouped by op (and for Conv by kernel shape and the algorithm hetero's cpu plugin picks).

    python benchmarks/onnx_node_profile.py --model nudenet_yolov8n --threads 1 [--runs 30] [--top 25]

hetero: each kernel's bound call is wrapped with a timer (``time.perf_counter``) and the replay recorded again, so a
run times every native call; the median per node over ``--runs`` runs. onnxruntime: ``enable_profiling``, the
median ``dur`` of each node's kernel event over the same number of runs (its fused nodes keep their fused names: a
Conv with a fused activation is one event, where hetero fuses SiLU into its Conv too). Wall time at any thread count:
quote it only from a quiet machine, or as ratios of one run; ``--clock thread`` times hetero's calls in the calling
thread's CPU time (1 thread on a busy machine: A/B of two builds with ``--hetero-only``). The load average is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from real_models.models import MODELS  # noqa: E402


def _label(kernel, ins) -> str:
    """The op, and for a Conv its shape and the algorithm hetero's cpu plugin runs for it."""
    node = kernel.node
    packed = getattr(kernel, "packed", None)
    if packed is None or not hasattr(packed, "algorithm") or ins[0] is None:
        return node.op_type
    x = tuple(ins[0].shape)
    if len(x) != 4:
        return node.op_type
    kh, kw = packed.kernel
    algo = packed.algorithm(list(x), list(kernel.native_strides), list(kernel.pads), list(kernel.native_dilations))
    return (f"Conv {packed.in_channels}->{packed.out_channels} {kh}x{kw} s{kernel.native_strides[0]}"
            f"{' g' + str(packed.group) if packed.group > 1 else ''} on {x[2]}x{x[3]} {algo}")


# hetero's node name per tensor it produces (after its fusions), filled by hetero_profile, and the source graph's
# tensor -> the output of its only consumer: onnxruntime names its NCHWc nodes after their output tensor, which is
# the conv's or a BatchNormalization's where hetero's fused node ends at a later activation's.
OUTPUT_NAMES: dict[str, str] = {}
NEXT_TENSOR: dict[str, str] = {}


def _hetero_node_of(tensor: str) -> str | None:
    for _ in range(4):
        if tensor in OUTPUT_NAMES:
            return OUTPUT_NAMES[tensor]
        if tensor not in NEXT_TENSOR:
            return None
        tensor = NEXT_TENSOR[tensor]
    return None


def time_bound_calls(session: Any, timed: Callable[[str, Callable[[], None]], Callable[[], None]],
                     labels: dict[str, str], order: list[str] | None = None) -> None:
    """Wrap every kernel's ``bind`` so that each call it returns runs through ``timed(node name, call)``, note each
    node's label (and, with ``order``, the nodes in the order their calls were bound), then drop the replay so the
    next run records the wrapped calls."""
    for node, kernel in session.kernels():
        bind = getattr(kernel, "bind", None)
        if bind is None:
            continue

        def wrapped(ins, outs, _bind=bind, _name=node.name, _kernel=kernel):
            call = _bind(ins, outs)
            labels[_name] = _label(_kernel, ins)
            if order is not None and _name not in order:
                order.append(_name)
            if call is None:
                return None
            if callable(call):
                return timed(_name, call)
            return [timed(_name, c) for c in call]
        kernel.bind = wrapped
    session.invalidate_replay()


def hetero_profile(path: str, feeds: dict, threads: int, runs: int,
                   clock: Callable[[], float] = time.perf_counter,
                   stat: Callable[[list[float]], float] = statistics.median) -> dict[str, tuple[str, float]]:
    import hetero

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hetero.HeteroWarning)
        session = hetero.Session(path, backends=["cpu"], on_fallback="silent", threads=threads)
    session.run(feeds)
    times: dict[str, list[float]] = defaultdict(list)
    labels: dict[str, str] = {}
    OUTPUT_NAMES.clear()
    for node, _ in session.kernels():
        for out in node.outputs:
            OUTPUT_NAMES[out] = node.name

    acc: dict[str, float] = defaultdict(float)  # this run's time per node: a node of several calls sums them

    def timed(name: str, call):
        def run() -> None:
            t0 = clock()
            call()
            acc[name] += clock() - t0
        return run

    time_bound_calls(session, timed, labels)
    for _ in range(3):
        session.run(feeds)
    acc.clear()
    for _ in range(runs):
        session.run(feeds)
        for name, t in acc.items():
            times[name].append(t)
        acc.clear()
    return {name: (labels[name], stat(v) * 1e3) for name, v in times.items()}


def ort_profile(path: str, feeds: dict, threads: int, runs: int) -> dict[str, tuple[str, float]]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    with tempfile.TemporaryDirectory() as tmp:
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(tmp, "ort")
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        for _ in range(3 + runs):
            session.run(None, feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
    times: dict[str, list[float]] = defaultdict(list)
    ops: dict[str, str] = {}
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        name = e["name"][: -len("_kernel_time")]
        times[name].append(e["dur"] / 1e3)
        ops[name] = e.get("args", {}).get("op_name", "?")
    return {n: (ops[n], statistics.median(v[3:] if len(v) > 3 else v)) for n, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, choices=sorted(MODELS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--top", type=int, default=30, help="nodes listed, slowest hetero first")
    parser.add_argument("--clock", choices=("wall", "thread"), default="wall",
                        help="hetero's timer: wall, or the calling thread's CPU time (1 thread, a busy machine)")
    parser.add_argument("--stat", choices=("median", "min"), default="median",
                        help="hetero's statistic per node: min (best of --runs) filters a busy machine's preemptions"
                             " out of wall times at 2 threads")
    parser.add_argument("--hetero-only", action="store_true", help="skip onnxruntime (A/B of hetero builds)")
    args = parser.parse_args()
    model = MODELS[args.model]
    path = model.file()
    if path is None:
        raise SystemExit(f"{args.model} is not installed: {model.install_hint}")
    feeds = {k: np.asarray(v) for k, v in model.feeds(model).items()}
    consumers: dict[str, list] = defaultdict(list)
    for node in onnx.load(str(path), load_external_data=False).graph.node:
        for t in node.input:
            consumers[t].append(node)
    NEXT_TENSOR.update({t: c[0].output[0] for t, c in consumers.items() if len(c) == 1 and c[0].output})
    print(f"load average before: {os.getloadavg()}")
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    het = hetero_profile(str(path), feeds, args.threads, args.runs, clock,
                         min if args.stat == "min" else statistics.median)
    ort = {} if args.hetero_only else ort_profile(str(path), feeds, args.threads, args.runs)
    print(f"load average after: {os.getloadavg()}")
    by_op_h: dict[str, float] = defaultdict(float)
    by_op_o: dict[str, float] = defaultdict(float)
    for label, ms in het.values():
        by_op_h[label.split(" ")[0]] += ms
    for op, ms in ort.values():
        by_op_o[op] += ms
    print(f"\n{args.model}, {args.threads} thread(s), median of {args.runs} runs per node (wall ms)")
    het_total, ort_total = sum(v for _, v in het.values()), sum(v for _, v in ort.values())
    print(f"hetero total {het_total:.3f} ms, onnxruntime total {ort_total:.3f}")
    print("\nby op (hetero / onnxruntime):")
    for op in sorted(set(by_op_h) | set(by_op_o), key=lambda o: -max(by_op_h.get(o, 0), by_op_o.get(o, 0))):
        print(f"  {op:24s} {by_op_h.get(op, 0):8.3f} {by_op_o.get(op, 0):8.3f}")
    per_node = _ort_by_hetero_name(ort)
    print("\nnodes, slowest in hetero first (onnxruntime's node of the same name where it kept it, with the"
          " activation it runs apart; ratio hetero / onnxruntime):")
    for name, (label, ms) in sorted(het.items(), key=lambda kv: -kv[1][1])[: args.top]:
        o = per_node.get(name, float("nan"))
        print(f"  {ms:7.3f} {o:7.3f} {ms / o:5.2f}  {label:40s} {name}")


def _ort_by_hetero_name(ort: dict[str, tuple[str, float]]) -> dict[str, float]:
    """onnxruntime's per-node times under the names of the source graph: its NCHWc convs are named after their
    output (``<conv>_output_0_nchwc``), and a SiLU it fuses into a QuickGelu node of its own
    (``<block>/act/Mul/QuickGeluFusion/``) is added to the conv of that block (hetero fuses it into the conv); others
    (``<tensor>_nchwc``) after the hetero node that produces that tensor, where hetero_profile ran first."""
    out: dict[str, float] = defaultdict(float)
    for name, (_, ms) in ort.items():
        if name.endswith("_output_0_nchwc"):
            name = name[: -len("_output_0_nchwc")]
        elif name.endswith("_nchwc") and _hetero_node_of(name[: -len("_nchwc")]):
            name = _hetero_node_of(name[: -len("_nchwc")]) or name
        elif name.endswith("/act/Mul/QuickGeluFusion/"):
            name = name[: -len("/act/Mul/QuickGeluFusion/")] + "/conv/Conv"
        out[name] += ms
    return out


if __name__ == "__main__":
    main()
