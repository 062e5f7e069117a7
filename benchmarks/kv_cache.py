"""KV cache types compared: the accuracy lost by the float16, int8 ("q8") and rotated 4 / 3-bit ("q4r" / "q3r")
caches against the exact float32 one, memory per token, and decode speed at a long context.

    python benchmarks/kv_cache.py model MODEL.gguf    # a real model: logits over a long prompt, greedy streams
    python benchmarks/kv_cache.py accuracy            # fixtures + the text runs, markdown (or --json)
    python benchmarks/kv_cache.py speed -d 2048 -n 32 # decode tokens/s after a 2048-token context, f16 vs q8
    python benchmarks/kv_cache.py speed -d 2048 --kinds f16,q8,q4r,q3r
    python benchmarks/kv_cache.py attention -d 2048   # one layer's decode attention alone, f32 / f16 / q8
    python benchmarks/kv_cache.py attention -l 28     # 28 layers' (past L3)

Accuracy, per model: each cache type's logits against the float32 cache's on the same tokens (teacher forced, every
position's logits): max and mean |d logit|, top-1 agreement, and the mean negative log-likelihood of the actual next
tokens (its change is the perplexity cost). Models: the committed transformers fixtures (tests/fixtures/llm: 2
layers, heads of 32, float32 weights) on their prompts and chat, and on ~580 tokens of English text through their own
tokenizer; and, when present, benchmarks/llm.py's Qwen3-0.6B-shaped F16 GGUF (28 layers, 16/8 heads of 128) on the
same text. All have random weights: they attend almost uniformly, which averages quantization noise out, while a
trained model with peaked attention and outlier key channels can lose more — read the numbers as a floor.

Speed: the synthetic Qwen3-0.6B-shaped model (q4 weights, as ``hetero bench`` uses) once per cache type, the types
interleaved within each repetition: the cache prefilled to the depth (timed on its own), then N single-token decode
steps timed; the medians of the repetitions.

Model (a real GGUF, e.g. Qwen2.5-Coder-1.5B): per cache type, (1) the logits of the last ``--scored`` positions of
a ``--prompt-tokens`` prompt (the needle eval's haystack prose, teacher forced) against the float32 cache's: max /
mean |d logit|, top-1 agreement, NLL of the actual next tokens; (2) ``--gen`` greedy tokens after each of
``--prompts`` prompts (a slice of the same prose, each ~``--gen-context`` tokens long): the position where the
stream first differs from the float32 cache's stream; (3) KV bytes per token of the model.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

import hetero.llm
from hetero.contract.graph import Graph
from hetero.contract.quant import parse_quant
from hetero.llm.families import build_graph
from hetero.llm.model import Llm
from hetero.llm.synthetic import LABELS, SyntheticWeights, synthetic_config

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "llm"
KINDS = ("f32", "f16", "q8")
DEFAULT_GGUF = Path.home() / ".cache" / "hetero" / "bench-models" / "qwen3-0.6b-v32k-f16.gguf"

TEXT = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, counting the steps as his father had "
    "taught him. There were one hundred and twelve of them, worn smooth in the middle by a century of boots. At the "
    "top he trimmed the wick, polished the great lens with a soft cloth, and struck the match. Out on the water the "
    "fishing boats turned their bows toward the beam and followed it home through the fog. In winter the storms came "
    "from the north and the waves broke over the rocks below, throwing spray as high as the gallery rail. He kept a "
    "logbook of every ship that passed, the weather, the wind, and the hour the lamp was lit. Years later, when the "
    "light was automated and the keepers were sent ashore, the logbooks were found stacked in a cupboard: forty "
    "volumes of careful handwriting, a record of the sea that no machine would ever write again."
)


def kv_bytes_per_token_layer(kv_heads: int, head_dim: int, kind: str) -> int:
    """Bytes one token's K and V take in one layer's cache."""
    blocks = -(-head_dim // 32)
    per_row = {"f32": 4 * head_dim, "f16": 2 * head_dim, "q8": head_dim + 4 * blocks,
               "q4r": 16 * blocks + 2 * blocks, "q3r": 12 * blocks + 2 * blocks}[kind]
    return 2 * kv_heads * per_row


# -- accuracy --------------------------------------------------------------------------------------------------------
def _log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z -= z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def compare(runs: dict[str, list[np.ndarray]], targets: list[np.ndarray]) -> dict[str, dict[str, float]]:
    """Per cache type: the distance of its logits from the f32 cache's, and the NLL of ``targets`` (the next token
    of each position; -1 = none)."""
    out = {}
    base = np.concatenate(runs["f32"])
    tgt = np.concatenate(targets)
    keep = tgt >= 0
    for kind, chunks in runs.items():
        logits = np.concatenate(chunks)
        d = np.abs(logits - base)
        nll = -_log_softmax(logits[keep])[np.arange(keep.sum()), tgt[keep]]
        out[kind] = {"max_abs": float(d.max()), "mean_abs": float(d.mean()),
                     "top1": float((logits.argmax(-1) == base.argmax(-1)).mean()), "nll": float(nll.mean()),
                     "positions": len(logits), "scored": int(keep.sum()),
                     "logit_std": float(base.std())}
    for kind in out:
        out[kind]["d_nll"] = out[kind]["nll"] - out["f32"]["nll"]
        out[kind]["ppl_ratio"] = float(np.exp(out[kind]["d_nll"]))
    return out


def fixture_sequences(family: str) -> list[list[int]]:
    exp = json.loads((FIXTURES / family / "expected.json").read_text(encoding="utf-8"))
    return [p["ids"] for p in exp["prompts"]] + [exp["chat"]["ids"]]


def run_all_logits(llm: Llm, seqs: list[list[int]]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    chunks, targets = [], []
    for ids in seqs:
        llm.reset()
        logits = llm.prefill(ids)
        chunks.append(logits)
        targets.append(np.array([*ids[1:], -1], dtype=np.int64))
    return chunks, targets


def _three_runs(open_model, seqs: list[list[int]]) -> dict:
    runs, targets = {}, []
    for kind in KINDS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            llm = open_model(kind)
        runs[kind], targets = run_all_logits(llm, seqs)
        llm.close()
    return compare(runs, targets)


def _loader(path: Path, backends: list[str] | None):
    def open_model(kind: str) -> Llm:
        return hetero.llm.load(path, backends=backends, on_fallback="silent", context=1024, all_logits=True,
                               kv_cache=kind, prefill_chunk=0)
    return open_model


def accuracy_fixture(family: str, backends: list[str] | None, text: bool = False) -> dict:
    """The fixture's prompts and chat, or (text=True) the English text through the fixture's own tokenizer."""
    open_model = _loader(FIXTURES / family, backends)
    if not text:
        return _three_runs(open_model, fixture_sequences(family))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _three_runs(open_model, [open_model("f32").tokenize(TEXT)])


def accuracy_gguf(path: Path, backends: list[str] | None) -> dict:
    """A float-weight GGUF (benchmarks/llm.py's Qwen3-0.6B-shaped F16 file) over the text: 28 layers, heads of 128
    like the real model, and float GEMVs (int8 activations would add noise of the same order as the cache's)."""
    open_model = _loader(path, backends)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _three_runs(open_model, [open_model("f32").tokenize(TEXT)])


@functools.cache
def _synthetic_graph(quant: str, context: int, all_logits: bool) -> Graph:
    return build_graph(synthetic_config("qwen3-0.6b"), SyntheticWeights(parse_quant(quant), 0), context=context,
                       all_logits=all_logits, progress=False)


def synthetic(kind: str, quant: str, context: int, backends: list[str] | None, all_logits: bool) -> Llm:
    """The synthetic Qwen3-0.6B-shaped model (what ``hetero bench`` runs), optionally returning every position's
    logits; the prompt is prefilled in chunks of 512 like the library's default. The graph is built once per
    shape (a Session works on its own copy; Llm sets the Attention nodes' kv_dtype before handing it over)."""
    cfg = synthetic_config("qwen3-0.6b")
    graph = _synthetic_graph(quant, context, all_logits)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Llm(cfg, graph, None, context=context, backends=backends, on_fallback="silent",
                   name=f"qwen3 {LABELS['qwen3-0.6b']} synthetic", quant=quant, kv_cache=kind)


def accuracy(args: argparse.Namespace) -> dict:
    results = {}
    for family in ("qwen2", "qwen3", "qwen3_moe"):
        results[f"fixture {family}, prompts + chat"] = accuracy_fixture(family, args.backend)
        results[f"fixture {family}, text"] = accuracy_fixture(family, args.backend, text=True)
        print(f"done: fixture {family}", file=sys.stderr)
    if args.gguf and Path(args.gguf).exists():
        results[f"{Path(args.gguf).stem}, text"] = accuracy_gguf(Path(args.gguf), args.backend)
    elif args.gguf:
        print(f"skipped: {args.gguf} does not exist (benchmarks/llm.py makes it)", file=sys.stderr)
    return results


def accuracy_markdown(results: dict) -> str:
    rows = ["| model | cache | positions | max abs d logit | mean abs d logit | top-1 agree | NLL | d NLL "
            "| ppl ratio |",
            "|---|---|--:|--:|--:|--:|--:|--:|--:|"]
    for model, kinds in results.items():
        for kind in ("f16", "q8"):
            r = kinds[kind]
            rows.append(f"| {model} (logit std {r['logit_std']:.2f}) | {kind} | {r['positions']} | "
                        f"{r['max_abs']:.2e} | {r['mean_abs']:.2e} | {100 * r['top1']:.1f}% | {r['nll']:.4f} | "
                        f"{r['d_nll']:+.2e} | {r['ppl_ratio']:.5f} |")
    return "\n".join(rows)


# -- speed -----------------------------------------------------------------------------------------------------------
def speed(args: argparse.Namespace) -> dict:
    """Each repetition runs every cache type in turn (interleaved, so a busy machine slows them alike): prefill the
    depth (timed separately), then N single-token decode steps timed."""
    cfg = synthetic_config("qwen3-0.6b")
    kinds = args.kinds.split(",")
    llms = {kind: synthetic(kind, args.quant, args.depth + args.n_gen + 1, args.backend, all_logits=False)
            for kind in kinds}
    samples: dict[str, dict[str, list[float]]] = {kind: {"tg": [], "pp": []} for kind in kinds}
    rng = np.random.default_rng(0)
    for rep in range(args.repetitions + 1):  # the first round warms up (kernels prepared, pages mapped)
        prompt = rng.integers(0, cfg.vocab_size, size=args.depth).tolist()
        tokens = rng.integers(0, cfg.vocab_size, size=args.n_gen).tolist()
        for kind, llm in llms.items():
            llm.reset()
            started = time.perf_counter()
            llm.prefill(prompt)
            prefilled = time.perf_counter()
            for token in tokens:
                llm.forward([token])
            if rep:
                samples[kind]["pp"].append(args.depth / (prefilled - started))
                samples[kind]["tg"].append(args.n_gen / (time.perf_counter() - prefilled))
        print(f"round {rep} of {args.repetitions} done", file=sys.stderr)
    results = {}
    for kind in kinds:
        per_layer = kv_bytes_per_token_layer(cfg.num_kv_heads, cfg.head_dim, kind)
        results[kind] = {"median_ts": statistics.median(samples[kind]["tg"]), "samples_ts": samples[kind]["tg"],
                         "prefill_median_ts": statistics.median(samples[kind]["pp"]),
                         "prefill_samples_ts": samples[kind]["pp"],
                         "kv_bytes_per_token_per_layer": per_layer,
                         "kv_mib_at_depth": per_layer * cfg.num_layers * args.depth / 2**20}
        llms[kind].close()
    return {"depth": args.depth, "n_gen": args.n_gen, "quant": args.quant, "results": results}


def speed_markdown(out: dict) -> str:
    rows = [f"| cache | tg{out['n_gen']} at depth {out['depth']}, t/s (median) | pp{out['depth']}, t/s (median) | "
            "KV bytes / token / layer | KV cache at depth (MiB) |", "|---|--:|--:|--:|--:|"]
    for kind, r in out["results"].items():
        rows.append(f"| {kind} | {r['median_ts']:.2f} | {r['prefill_median_ts']:.1f} | "
                    f"{r['kv_bytes_per_token_per_layer']} | {r['kv_mib_at_depth']:.1f} |")
    return "\n".join(rows)


def attention(args: argparse.Namespace) -> dict:
    """Decode attention alone (the cpu plugin's native cache objects, Qwen3-0.6B's 16/8 heads of 128), ``--layers``
    of them (28: a cache larger than L3, as in the model): each filled to the depth, then single-token calls timed,
    wall and CPU time (the CPU time counts what this process ran, which a busy machine disturbs less); medians."""
    import hetero_cpu._native as native

    if args.threads:
        native.set_num_threads(args.threads)
    hq, hkv, d, calls = 16, 8, 128, 20 if args.layers == 1 else 3
    rng = np.random.default_rng(0)
    q = rng.standard_normal((args.depth, hq, d)).astype(np.float32)
    k = rng.standard_normal((args.depth, hkv, d)).astype(np.float32)
    out = np.empty((args.depth, hq * d), np.float32)
    results = {}
    for kind in args.kinds.split(","):
        caches = [native.LlmAttention(hkv, d, args.depth + 1, kind) for _ in range(args.layers)]
        for cache in caches:
            cache(q, k, k, 0, d**-0.5, out)
        q1, k1, o1 = q[:1].copy(), k[:1].copy(), out[:1].copy()
        wall, cpu = [], []
        for _ in range(args.repetitions):
            started, cpu_started = time.perf_counter(), time.process_time()
            for _ in range(calls):
                for cache in caches:
                    cache(q1, k1, k1, args.depth, d**-0.5, o1)
            wall.append((time.perf_counter() - started) / calls * 1e6)
            cpu.append((time.process_time() - cpu_started) / calls * 1e6)
        nbytes = kv_bytes_per_token_layer(hkv, d, kind) * args.depth * args.layers
        results[kind] = {"median_us": statistics.median(wall), "cpu_median_us": statistics.median(cpu),
                         "read_gb_s": nbytes / statistics.median(wall) / 1e3, "kv_mb": nbytes / 1e6}
        del caches
    return {"depth": args.depth, "layers": args.layers, "results": results}


# -- a real model ----------------------------------------------------------------------------------------------------
def _prose_tokens(llm: Llm, n: int, offset: int) -> list[int]:
    """``n`` tokens of the needle eval's default haystack (Python's language reference prose), from sentence
    ``offset`` on."""
    from hetero.llm.needle import haystack_sentences

    sentences, _ = haystack_sentences()
    ids: list[int] = []
    i = offset
    while len(ids) < n:
        ids += llm.tokenize(" ".join(sentences[i:i + 40]))
        i += 40
    return ids[:n]


def model_accuracy(args: argparse.Namespace) -> dict:
    """Logits over a long prompt and greedy streams, per cache type, against the float32 cache; interleaving is not
    needed (nothing here is timed). ``--save DIR``: one process per type (each also saves its raw logits and
    streams there; ``--from DIR`` then compares the saved runs without a model)."""
    kinds = args.kinds.split(",")
    if kinds[0] != "f32" and not args.save:
        kinds = ["f32", *[k for k in kinds if k != "f32"]]
    out: dict = {"model": Path(args.path).name, "prompt_tokens": args.prompt_tokens, "scored": args.scored,
                 "gen": args.gen, "prompts": args.prompts, "kinds": {}}
    base_logits = None
    base_streams: list[list[int]] = []
    for kind in kinds:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            llm = hetero.llm.load(args.path, backends=args.backend, on_fallback="silent", threads=args.threads,
                                  context=max(args.prompt_tokens, args.gen_context + args.gen) + 8,
                                  all_logits=True, kv_cache=kind)
        cfg = llm.config
        ids = _prose_tokens(llm, args.prompt_tokens + 1, 0)
        started = time.perf_counter()
        llm.reset()
        head, tail = ids[:args.prompt_tokens - args.scored], ids[args.prompt_tokens - args.scored:args.prompt_tokens]
        for i in range(0, len(head), 512):
            llm.forward(head[i:i + 512])
        logits = np.asarray(llm.forward(tail), dtype=np.float32)
        targets = np.array(ids[args.prompt_tokens - args.scored + 1:args.prompt_tokens + 1])
        nll = float(-_log_softmax(logits)[np.arange(len(targets)), targets].mean())
        row: dict = {"nll": nll, "prefill_s": time.perf_counter() - started,
                     "kv_bytes_per_token": kv_bytes_per_token_layer(cfg.num_kv_heads, cfg.head_dim, kind)
                     * sum(1 for i in range(cfg.num_layers) if not cfg.is_linear_layer(i))}
        if args.save:
            np.savez(Path(args.save) / f"{kind}.npz", logits=logits, targets=targets, nll=nll,
                     streams=np.array([[]]), bytes=row["kv_bytes_per_token"])
        if base_logits is None:
            base_logits = logits
        d = np.abs(logits - base_logits)
        row.update(max_abs=float(d.max()), mean_abs=float(d.mean()),
                   top1=float((logits.argmax(-1) == base_logits.argmax(-1)).mean()),
                   logit_std=float(base_logits.std()))
        streams = []
        for p in range(args.prompts):
            prompt = _prose_tokens(llm, args.gen_context, 200 + 300 * p)
            llm.reset()
            stream: list[int] = []
            step = np.asarray(llm.forward(prompt))[-1]
            for _ in range(args.gen):
                token = int(np.argmax(step))
                stream.append(token)
                step = np.asarray(llm.forward([token]))[-1]
            streams.append(stream)
        if args.save:
            np.savez(Path(args.save) / f"{kind}.npz", logits=logits, targets=targets, nll=nll,
                     streams=np.array(streams), bytes=row["kv_bytes_per_token"])
        if not base_streams:
            base_streams = streams
        row["first_diff"] = [next((i for i, (a, b) in enumerate(zip(s, t, strict=True)) if a != b), len(s))
                             for s, t in zip(streams, base_streams, strict=True)]
        row["same_tokens"] = float(np.mean([np.mean(np.array(s) == np.array(t))
                                            for s, t in zip(streams, base_streams, strict=True)]))
        out["kinds"][kind] = row
        llm.close()
        print(f"done: {kind} ({row['prefill_s']:.0f} s prefill)", file=sys.stderr)
    return out


def model_from(args: argparse.Namespace) -> dict:
    """The table of runs saved by ``model --save DIR`` (one file per cache type, f32 among them)."""
    runs = {kind: np.load(Path(args.path) / f"{kind}.npz") for kind in args.kinds.split(",")}
    base = runs["f32"]
    out: dict = {"model": str(args.path), "gen": int(base["streams"].shape[1]), "kinds": {}}
    for kind, r in runs.items():
        d = np.abs(r["logits"] - base["logits"])
        s, t = r["streams"], base["streams"]
        out["kinds"][kind] = {
            "nll": float(r["nll"]), "kv_bytes_per_token": int(r["bytes"]), "max_abs": float(d.max()),
            "mean_abs": float(d.mean()), "top1": float((r["logits"].argmax(-1) == base["logits"].argmax(-1)).mean()),
            "first_diff": [int(np.argmax(a != b)) if np.any(a != b) else len(a) for a, b in zip(s, t, strict=True)],
            "same_tokens": float((s == t).mean())}
    return out


def model_markdown(out: dict) -> str:
    rows = [f"| cache | KV bytes / token | max abs d logit | mean abs d logit | top-1 agree | NLL | d NLL "
            f"| greedy: first differing token of {out['gen']} (per prompt) | same tokens |",
            "|---|--:|--:|--:|--:|--:|--:|---|--:|"]
    base = out["kinds"].get("f32", next(iter(out["kinds"].values())))["nll"]
    for kind, r in out["kinds"].items():
        rows.append(f"| {kind} | {r['kv_bytes_per_token']} | {r['max_abs']:.3f} | {r['mean_abs']:.4f} | "
                    f"{100 * r['top1']:.1f}% | {r['nll']:.4f} | {r['nll'] - base:+.4f} | "
                    f"{' / '.join(str(x) for x in r['first_diff'])} | {100 * r['same_tokens']:.0f}% |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("accuracy")
    p.add_argument("--gguf", default=str(DEFAULT_GGUF), help="a float-weight GGUF for the deep run ('' to skip)")
    p = sub.add_parser("model")
    p.add_argument("path", help="a GGUF file or model folder")
    p.add_argument("--kinds", default="f32,f16,q8,q4r,q3r")
    p.add_argument("--prompt-tokens", type=int, default=2048, help="the teacher-forced prompt's length")
    p.add_argument("--scored", type=int, default=256, help="its last positions whose logits are compared")
    p.add_argument("--gen", type=int, default=256, help="greedy tokens per prompt")
    p.add_argument("--gen-context", type=int, default=512, help="tokens of each greedy prompt")
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("-t", "--threads", type=int, default=None)
    p.add_argument("--save", default=None, metavar="DIR", help="also save each type's logits and streams there")
    p.add_argument("--from", dest="from_dir", action="store_true",
                   help="PATH is a --save folder: compare its runs (no model)")
    p = sub.add_parser("speed")
    p.add_argument("-d", "--depth", type=int, default=2048, help="context prefilled before the timed decode")
    p.add_argument("-n", "--n-gen", type=int, default=32)
    p.add_argument("-r", "--repetitions", type=int, default=3)
    p.add_argument("-q", "--quant", default="q4")
    p.add_argument("--kinds", default="f16,q8")
    p = sub.add_parser("attention")
    p.add_argument("-d", "--depth", type=int, default=2048)
    p.add_argument("-l", "--layers", type=int, default=1, help="caches read per token (28: past L3, as in the model)")
    p.add_argument("-t", "--threads", type=int, default=None)
    p.add_argument("-r", "--repetitions", type=int, default=7)
    p.add_argument("--kinds", default="f32,f16,q8")
    for p in sub.choices.values():
        p.add_argument("-b", "--backend", action="append", default=None, help="backend(s), e.g. cpu")
        p.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.what == "model":
        out = model_from(args) if args.from_dir else model_accuracy(args)
        print(json.dumps(out, indent=2) if args.json else model_markdown(out))
    elif args.what == "accuracy":
        out = accuracy(args)
        print(json.dumps(out, indent=2) if args.json else accuracy_markdown(out))
    elif args.what == "speed":
        out = speed(args)
        print(json.dumps(out, indent=2) if args.json else speed_markdown(out))
    else:
        out = attention(args)
        rows = [f"| cache | {out['layers']} layer(s)' decode attention at depth {out['depth']}: us per token (wall) | "
                "CPU us | KV read (MB) | GB/s (wall) |", "|---|--:|--:|--:|--:|"]
        rows += [f"| {kind} | {r['median_us']:.0f} | {r['cpu_median_us']:.0f} | {r['kv_mb']:.0f} | "
                 f"{r['read_gb_s']:.1f} |" for kind, r in out["results"].items()]
        print(json.dumps(out, indent=2) if args.json else "\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
