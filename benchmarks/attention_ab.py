"""Paired A/B of two builds' native ``fused_attention`` at the text encoders' head shapes: one worker process per
build (CPython hands a second import of an extension module of the same name back as the first: two builds cannot
share a process), kept alive and driven batch by batch, base / new alternated (the order flipped every round), each
batch timed by its worker's thread CPU time; the median and quartiles of the per-round ratios. On a shared two-core
machine this pairs each new batch with a base batch milliseconds apart, where fresh processes a side saw +-10 %
between two identical builds. The outputs of the two builds are compared bit for bit first.

    python benchmarks/attention_ab.py --base /work/base34/plugins/cpu --new plugins/cpu --cases t5,minilm128 \\
        --rounds 40

Cases: T5-small's 6 x 64 heads at 70 / 39 / 15 tokens with a per-head position bias, MiniLM's 12 x 32 heads at 64 /
128 tokens with a padding mask and its d^-1/4 operand scales, a ViT-S/14's 6 x 64 heads at 257 tokens unmasked; Q /
K / V read through the [S, H d] rows a projection writes, as in the models.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

# name: (tokens, heads, head size, mask: "bias" [1, H, S, S] / "key" [1, 1, 1, S] broadcast / "none", Q and K scale)
CASES: dict[str, tuple[int, int, int, str, float]] = {
    "t5": (70, 6, 64, "bias", 1.0),
    "t5_39": (39, 6, 64, "bias", 1.0),
    "t5_15": (15, 6, 64, "bias", 1.0),
    "minilm64": (64, 12, 32, "key", 32.0 ** -0.25),
    "minilm128": (128, 12, 32, "key", 32.0 ** -0.25),
    "vit257": (257, 6, 64, "none", 64.0 ** -0.25),
}


def load_native(plugin_dir: str) -> ModuleType:
    """The ``_native`` extension of the cpu plugin under ``plugin_dir`` (its hetero_cpu folder); one a process."""
    found = sorted(Path(plugin_dir, "hetero_cpu").glob("_native*.so"))
    if not found:
        raise SystemExit(f"no _native*.so under {plugin_dir}/hetero_cpu")
    spec = importlib.util.spec_from_file_location("_native", found[0])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def worker(plugin_dir: str) -> None:
    """A build's side: lines "time CASE N" (N calls, their thread CPU time in us a call) and "bits CASE" (the
    output's sha256) on stdin, the answers on stdout."""
    native = load_native(plugin_dir)
    native.set_num_threads(1)
    ready: dict[str, tuple[tuple[Any, ...], np.ndarray, float]] = {}
    for line in sys.stdin:
        cmd, name, *rest = line.split()
        if name not in ready:
            inputs, shape = case_args(name, np.random.default_rng(sorted(CASES).index(name)))
            ready[name] = (inputs, np.empty(shape, np.float32).transpose(0, 2, 1, 3), CASES[name][4])
        inputs, out, by = ready[name]
        if cmd == "bits":
            for _ in range(5):
                native.fused_attention(*inputs, out, 1.0, 1.0, False, by, by)
            print(hashlib.sha256(np.ascontiguousarray(out).tobytes()).hexdigest(), flush=True)
            continue
        calls = int(rest[0])
        t0 = time.thread_time()
        for _ in range(calls):
            native.fused_attention(*inputs, out, 1.0, 1.0, False, by, by)
        print((time.thread_time() - t0) / calls * 1e6, flush=True)


class Side:
    def __init__(self, plugin_dir: str) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", plugin_dir], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def ask(self, line: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


def case_args(name: str, rng: np.random.Generator) -> tuple[tuple[Any, ...], tuple[int, ...]]:
    """fused_attention's arguments without ``out`` (q, k, v, mask, then scale, divisor, nan_to_zero, q / k scale)
    and the output's [1, S, H, d] shape."""
    seq, heads, d, mask_kind, _ = CASES[name]
    rows = rng.normal(size=(3, 1, seq, heads * d)).astype(np.float32)
    q = rows[0].reshape(1, seq, heads, d).transpose(0, 2, 1, 3)
    kt = rows[1].reshape(1, seq, heads, d).transpose(0, 2, 3, 1)
    v = rows[2].reshape(1, seq, heads, d).transpose(0, 2, 1, 3)
    mask: np.ndarray | None = None
    if mask_kind == "bias":
        mask = rng.normal(size=(1, heads, seq, seq)).astype(np.float32)
    elif mask_kind == "key":
        mask = np.broadcast_to(np.zeros((1, 1, 1, seq), np.float32), (1, heads, seq, seq))
    return (q, kt, v, mask), (1, seq, heads, d)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the base build's plugins/cpu folder")
    ap.add_argument("--new", required=True, help="the new build's plugins/cpu folder")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--ms", type=float, default=4.0, help="about this long a batch of calls")
    args = ap.parse_args()
    sides = {"base": Side(args.base), "new": Side(args.new)}
    print(f"load before: {os.getloadavg()}")
    try:
        for name in args.cases.split(","):
            same = sides["base"].ask(f"bits {name}") == sides["new"].ask(f"bits {name}")
            once = float(sides["base"].ask(f"time {name} 3"))
            batch = max(3, int(args.ms * 1000 / max(once, 1.0)))
            times: dict[str, list[float]] = {side: [] for side in sides}
            for r in range(args.rounds):
                for side in ("base", "new") if r % 2 == 0 else ("new", "base"):
                    times[side].append(float(sides[side].ask(f"time {name} {batch}")))
            ratios = np.array(times["new"]) / np.array(times["base"])
            print(f"{name:10s} base {np.median(times['base']):8.2f} us  new {np.median(times['new']):8.2f} us  "
                  f"new / base median {np.median(ratios):.3f} (quartiles {np.percentile(ratios, 25):.3f}-"
                  f"{np.percentile(ratios, 75):.3f})  same bits: {same}")
    finally:
        for worker_side in sides.values():
            worker_side.close()
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
