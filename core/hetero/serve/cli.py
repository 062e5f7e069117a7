"""``hetero serve MODEL``: the OpenAI-compatible server from the command line (flags as llama-server's where they
overlap: -c, -t, -np, --host, --port, --alias)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..cli_parser import add_backend_option, add_command


def add_serve_command(subparsers: Any) -> None:
    p = add_command(subparsers, "serve", "serve an LLM over HTTP with the OpenAI API (/v1/chat/completions, "
                    "/v1/completions, /v1/models, /health, /metrics); needs pip install 'hetero[serve]'", _cmd_serve)
    p.add_argument("model", nargs="?", help="a .gguf file or a Hugging Face model folder")
    p.add_argument("-m", "--model", dest="model_opt", metavar="MODEL", help="same as the positional MODEL")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("-np", "--parallel", type=int, default=1, metavar="N",
                   help="slots: requests answered at once, each with its own KV cache, their decode steps batched "
                        "through one copy of the model (default 1)")
    p.add_argument("--queue", type=int, default=16, metavar="N",
                   help="requests that may wait for a slot; more are answered 429 (default 16)")
    p.add_argument("--prefix-cache", type=int, default=256, metavar="MIB",
                   help="memory for computed prompts kept for later requests that start the same way, shared by "
                        "the slots (default 256 MiB; 0: off)")
    p.add_argument("--prefix-cache-dir", default=None, metavar="DIR",
                   help="also write the computed prompts to DIR as prefix-cache files and look them up there, so a "
                        "restarted server finds them again (files of another model or KV type are passed over; "
                        "kept under 4 GiB, least recently used deleted first; docs/long-context.md)")
    p.add_argument("--resume-window", type=float, default=0.0, metavar="S",
                   help="seconds a stream whose client went away keeps going, resumable with GET "
                        "/v1/streams/ID (default 0: a client gone cancels its generation at once)")
    p.add_argument("--alias", default=None, help="the model id clients use (default: the model's name)")
    p.add_argument("--embeddings", action="store_true",
                   help="answer /v1/embeddings (the last token's final hidden state; costs a little per step)")
    p.add_argument("-c", "--ctx-size", "--ctx", dest="ctx", type=int, default=4096, metavar="N",
                   help="context length (KV cache) of each slot in tokens (default 4096)")
    p.add_argument("-t", "--threads", type=int, default=None, metavar="N",
                   help="threads of the CPU backend (default: every core)")
    p.add_argument("-q", "--quant", default=None, help="quantize float weights at load: q4 / q8")
    p.add_argument("--kv-cache", default="f16", choices=["f16", "f32", "q8", "q4r", "q3r"],
                   help="KV cache element type (q4r / q3r: rotated 4 / 3-bit, cpu)")
    p.add_argument("--on-fallback", choices=["warn", "error", "silent"], default=None,
                   help="nodes that leave the requested backends (default: silent)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level (default info: one line per request)")
    add_backend_option(p)


def _cmd_serve(args: argparse.Namespace) -> int:
    from ..contract.errors import HeteroError
    from ..llm.cli_generation import load_llm
    from . import _require, run

    _require()  # before minutes of loading
    model = args.model_opt or args.model
    if not model:
        raise HeteroError("no model given: hetero serve MODEL (a .gguf file or a Hugging Face folder)")
    if args.parallel < 1 or args.queue < 0:
        raise HeteroError(f"-np {args.parallel} / --queue {args.queue}: expected at least one slot and a queue >= 0")
    if args.prefix_cache < 0 or args.resume_window < 0:
        raise HeteroError(f"--prefix-cache {args.prefix_cache} / --resume-window {args.resume_window}: expected >= 0")
    models = load_llm(args, model, slots=args.parallel).llm.sequences()
    print(f"hetero serve: {models[0].name} on http://{args.host}:{args.port}/v1 ({args.parallel} slot(s), "
          f"context {args.ctx}, queue {args.queue}, prefix cache {args.prefix_cache} MiB"
          f"{' + ' + args.prefix_cache_dir if args.prefix_cache_dir else ''}, resume window "
          f"{args.resume_window:g} s)", file=sys.stderr, flush=True)
    run(models, host=args.host, port=args.port, log_level=args.log_level, name=args.alias, max_queue=args.queue,
        prefix_cache_bytes=args.prefix_cache << 20, resume_window=args.resume_window,
        prefix_cache_dir=args.prefix_cache_dir)
    return 0
