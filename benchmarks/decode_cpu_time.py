"""Wall time and process CPU time of a decode step, medians over steps: on a device backend whose kernels run on
the host's cores (OpenCL on PoCL) the CPU time counts the device's work as well as the runtime's, so a change that
keeps wall time but burns more cores shows here (and not in ``hetero bench``).

    python benchmarks/decode_cpu_time.py MODEL.gguf [--backend opencl] [--steps 12] [--threads 2]

Compare two checkouts by running it from each, alternately, in one session (see FACTS.md: the machine is shared).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

import hetero.llm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--backend", default="opencl")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=16, help="prompt tokens before the timed steps")
    args = ap.parse_args()
    backends = [args.backend] if args.backend == "cpu" else [args.backend, "cpu"]
    llm = hetero.llm.load(args.model, backends=backends, threads=args.threads, context=args.prompt + args.steps + 8)
    ids = [int(x) for x in np.random.default_rng(0).integers(3, 1000, args.prompt)]
    token = int(np.argmax(llm.prefill(ids)[-1]))
    walls, cpus = [], []
    for i in range(args.steps + 3):  # the first three steps record the replay: not timed
        wall, cpu = time.perf_counter(), time.process_time()
        logits = llm.forward([token])
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        token = int(np.argmax(logits[-1]))
        if i >= 3:
            walls.append(wall)
            cpus.append(cpu)
    print(f"{args.backend}: decode step wall {statistics.median(walls) * 1e3:.1f} ms, process CPU "
          f"{statistics.median(cpus) * 1e3:.1f} ms (medians of {args.steps}); last token {token}; "
          f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
