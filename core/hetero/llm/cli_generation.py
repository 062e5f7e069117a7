"""Loading an LLM for a command and printing its replies with the stats line: shared by ``generate`` / ``run`` and
the ``chat`` REPL."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .. import progress
from ..cli_parser import backends_of
from ..contract.errors import HeteroError
from .stats import stats_line


class Loaded:
    """An Llm with how long loading took (for the stats line) and its speculative decoding (``--spec``), if any."""

    def __init__(self, llm: Any, seconds: float, spec: Any = None) -> None:
        self.llm, self.seconds, self.spec = llm, seconds, spec


def load_llm(args: argparse.Namespace, model: str, slots: int = 1) -> Loaded:
    from .loader import load

    started = time.perf_counter()
    with progress.phase(f"loading {Path(model).name}"):
        llm = load(model, backends=backends_of(args), on_fallback=args.on_fallback or "silent", threads=args.threads,
                   quant=args.quant, context=args.ctx, kv_cache=args.kv_cache, progress=True,  # (terminal only)
                   embeddings=getattr(args, "embeddings", False), slots=slots)
        spec = None
        if getattr(args, "spec", None):
            from .speculative.registry import speculation

            spec = speculation(args.spec, llm, max_draft=args.spec_draft)
    return Loaded(llm, time.perf_counter() - started, spec)


def sampling(args: argparse.Namespace) -> dict[str, Any]:
    return dict(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                repetition_penalty=args.repeat_penalty, presence_penalty=args.presence_penalty,
                frequency_penalty=args.frequency_penalty, seed=args.seed)


def prompt_cache_options(args: argparse.Namespace) -> dict[str, Any]:
    """``--prompt-cache FILE [--prompt-cache-ro]`` as ``generate`` / ``chat`` keywords (none when not given)."""
    path = getattr(args, "prompt_cache", None)
    if getattr(args, "prompt_cache_ro", False) and not path:
        raise HeteroError("--prompt-cache-ro needs --prompt-cache FILE")
    return {"prompt_cache": path, "prompt_cache_ro": bool(args.prompt_cache_ro)} if path else {}


def print_stats(loaded: Loaded, overrides: dict[str, Any], first_token_seconds: float | None) -> None:
    llm = loaded.llm
    if llm.last.context_full:
        print(f"hetero: warning: the context of {llm.context} tokens is full: the reply stops here (load with a "
              "larger -c/--ctx-size)", file=sys.stderr)
    print(stats_line(llm, loaded.seconds, first_token_seconds, overrides), file=sys.stderr)
    if llm.decoder is not None and llm.decoder.note:
        print(f"hetero: note: {llm.decoder.note}", file=sys.stderr)


def stream_out(pieces: Iterable[str], started: float) -> float | None:
    """Print ``pieces`` as they come; returns the seconds to the first one (None: nothing came)."""
    iterator = iter(pieces)
    # The prompt's prefill (and, on a fresh session, memory planning and device program builds) comes before the
    # first piece: a status line says so on a terminal until it arrives.
    with progress.phase("processing the prompt"):
        piece = next(iterator, None)
    if piece is None:
        print()
        return None
    first = time.perf_counter() - started
    print(piece, end="", flush=True)
    for piece in iterator:
        print(piece, end="", flush=True)
    print()
    return first


def model_path(args: argparse.Namespace) -> str:
    """The model from -m or the first positional (llama.cpp's and our own habit); with -m, a lone positional is the
    prompt (``generate -m M "hi"``)."""
    given, positional = getattr(args, "model_opt", None), args.model
    if given and positional:
        if getattr(args, "prompt", None) is not None or not hasattr(args, "prompt"):
            raise HeteroError(f"two models given: -m {given} and {positional}")
        args.prompt = positional
        return given
    model = given or positional
    if not model:
        raise HeteroError("no model given: pass -m MODEL (a .gguf file or a Hugging Face folder)")
    return model
