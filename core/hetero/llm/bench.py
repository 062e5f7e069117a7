"""Throughput in the manner of llama.cpp's ``llama-bench``.

* ``pp P``: prefill P tokens into an empty cache; t/s = P / time.
* ``tg N``: decode N tokens one at a time after a one-token context; t/s = N / time.
* ``pp P + tg N``: prefill P then decode N on the same cache; t/s = (P + N) / time.

Tokens are seeded random ids and nothing is sampled (the logits are computed, not used), as llama-bench does.
Each test runs once untimed (warm-up: kernels prepared for the shapes), then ``repetitions`` timed times.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from .model import Llm


@dataclass
class BenchResult:
    model: str
    size_bytes: int
    params: int
    backend: str
    threads: int
    test: str
    n_prompt: int
    n_gen: int
    samples_ts: list[float] = field(default_factory=list)

    @property
    def avg_ts(self) -> float:
        return statistics.fmean(self.samples_ts) if self.samples_ts else 0.0

    @property
    def stdev_ts(self) -> float:
        return statistics.stdev(self.samples_ts) if len(self.samples_ts) > 1 else 0.0

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "avg_ts": self.avg_ts, "stdev_ts": self.stdev_ts}


def label_of(n_prompt: int, n_gen: int) -> str:
    if n_prompt and n_gen:
        return f"pp{n_prompt}+tg{n_gen}"
    return f"pp{n_prompt}" if n_prompt else f"tg{n_gen}"


def plan(prompts: Sequence[int], gens: Sequence[int], pairs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The (n_prompt, n_gen) tests in llama-bench order: prefill tests, decode tests, then the pairs."""
    return [(p, 0) for p in prompts if p > 0] + [(0, n) for n in gens if n > 0] + [(p, n) for p, n in pairs]


def run_test(llm: Llm, n_prompt: int, n_gen: int, rng: np.random.Generator) -> float:
    """One timed run; returns tokens per second."""
    vocab = llm.config.vocab_size
    llm.reset()
    if not n_prompt:
        llm.forward([int(rng.integers(vocab))])  # the short context decode starts from (untimed)
    tokens = rng.integers(0, vocab, size=n_prompt + n_gen).tolist()
    started = time.perf_counter()
    if n_prompt:
        llm.prefill(tokens[:n_prompt])
    for token in tokens[n_prompt:]:
        llm.forward([token])
    elapsed = time.perf_counter() - started
    return (n_prompt + n_gen) / elapsed if elapsed > 0 else float("inf")


def bench(llm: Llm, tests: Sequence[tuple[int, int]], repetitions: int = 5, *, warmup: bool = True,
          seed: int = 0, threads: int | None = None) -> list[BenchResult]:
    rng = np.random.default_rng(seed)
    backend = ",".join(llm.backend_names())
    shared = dict(model=llm.name + (f" {llm.quant}" if llm.quant else ""), size_bytes=llm.size_bytes(),
                  params=llm.num_params(), backend=backend, threads=threads or llm.threads or os.cpu_count() or 1)
    results = []
    for n_prompt, n_gen in tests:
        result = BenchResult(test=label_of(n_prompt, n_gen), n_prompt=n_prompt, n_gen=n_gen, **shared)
        if warmup:
            run_test(llm, n_prompt, min(n_gen, 1), rng)
        for _ in range(max(1, repetitions)):
            result.samples_ts.append(run_test(llm, n_prompt, n_gen, rng))
        results.append(result)
    llm.reset()
    return results


def markdown(results: Sequence[BenchResult]) -> str:
    rows = [("model", "size", "params", "backend", "threads", "test", "t/s")]
    for r in results:
        rows.append((r.model, _size(r.size_bytes), _count(r.params), r.backend, str(r.threads), r.test,
                     f"{r.avg_ts:.2f} ± {r.stdev_ts:.2f}"))
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    right = {1, 2, 4, 6}  # numbers align right, as llama-bench prints them

    def line(row: Sequence[str]) -> str:
        cells = [cell.rjust(w) if c in right else cell.ljust(w) for c, (cell, w) in enumerate(zip(row, widths,
                                                                                                   strict=True))]
        return "| " + " | ".join(cells) + " |"

    rule = "| " + " | ".join(("-" * (w - 1) + ":") if c in right else "-" * w for c, w in enumerate(widths)) + " |"
    return "\n".join([line(rows[0]), rule, *(line(r) for r in rows[1:])])


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.2f} MiB"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M" if n >= 1e6 else f"{n / 1e3:.2f} K"
