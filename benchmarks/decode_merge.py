"""The decode step as one native call (``hetero_cpu.fuse.step_calls``) against the same step as separate calls
(``HETERO_CPU_STEP=0``), in one process, alternating blocks of steps, so a busy neighbour hits both alike.

    python benchmarks/decode_merge.py ~/.cache/hetero/bench-models/qwen3-0.6b-v32k-q4_k_m.gguf --threads 1,2
    python benchmarks/decode_merge.py MODEL.gguf --blocks 20 --steps 10 --json

Each block re-records the session's replay with the setting (``Session.invalidate_replay``) and times ``--steps``
decode steps at a fixed context (the cache rolled back before each); prints per setting the minimum, 10th
percentile and median step over all its blocks and the ratios. On a shared machine the minimum and p10 are the
figures to read (a neighbour only adds time). The logits of both settings are compared too (they must be equal).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a .gguf file or Hugging Face folder")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--blocks", type=int, default=12, help="alternating blocks per setting")
    ap.add_argument("--steps", type=int, default=8, help="decode steps per block")
    ap.add_argument("--prompt", type=int, default=16, help="cached tokens each step sees")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    for sub in ("core", "plugins/cpu"):
        sys.path.insert(0, str(ROOT / sub))
    from hetero.llm import load
    from hetero_cpu import _native

    threads = [int(t) for t in args.threads.split(",")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        llm = load(args.model, backends=["cpu"], on_fallback="silent", threads=max(threads))
    ids = np.random.default_rng(0).integers(0, llm.config.vocab_size, args.prompt + 8).tolist()
    llm.forward(ids[:args.prompt])
    load_before = os.getloadavg()[0]
    results = []
    for t in threads:
        _native.set_num_threads(t)
        times: dict[str, list[float]] = {"merged": [], "calls": []}
        logits: dict[str, np.ndarray] = {}
        for _ in range(args.blocks):
            for name, env in (("merged", "1"), ("calls", "0")):
                os.environ["HETERO_CPU_STEP"] = env
                llm.session.invalidate_replay()
                for i in range(args.steps + 3):  # 3 steps record the replay again
                    llm.rollback(args.prompt)
                    t0 = time.perf_counter()
                    out = llm.forward([ids[args.prompt + i % 8]])
                    if i >= 3:
                        times[name].append(time.perf_counter() - t0)
                    if i == 3:
                        logits[name] = np.array(out)
        same = bool(np.array_equal(logits["merged"], logits["calls"]))
        row = {"threads": t, "same_logits": same}
        for name, ts in times.items():
            ms = 1e3 * np.asarray(ts)
            row[name] = dict(min=float(ms.min()), p10=float(np.percentile(ms, 10)), median=float(np.median(ms)))
        row["ratio_min"] = row["calls"]["min"] / row["merged"]["min"]
        row["ratio_p10"] = row["calls"]["p10"] / row["merged"]["p10"]
        row["ratio_median"] = statistics.median(times["calls"]) / statistics.median(times["merged"])
        results.append(row)
    os.environ.pop("HETERO_CPU_STEP", None)
    load_after = os.getloadavg()[0]
    if args.json:
        print(json.dumps(dict(model=llm.name, load_avg=[load_before, load_after], rows=results), indent=2))
        return 0
    print(f"{llm.name}: {args.blocks} alternating blocks of {args.steps} steps; load average {load_before:.2f} -> "
          f"{load_after:.2f}")
    print("| T | merged min / p10 / median ms | calls min / p10 / median ms | speed-up min / p10 / median | "
          "same logits |")
    print("|---|---|---|---|---|")
    for r in results:
        m, c = r["merged"], r["calls"]
        print(f"| {r['threads']} | {m['min']:.2f} / {m['p10']:.2f} / {m['median']:.2f} | {c['min']:.2f} / "
              f"{c['p10']:.2f} / {c['median']:.2f} | {r['ratio_min']:.3f} / {r['ratio_p10']:.3f} / "
              f"{r['ratio_median']:.3f} | {r['same_logits']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
