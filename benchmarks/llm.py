"""hetero against llama.cpp on the same GGUF files: pp512 / tg128 tokens per second, their ratios, peak memory, load
time, and how close decode comes to the machine's memory-bandwidth bound. Prints a markdown table.

    python benchmarks/llm.py [--models qwen3-0.6b,qwen2.5-1.5b,qwen3.5-0.8b,qwen3.5-2b] [--types Q4_0,Q4_K_M,Q8_0]
                             [--threads 2] [--reps 5] [--skip-build] [--json] [--cache-dir DIR]

Needs ``gguf`` and ``llama-cpp-python`` (PyPI; pip compiles llama.cpp from its source distribution, which takes a
while on 2 cores), or ``--llama-bench PATH``: a natively built ``llama-bench`` binary that runs llama.cpp instead
(``run_llama_bench``; not with ``--pairs``). The hetero under test is this checkout: ``core/`` and ``plugins/cpu``
go first on the workers' ``PYTHONPATH`` (``--installed`` uses the installed packages instead).

Models (built once, kept in ``--cache-dir``, default ``~/.cache/hetero/bench-models``, never in the repository):
random weights (``scripts/make_gguf_fixtures.py``'s ``random_folder``) in the shapes of Qwen3-0.6B, Qwen2.5-1.5B,
and Qwen3.5-0.8B / 2B (llama.cpp's ``qwen35`` architecture: 3 Gated DeltaNet layers then a gated full-attention
layer, repeated) with a 32768-token vocabulary (the real ones have ~152k / ~248k: the LM head is 5-8x smaller here),
tied embeddings as in the real models. Each is written as an F16 GGUF by ``scripts/make_gguf_fixtures.py``'s
``convert`` (the ``gguf`` package's writer, in llama.cpp's layout; the tokenizer is the test fixtures' byte-level
BPE, padded to the vocabulary size), then quantized by llama.cpp's own quantizer
(``llama_model_quantize``) into Q4_0, Q4_K_M and Q8_0 — the mixes llama.cpp makes (e.g. the tied embedding / LM head
becomes Q6_K in the Q4_0 and Q8_0 files, as it does for real models). Both runtimes load the same files.

Measurement (each runtime in its own subprocess, one after the other, alternating which goes first):

* the timing core is ``hetero.llm.bench`` (llama-bench semantics) for both runtimes: llama.cpp is driven through a
  small adapter with the ``Llm`` methods ``bench`` calls (``reset`` / ``prefill`` / ``forward``) that calls
  ``llama_decode`` on ``llama_batch_get_one`` batches, as llama-bench does (not the high-level ``Llama.eval``, whose
  Python overhead would flatter hetero). One untimed warm-up run per test, then ``--reps`` timed runs; tokens are
  seeded random ids; only the last token's logits are computed in a prefill by both.
* pp512: 512 prompt tokens into an empty cache; tg128: 128 tokens decoded one at a time.
* t/s: the median of the repetitions (mean ± std alongside); ratios are hetero / llama.cpp of the medians, from this
  run.
* peak memory: the worker's ``ru_maxrss`` (resident set high-water mark: the interpreter, the imported modules, the
  touched pages of the memory-mapped file and everything allocated), and the same taken before loading (``base``);
  the resident set after loading and at the end, split into anonymous memory (repacked weights, caches) and file
  pages (the mapped model, libraries), from /proc/self/status.
* load: the wall time of ``hetero.llm.load`` / ``llama_model_load_from_file`` + ``llama_init_from_model`` on a file
  already in the page cache.
* bandwidth: the native read probe (``benchmarks/read_bandwidth.py``: N threads of one process each stream their
  own 256 MiB buffer, on 4 KiB and on 2 MiB pages; best pass of either), at each thread count of the run. A decode
  step reads every weight once (the tied embedding table in full, as the LM head) plus the KV cache (and, for
  Qwen3.5, the float32 recurrent state of each Gated DeltaNet layer), so the bound is bandwidth / bytes per token;
  "% of bound" = t/s x bytes per token / bandwidth. The VM this runs on has a fast and a slow memory phase (the
  2-thread probe 33 or 57 GB/s an hour apart), so a probe taken once at the start can be in another phase than a
  decode run: each engine's run is bracketed by its own probes at its thread count (``--probe around``, the
  default: one right before and one right after the run), and its "% of bound" is against the median of those
  probes. The table prints them (``before -> after`` GB/s) beside the session's start probe, so a phase change
  during a run shows; ``--probe start`` is the old single probe per thread count.

Paired mode (``--pairs N``): the mode above runs each engine's whole worker one after the other, minutes apart, and
on this VM the two runs can meet different memory phases (a 2-thread probe of ~35 GB/s in some minutes, 56-65 in
others): a ratio from runs in different phases measures the VM, not the engines. With ``--pairs N`` both engines
are loaded once in resident workers (``benchmarks/resident.py``, the mechanism of ``decode_ab.py``) and warmed up
(one untimed run of each test), then take N rounds of turns: each round one run of each test by each engine, back
to back, the first engine alternating round by round, and a short read probe at the run's thread count
(``quick_bandwidth``) before the first round and after each. Reported per file, thread count and test: each engine's
median t/s, the median of the per-round ratios (hetero / llama.cpp of the same round) with their min-max and
quartiles, the ratio of the medians beside it, the probes' range, and "% of bound" with each round against the mean
of its two probes (the median over the rounds). A round's probes are seconds from its tg runs and can meet another
phase, so with ``--probe around`` (the default) each engine's tg run is also bracketed by a short probe
(``run_bandwidth``, ~0.35 s) right before and right after it (the engines run back to back: the probe between them is
the first one's "after" and the second one's "before"): each run's "% of own-probe bound" is against the mean of its
two probes, and a run whose probes differ by more than 15 % is flagged "phase changed" (its fraction then says
little; the table gives the median over the other runs too, and a line per run below it). The same probe passes are
also timed by CPU clock: a run is flagged "lost CPU" where a probe beside it read > 15 % faster by CPU time than by
the wall clock (other processes took the CPU: its GB/s drop is not the memory's). "read GB/s": an engine's
decode t/s x the bytes a step reads (the bound's bytes), to set beside the probes' GB/s. A worker that dies or does
not answer within ``--timeout`` seconds ends its row with the error; both workers are stopped.

    python benchmarks/llm.py --files a.gguf,b.gguf --threads 2 --pairs 10

The machine is shared (see shared/FACTS.md: a busy neighbour halves the cores): compare ratios from one run, repeat.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # once: its siblings (read_bandwidth, resident), imported lazily
CACHE = Path(os.environ.get("HETERO_BENCH_MODELS", Path.home() / ".cache" / "hetero" / "bench-models"))
VOCAB = 32768
PP, TG = 512, 128

# Hugging Face config.json fields of each shape (random weights; the tokenizer comes from the fixture named).
_QWEN35_LINEAR = dict(linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128,
                      linear_value_head_dim=128, linear_conv_kernel_dim=4, full_attention_interval=4,
                      layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(24)],
                      rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0,
                                       "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10]})
MODELS: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": dict(
        tokenizer="qwen3", architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=1024,
        intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        rope_theta=1_000_000.0, max_position_embeddings=40960),
    "qwen2.5-1.5b": dict(
        tokenizer="qwen2", architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=1536,
        intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
        rope_theta=1_000_000.0, max_position_embeddings=32768),
    # Qwen3.5 (llama.cpp architecture "qwen35"): 3 Gated DeltaNet layers then one gated full-attention layer,
    # repeated; the shapes of hetero.llm.synthetic.HYBRID_SHAPES.
    "qwen3.5-0.8b": dict(
        tokenizer="qwen3", architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", hidden_size=1024,
        intermediate_size=3584, num_hidden_layers=24, num_attention_heads=8, num_key_value_heads=2, head_dim=256,
        max_position_embeddings=262144, **_QWEN35_LINEAR),
    "qwen3.5-2b": dict(
        tokenizer="qwen3", architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", hidden_size=2048,
        intermediate_size=6144, num_hidden_layers=24, num_attention_heads=8, num_key_value_heads=2, head_dim=256,
        max_position_embeddings=262144, **_QWEN35_LINEAR),
}
# llama.cpp's llama_ftype values
TYPES = {"Q4_0": 2, "Q4_K_M": 15, "Q8_0": 7}


def log(msg: str) -> None:
    print(f"[llm-bench] {msg}", file=sys.stderr, flush=True)


# -- model files -------------------------------------------------------------------------------------------------------
def model_path(cache: Path, model: str, qtype: str) -> Path:
    return cache / f"{model}-v{VOCAB // 1024}k-{qtype.lower()}.gguf"


def _random_folder(dest: Path, model: str, fixtures: Any, seed: int = 0) -> Path:
    """A Hugging Face folder (config, the fixture tokenizer, F16 safetensors of random weights) of ``model``."""
    spec = dict(MODELS[model])
    tokenizer = ROOT / "tests" / "fixtures" / "llm" / spec.pop("tokenizer")
    cfg = {**spec, "vocab_size": VOCAB, "tie_word_embeddings": True, "rms_norm_eps": 1e-6, "bos_token_id": 0,
           "eos_token_id": 2, "hidden_act": "silu", "dtype": "bfloat16",
           "attention_bias": spec["model_type"] == "qwen2"}
    return fixtures.random_folder(dest, cfg, seed, tokenizer_from=tokenizer)


def build_f16(cache: Path, model: str) -> Path:
    out = model_path(cache, model, "F16")
    if out.is_file():
        return out
    sys.path.insert(0, str(ROOT / "scripts"))
    import make_gguf_fixtures as fixtures  # the GGUF writer the test fixtures use

    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        started = time.perf_counter()
        log(f"{model}: drawing random weights (F16 safetensors) ...")
        folder = _random_folder(Path(tmp) / model, model, fixtures)
        log(f"{model}: writing the F16 GGUF with the gguf package's writer ...")
        part = Path(tmp) / out.name
        fixtures.convert(folder, part, "F16")
        os.replace(part, out)
    log(f"{model}: {out} ({out.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - started:.0f} s")
    return out


def build_quant(cache: Path, model: str, qtype: str, threads: int) -> Path:
    out = model_path(cache, model, qtype)
    if out.is_file():
        return out
    src = build_f16(cache, model)
    part = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    logfile = cache / "quantize.log"
    log(f"{model}: quantizing to {qtype} with llama.cpp's llama_model_quantize (log: {logfile}) ...")
    started = time.perf_counter()
    with open(logfile, "a") as err:
        done = subprocess.run([sys.executable, __file__, "--worker", "quantize", "--model", str(src), "--out",
                               str(part), "--ftype", str(TYPES[qtype]), "--threads", str(threads)],
                              stderr=err, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0 or not part.is_file():
        part.unlink(missing_ok=True)
        raise SystemExit(f"llama_model_quantize failed for {model} {qtype} (exit {done.returncode}); see {logfile}")
    os.replace(part, out)
    log(f"{model}: {out.name} ({out.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - started:.0f} s")
    return out


def _quantize_worker(args: argparse.Namespace) -> int:
    import ctypes

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = args.threads
    params.ftype = args.ftype
    rc = llama_cpp.llama_model_quantize(args.model.encode(), args.out.encode(), ctypes.byref(params))
    return 1 if rc else 0


def file_stats(path: Path, tg: int) -> dict[str, Any]:
    """Bytes a decode step reads from this file's weights (+ the f16 KV cache at the mean tg context, + the float32
    recurrent state of Gated DeltaNet layers), and the mix of tensor types."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    arch = str(reader.fields["general.architecture"].contents())

    def meta(key: str, default: int | None = None) -> int:
        field = reader.fields.get(f"{arch}.{key}")
        if field is None and default is not None:
            return default
        return int(field.contents())  # type: ignore[union-attr]  # no default: a missing key fails here

    weights = sum(int(t.n_bytes) for name, t in tensors.items() if name != "token_embd.weight")
    embd = tensors["token_embd.weight"]
    tied = "output.weight" not in tensors
    weights += int(embd.n_bytes) if tied else int(embd.n_bytes) // int(embd.shape[-1])  # LM head, or one row
    kv_heads, heads = meta("attention.head_count_kv"), meta("attention.head_count")
    head_dim = meta("attention.key_length", meta("embedding_length") // heads)
    attention_layers = sum(1 for name in tensors if name.endswith(".attn_k.weight"))  # hybrids: full-attention only
    kv = 2 * attention_layers * kv_heads * head_dim * 2 * (tg + 1) / 2
    linear_layers = sum(1 for name in tensors if name.endswith(".ssm_a"))
    state = linear_layers * meta("ssm.time_step_rank", 0) * meta("ssm.state_size", 0) * 4 * (
        meta("ssm.inner_size", 0) // max(meta("ssm.time_step_rank", 1), 1))
    mix: dict[str, int] = {}
    for t in tensors.values():
        if len(t.shape) > 1:
            mix[t.tensor_type.name] = mix.get(t.tensor_type.name, 0) + 1
    return {"file_bytes": path.stat().st_size, "weight_bytes_per_token": weights, "kv_bytes_per_token": int(kv),
            "state_bytes_per_token": int(state), "bytes_per_token": int(weights + kv + state), "tensor_types": mix,
            "architecture": arch}


# -- memory bandwidth --------------------------------------------------------------------------------------------------
def bandwidth(threads: int) -> dict[str, float]:
    """Read bandwidth in GB/s of ``threads`` threads of one process (the native probe, benchmarks/read_bandwidth.py):
    "best" (the best pass on either page size: the ceiling of a decode step at that thread count), "best_4k",
    "best_2m"."""
    from read_bandwidth import measure

    return measure([threads], mib=256, reps=7, rounds=2)[threads]


def bracket_probe(threads: int, run: Any, probe: Any = None) -> dict[str, Any]:
    """``run()`` (an engine's decode run, a result dict) between two read probes at ``threads`` threads, taken right
    before and right after it, so the bound is measured in the VM's phase of that run; the probes' best GB/s go
    into the result as "probes", the 1-minute load average at each as "probe_load"."""
    probe = probe or bandwidth
    before, load_before = probe(threads)["best"], os.getloadavg()[0]
    result = dict(run())
    after, load_after = probe(threads)["best"], os.getloadavg()[0]
    result["probes"], result["probe_load"] = [before, after], [load_before, load_after]
    return result


def run_bound(run: dict[str, Any], fallback: float | None) -> float | None:
    """The GB/s a run's "% of bound" is against: the median of its own probes, else the session's start probe."""
    probes = run.get("probes")
    return statistics.median(probes) if probes else fallback


def pct_of_bound(tps: float | None, bytes_per_token: int, bound: float | None) -> float | None:
    """Decode t/s as a percentage of the bandwidth bound (bound GB/s over the bytes a step reads)."""
    return 100 * tps * bytes_per_token / (bound * 1e9) if tps and bound else None


def _probes(run: dict[str, Any]) -> str:
    probes = run.get("probes")
    return " -> ".join(f"{p:.1f}" for p in probes) if probes else "—"


# -- workers ---------------------------------------------------------------------------------------------------------
class LlamaCpp:
    """llama.cpp through llama-cpp-python's low-level API, with the methods ``hetero.llm.bench`` calls on an ``Llm``.

    Every call is one ``llama_decode`` on a ``llama_batch_get_one`` batch followed by ``llama_synchronize``, as in
    llama-bench (test_prompt / test_gen); the batch asks for the last token's logits only.
    """

    def __init__(self, path: str, threads: int, n_ctx: int) -> None:
        import llama_cpp as lc

        self.lc = lc
        lc.llama_backend_init()
        mparams = lc.llama_model_default_params()
        mparams.n_gpu_layers = 0
        self.model = lc.llama_model_load_from_file(path.encode(), mparams)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_threads = cparams.n_threads_batch = threads
        cparams.no_perf = True
        self.n_batch = int(cparams.n_batch)
        self.ctx = lc.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            raise RuntimeError("llama_init_from_model failed")
        self.memory = lc.llama_get_memory(self.ctx)
        vocab = lc.llama_model_get_vocab(self.model)
        self.config = SimpleNamespace(vocab_size=int(lc.llama_vocab_n_tokens(vocab)))
        self.settings = {"n_ctx": n_ctx, "n_batch": self.n_batch, "n_ubatch": int(cparams.n_ubatch),
                         "flash_attn_type": int(cparams.flash_attn_type), "type_k": int(cparams.type_k),
                         "type_v": int(cparams.type_v), "system": lc.llama_print_system_info().decode().strip()}
        self.name, self.quant, self.threads = Path(path).stem, "", threads

    def reset(self) -> None:
        self.lc.llama_memory_clear(self.memory, True)

    def forward(self, ids: Sequence[int]) -> None:
        tokens = (self.lc.llama_token * len(ids))(*ids)
        rc = self.lc.llama_decode(self.ctx, self.lc.llama_batch_get_one(tokens, len(ids)))
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        self.lc.llama_synchronize(self.ctx)

    def prefill(self, ids: Sequence[int]) -> None:
        for start in range(0, len(ids), self.n_batch):
            self.forward(ids[start:start + self.n_batch])

    def size_bytes(self) -> int:
        return int(self.lc.llama_model_size(self.model))

    def num_params(self) -> int:
        return int(self.lc.llama_model_n_params(self.model))

    def backend_names(self) -> list[str]:
        return ["llama.cpp"]


def _max_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _memory() -> dict[str, int]:
    """The resident set now, split into anonymous memory (allocations: repacked weights, caches) and file pages
    (the mapped model file, libraries), from /proc/self/status (Linux; empty elsewhere)."""
    fields = {"VmRSS": "rss", "RssAnon": "anon", "RssFile": "file", "VmHWM": "peak"}
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key in fields:
                    out[fields[key]] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def _load_engine(args: argparse.Namespace, n_ctx: int) -> tuple[Any, dict[str, Any]]:
    """The worker's engine (hetero's ``Llm`` or the ``LlamaCpp`` adapter), loaded, and what was measured loading it:
    load_s, base_rss (before loading, the engine's modules imported), mem_loaded, info."""
    if args.worker == "hetero":
        import warnings

        import hetero
        from hetero.llm import load

        base_rss = _max_rss()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            started = time.perf_counter()
            llm: Any = load(args.model, backends=["cpu"], on_fallback="silent", threads=args.threads,
                            context=n_ctx, progress=False)
        load_s = time.perf_counter() - started
        import hetero_cpu

        info = {"fallback": llm.session.placement.fallback_summary() or "none",
                "placement": llm.session.placement.counts(), "hetero": hetero.__file__,
                "hetero_cpu": hetero_cpu.__file__}
    else:
        import llama_cpp  # noqa: F401  (imported before the base RSS is taken, like hetero above)

        base_rss = _max_rss()
        started = time.perf_counter()
        llm = LlamaCpp(args.model, args.threads, n_ctx)
        load_s = time.perf_counter() - started
        info = dict(llm.settings)
    return llm, {"load_s": load_s, "base_rss": base_rss, "mem_loaded": _memory(), "info": info}


def _bench_worker(args: argparse.Namespace) -> int:
    from hetero.llm.bench import bench, plan

    tests = plan([args.pp], [args.tg], [])
    llm, loaded = _load_engine(args, args.pp + args.tg + 8)
    results = bench(llm, tests, args.reps, warmup=True, seed=args.seed, threads=args.threads)
    print(json.dumps({**loaded, "peak_rss": _max_rss(), "mem_end": _memory(),
                      "tests": {r.test: r.samples_ts for r in results}}))
    return 0


def _resident_worker(args: argparse.Namespace) -> int:
    """--pairs: load, one untimed run of each test (the warm-up, as ``bench`` does), print "ready" + what loading
    measured, then answer each stdin line naming a test ("pp512", "tg128") with one timed run of it: {"ts": t/s}.
    The timing is ``hetero.llm.bench.run_test``'s, for both engines; both draw their tokens from the same seed, so
    the two engines of a round run the same tokens."""
    import numpy as np

    from hetero.llm.bench import label_of, plan, run_test

    tests = {label_of(p, g): (p, g) for p, g in plan([args.pp], [args.tg], [])}
    llm, loaded = _load_engine(args, args.pp + args.tg + 8)
    rng = np.random.default_rng(args.seed)
    for n_prompt, n_gen in tests.values():
        run_test(llm, n_prompt, n_gen, rng)
    print("ready", json.dumps({**loaded, "peak_rss": _max_rss()}), flush=True)
    for line in sys.stdin:
        test = line.strip()
        if test not in tests:
            raise SystemExit(f"unknown test {test!r}; this worker runs {list(tests)}")
        print(json.dumps({"ts": run_test(llm, *tests[test], rng)}), flush=True)
    return 0


def _worker_env(threads: int, installed: bool) -> dict[str, str]:
    """A worker's environment: its thread count, and this checkout first on PYTHONPATH unless ``installed``."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    if not installed:
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "core"), str(ROOT / "plugins" / "cpu"),
                                             *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def _worker_cmd(runtime: str, path: Path, threads: int, reps: int, pp: int, tg: int, seed: int = 0) -> list[str]:
    return [sys.executable, __file__, "--worker", runtime, "--model", str(path), "--threads", str(threads),
            "--reps", str(reps), "--pp", str(pp), "--tg", str(tg), "--seed", str(seed)]


def run_worker(runtime: str, path: Path, threads: int, reps: int, pp: int, tg: int, installed: bool,
               timeout: float) -> dict[str, Any]:
    cmd = _worker_cmd(runtime, path, threads, reps, pp, tg)
    try:
        done = subprocess.run(cmd, env=_worker_env(threads, installed), capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {done.returncode}: " + " | ".join(tail)}
    return json.loads(lines[-1])


def run_llama_bench(binary: Path, path: Path, threads: int, reps: int, pp: int, tg: int,
                    timeout: float) -> dict[str, Any]:
    """llama.cpp's own ``llama-bench`` (a native build, ``--llama-bench PATH``) on the file instead of the
    llama-cpp-python worker: one process runs pp then tg (a warm-up run each, then ``reps`` timed runs), and its
    JSON samples become the run's tests; it reports no load time or memory, so those cells stay empty."""
    cmd = [str(binary), "-m", str(path), "-t", str(threads), "-p", str(pp), "-n", str(tg), "-r", str(reps),
           "-o", "json"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        results = json.loads(done.stdout) if done.returncode == 0 else []
    except subprocess.TimeoutExpired:
        return {"error": f"llama-bench timed out after {timeout:.0f} s"}
    except ValueError:
        results = []
    if not results:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"error": f"llama-bench exit {done.returncode}: " + " | ".join(tail)}
    tests = {f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}": [float(x) for x in r["samples_ts"]]
             for r in results}
    first = results[0]
    return {"tests": tests, "info": {"llama_bench": str(binary), "build_commit": first.get("build_commit"),
                                     "build_number": first.get("build_number"), "cpu_info": first.get("cpu_info")}}


# -- paired runs (--pairs) -------------------------------------------------------------------------------------------
def quick_bandwidth(threads: int) -> float:
    """The read probe between two rounds of --pairs: 128 MiB a thread, 5 timed passes on 4 KiB and 5 on 2 MiB pages
    (after a warm-up pass each), the best; two launches where the full probe (``bandwidth``) makes four of twice the
    buffers: ~0.9 s against ~3.7 s (docs/llm-benchmarks.md, branch pair26)."""
    from read_bandwidth import measure

    return measure([threads], mib=128, reps=6, rounds=1)[threads]["best"]


def run_bandwidth(threads: int) -> dict[str, float]:
    """The read probe right before and right after each engine's decode run in --pairs (``--probe around``): 64 MiB
    a thread, 5 timed passes on 4 KiB and 5 on 2 MiB pages, the best ("best", wall clock; "best_cpu": the same
    passes timed by the threads' CPU time); ~0.3-0.4 s, short enough to sit beside a 2-8 s tg128 run in the same
    memory phase of the VM (the phases last seconds to minutes)."""
    from read_bandwidth import measure

    return measure([threads], mib=64, reps=6, rounds=1)[threads]


def pair_rounds(workers: Sequence[Any], tests: Sequence[str], rounds: int, probe: Any = None,
                timeout: float | None = None, run_probe: Callable[[], dict[str, float]] | None = None,
                probed_test: str | None = None) -> dict[str, Any]:
    """``rounds`` rounds of one run of each test by each of the two resident workers (``ask(test, timeout)`` answers
    {"ts": t/s}), the engines back to back on each test, the first engine alternating round by round
    (``turn_order``); ``probe()`` (GB/s) before the first round and after each. With ``run_probe``, each run of
    ``probed_test`` (the decode test) is bracketed by ``run_probe()`` readings ({"best": GB/s, optionally
    "best_cpu"}) taken right before and right after it; the engines run it back to back, so the reading between
    them is the first one's "after" and the second one's "before" (nothing runs between the two). Returns the
    samples per test and engine (index as ``workers``), the probes, each round's order and, with ``run_probe``,
    "run_probes": per engine, per round, [before, after] GB/s ("run_probes_cpu": the same, CPU clock)."""
    from resident import turn_order

    samples: dict[str, list[list[float]]] = {test: [[], []] for test in tests}
    probes = [probe()] if probe else []
    bracketed = run_probe is not None and probed_test in tests
    run_probes: list[list[list[dict[str, float]]]] = [[], []]
    orders = []
    for r in range(rounds):
        order = turn_order(r)
        orders.append(list(order))
        for test in tests:
            around = run_probe if bracketed and test == probed_test else None
            last = around() if around else {}  # the next run's "before"
            for i in order:
                samples[test][i].append(float(json.loads(workers[i].ask(test, timeout))["ts"]))
                if around:
                    after = around()
                    run_probes[i].append([last, after])
                    last = after
        if probe:
            probes.append(probe())
        log(f"  round {r + 1}/{rounds}: " + ", ".join(f"{test} {s[0][-1]:.2f} / {s[1][-1]:.2f} t/s"
                                                    for test, s in samples.items())
            + (f"; {probed_test} probes " + " / ".join(" -> ".join(f"{p['best']:.1f}" for p in run_probes[i][-1])
                                                      for i in (0, 1)) + " GB/s" if bracketed else "")
            + (f"; probe {probes[-1]:.1f} GB/s" if probe else ""))
    out = {"samples": samples, "probes": probes, "orders": orders}
    if bracketed:
        out["run_probes"] = [[[p["best"] for p in run] for run in runs] for runs in run_probes]
        if all("best_cpu" in p for runs in run_probes for run in runs for p in run):
            out["run_probes_cpu"] = [[[p["best_cpu"] for p in run] for run in runs] for runs in run_probes]
    return out


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min, max and the quartiles (inclusive method: within min-max even for a few values)."""
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "q1": q1, "q3": q3}


def round_bounds(probes: Sequence[float], rounds: int) -> list[float] | None:
    """Each round's bandwidth: the mean of the probes right before and right after it (None without probes)."""
    if len(probes) != rounds + 1:
        return None
    return [(probes[r] + probes[r + 1]) / 2 for r in range(rounds)]


# Two probes of one run that differ by more than this (the faster over the slower, minus 1) met two memory phases
# of the VM: the run's % of bound against their mean says little (the phases are ~35 and ~60 GB/s at 2 threads).
PHASE_CHANGE = 0.15


def read_gbs(tps: float, bytes_per_token: int) -> float:
    """The GB/s a decode run read: its t/s x the bytes one step reads (those of the bound: weights, KV, state)."""
    return tps * bytes_per_token / 1e9


def bracketed_runs(samples: Sequence[float], probes: Sequence[Sequence[float]], bytes_per_token: int,
                   cpu_probes: Sequence[Sequence[float]] | None = None) -> list[dict[str, Any]]:
    """One engine's decode runs, each with the probes right before and after it: its t/s, the GB/s it read, its
    bound (the mean of its two probes), their spread (the faster over the slower, minus 1), its % of that bound,
    and whether the probes say the VM's memory phase changed during it (spread > ``PHASE_CHANGE``); with
    ``cpu_probes`` (the same probes timed by CPU clock), those as "cpu_probes", and "lost_cpu": a probe read more
    than ``PHASE_CHANGE`` faster by CPU time than by the wall clock (other processes took the CPU from it, and
    likely from the run beside it: a drop of its wall-clock GB/s is then not the memory's)."""
    runs = []
    for k, (ts, (before, after)) in enumerate(zip(samples, probes, strict=True)):
        bound = (before + after) / 2
        gap = max(before, after) / min(before, after) - 1
        runs.append({"ts": ts, "read_gbs": read_gbs(ts, bytes_per_token), "probes": [before, after],
                     "bound": bound, "spread": gap, "pct": pct_of_bound(ts, bytes_per_token, bound),
                     "phase_changed": gap > PHASE_CHANGE,
                     "cpu_probes": list(cpu_probes[k]) if cpu_probes else None,
                     "lost_cpu": any(c > w * (1 + PHASE_CHANGE) for c, w in zip(cpu_probes[k], (before, after),
                                                                                  strict=True))
                     if cpu_probes else None})
    return runs


def own_bound_summary(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Over one engine's bracketed runs (``bracketed_runs``): the median % of own bound, the same over the runs
    whose probes agree and did not lose the CPU (None if none), the medians of the GB/s read and of the bounds, the
    probes' largest spread and the number of runs flagged "phase changed" and "lost CPU"."""
    steady = [r["pct"] for r in runs if not r["phase_changed"] and not r.get("lost_cpu")]
    return {"pct": statistics.median(r["pct"] for r in runs),
            "pct_steady": statistics.median(steady) if steady else None,
            "read_gbs": statistics.median(r["read_gbs"] for r in runs),
            "bound": statistics.median(r["bound"] for r in runs),
            "spread_max": max(r["spread"] for r in runs),
            "phase_changed": sum(r["phase_changed"] for r in runs),
            "lost_cpu": sum(bool(r.get("lost_cpu")) for r in runs), "n": len(runs),
            "cpu_clock": all(r.get("cpu_probes") for r in runs)}


def pair_summary(result: dict[str, Any], bytes_per_token: int, decode_test: str) -> dict[str, Any]:
    """Per test: each engine's median t/s, the per-round ratios (engine 1 / engine 0 of the same round) and their
    spread, the ratio of the medians (what the sequential mode reports); for the decode test, each engine's GB/s
    read (median t/s x bytes per token), its median % of bound against its rounds' probes (between the rounds) and,
    where each run was bracketed by its own probes ("run_probes"), each run against its own two probes
    (``bracketed_runs``, ``own_bound_summary``). Plus the round probes' spread."""
    tests: dict[str, Any] = {}
    for test, (ref, sub) in result["samples"].items():
        ratios = [b / a for a, b in zip(ref, sub, strict=True)]
        entry: dict[str, Any] = {"median": [statistics.median(ref), statistics.median(sub)], "ratios": ratios,
                                 "ratio": spread(ratios),
                                 "ratio_of_medians": statistics.median(sub) / statistics.median(ref)}
        if test == decode_test:
            entry["read_gbs"] = [read_gbs(m, bytes_per_token) for m in entry["median"]]
            bounds = round_bounds(result["probes"], len(ratios))
            if bounds:
                entry["pct_of_bound"] = [statistics.median(pct_of_bound(ts, bytes_per_token, bw) or math.nan
                                                           for ts, bw in zip(runs, bounds, strict=True))
                                         for runs in (ref, sub)]
            if result.get("run_probes"):
                cpu = result.get("run_probes_cpu") or [None, None]
                entry["runs"] = [bracketed_runs(runs, probes, bytes_per_token, cpu_probes)
                                 for runs, probes, cpu_probes in zip((ref, sub), result["run_probes"], cpu,
                                                                     strict=True)]
                entry["own_bound"] = [own_bound_summary(runs) for runs in entry["runs"]]
        tests[test] = entry
    return {"tests": tests, "probes": spread(result["probes"]) if result["probes"] else None}


def run_paired(runtimes: Sequence[str], path: Path, threads: int, rounds: int, pp: int, tg: int, installed: bool,
               timeout: float, probe: Any = None, seed: int = 0,
               run_probe: Callable[[], dict[str, float]] | None = None) -> dict[str, Any]:
    """Both engines resident (loaded, warmed up), then ``pair_rounds`` (``run_probe``: around each tg run);
    {"error": ...} if a worker dies or does not answer in ``timeout`` s (then both are stopped)."""
    from resident import Resident, WorkerError

    env = _worker_env(threads, installed)
    workers: list[Any] = []
    try:
        for runtime in runtimes:
            cmd = [*_worker_cmd(runtime, path, threads, 0, pp, tg, seed), "--resident"]
            workers.append(Resident(runtime, cmd, env, ready_timeout=timeout))
        tests = [f"pp{pp}"] * (pp > 0) + [f"tg{tg}"] * (tg > 0)  # hetero.llm.bench's labels, its order
        result = pair_rounds(workers, tests, rounds, probe, timeout, run_probe, f"tg{tg}")
    except WorkerError as err:
        return {"error": str(err)}
    finally:
        for worker in workers:
            worker.close()
    result["loaded"] = [json.loads(w.ready) for w in workers]
    return result


def paired_markdown(rows: list[dict[str, Any]], runtimes: Sequence[str] = ("llama.cpp", "hetero")) -> str:
    """The --pairs table: a line per file, thread count and test."""
    ref, sub = runtimes
    head = ["model", "type", "thr", "rounds", "test", f"{ref} t/s", f"{sub} t/s", "ratio: median of rounds",
            "ratio min-max", "ratio IQR", "ratio of medians", "% of BW bound (l / h)", "round probes GB/s",
            "read GB/s (l / h)", "own probes GB/s (l / h)", "% of own-probe bound (l / h)",
            "same, probes agree (l / h)", "phase changed (l / h)"]
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * 5 + ["---:"] * (len(head) - 5)) + "|"]
    for row in rows:
        lead = [row["model"], row["type"], str(row["threads"])]
        if "error" in row["pair"]:
            cells = [*lead, "—", "—", f"error: {row['pair']['error'][:160]}", *[""] * (len(head) - 6)]
            out.append("| " + " | ".join(cells) + " |")
            continue
        summary = row["summary"]
        p = summary["probes"]
        probes = f"{p['min']:.1f}-{p['max']:.1f} (median {p['median']:.1f})" if p else "—"
        for test, e in summary["tests"].items():
            r = e["ratio"]
            pct = e.get("pct_of_bound")
            cells = [*lead, str(len(e["ratios"])), test, _fmt(e["median"][0]), _fmt(e["median"][1]),
                     _fmt(r["median"], 2), f"{r['min']:.2f}-{r['max']:.2f}", f"{r['q1']:.2f}-{r['q3']:.2f}",
                     _fmt(e["ratio_of_medians"], 2), f"{_fmt(pct[0], 0)} / {_fmt(pct[1], 0)}" if pct else "—",
                     probes, *_own_bound_cells(e)]
            out.append("| " + " | ".join(cells) + " |")
    out.append("")
    out.append(f"t/s: median of the rounds; ratio: {sub} / {ref} of the same round (its median, min-max and "
               "quartiles over the rounds), beside the ratio of the two medians; % of BW bound: each round's t/s "
               "against the mean of the probes right before and after that round, median over the rounds; l / h: "
               f"{ref} / {sub}. read GB/s: median t/s x the bytes a step reads (the bound's). Own probes: a short "
               "read probe right before and right after each decode run; % of own-probe bound: each run against "
               "the mean of its two probes, median over the rounds (own probes GB/s: the median of those means); "
               "probes agree: the same over the runs whose probes differ by <= "
               f"{100 * PHASE_CHANGE:.0f} % (and did not lose the CPU, below); phase changed: the runs whose "
               "probes differ by more (the largest difference in brackets).")
    detail = _run_lines(rows, runtimes)
    if detail:
        out += ["", "Each decode run between its own probes:", "", *detail, "",
                "probes by CPU clock: the same probes' passes timed by the threads' CPU time; lost CPU: one of "
                f"them more than {100 * PHASE_CHANGE:.0f} % above the wall clock's, the probe (and likely the run "
                "beside it) lost CPU time to other processes: a drop of its GB/s is then not the memory's."]
    return "\n".join(out)


