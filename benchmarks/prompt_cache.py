"""Time to first token with and without a prefix-cache file (``Llm.save_prompt_cache``, ``generate(prompt_cache=)``).

    python benchmarks/prompt_cache.py /work/models/qwen2.5-coder-1.5b.gguf -p 2048,8192 -t 1

For each prefix length N: a prompt of N tokens of prose (the needle eval's default haystack, the Python language
reference) followed by a short question (the rest). The model (loaded once per N, context N + 256):

0. a warm-up: a prompt of one prefill chunk and the question, so both step shapes are planned before timing;
1. without a file: ``generate(prompt, 1 token)`` from an empty cache, timed to the first token (the whole prompt
   is prefilled);
2. the cache rolled back to the N prefix tokens and saved with ``save_prompt_cache`` (timed, file size);
3. with the file: the cache emptied, ``generate(prompt, 1 token, prompt_cache=FILE, prompt_cache_ro=True)`` timed
   to the first token (the file verified, mapped and loaded, then only the question prefilled), ``-r`` times; and
   ``load_prompt_cache`` alone. The first token must be the same as without the file.

The file is read from the page cache (it was just written); "load from disk" times one ``load_prompt_cache`` after
the file's pages were dropped from the page cache (``posix_fadvise(DONTNEED)`` on that file alone). The model's
content hash is computed once (seconds for a 1 GB file) and memoized; the one-off cost is printed apart. Prints the
load average: on a shared machine only the ratio within one run means much.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import hetero.llm
from hetero.llm.model_hash import file_sha256
from hetero.llm.needle import haystack_sentences

QUESTION = "\n\nQuestion: which statement does the text above describe first? Answer in one sentence."


def prefix_ids(llm: hetero.llm.Llm, n: int) -> list[int]:
    sentences, _ = haystack_sentences()
    text, ids = "", []
    for sentence in sentences * 8:
        text += sentence
        if len(text) > 6 * n:
            ids = llm.tokenize(text)
            if len(ids) >= n:
                return ids[:n]
    raise SystemExit(f"the haystack holds fewer than {n} tokens")


def first_token(llm: hetero.llm.Llm, prompt: list[int], **options: object) -> tuple[float, list[int]]:
    started = time.perf_counter()
    llm.generate(prompt, 1, temperature=0, **options)
    return time.perf_counter() - started, list(llm.last.tokens)


def evict(path: Path) -> None:
    """Drop the file's pages from the page cache (this file only), so the next read comes from the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def run(model: str, n: int, threads: int | None, repeats: int, kv_cache: str, folder: Path) -> dict[str, float]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        llm = hetero.llm.load(model, backends=["cpu"], threads=threads, context=n + 256, kv_cache=kv_cache,
                              on_fallback="silent")
    prefix = prefix_ids(llm, n)
    prompt = prefix + llm.tokenize(QUESTION, add_special_tokens=False)
    path = folder / f"prefix-{n}.hpc"
    first_token(llm, prompt[-(llm.prefill_chunk + len(prompt) - n):])  # warm-up: plans for both step shapes
    llm.reset()
    cold, want = first_token(llm, prompt)
    llm.rollback(n)
    started = time.perf_counter()
    size = llm.save_prompt_cache(path)
    save = time.perf_counter() - started
    warm, loads = [], []
    for _ in range(repeats):
        llm.reset()
        seconds, got = first_token(llm, prompt, prompt_cache=path, prompt_cache_ro=True)
        if got != want or llm.stats.cached_tokens != n:
            raise SystemExit(f"{n}: with the file the first token is {got} ({llm.stats.cached_tokens} cached), "
                             f"without {want}")
        warm.append(seconds)
        llm.reset()
        started = time.perf_counter()
        if llm.load_prompt_cache(path) != n:
            raise SystemExit(f"{n}: load_prompt_cache did not restore {n} tokens")
        loads.append(time.perf_counter() - started)
    llm.reset()
    evict(path)
    started = time.perf_counter()
    llm.load_prompt_cache(path)
    cold_load = time.perf_counter() - started
    llm.close()
    return {"prefix": n, "rest": len(prompt) - n, "without": cold, "with": statistics.median(warm),
            "size": size, "load": statistics.median(loads), "save": save, "cold_load": cold_load}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("-p", "--prefix", default="2048,8192", help="prefix lengths in tokens (default 2048,8192)")
    parser.add_argument("-t", "--threads", type=int, default=None)
    parser.add_argument("-r", "--repeats", type=int, default=3, help="runs with the file (the median is shown)")
    parser.add_argument("--kv-cache", default="f16")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.1f} / {os.getloadavg()[1]:.1f} / {os.getloadavg()[2]:.1f}",
          file=sys.stderr)
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["HETERO_CACHE_DIR"] = scratch  # an empty hash index: the first hash is the one-off cost
        started = time.perf_counter()
        file_sha256(Path(args.model))
        hashing = time.perf_counter() - started
        started = time.perf_counter()
        file_sha256(Path(args.model))
        memo = time.perf_counter() - started
        print(f"model {Path(args.model).name}, threads {args.threads or 'all'}, KV cache {args.kv_cache}; content "
              f"hash {hashing:.2f} s once, then {memo * 1e3:.2f} ms (memoized)", flush=True)
        print("| prefix tokens | rest | TTFT without file (s) | TTFT with file (s) | speed-up | file (MiB) | "
              "load (s) | load from disk (s) | save (s) |")
        print("|---|---|---|---|---|---|---|---|---|", flush=True)
        for n in args.prefix.split(","):
            r = run(args.model, int(n), args.threads, args.repeats, args.kv_cache, Path(scratch))
            print(f"| {r['prefix']} | {r['rest']} | {r['without']:.2f} | {r['with']:.3f} | "
                  f"{r['without'] / r['with']:.0f}x | {r['size'] / 2**20:.1f} | {r['load']:.3f} | "
                  f"{r['cold_load']:.3f} | {r['save']:.3f} |", flush=True)
    load = os.getloadavg()
    print(f"load average at end: {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
