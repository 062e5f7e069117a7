"""Aggregate decode throughput of batched sequences (``hetero.llm.batch``) at 1, 2, 4, 8 streams, library level.

    python benchmarks/batch_decode.py --model qwen3-0.6b-q4_k_m.gguf [--streams 1,2,4,8] [--tokens 16]
                                      [--prompt 64] [--threads 2] [--rounds 3] [--mode step,threads,alone]

One model is loaded with ``slots = max(streams)`` (one copy of the weights). Per round and stream count B (the
counts rotate from round to round, so a change in the machine's load spreads over all of them): B sequences are
prefilled with distinct prompts of ``--prompt`` random token ids (not timed), then ``--tokens`` greedy decode steps
are timed. Aggregate tok/s = B x tokens / wall time. Modes:

* ``step``: one thread calls ``decode_step`` over the B sequences (the batched step alone);
* ``threads``: B threads, each decoding its sequence with ``forward`` (what ``hetero serve -np N`` does: the
  batcher gathers their steps);
* ``alone``: a second model loaded with one slot decodes one sequence (the one-sequence step: the 1-stream
  baseline the ratios are taken against).

Prints a markdown table of medians over the rounds, with the load average; the machine is shared, so compare the
rows of one run only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT / "core", ROOT / "plugins" / "cpu"):
    sys.path.insert(0, str(path))


def _prompts(count: int, length: int, vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(7)
    return [rng.integers(100, min(vocab, 30000), size=length).tolist() for _ in range(count)]


def _greedy(row: np.ndarray) -> int:
    return int(np.argmax(row))


def run_step(seqs: list[Any], prompts: list[list[int]], tokens: int) -> float:
    from hetero.llm.batch import decode_step

    rows = [_greedy(s.prefill(p)[-1]) for s, p in zip(seqs, prompts, strict=True)]
    started = time.perf_counter()
    for _ in range(tokens):
        rows = [_greedy(r) for r in decode_step(seqs, rows)]
    return len(seqs) * tokens / (time.perf_counter() - started)


def run_threads(seqs: list[Any], prompts: list[list[int]], tokens: int) -> float:
    firsts = [_greedy(s.prefill(p)[-1]) for s, p in zip(seqs, prompts, strict=True)]
    barrier = threading.Barrier(len(seqs) + 1)

    def decode(seq: Any, token: int) -> None:
        barrier.wait()
        for _ in range(tokens):
            token = _greedy(seq.forward([token])[-1])
        seq.idle()

    threads = [threading.Thread(target=decode, args=(s, t)) for s, t in zip(seqs, firsts, strict=True)]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    return len(seqs) * tokens / (time.perf_counter() - started)


def run_alone(llm: Any, prompts: list[list[int]], tokens: int) -> float:
    """One sequence on a one-slot model: the tok/s of one stream."""
    llm.reset()
    token = _greedy(llm.prefill(prompts[0])[-1])
    started = time.perf_counter()
    for _ in range(tokens):
        token = _greedy(llm.forward([token])[-1])
    return tokens / (time.perf_counter() - started)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a .gguf file or a Hugging Face folder")
    p.add_argument("--streams", default="1,2,4,8")
    p.add_argument("--tokens", type=int, default=16, help="timed decode steps per sequence")
    p.add_argument("--prompt", type=int, default=64, help="prompt tokens per sequence (not timed)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--mode", default="step,threads,alone")
    args = p.parse_args()
    import hetero.llm

    streams = [int(s) for s in args.streams.split(",")]
    modes = args.mode.split(",")
    common = dict(backends=["cpu"], threads=args.threads, context=args.context, on_fallback="silent")
    multi = hetero.llm.load(args.model, slots=max(streams), **common)
    single = hetero.llm.load(args.model, **common) if "alone" in modes else None
    prompts = _prompts(max(streams), args.prompt, multi.config.vocab_size)
    results: dict[tuple[str, int], list[float]] = {}
    loads = []
    for r in range(args.rounds):
        order = streams[r % len(streams):] + streams[:r % len(streams)]
        for b in order:
            for mode in modes:
                if mode == "alone" and b != 1:
                    continue  # one stream's figure: the same at every B
                seqs = multi.sequences()[:b]
                for s in seqs:
                    s.reset()
                if mode == "step":
                    rate = run_step(seqs, prompts[:b], args.tokens)
                elif mode == "threads":
                    rate = run_threads(seqs, prompts[:b], args.tokens)
                else:
                    assert single is not None
                    rate = run_alone(single, prompts[:b], args.tokens)
                results.setdefault((mode, b), []).append(rate)
                loads.append(os.getloadavg()[0])
                print(f"round {r + 1} {mode} B={b}: {rate:.2f} tok/s (load {loads[-1]:.1f})", file=sys.stderr)
    print(f"\n{multi.name} {multi.quant}, {args.threads} thread(s), {args.prompt}-token prompts, {args.tokens} "
          f"decode steps, medians of {args.rounds} rounds; load average {min(loads):.1f}-{max(loads):.1f}\n")
    base = statistics.median(results[("alone", 1)]) if ("alone", 1) in results else None
    head = "| streams | " + " | ".join(f"{m} tok/s" for m in modes) + (" | step vs 1 stream alone |" if base else " |")
    print(head)
    print("|" + " ---: |" * (head.count("|") - 1))
    for b in streams:
        cells = [f"{statistics.median(results[(m, b)]):.2f}" if (m, b) in results else "-" for m in modes]
        ratio = ""
        if base and "step" in modes:
            ratio = f" {statistics.median(results[('step', b)]) / base:.2f}x |"
        print(f"| {b} | " + " | ".join(cells) + " |" + ratio)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