def _own_bound_cells(entry: dict[str, Any]) -> list[str]:
    """The --pairs table's cells of a test's read GB/s and own-probe bound (dashes where not measured)."""
    read = entry.get("read_gbs")
    cells = [f"{_fmt(read[0])} / {_fmt(read[1])}" if read else "—"]
    own = entry.get("own_bound")
    if not own:
        return [*cells, "—", "—", "—", "—"]
    a, b = own
    return [*cells, f"{_fmt(a['bound'])} / {_fmt(b['bound'])}", f"{_fmt(a['pct'], 0)} / {_fmt(b['pct'], 0)}",
                    f"{_fmt(a['pct_steady'], 0)} / {_fmt(b['pct_steady'], 0)}",
                    f"{a['phase_changed']} / {b['phase_changed']} of {a['n']} "
                    f"(max {100 * a['spread_max']:.0f} / {100 * b['spread_max']:.0f} %)"
                    + (f"; lost CPU {a['lost_cpu']} / {b['lost_cpu']}" if a["cpu_clock"] and b["cpu_clock"] else "")]


def _run_lines(rows: list[dict[str, Any]], runtimes: Sequence[str]) -> list[str]:
    """A table line per bracketed decode run, in the order they ran (empty without bracketed runs)."""
    lines = []
    for row in rows:
        for test, e in row.get("summary", {}).get("tests", {}).items():
            for r, order in enumerate(row["pair"]["orders"] if "runs" in e else []):
                for i in order:
                    run = e["runs"][i][r]
                    flag = ", ".join(f for f, on in (("phase changed", run["phase_changed"]),
                                                     ("lost CPU", run.get("lost_cpu"))) if on)
                    cpu = run.get("cpu_probes")
                    cpu_cell = " -> ".join(_fmt(p) for p in cpu) if cpu else "—"
                    lines.append(f"| {row['model']} | {row['threads']} | {test} | {r + 1} | {runtimes[i]} | "
                                 f"{run['probes'][0]:.1f} | {run['ts']:.1f} | {run['read_gbs']:.1f} | "
                                 f"{run['probes'][1]:.1f} | {100 * run['spread']:.0f} | {_fmt(run['pct'], 0)} | "
                                 f"{flag} | {cpu_cell} |")
    if not lines:
        return []
    return ["| model | thr | test | round | engine | probe before GB/s | t/s | read GB/s | probe after GB/s | "
            "probes differ % | % of own-probe bound | | probes by CPU clock GB/s |",
            "|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---|---:|", *lines]


