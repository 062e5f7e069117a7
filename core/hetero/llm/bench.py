"""Throughput in the manner of llama.cpp's ``llama-bench``.

* ``pp P``: prefill P tokens into an empty cache; t/s = P / time.
* ``tg N``: decode N tokens one at a time after a one-token context; t/s = N / time.
* ``pp P + tg N``: prefill P then decode N on the same cache; t/s = (P + N) / time.

Tokens are seeded random ids and nothing is sampled (the logits are computed, not used), as llama-bench does.
Each test runs once untimed (warm-up: kernels prepared for the shapes), then ``repetitions`` timed times.

Hybrid models (GatedDeltaRule linear attention, Qwen3.5): with the nodes' ``mode`` left at "auto", every prefill
test runs twice, in the chunked form and in the recurrent form (the nodes' mode switched for the run, one form then
the other within each repetition so that a load change on a shared machine hits both alike): the row
``pp P (recurrent)`` and the chunked row's ``chunked_gain`` (median of the per-repetition ratios chunked t/s /
recurrent t/s) show what the chunked prefill form buys.
"""

from __future__ import annotations

import csv
import io
import json
import os
import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import TypedDict

import numpy as np

from ..progress import Progress
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
    linear_attention: str = ""  # GatedDeltaRule form of hybrid models: "chunked", "recurrent" or "auto"
    chunked_gain: float | None = None  # chunked rows of a comparison: median chunked / recurrent t/s

    @property
    def avg_ts(self) -> float:
        return statistics.fmean(self.samples_ts) if self.samples_ts else 0.0

    @property
    def stdev_ts(self) -> float:
        return statistics.stdev(self.samples_ts) if len(self.samples_ts) > 1 else 0.0

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "avg_ts": self.avg_ts, "stdev_ts": self.stdev_ts}


class _Shared(TypedDict):
    """The fields of a BenchResult that every test of one run shares."""

    model: str
    size_bytes: int
    params: int
    backend: str
    threads: int


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


LINEAR_ATTENTION_OP = "GatedDeltaRule"


def _linear_attention_nodes(llm: Llm) -> list:
    session = getattr(llm, "session", None)  # (benchmarks/llm.py also times llama.cpp through this function)
    if session is None:
        return []
    return [node for node in session.graph.nodes if node.op_type == LINEAR_ATTENTION_OP]


@contextmanager
def linear_attention_mode(llm: Llm, mode: str) -> Iterator[None]:
    """Run the model's GatedDeltaRule nodes in ``mode`` ("chunked", "recurrent", "auto") inside the block: their
    kernels read the attribute per call, so the loaded session switches forms without a reload."""
    nodes = _linear_attention_nodes(llm)
    before = [node.attrs.get("mode") for node in nodes]
    for node in nodes:
        node.attrs["mode"] = mode
    try:
        yield
    finally:
        for node, old in zip(nodes, before, strict=True):
            if old is None:
                node.attrs.pop("mode", None)
            else:
                node.attrs["mode"] = old


def bench(llm: Llm, tests: Sequence[tuple[int, int]], repetitions: int = 5, *, warmup: bool = True,
          seed: int = 0, threads: int | None = None, compare_linear_attention: bool | None = None,
          progress: bool = False) -> list[BenchResult]:
    """The tests in order. compare_linear_attention: prefill tests of a hybrid model in both GatedDeltaRule forms
    (None: when the nodes' mode is "auto"; see the module doc). progress: a bar over the tests (on a terminal)."""
    total = len(tests) * max(1, repetitions)
    with Progress(f"benchmarking {','.join(llm.backend_names())}", total, enabled=progress) as bar:
        return _bench(llm, tests, repetitions, warmup, seed, threads, compare_linear_attention, bar)


def _bench(llm: Llm, tests: Sequence[tuple[int, int]], repetitions: int, warmup: bool, seed: int,
           threads: int | None, compare_linear_attention: bool | None, bar: Progress) -> list[BenchResult]:
    rng = np.random.default_rng(seed)
    backend = ",".join(llm.backend_names())
    shared = _Shared(model=llm.name + (f" {llm.quant}" if llm.quant else ""), size_bytes=llm.size_bytes(),
                     params=llm.num_params(), backend=backend, threads=threads or llm.threads or os.cpu_count() or 1)
    nodes = _linear_attention_nodes(llm)
    modes = {str(node.attrs.get("mode", "auto")) for node in nodes}
    mode = modes.pop() if len(modes) == 1 else ("mixed" if modes else "")
    if compare_linear_attention is None:
        compare_linear_attention = mode == "auto"
    compare = compare_linear_attention and bool(nodes)
    results: list[BenchResult] = []
    for n_prompt, n_gen in tests:
        label = label_of(n_prompt, n_gen)
        bar.update(0, label)
        if compare and n_prompt and not n_gen:
            results.extend(_compare_forms(llm, n_prompt, repetitions, warmup, rng, shared))
            bar.update(max(1, repetitions), label)
            continue
        result = BenchResult(test=label, n_prompt=n_prompt, n_gen=n_gen, linear_attention=mode, **shared)
        if warmup:
            run_test(llm, n_prompt, min(n_gen, 1), rng)
        for rep in range(max(1, repetitions)):
            result.samples_ts.append(run_test(llm, n_prompt, n_gen, rng))
            bar.update(1, f"{label} {rep + 1}/{max(1, repetitions)}")
        results.append(result)
    llm.reset()
    return results


