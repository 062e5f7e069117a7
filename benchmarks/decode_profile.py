"""Where an LLM decode step's time goes: inside the backends' native code, or outside it (Python), per op type.

    python benchmarks/decode_profile.py [MODEL.gguf | HF folder] [--threads 2] [--steps 64] [--prompt 16] [--json]
                                        [--synthetic qwen3-0.6b --quant q4] [--clock cpu] [--cprofile 25]
    python benchmarks/decode_profile.py --floor [--threads 1] [--steps 1500]

Without a model: the Qwen3-0.6B-shaped Q4_0 file that benchmarks/llm.py caches, else hetero's synthetic model.
The hetero under test is this checkout (``core/`` and ``plugins/cpu`` go first on ``sys.path``; ``--installed``: the
installed packages).

Method: the same decode step (one token after ``--prompt`` cached tokens, the cache reset to that point before each
pass so that every pass sees the same context lengths) is timed three ways, after warm-up steps (so the session
replays its recorded steady-state run):

1. plain: ``Llm.forward([token])`` with nothing instrumented -> the step time T (median over ``--steps``);
2. kernels: every kernel's ``run`` wrapped with a timer (an instance attribute, so the session's replay records the
   wrapper) -> time inside ``kernel.run`` per op type (K);
3. native: additionally, every call from a kernel into a compiled extension module (the backend's ``_native``: its
   module-level functions and the native objects a kernel holds, e.g. the attention's KV-cache object) wrapped with
   a timer -> time inside native code per op type (N).

Each quantity comes from the pass that does not inflate it: N is measured inside the native calls (the wrappers'
own cost falls outside), K is measured without the native wrappers, T without any. Then
``outside native = T - N`` = ``runtime (T - K)`` (``Llm.forward``, the session / replay loop, feeds and outputs) +
``kernel wrappers (K - N)`` (the Python in each ``kernel.run`` or in the call its ``bind`` made for the replay:
argument unpacking, checks, numpy glue). numpy calls count as outside: they are Python-driven, not the backend's
kernels. Medians per step, so an interrupted step (the machine is shared) does not skew them; the steps run in
``--rounds`` interleaved rounds and each way's figures come from its quietest round (a neighbour only adds time).
``--cprofile N`` adds cProfile's top N functions by own time over the steps (cProfile inflates Python time; use it
to see where, not how much).

``--floor``: the Python cost of a step where nothing else shows: the Qwen3-0.6B decoder's graph (28 layers, same
nodes) at width 64, where each kernel's arithmetic is well under a microsecond; prints the minimum, 10th percentile
and median of ``--steps`` plain decode steps. Every cost of a step but the real arithmetic is in it (``Llm.forward``,
session and replay, each kernel call with its argument conversion): on a shared machine its minimum is a far steadier
figure than the profile's T - N, a difference of two large numbers from separate passes.

The measurement itself lives in ``hetero.llm.profile`` (``hetero bench --profile`` uses it too).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _default_model() -> str | None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from llm import CACHE, model_path

    path = model_path(CACHE, "qwen3-0.6b", "Q4_0")
    return str(path) if path.is_file() else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", help="a .gguf file or Hugging Face folder (default: see above)")
    ap.add_argument("--synthetic", default=None, help="a synthetic model (qwen3-0.6b or tiny) instead of a file")
    ap.add_argument("--quant", default=None, help="quantize at load (q4 / q8 ...); synthetic default q4")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=64, help="profiled decode steps per pass")
    ap.add_argument("--prompt", type=int, default=16, help="cached tokens before the profiled steps")
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--width", type=int, default=1,
                    help="tokens a step: > 1 profiles a speculative verify step of that many after the prompt")
    ap.add_argument("--rounds", type=int, default=8,
                    help="interleaved rounds the steps are split into (each way's figures: its quietest round)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: the calling thread's CPU time (holds on a busy machine; see hetero.llm.profile)")
    ap.add_argument("--cprofile", type=int, default=0, metavar="N", help="also list cProfile's top N functions")
    ap.add_argument("--floor", action="store_true", help="time steps of the Qwen3-0.6B graph at width 64 (see above)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--installed", action="store_true", help="profile the installed hetero, not this checkout")
    args = ap.parse_args(argv)
    if not args.installed:
        sys.path[:0] = [str(ROOT / "core"), str(ROOT / "plugins" / "cpu")]
    import warnings

    if args.floor:
        return _floor(args)
    context = args.prompt + args.warmup + args.steps + 8
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = args.model if args.synthetic is None else None
        if model is None and args.synthetic is None:
            model = _default_model()
        if model is None:
            from hetero.llm.synthetic import load_synthetic

            llm = load_synthetic(args.synthetic or "qwen3-0.6b", args.quant or "q4", backends=["cpu"],
                                 on_fallback="silent", threads=args.threads, context=context, progress=False)
        else:
            from hetero.llm import load

            llm = load(model, backends=["cpu"], on_fallback="silent", threads=args.threads, quant=args.quant,
                       context=context, progress=False)
    from hetero.llm.profile import profile_decode  # after sys.path is set: the checkout's hetero

    result = profile_decode(llm, steps=args.steps, prompt=args.prompt, warmup=args.warmup,
                            cprofile_top=args.cprofile, rounds=args.rounds, clock=args.clock,
                            width=args.width)
    fallback = llm.session.placement.fallback_summary()
    if args.json:
        print(json.dumps({**result.as_dict(), "fallback": fallback or "none"}, indent=2))
    else:
        print(result.markdown())
        if fallback:
            print(f"\nnot on the native backend: {fallback}")
    return 0


def _floor(args: argparse.Namespace) -> int:
    import dataclasses
    import time
    import warnings

    import numpy as np

    from hetero.contract.quant import parse_quant
    from hetero.llm.families import build_graph
    from hetero.llm.model import Llm
    from hetero.llm.synthetic import SHAPES, SyntheticWeights, synthetic_config

    layers = SHAPES["qwen3-0.6b"]["num_layers"]
    cfg = dataclasses.replace(synthetic_config("tiny"), num_layers=layers)
    fmt = parse_quant(args.quant or "q4")
    context = args.prompt + args.warmup + args.steps + 8
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = build_graph(cfg, SyntheticWeights(fmt, 0), context=context)
        llm = Llm(cfg, graph, None, context=context, backends=["cpu"], on_fallback="silent", threads=args.threads,
                  name=f"qwen3 {layers} layers at width {cfg.hidden_size}", quant=fmt.name)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, cfg.vocab_size, size=args.prompt + args.warmup + args.steps).tolist()
    llm.prefill(ids[:args.prompt])
    for token in ids[args.prompt:args.prompt + args.warmup]:
        llm.forward([token])  # the replay is recorded
    times = []
    for token in ids[args.prompt + args.warmup:]:
        if len(llm.tokens) >= args.prompt + 64:
            llm.rollback(args.prompt)  # a short cache: the attention's work stays negligible too
        t0 = time.perf_counter()
        llm.forward([token])
        times.append(time.perf_counter() - t0)
    us = 1e6 * np.asarray(times)
    result = dict(model=llm.name, nodes=len(graph.nodes), threads=args.threads, steps=len(times),
                  min_us=float(us.min()), p10_us=float(np.percentile(us, 10)), median_us=float(np.median(us)))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{result['model']}, {result['nodes']} nodes, threads={args.threads}: decode step min "
              f"{result['min_us']:.0f} us, p10 {result['p10_us']:.0f} us, median {result['median_us']:.0f} us "
              f"over {len(times)} steps")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