# -- report ------------------------------------------------------------------------------------------------------------
def summarize(samples: list[float]) -> dict[str, float]:
    return {"median": statistics.median(samples), "mean": statistics.fmean(samples),
            "std": statistics.stdev(samples) if len(samples) > 1 else 0.0, "n": len(samples)}


def _fmt(value: float | None, digits: int = 1) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _median(run: dict[str, Any], test: str) -> float | None:
    stats = run.get("stats", {}).get(test)
    return stats["median"] if stats else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def markdown(rows: list[dict[str, Any]], bw: dict[int, float], pp: int, tg: int) -> str:
    pt, gt = f"pp{pp}", f"tg{tg}"
    head = ["model", "type", "size MiB", "thr", f"{pt} llama.cpp", f"{pt} hetero", "ratio", f"{gt} llama.cpp",
            f"{gt} hetero", "ratio", f"{gt} % of BW bound (l / h)", "run's probes GB/s (l / h)",
            f"{gt} read GB/s (l / h)", "load s (l / h)", "peak RSS MiB (l / h)"]
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * 2 + ["---:"] * (len(head) - 2)) + "|"]
    for row in rows:
        lc, he = row["llama.cpp"], row["hetero"]
        start = bw.get(row["threads"])
        per_token = row["file"]["bytes_per_token"]

        def pct(run: dict[str, Any], start: float | None = start, per_token: int = per_token) -> str:
            return _fmt(pct_of_bound(_median(run, gt), per_token, run_bound(run, start)), 0)

        def read(run: dict[str, Any], per_token: int = per_token) -> str:
            tps = _median(run, gt)
            return _fmt(read_gbs(tps, per_token) if tps else None)

        cells = [row["model"], row["type"], _fmt(row["file"]["file_bytes"] / 2**20, 0), str(row["threads"]),
                 _fmt(_median(lc, pt)), _fmt(_median(he, pt)), _fmt(_ratio(_median(he, pt), _median(lc, pt)), 2),
                 _fmt(_median(lc, gt)), _fmt(_median(he, gt)), _fmt(_ratio(_median(he, gt), _median(lc, gt)), 2),
                 f"{pct(lc)} / {pct(he)}", f"{_probes(lc)} / {_probes(he)}", f"{read(lc)} / {read(he)}",
                 f"{_fmt(lc.get('load_s'), 2)} / {_fmt(he.get('load_s'), 2)}",
                 f"{_fmt(lc.get('peak_rss', math.nan) / 2**20, 0)} / {_fmt(he.get('peak_rss', math.nan) / 2**20, 0)}"]
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    out.append("t/s: median of the repetitions; ratio: hetero / llama.cpp; l / h: llama.cpp / hetero. % of BW bound: "
               "against the median of the run's own probes (before -> after it, same thread count) where taken, "
               "else the start probe below; read GB/s: the decode t/s x the bytes a step reads (the bound's).")
    for threads, value in sorted(bw.items()):
        out.append(f"read bandwidth, {threads} thread(s) (native probe, session start): {value:.1f} GB/s")
    out.append("")
    out.append("| model | type | thr | runtime | test | median t/s | mean ± std | n |")
    out.append("|---|---|---:|---|---|---:|---:|---:|")
    for row in rows:
        for runtime in ("llama.cpp", "hetero"):
            run = row[runtime]
            if "error" in run:
                out.append(f"| {row['model']} | {row['type']} | {row['threads']} | {runtime} | — | error: "
                           f"{run['error'][:120]} | | |")
                continue
            for test, s in run["stats"].items():
                out.append(f"| {row['model']} | {row['type']} | {row['threads']} | {runtime} | {test} | "
                           f"{s['median']:.2f} | {s['mean']:.2f} ± {s['std']:.2f} | {s['n']} |")
    out.append("")
    out.append("Memory, MiB (anon: allocated memory; file: resident pages of the mapped model file and libraries):")
    out.append("")
    out.append("| model | type | thr | runtime | before load | after load: anon + file | end: anon + file | peak |")
    out.append("|---|---|---:|---|---:|---:|---:|---:|")

    def mib(value: float | None) -> str:
        return _fmt(value / 2**20 if value is not None else None, 0)

    for row in rows:
        for runtime in ("llama.cpp", "hetero"):
            run = row[runtime]
            if "error" in run:
                continue
            loaded, end = run.get("mem_loaded", {}), run.get("mem_end", {})
            out.append(f"| {row['model']} | {row['type']} | {row['threads']} | {runtime} | "
                       f"{mib(run.get('base_rss'))} | {mib(loaded.get('anon'))} + {mib(loaded.get('file'))} | "
                       f"{mib(end.get('anon'))} + {mib(end.get('file'))} | {mib(run.get('peak_rss'))} |")
    return "\n".join(out)


