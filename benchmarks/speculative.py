"""What a speculative verify step costs on this CPU: one forward pass of T tokens over the KV cache against one
decode step (the economics of drafting: k drafts pay when the step of k + 1 tokens costs less than the tokens it
commits), and on hybrid models the cost of rolling back into the verify block (the block-start checkpoint restored,
then the accepted tokens' recurrence replayed: ``hetero.ops.gated_delta``'s module doc) against a step that keeps
its whole block. Synthetic models (hetero.llm.synthetic, random q4 weights: speed only), one thread by default,
or a real model file (``--gguf PATH``: the step-cost table ``benchmarks/lookahead_replay.py --cost`` takes).
Runs are alternated (decode step, block, decode step, ...); prints medians and the median of per-pair ratios.

    PYTHONPATH=core:plugins/cpu python benchmarks/speculative.py [--model qwen3-0.6b] [--threads 1] [--reps 5]
    PYTHONPATH=core:plugins/cpu python benchmarks/speculative.py --gguf qwen2.5-coder-1.5b.gguf --blocks 2,3,4,5,6,8

``--live`` (with ``--gguf``): instead, ``hetero bench --spec lookahead:flat --spec lookahead`` on the bench's code and
chat prompts and a second code prompt not in its default set (``hetero.llm.speculative.bench.ALL_PROMPTS``), plain
decoding in the same repetitions, at each ``--threads`` (``-n`` tokens, ``--reps`` repetitions).
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


def measure(model: str, threads: int, reps: int, blocks: list[int], gguf: bool = False) -> None:
    if gguf:
        import hetero.llm

        llm = hetero.llm.load(model, backends=["cpu"], on_fallback="silent", threads=threads, context=1024)
    else:
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
    name = model if gguf else f"{model} q4"
    print(f"{name}, {threads} thread(s), prompt {PROMPT}, load average {os.getloadavg()[0]:.2f}")
    print("| tokens in the step | step ms (median) | x one decode step (median of pairs) |")
    print("|---|---|---|")
    one = [_timed(decode) for _ in range(reps)]
    print(f"| 1 | {1000 * statistics.median(one):.1f} | 1.00 |")
    curve = [1.0]
    for t in blocks:
        pairs = [(_timed(decode), _timed(lambda t=t: block(t))) for _ in range(reps)]
        curve.append(statistics.median(b / a for a, b in pairs))
        print(f"| {t} | {1000 * statistics.median(b for _, b in pairs):.1f} | {curve[-1]:.2f} |")
    print("cost curve (T = 1, " + ", ".join(map(str, blocks)) + "): " + " ".join(f"{c:.2f}" for c in curve))
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
    parser.add_argument("--gguf", help="a real model file instead of the synthetic models")
    parser.add_argument("--threads", type=int, nargs="+", default=[1])
    parser.add_argument("--live", action="store_true", help="lookahead against plain decoding on three prompts")
    parser.add_argument("-n", type=int, default=64, help="tokens per generation (--live)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--blocks", default="2,4,8,16", help="verify block sizes (tokens)")
    args = parser.parse_args()
    blocks = [int(b) for b in args.blocks.split(",")]
    if args.live:
        if not args.gguf:
            parser.error("--live needs --gguf MODEL (a real model: the prompts are text)")
        live(args.gguf, args.threads, args.n, args.reps)
        return
    for threads in args.threads:
        for model in [args.gguf] if args.gguf else args.model or ["qwen3-0.6b", "qwen3.5-0.8b"]:
            measure(model, threads, args.reps, blocks, gguf=bool(args.gguf))
            print()


def live(gguf: str, threads: list[int], n: int, reps: int) -> None:
    import hetero.llm
    from hetero.llm.speculative.bench import ALL_PROMPTS, bench_speculative, spec_table

    results = []
    for t in threads:
        llm = hetero.llm.load(gguf, backends=["cpu"], on_fallback="silent", threads=t, context=2048)
        results += bench_speculative(llm, ["lookahead:flat", "lookahead"], n_gen=n, repetitions=reps, threads=t,
                                     prompts=ALL_PROMPTS)
        print(spec_table(results[-2 * len(ALL_PROMPTS):]), flush=True)
    print(spec_table(results))


if __name__ == "__main__":
    main()
