"""``hetero generate``, ``hetero chat`` and ``hetero bench`` (and ``hetero run`` on an LLM), with llama.cpp's flag
names: ``-m/--model``, ``-p/--prompt``, ``-c/--ctx-size``, ``-n/--n-predict``, ``--temp``, ``--top-k``, ``--top-p``,
``--min-p``, ``--seed``, ``-t/--threads``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import progress
from ..cli_parser import add_backend_option, add_command, backends_of
from ..contract.errors import HeteroError
from . import steplog
from .cli_generation import load_llm, model_path, print_stats, prompt_cache_options, sampling, stream_out

MODEL_HELP = "a .gguf file, a Hugging Face model folder, or a repo id found in the local Hugging Face cache"


def add_llm_commands(subparsers: Any) -> None:
    """Add generate / chat / bench to the subparsers of the main parser."""

    def command(name: str, help_text: str, func: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
        return add_command(subparsers, name, help_text, func)

    p = command("generate", "continue a prompt with an LLM (GGUF file or Hugging Face folder)", _cmd_generate)
    _model_arguments(p)
    p.add_argument("prompt", nargs="?", help="the prompt text (same as -p)")
    p.add_argument("-p", "--prompt", dest="prompt_opt", metavar="TEXT",
                   help="the prompt text (default: read stdin; on a terminal, end it with Ctrl-D)")
    p.add_argument("-f", "--file", dest="prompt_file", metavar="FILE", help="read the prompt from FILE")
    add_backend_option(p)
    add_generation_options(p, default_n=128)
    p.add_argument("--compress-to", type=int, default=None, metavar="N",
                   help="fit the prompt into N tokens: its first two and last two sentences and those most relevant to "
                        "them are kept (docs/long-context.md; default: off)")

    p = command("chat", "chat with an LLM in a line editor: history, multi-line input, /help, /reset, /bye",
                _cmd_chat)
    _model_arguments(p)
    add_backend_option(p)
    add_generation_options(p, default_n=1024)

    p = command("bench", "LLM throughput, llama-bench style: sweeps of prompt / generation sizes, threads and "
                "backends (default model: a synthetic Qwen3-0.6B in q4)", _cmd_bench)
    p.add_argument("-m", "--model", help=MODEL_HELP + " (default: a synthetic model, see --synthetic)")
    p.add_argument("--synthetic", default="qwen3-0.6b",
                   help="synthetic shapes without -m: qwen3-0.6b, qwen3.5-0.8b, qwen3.5-2b, tiny, qwen3.5-tiny")
    p.add_argument("--linear-attention-mode", default="auto", choices=["auto", "chunked", "recurrent"],
                   help="Qwen3.5 synthetic models: GatedDeltaRule prefill form (compare chunked with recurrent)")
    p.add_argument("-p", "--n-prompt", action="append", default=None, metavar="N[,N]",
                   help="prefill test sizes, e.g. 512 or 128,512 (default 512)")
    p.add_argument("-n", "--n-gen", action="append", default=None, metavar="N[,N]",
                   help="decode test sizes, e.g. 128 (default 128)")
    p.add_argument("-pg", action="append", default=None, metavar="P,N", help="prefill P then decode N (repeatable)")
    p.add_argument("-r", "--repetitions", type=int, default=5, help="timed runs per test (default 5)")
    p.add_argument("-b", "--backend", action="append", default=[], metavar="NAME[,NAME]",
                   help="backends in preference order for every test, e.g. opencl,cpu")
    p.add_argument("-a", "--backends", dest="compare", action="append", default=[], metavar="A,B",
                   help="compare backends, one model load each, in one table (MNN llm_bench's -a), e.g. cpu,opencl")
    p.add_argument("-t", "--threads", action="append", default=None, metavar="N[,N]",
                   help="thread counts to sweep, e.g. 1,2 (default: the backend's)")
    p.add_argument("-q", "--quant", default=None,
                   help="quantize at load: q4 / q8 (+ _asym, _b64, _b128); synthetic default q4")
    p.add_argument("-c", "--ctx-size", "--ctx", dest="ctx", type=int, default=None,
                   help="context in tokens (default: what the tests need)")
    p.add_argument("--no-warmup", action="store_true", help="time the first run of each test too")
    p.add_argument("--seed", type=int, default=0, help="seed of the random token ids (default 0)")
    p.add_argument("-o", "--output", choices=["md", "json", "csv", "jsonl"], default="md",
                   help="table format: md (default, as llama-bench prints), json, jsonl or csv")
    p.add_argument("--json", action="store_true", help="same as -o json")
    p.add_argument("--spec", action="append", default=None, metavar="DRAFTER",
                   help="speculative decoding against plain decoding, alternated in one run, on a code-completion "
                        "and a chat prompt: lookahead, draft:PATH, eagle:PATH, dflash:PATH (-n: tokens per run, "
                        "default 64; -r: pairs, default 5; repeat --spec to compare drafters in the same run)")
    p.add_argument("--spec-draft", type=int, default=None, metavar="N", help="--spec: most tokens per draft")
    p.add_argument("--spec-log", default=None, metavar="PATH",
                   help="--spec: append one JSON line per decode step to PATH (draft lengths, times, the policy's "
                        "state: hetero.llm.steplog; the same as HETERO_SPEC_LOG=PATH)")
    p.add_argument("--profile", action="store_true",
                   help="after the tests: a decode step's time inside native code vs Python, per op type")
    _kv_option(p)


def _model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", help=MODEL_HELP + " (same as -m)")
    p.add_argument("-m", "--model", dest="model_opt", metavar="MODEL", help=MODEL_HELP)


def add_generation_options(p: argparse.ArgumentParser, *, default_n: int = 128,
                           seed_help: str = "sampling seed (default: random)") -> None:
    """Flags of every command that loads and samples from an LLM (generate, chat, run)."""
    p.add_argument("-n", "--n-predict", "--max-new-tokens", dest="max_new_tokens", type=int, default=default_n,
                   metavar="N", help=f"most tokens to generate (default {default_n})")
    p.add_argument("-c", "--ctx-size", "--ctx", dest="ctx", type=int, default=4096, metavar="N",
                   help="context length (KV cache) in tokens (default 4096)")
    p.add_argument("-t", "--threads", type=int, default=None, metavar="N",
                   help="threads of the CPU backend (default: every core)")
    p.add_argument("-q", "--quant", default=None,
                   help="quantize float weights at load: q4 / q8 (+ _asym, _b64, _b128); GGUF's own types are kept")
    p.add_argument("--on-fallback", choices=["warn", "error", "silent"], default=None,
                   help="nodes that leave the requested backends: one warning, an error, or nothing "
                        "(default: warn for ONNX models, silent for LLMs)")
    p.add_argument("--system", help="chat: a system prompt")
    p.add_argument("--no-think", action="store_true", help="chat: ask thinking models not to think")
    p.add_argument("--stop", action="append", default=[], help="stop at this text (repeatable)")
    p.add_argument("--no-stream", action="store_true", help="print the text once it is complete")
    p.add_argument("--temp", "--temperature", dest="temp", type=float, default=None,
                   help="temperature; 0 is greedy (default: the model file's sampling keys, else llama.cpp's 0.8)")
    p.add_argument("--top-k", type=int, default=None, help="keep the K most likely tokens; 0 is off")
    p.add_argument("--top-p", type=float, default=None, help="keep the smallest set with this much probability")
    p.add_argument("--min-p", type=float, default=None, help="drop tokens below this fraction of the best")
    p.add_argument("--repeat-penalty", type=float, default=None, help="penalize tokens seen recently (1 is off)")
    p.add_argument("--presence-penalty", type=float, default=None, help="subtracted once from every seen token")
    p.add_argument("--frequency-penalty", type=float, default=None, help="subtracted per occurrence")
    p.add_argument("--seed", type=int, default=None, help=seed_help)
    p.add_argument("--spec", default=None, metavar="DRAFTER",
                   help="speculative decoding (same output, greedy identical): lookahead, draft:PATH (a smaller "
                        "model with the same tokenizer), eagle:PATH or dflash:PATH (docs/speculative.md)")
    p.add_argument("--spec-draft", type=int, default=None, metavar="N",
                   help="most tokens drafted per verify step (1..15; default: the drafter's)")
    p.add_argument("--prompt-cache", default=None, metavar="FILE",
                   help="a prefix-cache file, as llama.cpp's: the part of the prompt it holds is loaded instead of "
                        "computed, and the computed prompt is saved to it (created when missing; a file of another "
                        "model, model version, backend or KV type is ignored with a warning; chat: the first prompt)")
    p.add_argument("--prompt-cache-ro", action="store_true",
                   help="use --prompt-cache without writing it")
    _kv_option(p)


def _kv_option(p: argparse.ArgumentParser) -> None:
    # The choices are hetero.llm.model.KV_CACHE_TYPES, spelled out so building the parser imports nothing heavy.
    p.add_argument("--kv-cache", default="f16", choices=["f16", "f32", "q8", "q4r", "q3r"],
                   help="KV cache element type: f16 (default), f32 (exact), q8 (int8, about half of f16's memory), "
                        "q4r / q3r (rotated 4 / 3-bit, about a quarter / a fifth; cpu)")


def _load(args: argparse.Namespace) -> Any:
    """The model the arguments name, loaded (tests reach the loaded model through this)."""
    return load_llm(args, model_path(args)).llm


def _read_prompt(args: argparse.Namespace) -> str:
    if args.prompt_file:
        try:
            return Path(args.prompt_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise HeteroError(f"-f {args.prompt_file}: cannot read the prompt ({exc})") from exc
    if sys.stdin.isatty():
        print("hetero: reading the prompt from stdin (end it with Ctrl-D; or pass -p TEXT)", file=sys.stderr)
    return sys.stdin.read()


def _generate(args: argparse.Namespace, model: str, prompt: str) -> int:
    if not prompt.strip():
        raise HeteroError("the prompt is empty: give it with -p TEXT, -f FILE or on stdin")
    loaded = load_llm(args, model)
    overrides = sampling(args)
    options = {"compress_to": args.compress_to} if getattr(args, "compress_to", None) is not None else {}
    options.update(prompt_cache_options(args))
    started = time.perf_counter()
    if args.no_stream:
        print(loaded.llm.generate(prompt, args.max_new_tokens, stop=args.stop, spec=loaded.spec, **overrides,
                                  **options))
        first = None
    else:
        first = stream_out(loaded.llm.generate(prompt, args.max_new_tokens, stop=args.stop, stream=True,
                                               spec=loaded.spec, **overrides, **options), started)
    print_stats(loaded, overrides, first)
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    model = model_path(args)
    if args.prompt is not None and args.prompt_opt is not None:
        raise HeteroError(f"two prompts given: -p {args.prompt_opt!r} and {args.prompt!r}")
    prompt = args.prompt if args.prompt is not None else args.prompt_opt
    return _generate(args, model, prompt if prompt is not None else _read_prompt(args))


def _cmd_chat(args: argparse.Namespace, stdin: Any = None) -> int:
    from .repl import ChatRepl

    model = model_path(args)
    loaded = load_llm(args, model)
    if loaded.spec is not None:  # the replies share this process: each verify width planned and recorded now, at
        loaded.spec.warm(loaded.llm)  # load, not in the first replies' drafts (Speculation.warm)
    return ChatRepl(loaded, args, stdin or sys.stdin).run()


def run_llm(args: argparse.Namespace) -> int:
    """``hetero run MODEL [PROMPT]`` on an LLM, as ``ollama run``: generate from the prompt, else chat on a terminal,
    else generate from stdin."""
    onnx_only = [flag for flag, given in (("-i", args.input), ("--random-inputs", args.random_inputs),
                                          ("--explain", args.explain), ("--save-outputs", args.save_outputs)) if given]
    if onnx_only:
        raise HeteroError(f"{args.model} is an LLM: {', '.join(onnx_only)} apply to ONNX models (give a prompt)")
    if args.prompt is not None:
        return _generate(args, args.model, args.prompt)
    if sys.stdin.isatty():
        args.model_opt = None
        return _cmd_chat(args)
    args.prompt_file = None
    return _generate(args, args.model, _read_prompt(args))


# -- bench -------------------------------------------------------------------------------------------------------
def _sizes(values: list[str] | None, flag: str = "-p") -> list[int]:
    out = []
    for value in values or []:
        for part in value.split(","):
            try:
                out.append(int(part))
            except ValueError:
                raise HeteroError(f"bench: {flag} {part!r} is not a number") from None
    if any(v < 0 for v in out):
        raise HeteroError(f"bench: {flag} values must be >= 0")
    return out


def _pairs(values: list[str] | None) -> list[tuple[int, int]]:
    pairs = []
    for value in values or []:
        parts = value.split(",")
        if len(parts) != 2:
            raise HeteroError(f"bench: -pg {value!r}: expected P,N (e.g. 512,128)")
        p, n = _sizes(parts, "-pg")
        pairs.append((p, n))
    return pairs


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench import bench, formatted, plan

    if args.spec:
        return _bench_spec(args)
    if args.n_prompt is None and args.n_gen is None and args.pg is None:
        tests = plan([512], [128], [])
    else:
        tests = plan(_sizes(args.n_prompt, "-p"), _sizes(args.n_gen, "-n"), _pairs(args.pg))
    if not tests:
        raise HeteroError("bench: nothing to run (all test sizes are 0)")
    threads: list[int | None] = [*_sizes(args.threads, "-t")] or [None]
    if any(t == 0 for t in threads):
        raise HeteroError("bench: -t values must be >= 1")
    if args.compare and args.backend:
        raise HeteroError("bench: give -b (one preference list) or -a (backends to compare), not both")
    runs: list[list[str] | None] = [[b.strip()] for spec in args.compare for b in spec.split(",") if b.strip()]
    runs = runs or [backends_of(args)]
    needed = max(p + max(n, 1) for p, n in tests) + 1
    if args.profile:
        from .profile import context_needed

        needed = max(needed, context_needed())
    context = args.ctx or needed
    if context < needed:
        raise HeteroError(f"bench: the tests need a context of {needed} tokens; -c is {context}")
    output = "json" if args.json else args.output
    results = []
    profile = None
    notes: list[str] = []  # caveats of what ran (a simulator's speed is not the device's)
    for backends in runs:
        for n_threads in threads:
            llm = _bench_model(args, backends, n_threads, context, show=output == "md")
            notes += [llm.decoder.note] if llm.decoder is not None and llm.decoder.note not in ("", *notes) else []
            results += bench(llm, tests, args.repetitions, warmup=not args.no_warmup, seed=args.seed,
                             threads=n_threads, progress=output == "md")
            if args.profile and profile is None:
                from .profile import profile_decode

                profile = profile_decode(llm, seed=args.seed)
            del llm  # freed before the next load: one model in memory at a time
    if output == "json" and profile:
        print(json.dumps({"results": [r.as_dict() for r in results], "profile": profile.as_dict()}, indent=2))
        return 0
    print(formatted(results, output))
    for note in notes:
        print(f"note: {note}", file=sys.stderr if output != "md" else sys.stdout)
    if profile and output == "md":
        print()
        print(profile.markdown())
    return 0


def _bench_spec(args: argparse.Namespace) -> int:
    from .speculative.bench import bench_speculative, spec_table

    if not args.model:
        raise HeteroError("bench --spec needs -m MODEL (a real model: a synthetic one has no tokenizer to draft with)")
    if args.spec_log:
        os.environ[steplog.ENV] = args.spec_log
    n_gen = (_sizes(args.n_gen, "-n") or [64])[-1]
    threads: list[int | None] = [*_sizes(args.threads, "-t")] or [None]
    results = []
    for n_threads in threads:
        llm = _bench_model(args, backends_of(args), n_threads, args.ctx or 2048, show=args.output == "md")
        results += bench_speculative(llm, args.spec, n_gen=n_gen, repetitions=args.repetitions, threads=n_threads,
                                     max_draft=args.spec_draft)
        del llm
    if args.json or args.output == "json":
        print(json.dumps([r.as_dict() for r in results], indent=2))
    else:
        print(spec_table(results))
    return 0


def _bench_model(args: argparse.Namespace, backends: list[str] | None, threads: int | None, context: int,
                 show: bool) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the placement shows in the backend column
        name = Path(args.model).name if args.model else f"synthetic {args.synthetic}"
        with progress.phase(f"loading {name}"):
            if args.model:
                from .loader import load

                return load(args.model, backends=backends, on_fallback="silent", threads=threads, quant=args.quant,
                            context=context, kv_cache=args.kv_cache, progress=show)
            from .synthetic import load_synthetic

            return load_synthetic(args.synthetic, args.quant or "q4", backends=backends, on_fallback="silent",
                                  threads=threads, context=context, progress=show,
                                  linear_attention_mode=args.linear_attention_mode, kv_cache=args.kv_cache)


__all__ = ["add_generation_options", "add_llm_commands", "run_llm"]