# -- main --------------------------------------------------------------------------------------------------------------
def _csv(value: str, allowed: Sequence[str], what: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    lookup = {a.lower(): a for a in allowed}
    bad = [v for v in items if v.lower() not in lookup]
    if bad:
        raise SystemExit(f"unknown {what} {bad}; expected some of {list(allowed)}")
    return [lookup[v.lower()] for v in items]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {list(MODELS)}")
    ap.add_argument("--types", default=",".join(TYPES), help=f"comma-separated, of {list(TYPES)}")
    ap.add_argument("--files", default="", help="comma-separated GGUF files to run instead of the bench models "
                    "(e.g. a real model); --models / --types are then ignored")
    ap.add_argument("--threads", default="2", help="comma-separated thread counts, e.g. 2 or 1,2")
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions per test (after one warm-up)")
    ap.add_argument("--pp", type=int, default=PP, help="prompt tokens of the prefill test")
    ap.add_argument("--tg", type=int, default=TG, help="tokens of the decode test")
    ap.add_argument("--skip-build", action="store_true", help="use the cached model files; build nothing")
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of markdown")
    ap.add_argument("--save", type=Path, help="also write the JSON results to this file")
    ap.add_argument("--cache-dir", type=Path, default=CACHE, help=f"model files (default {CACHE})")
    ap.add_argument("--runtimes", default="llama.cpp,hetero", help="comma-separated: llama.cpp, hetero")
    ap.add_argument("--installed", action="store_true", help="benchmark the installed hetero, not this checkout")
    ap.add_argument("--no-bandwidth", action="store_true", help="skip the bandwidth measurement")
    ap.add_argument("--probe", choices=("around", "start"), default="around",
                    help="around: a read probe right before and after each engine's run (its %% of bound is "
                    "against their median), plus the start probe; start: the start probe only. --pairs: around "
                    "adds a short probe right before and after each tg run (each run's %% of bound against their "
                    "mean) to the probes between rounds; start keeps those between rounds only")
    ap.add_argument("--pairs", type=int, default=0, metavar="N",
                    help="paired mode: both engines resident, N rounds of one run of each test by each, the first "
                    "engine alternating, a short read probe between rounds and (--probe around) right before "
                    "and after each tg run (see the module doc)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per worker before it is abandoned "
                    "(--pairs: for a worker to load and warm up, or to answer one run)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--llama-bench", type=Path, metavar="PATH",
                    help="run llama.cpp as this natively built llama-bench binary instead of through "
                         "llama-cpp-python (no load time / memory for it; not with --pairs)")
    # internal: the subprocesses
    ap.add_argument("--worker", choices=["hetero", "llama.cpp", "quantize"], help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--ftype", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--resident", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker == "quantize":
        args.threads = int(args.threads)
        return _quantize_worker(args)
    if args.worker:
        args.threads = int(args.threads)
        return _resident_worker(args) if args.resident else _bench_worker(args)

    models = _csv(args.models, list(MODELS), "model(s)") if not args.files else []
    types = _csv(args.types, list(TYPES), "type(s)") if not args.files else []
    runtimes = _csv(args.runtimes, ["llama.cpp", "hetero"], "runtime(s)")
    threads = [int(t) for t in args.threads.split(",") if t.strip()]
    paths: dict[tuple[str, str], Path] = {}
    if args.files:
        models, types = [], ["file"]
        for f in args.files.split(","):
            path = Path(f).expanduser()
            if not path.is_file():
                raise SystemExit(f"--files: {path} is not a file")
            models.append(path.stem)
            paths[path.stem, "file"] = path
    for model in models if not args.files else []:
        for qtype in types:
            path = model_path(args.cache_dir, model, qtype)
            if not path.is_file():
                if args.skip_build:
                    raise SystemExit(f"{path} is missing: run once without --skip-build")
                path = build_quant(args.cache_dir, model, qtype, max(threads))
            paths[model, qtype] = path

    bw: dict[int, float] = {}
    if not args.no_bandwidth:
        for t in sorted(set(threads)):
            log(f"measuring read bandwidth with {t} thread(s) ...")
            probe = bandwidth(t)
            bw[t] = probe["best"]
            log(f"  {bw[t]:.1f} GB/s (4 KiB pages {probe['best_4k']:.1f}, 2 MiB pages {probe['best_2m']:.1f})")

    if args.pairs:
        return _main_paired(args, models, types, paths, threads, runtimes, bw)
    rows = []
    order = 0
    for model in models:
        for qtype in types:
            stats = file_stats(paths[model, qtype], args.tg)
            for t in threads:
                row: dict[str, Any] = {"model": model, "type": qtype, "threads": t, "file": stats,
                                       "path": str(paths[model, qtype])}
                sequence = runtimes if order % 2 == 0 else list(reversed(runtimes))
                order += 1
                for runtime in sequence:
                    log(f"{model} {qtype} threads={t}: {runtime} (pp{args.pp}, tg{args.tg}, {args.reps} reps) ...")
                    def one(runtime: str = runtime, t: int = t, path: Path = paths[model, qtype]) -> dict[str, Any]:
                        if runtime == "llama.cpp" and args.llama_bench:
                            return run_llama_bench(args.llama_bench, path, t, args.reps, args.pp, args.tg,
                                                   args.timeout)
                        return run_worker(runtime, path, t, args.reps, args.pp, args.tg, args.installed, args.timeout)

                    bracket = not args.no_bandwidth and args.probe == "around"
                    run = bracket_probe(t, one) if bracket else one()
                    if "tests" in run:
                        run["stats"] = {test: summarize(s) for test, s in run["tests"].items()}
                        log("  " + ", ".join(f"{k} {v['median']:.2f} t/s" for k, v in run["stats"].items())
                            + (f"; load {run['load_s']:.2f} s; peak RSS {run['peak_rss'] / 2**20:.0f} MiB"
                               if "load_s" in run else "")
                            + (f"; probes {_probes(run)} GB/s" if "probes" in run else ""))
                    else:
                        log(f"  failed: {run['error']}")
                    row[runtime] = run
                for runtime in ("llama.cpp", "hetero"):
                    row.setdefault(runtime, {"error": "not run"})
                rows.append(row)

    return _emit(args, {"vocab": VOCAB, "pp": args.pp, "tg": args.tg, "reps": args.reps}, rows, bw,
                 lambda: markdown(rows, bw, args.pp, args.tg))


def _emit(args: argparse.Namespace, head: dict[str, Any], rows: list[dict[str, Any]], bw: dict[int, float],
          table: Callable[[], str]) -> int:
    """The results as a JSON document (written to --save; printed with --json), else the markdown ``table()`` and
    the load average at the end."""
    document = json.dumps({**head, "bandwidth_gbs": {str(k): v for k, v in bw.items()}, "rows": rows,
                           "machine": {"cpus": os.cpu_count(), "loadavg": os.getloadavg()}}, indent=2)
    if args.save:
        args.save.write_text(document)
    if args.json:
        print(document)
        return 0
    print(table())
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    return 0


def _main_paired(args: argparse.Namespace, models: list[str], types: list[str], paths: dict[tuple[str, str], Path],
                 threads: list[int], runtimes: list[str], bw: dict[int, float]) -> int:
    """--pairs: per file and thread count, ``run_paired`` of llama.cpp and hetero, then its table."""
    if runtimes != ["llama.cpp", "hetero"]:
        raise SystemExit("--pairs runs both engines: leave --runtimes at llama.cpp,hetero")
    if args.llama_bench:
        raise SystemExit("--pairs keeps llama.cpp resident through llama-cpp-python: drop --llama-bench")
    rows = []
    for model in models:
        for qtype in types:
            stats = file_stats(paths[model, qtype], args.tg)
            for t in threads:
                log(f"{model} {qtype} threads={t}: {args.pairs} paired rounds of pp{args.pp} / tg{args.tg} ...")

                def probe(t: int = t) -> float:
                    return quick_bandwidth(t)

                def around(t: int = t) -> float:
                    return run_bandwidth(t)

                probing = not args.no_bandwidth
                pair = run_paired(runtimes, paths[model, qtype], t, args.pairs, args.pp, args.tg, args.installed,
                                  args.timeout, probe if probing else None, args.seed,
                                  around if probing and args.probe == "around" else None)
                row: dict[str, Any] = {"model": model, "type": qtype, "threads": t, "file": stats,
                                       "path": str(paths[model, qtype]), "pair": pair}
                if "error" in pair:
                    log(f"  failed: {pair['error']}")
                else:
                    row["summary"] = pair_summary(pair, stats["bytes_per_token"], f"tg{args.tg}")
                    for test, e in row["summary"]["tests"].items():
                        log(f"  {test}: {e['median'][0]:.2f} / {e['median'][1]:.2f} t/s, ratios "
                            + " ".join(f"{r:.2f}" for r in e["ratios"])
                            + ("; read GB/s " + " / ".join(f"{g:.1f}" for g in e["read_gbs"])
                               if "read_gbs" in e else "")
                            + ("; % of own-probe bound " + " / ".join(f"{o['pct']:.0f}" for o in e["own_bound"])
                               if "own_bound" in e else ""))
                    log("  probes GB/s " + " ".join(f"{p:.1f}" for p in pair["probes"]))
                rows.append(row)
    return _emit(args, {"mode": "pairs", "rounds": args.pairs, "pp": args.pp, "tg": args.tg}, rows, bw,
                 lambda: "\n".join([paired_markdown(rows), ""] + [
                     f"read bandwidth, {t} thread(s) (native probe, session start): {value:.1f} GB/s"
                     for t, value in sorted(bw.items())]))


if __name__ == "__main__":
    raise SystemExit(main())