def _compare_forms(llm: Llm, n_prompt: int, repetitions: int, warmup: bool, rng: np.random.Generator,
                   shared: _Shared) -> list[BenchResult]:
    """One prefill test in the chunked and the recurrent form, alternating within each repetition."""
    label = label_of(n_prompt, 0)
    chunked = BenchResult(test=label, n_prompt=n_prompt, n_gen=0, linear_attention="chunked", **shared)
    recurrent = BenchResult(test=f"{label} (recurrent)", n_prompt=n_prompt, n_gen=0, linear_attention="recurrent",
                            **shared)
    forms = ((chunked, "chunked"), (recurrent, "recurrent"))
    if warmup:
        for _, form in forms:
            with linear_attention_mode(llm, form):
                run_test(llm, n_prompt, 0, rng)
    for _ in range(max(1, repetitions)):
        for result, form in forms:
            with linear_attention_mode(llm, form):
                result.samples_ts.append(run_test(llm, n_prompt, 0, rng))
    chunked.chunked_gain = statistics.median(c / r for c, r in zip(chunked.samples_ts, recurrent.samples_ts,
                                                                   strict=True))
    return [chunked, recurrent]


def markdown(results: Sequence[BenchResult]) -> str:
    hybrid = any(r.linear_attention for r in results)
    head = ("model", "size", "params", "backend", "threads", "test", "t/s")
    rows = [(*head[:6], "linear attn", *head[6:]) if hybrid else head]
    for r in results:
        row = (r.model, _size(r.size_bytes), _count(r.params), r.backend, str(r.threads), r.test,
               f"{r.avg_ts:.2f} ± {r.stdev_ts:.2f}")
        rows.append((*row[:6], r.linear_attention, *row[6:]) if hybrid else row)
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    right = {1, 2, 4, len(rows[0]) - 1}  # numbers align right, as llama-bench prints them

    def line(row: Sequence[str]) -> str:
        cells = [cell.rjust(w) if c in right else cell.ljust(w) for c, (cell, w) in enumerate(zip(row, widths,
                                                                                                   strict=True))]
        return "| " + " | ".join(cells) + " |"

    rule = "| " + " | ".join(("-" * (w - 1) + ":") if c in right else "-" * w for c, w in enumerate(widths)) + " |"
    gains = [f"{r.test} {r.chunked_gain:.2f}x" for r in results if r.chunked_gain is not None]
    notes = [f"\nlinear attention, chunked / recurrent prefill (median of paired runs): {', '.join(gains)}"] if gains \
        else []
    return "\n".join([line(rows[0]), rule, *(line(r) for r in rows[1:]), *notes])


OUTPUT_FORMATS = ("md", "json", "jsonl", "csv")


def formatted(results: Sequence[BenchResult], output: str = "md") -> str:
    """The results as llama-bench's ``-o``: a markdown table, a JSON array, JSON lines, or CSV with a header."""
    if output == "md":
        return markdown(results)
    rows = [r.as_dict() for r in results]
    if output == "json":
        return json.dumps(rows, indent=2)
    if output == "jsonl":
        return "\n".join(json.dumps(row) for row in rows)
    if output == "csv":
        out = io.StringIO()
        columns = [k for k in (rows[0] if rows else {}) if k != "samples_ts"] + ["samples_ts"]
        writer = csv.DictWriter(out, columns, lineterminator="\n")
        writer.writeheader()
        for result, row in zip(results, rows, strict=True):
            writer.writerow({**row, "samples_ts": ";".join(f"{v:.4f}" for v in result.samples_ts)})
        return out.getvalue().rstrip("\n")
    raise ValueError(f"output format {output!r}; expected one of {OUTPUT_FORMATS}")


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.2f} MiB"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M" if n >= 1e6 else f"{n / 1e3:.2f} K"
