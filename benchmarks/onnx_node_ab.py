"""Per-node A/B of environment settings on one real ONNX model: hetero's replay timed node by node
(onnx_node_profile.hetero_profile), each side in a fresh process (the cpu plugin reads its switches once), the sides
alternated round by round, medians per node and per kind of node (a conv's algorithm as the first side runs it,
else the op).

    python benchmarks/onnx_node_ab.py --model nudenet_yolov8n --rounds 4 --runs 10 \\
        --side off HETERO_CPU_CONV_BF16X3_PW=0 HETERO_CPU_CONV_BF16X3_ROWS=0 --side on [--nodes]

At 1 thread it times with the calling thread's CPU time (a busy machine), at 2+ with the wall clock.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = """
import json, sys, time
import numpy as np
sys.path.insert(0, {here!r})
from onnx_node_profile import MODELS, hetero_profile
model = MODELS[{model!r}]
feeds = {{k: np.asarray(v) for k, v in model.feeds(model).items()}}
clock = time.thread_time if {threads} == 1 else time.perf_counter
print(json.dumps(hetero_profile(str(model.file()), feeds, {threads}, {runs}, clock)))
"""


def kind(label: str) -> str:
    """A conv's algorithm (the last word of its label), else the op."""
    return label.split()[-1] if label.startswith("Conv") else label.split()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--side", nargs="+", action="append", required=True, metavar="NAME [VAR=VALUE ...]",
                        help="a side: its name, then the environment it sets (at least two sides)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--runs", type=int, default=10, help="replays timed per process")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--nodes", action="store_true", help="also list every node, slowest on the first side first")
    args = parser.parse_args()
    if len(args.side) < 2:
        raise SystemExit("give at least two --side")
    sides = {s[0]: dict(v.split("=", 1) for v in s[1:]) for s in args.side}
    code = CHILD.format(here=str(HERE), model=args.model, threads=args.threads, runs=args.runs)
    times: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    labels: dict[str, str] = {}
    print(f"load average before: {os.getloadavg()}")
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for name in order:
            out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **sides[name]),
                                 capture_output=True, text=True)
            if out.returncode:
                raise SystemExit(out.stderr[-3000:])
            for node, (label, ms) in json.loads(out.stdout.strip().splitlines()[-1]).items():
                times[name][node].append(ms)
                if name == args.side[0][0] or node not in labels:
                    labels[node] = label
    print(f"load average after: {os.getloadavg()}")
    names = list(sides)
    med = {n: {node: statistics.median(v) for node, v in times[n].items()} for n in names}
    base = names[0]
    print("total (ms): " + ", ".join(f"{n} {sum(med[n].values()):.3f}" for n in names))
    kinds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for node, label in labels.items():
        for n in names:
            kinds[kind(label)][n] += med[n].get(node, 0.0)
    for k, d in sorted(kinds.items(), key=lambda kv: -kv[1][base]):
        ratios = "  ".join(f"{n}/{base} {d[n] / d[base]:.3f}" for n in names[1:] if d[base] > 0)
        print(f"  {k:16s} " + "  ".join(f"{n} {d[n]:.3f}" for n in names) + f"  {ratios}")
    if args.nodes:
        for node in sorted(labels, key=lambda x: -med[base].get(x, 0.0)):
            a = med[base].get(node, 0.0)
            row = "  ".join(f"{med[n].get(node, 0.0):.3f}" for n in names)
            ratio = med[names[1]].get(node, 0.0) / a if a > 0 else float("nan")
            print(f"    {row}  {ratio:.2f}  {labels[node]:24s} {node}")


if __name__ == "__main__":
    main()
