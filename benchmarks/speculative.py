"""What a speculative verify step costs on this CPU: one forward pass of T tokens over the KV cache against one
decode step (the economics of drafting: k drafts pay when the step of k + 1 tokens costs less than the tokens it
commits), and on hybrid models the cost of rolling back into the verify block (the block-start checkpoint restored,
then the accepted tokens' recurrence replayed: ``hetero.ops.gated_delta``'s module doc) against a step that keeps
its whole block. Synthetic models (hetero.llm.synthetic, random q4 weights: speed only), one thread by default.
Runs are alternated (decode step, block, decode step, ...); prints medians and the median of per-pair ratios.

    PYTHONPATH=core:plugins/cpu python benchmarks/speculative.py [--model qwen3-0.6b] [--threads 1] [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from hetero.llm.synthetic import load_synthetic

PROMPT = 256


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def measure(model: str, threads: int, reps: int, blocks: list[int]) -> None:
    llm = load_synthetic(model, "q4", backends=["cpu"], on_fallback="silent", threads=threads, context=1024)
    prompt = [(7 * i + 3) % 1000 for i in range(PROMPT)]
    llm.prefill(prompt)
    base = len(llm.tokens)
    hybrid = model.startswith("qwen3.5")

    def decode() -> None:
        llm.rollback(base)
        llm.forward([11])

    def block(t: int) -> None:
        llm.rollback(base)
        llm.verify([11 + i for i in range(t)])

    for _ in range(2):  # plans of every shape
        decode()
        for t in blocks:
            block(t)
    print(f"{model} q4, {threads} thread(s), prompt {PROMPT}, load average {os.getloadavg()[0]:.2f}")
    print("| tokens in the step | step ms (median) | x one decode step (median of pairs) |")
    print("|---|---|---|")
    one = [_timed(decode) for _ in range(reps)]
    print(f"| 1 | {1000 * statistics.median(one):.1f} | 1.00 |")
    for t in blocks:
        pairs = [(_timed(decode), _timed(lambda t=t: block(t))) for _ in range(reps)]
        print(f"| {t} | {1000 * statistics.median(b for _, b in pairs):.1f} | "
              f"{statistics.median(b / a for a, b in pairs):.2f} |")
    if hybrid:
        t = max(blocks)
        print(f"\nrolling back into a block of {t}: the next one-token step after keeping n of its tokens, against "
              "the same step after keeping all (median of pairs)")
        print("| n kept | x the step after a fully kept block |")
        print("|---|---|")
        for keep in (1, t // 2, t - 1):
            def after(k: int) -> float:
                llm.rollback(base)
                llm.verify([11 + i for i in range(t)])
                llm.rollback(base + k)
                return _timed(lambda: llm.forward([5]))

            pairs = [(after(t), after(keep)) for _ in range(reps)]
            print(f"| {keep} | {statistics.median(b / a for a, b in pairs):.2f} |")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", default=None, help="synthetic model (default: qwen3-0.6b and "
                        "qwen3.5-0.8b)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--blocks", default="2,4,8,16", help="verify block sizes (tokens)")
    args = parser.parse_args()
    for model in args.model or ["qwen3-0.6b", "qwen3.5-0.8b"]:
        measure(model, args.threads, args.reps, [int(b) for b in args.blocks.split(",")])
        print()


if __name__ == "__main__":
    main()
