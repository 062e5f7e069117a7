"""``hetero generate``, ``hetero chat`` and ``hetero bench``: added to the main parser by ``add_llm_commands``."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from typing import Any

from ..contract.errors import HeteroError


def add_llm_commands(subparsers: Any) -> None:
    p = subparsers.add_parser("generate", help="continue a prompt with an LLM (Hugging Face folder)")
    p.add_argument("model", help="path to a Hugging Face model folder")
    p.add_argument("prompt", nargs="?", help="the prompt text (default: read stdin)")
    p.add_argument("-n", "--max-new-tokens", type=int, default=128)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--no-stream", action="store_true", help="print the text once it is complete")
    _model_options(p)
    _sampling_options(p)
    p.set_defaults(func=_cmd_generate)

    p = subparsers.add_parser("chat", help="chat with an LLM interactively (streaming; /reset, /exit)")
    p.add_argument("model", help="path to a Hugging Face model folder")
    p.add_argument("--system", help="a system prompt")
    p.add_argument("-n", "--max-new-tokens", type=int, default=1024)
    p.add_argument("--no-think", action="store_true", help="ask thinking models not to think (enable_thinking=False)")
    _model_options(p)
    _sampling_options(p)
    p.set_defaults(func=_cmd_chat)

    p = subparsers.add_parser("bench", help="LLM throughput, llama-bench style (default: synthetic Qwen3-0.6B q4)")
    p.add_argument("-m", "--model", help="Hugging Face model folder (default: a synthetic model, see --synthetic)")
    p.add_argument("--synthetic", default="qwen3-0.6b",
                   help="synthetic shapes without -m: qwen3-0.6b, qwen3.5-0.8b, qwen3.5-2b, tiny, qwen3.5-tiny")
    p.add_argument("--linear-attention-mode", default="auto", choices=["auto", "chunked", "recurrent"],
                   help="Qwen3.5 synthetic models: GatedDeltaRule prefill form (compare chunked with recurrent)")
    p.add_argument("-p", "--n-prompt", action="append", default=None, help="prefill test sizes, e.g. 512 or 128,512")
    p.add_argument("-n", "--n-gen", action="append", default=None, help="decode test sizes, e.g. 128")
    p.add_argument("-pg", action="append", default=None, metavar="P,N", help="prefill P then decode N")
    p.add_argument("-r", "--repetitions", type=int, default=5)
    p.add_argument("-b", "--backend", action="append", default=[], help="backend(s) in preference order, e.g. cpu")
    p.add_argument("-t", "--threads", type=int, default=None)
    p.add_argument("-q", "--quant", default=None, help="q4 / q8 (+ _asym, _b64, _b128); synthetic default q4")
    p.add_argument("-c", "--ctx", type=int, default=None, help="context (default: what the tests need)")
    p.add_argument("--no-warmup", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--profile", action="store_true",
                   help="after the tests: a decode step's time inside native code vs Python, per op type")
    _kv_option(p)
    p.set_defaults(func=_cmd_bench)


def _model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-b", "--backend", action="append", default=[], help="backend(s) in preference order, e.g. cpu")
    p.add_argument("-t", "--threads", type=int, default=None)
    p.add_argument("-q", "--quant", default=None, help="quantize at load: q4 / q8 (+ _asym, _b64, _b128)")
    p.add_argument("-c", "--ctx", type=int, default=4096, help="context length (KV cache) in tokens")
    p.add_argument("--on-fallback", choices=["warn", "error", "silent"], default="silent")
    _kv_option(p)


def _kv_option(p: argparse.ArgumentParser) -> None:
    # The choices are hetero.llm.model.KV_CACHE_TYPES, spelled out so building the parser imports nothing heavy.
    p.add_argument("--kv-cache", default="f16", choices=["f16", "f32", "q8"],
                   help="KV cache element type: f16 (default), f32 (exact) or q8 (int8, about half of f16's memory)")


def _sampling_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temp", type=float, default=None, help="temperature (0: greedy; default: the model's)")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--min-p", type=float, default=None)
    p.add_argument("--repeat-penalty", type=float, default=None)
    p.add_argument("--presence-penalty", type=float, default=None)
    p.add_argument("--frequency-penalty", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)


def _backends(args: argparse.Namespace) -> list[str] | None:
    return [b for spec in args.backend for b in spec.split(",") if b] or None


def _load(args: argparse.Namespace):
    from .loader import load

    return load(args.model, backends=_backends(args), on_fallback=args.on_fallback, threads=args.threads,
                quant=args.quant, context=args.ctx, kv_cache=args.kv_cache)


def _sampling(args: argparse.Namespace) -> dict[str, Any]:
    return dict(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                repetition_penalty=args.repeat_penalty, presence_penalty=args.presence_penalty,
                frequency_penalty=args.frequency_penalty, seed=args.seed)


def _print_stats(llm) -> None:
    s = llm.stats
    print(f"\n[prompt {s.prompt_tokens} tokens ({s.cached_tokens} cached), prefill {s.prefill_tokens_per_second:.1f} "
          f"t/s; generated {s.generated_tokens} tokens, {s.decode_tokens_per_second:.1f} t/s]", file=sys.stderr)


def _cmd_generate(args: argparse.Namespace) -> int:
    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    llm = _load(args)
    pieces = llm.generate(prompt, args.max_new_tokens, stop=args.stop, stream=not args.no_stream,
                          **_sampling(args))
    if args.no_stream:
        print(pieces)
    else:
        for piece in pieces:
            print(piece, end="", flush=True)
        print()
    _print_stats(llm)
    return 0


def _cmd_chat(args: argparse.Namespace, stdin: Any = None) -> int:
    stdin = stdin or sys.stdin
    llm = _load(args)
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages: list[dict[str, str]] = list(system)
    template = {"enable_thinking": False} if args.no_think else {}
    interactive = stdin.isatty()
    print("hetero chat: /reset clears the conversation, /exit quits", file=sys.stderr)
    while True:
        if interactive:
            print("> ", end="", flush=True)
        line = stdin.readline()
        if not line:
            break
        text = line.rstrip("\n")
        if text.strip() in ("/exit", "/quit"):
            break
        if text.strip() == "/reset":
            messages = list(system)
            llm.reset()
            continue
        if not text.strip():
            continue
        messages.append({"role": "user", "content": text})
        reply = []
        try:
            for piece in llm.chat(messages, args.max_new_tokens, stream=True, template_kwargs=template,
                                  **_sampling(args)):
                reply.append(piece)
                print(piece, end="", flush=True)
        except KeyboardInterrupt:
            print("\n[interrupted]", file=sys.stderr)
        print()
        messages.append({"role": "assistant", "content": "".join(reply)})
        _print_stats(llm)
    return 0


def _sizes(values: list[str] | None) -> list[int]:
    out = []
    for value in values or []:
        for part in value.split(","):
            try:
                out.append(int(part))
            except ValueError:
                raise HeteroError(f"bench: {part!r} is not a token count") from None
    if any(v < 0 for v in out):
        raise HeteroError("bench: token counts must be >= 0")
    return out


def _pairs(values: list[str] | None) -> list[tuple[int, int]]:
    pairs = []
    for value in values or []:
        parts = value.split(",")
        if len(parts) != 2:
            raise HeteroError(f"bench: -pg {value!r}: expected P,N (e.g. 512,128)")
        p, n = _sizes(parts)
        pairs.append((p, n))
    return pairs


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench import bench, markdown, plan

    if args.n_prompt is None and args.n_gen is None and args.pg is None:
        tests = plan([512], [128], [])
    else:
        tests = plan(_sizes(args.n_prompt), _sizes(args.n_gen), _pairs(args.pg))
    if not tests:
        raise HeteroError("bench: nothing to run (all test sizes are 0)")
    needed = max(p + max(n, 1) for p, n in tests) + 1
    if args.profile:
        from .profile import context_needed

        needed = max(needed, context_needed())
    context = args.ctx or needed
    if context < needed:
        raise HeteroError(f"bench: the tests need a context of {needed} tokens; -c is {context}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the placement shows in the backend column
        if args.model:
            from .loader import load

            llm = load(args.model, backends=_backends(args), on_fallback="silent", threads=args.threads,
                       quant=args.quant, context=context, kv_cache=args.kv_cache)
        else:
            from .synthetic import load_synthetic

            llm = load_synthetic(args.synthetic, args.quant or "q4", backends=_backends(args), on_fallback="silent",
                                 threads=args.threads, context=context, progress=not args.json,
                                 linear_attention_mode=args.linear_attention_mode, kv_cache=args.kv_cache)
    results = bench(llm, tests, args.repetitions, warmup=not args.no_warmup, seed=args.seed, threads=args.threads)
    profile = None
    if args.profile:
        from .profile import profile_decode

        profile = profile_decode(llm, seed=args.seed)
    if args.json:
        rows = [r.as_dict() for r in results]
        print(json.dumps({"results": rows, "profile": profile.as_dict()} if profile else rows, indent=2))
    else:
        print(markdown(results))
        if profile:
            print()
            print(profile.markdown())
    return 0
