"""``hetero eval needle``: the needle-in-a-haystack grid (``hetero.llm.needle``) on a model, for each KV cache type
and with / without token compression, as markdown tables and a heat-map PNG."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..cli_parser import add_backend_option, add_command, add_output_options
from ..contract.errors import HeteroError


def add_eval_command(subparsers: Any) -> None:
    p = subparsers.add_parser("eval", help="evaluations of an LLM: needle (long-context retrieval)",
                              description="evaluations of an LLM")
    # argparse cannot mix positionals across a nested subcommand (CommandParser's intermixing): plain parsing here
    p.is_subcommand = False
    evals = p.add_subparsers(dest="evaluation", metavar="EVALUATION", required=True, help="the evaluation to run")
    n = add_command(evals, "needle", "needle in a haystack, NeedleBench style: synthetic facts hidden at depths of a "
                    "prose haystack, retrieval accuracy per context length x depth (docs/long-context.md)",
                    _cmd_needle)
    n.add_argument("model", nargs="?", help="a .gguf file or a Hugging Face model folder (same as -m)")
    n.add_argument("-m", "--model", dest="model_opt", metavar="MODEL", help="same as the positional MODEL")
    n.add_argument("-l", "--lengths", default="512,1024,2048", metavar="N[,N]",
                   help="prompt lengths in tokens, template and question included (default 512,1024,2048)")
    n.add_argument("-d", "--depths", default="0,25,50,75,100", metavar="P[,P]",
                   help="needle depths in percent of the haystack (default 0,25,50,75,100)")
    n.add_argument("--needles", type=int, default=1, metavar="N",
                   help="needles per prompt: 1 is single-needle retrieval, more multi-needle (default 1)")
    n.add_argument("-r", "--repeats", type=int, default=1, metavar="N",
                   help="prompts per cell, each with other needles (default 1)")
    n.add_argument("--kv-cache", default="f16", metavar="TYPE[,TYPE]",
                   help="KV cache types to compare, one model load each: f16, f32, q8, q4r, q3r (default f16)")
    n.add_argument("--compress", type=float, default=None, metavar="SHARE",
                   help="also run with the document compressed to this share of its tokens (e.g. 0.5)")
    n.add_argument("--compress-only", action="store_true", help="with --compress: skip the uncompressed runs")
    n.add_argument("--template", choices=["auto", "chat", "plain"], default="auto",
                   help="chat: the model's chat template; plain: text ending in 'Answer:' (default: chat if the "
                        "model has a template)")
    n.add_argument("--haystack", metavar="FILE",
                   help="a plain-text file (default: the Python language reference's prose, shipped with Python)")
    n.add_argument("--heatmap", metavar="FILE.png", help="write the heat map (one panel per table) to this file")
    n.add_argument("--replies", metavar="FILE.jsonl",
                   help="write every prompt's setting, cell, tokens read, score and reply, one JSON object a line")
    n.add_argument("-n", "--max-new-tokens", type=int, default=None, metavar="N",
                   help=f"most tokens of each answer (default {ANSWER_TOKENS} per needle: a reply such as 'The "
                        "secret number of the amber river is 123456.' takes ~16 tokens)")
    n.add_argument("--seed", type=int, default=0, help="seed of the needles (default 0)")
    n.add_argument("-t", "--threads", type=int, default=None, metavar="N", help="threads of the CPU backend")
    n.add_argument("-q", "--quant", default=None, help="quantize float weights at load: q4 / q8")
    n.add_argument("--on-fallback", choices=["warn", "error", "silent"], default=None,
                   help="nodes that leave the requested backends (default: silent)")
    add_backend_option(n)
    add_output_options(n)


ANSWER_TOKENS = 24  # per needle


def _numbers(text: str, flag: str, kind: type) -> list[Any]:
    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise HeteroError(f"eval needle: {flag} {text!r}: expected comma-separated numbers") from None
    if not values:
        raise HeteroError(f"eval needle: {flag} is empty")
    return values


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """The options checked before a model is loaded."""
    lengths = _numbers(args.lengths, "--lengths", int)
    depths = _numbers(args.depths, "--depths", float)
    if any(n < 16 for n in lengths):
        raise HeteroError(f"eval needle: --lengths {args.lengths}: each must be at least 16 tokens")
    if any(not 0 <= d <= 100 for d in depths):
        raise HeteroError(f"eval needle: --depths {args.depths}: each must be within 0..100 (percent)")
    if not 1 <= args.needles <= 20:
        raise HeteroError(f"eval needle: --needles {args.needles}: expected 1..20")
    if args.max_new_tokens is None:
        args.max_new_tokens = ANSWER_TOKENS * args.needles
    if args.repeats < 1 or args.max_new_tokens < 1:
        raise HeteroError("eval needle: --repeats and --max-new-tokens must be >= 1")
    kv_types = [k.strip() for k in args.kv_cache.split(",") if k.strip()]
    from .model import KV_CACHE_TYPES

    bad = [k for k in kv_types if k not in KV_CACHE_TYPES]
    if bad or not kv_types:
        raise HeteroError(f"eval needle: --kv-cache {args.kv_cache!r}: expected some of {', '.join(KV_CACHE_TYPES)}")
    if args.compress is not None and not 0 < args.compress < 1:
        raise HeteroError(f"eval needle: --compress {args.compress}: expected a share between 0 and 1 (e.g. 0.5)")
    if args.compress_only and args.compress is None:
        raise HeteroError("eval needle: --compress-only needs --compress SHARE")
    if args.heatmap and not args.heatmap.lower().endswith(".png"):
        raise HeteroError(f"eval needle: --heatmap {args.heatmap}: the heat map is a .png file")
    compress: list[float | None] = [] if args.compress_only else [None]
    if args.compress is not None:
        compress.append(args.compress)
    return dict(lengths=sorted(set(lengths)), depths=sorted(set(depths)), kv_types=kv_types, compress=compress)


def _cmd_needle(args: argparse.Namespace) -> int:
    from .cli_generation import load_llm, model_path
    from .heatmap import Panel, write_heatmap
    from .needle import Grid, haystack_sentences, run_grid, table

    settings = _settings(args)
    model = model_path(args)
    sentences, source = haystack_sentences(args.haystack)
    quiet = getattr(args, "quiet", False)

    def log(line: str) -> None:
        if not quiet:
            print(line, file=sys.stderr, flush=True)

    grids = []
    args.ctx = max(settings["lengths"]) + args.max_new_tokens + 1
    for kv in settings["kv_types"]:
        args.kv_cache = kv
        llm = load_llm(args, model).llm
        if llm.tokenizer is None:
            raise HeteroError(f"{model}: the model has no tokenizer; the evaluation needs text")
        for compress in settings["compress"]:
            label = f"kv {kv}, " + ("uncompressed" if compress is None else f"compressed to {compress:g}")
            grid = Grid(label, settings["lengths"], settings["depths"])
            grids.append(run_grid(llm, grid, sentences, needles=args.needles, repeats=args.repeats,
                                  template=args.template, compress=compress, seed=args.seed,
                                  max_new_tokens=args.max_new_tokens, log=log))
        del llm  # one model in memory at a time
    print(f"needle in a haystack: {Path(model).name}, {args.needles} needle(s), {args.repeats} prompt(s) per cell, "
          f"haystack: {source}; accuracy in % (rows: prompt tokens, columns: needle depth)")
    for grid in grids:
        print(f"\n{grid.label}\n\n{table(grid)}")
    if args.replies:
        _write_replies(args.replies, grids)
    if args.heatmap:
        panels = [Panel([str(n) for n in g.lengths], [f"{d:g}" for d in g.depths], g.rows()) for g in grids]
        path = write_heatmap(args.heatmap, panels)
        print(f"\nheat map: {path} (panels top to bottom in the order of the tables)")
    return 0


def _write_replies(path: str, grids: list[Any]) -> None:
    import json

    try:
        with open(path, "w", encoding="utf-8") as out:
            for grid in grids:
                for t in grid.trials:
                    out.write(json.dumps({"setting": grid.label, "length": t.length, "depth": t.depth,
                                          "prompt_tokens": t.prompt_tokens, "score": t.score, "reply": t.reply}) + "\n")
    except OSError as exc:
        raise HeteroError(f"--replies {path}: cannot write it ({exc.strerror or exc})") from exc


__all__ = ["add_eval_command"]
