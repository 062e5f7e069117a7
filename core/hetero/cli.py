"""The ``hetero`` command: backends, run, info, demo, ops; and the LLM commands generate, chat, bench.

Every failure ends as one ``hetero: error: ...`` line and exit status 2 (``cli_errors``); progress is drawn on a
terminal only (``hetero.progress``); ``run`` dispatches on the model's kind (an ONNX graph runs once per repeat, a
GGUF file or Hugging Face folder generates text, as ``ollama run`` does).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__, progress
from .cli_errors import EXIT_ERROR, EXIT_INTERRUPTED, WarningPrinter, report_error
from .cli_parser import CommandParser, add_backend_option, add_command, add_output_options, backends_of
from .contract.errors import HeteroError
from .model_files import LLM_KINDS, model_kind


def _cmd_backends(args: argparse.Namespace) -> int:
    from .plugins import statuses

    rows = sorted(statuses(), key=lambda r: (r.priority, r.name))
    if args.json:
        print(json.dumps([
            {"name": r.name, "plugin": r.plugin, "distribution": r.distribution, "version": r.version,
             "status": r.status, "devices": [_device_text(d) for d in r.devices], "reason": r.reason, "hint": r.hint}
            for r in rows
        ], indent=2))
        return 0
    table = [("backend", "version", "status", "devices", "reason")]
    for r in rows:
        devices = "; ".join(_device_text(d) for d in r.devices) or "-"
        table.append((r.name, r.version, r.status, devices, r.reason + (f" (hint: {r.hint})" if r.hint else "")))
    widths = [max(len(row[c]) for row in table) for c in range(4)]
    for row in table:
        print(("  ".join(row[c].ljust(widths[c]) for c in range(4)) + "  " + row[4]).rstrip())
    return 0


_DEVICE_FACTS = ("mode", "isa", "threads", "version", "compute_units", "fp16", "subgroups")


def _device_text(device) -> str:
    facts = [f"{k}={device.properties[k]}" for k in _DEVICE_FACTS if k in device.properties]
    if device.memory_bytes:
        facts.append(f"memory={device.memory_bytes / 2**30:.1f} GiB")
    vendor = f" [{device.vendor}]" if device.vendor else ""
    return f"{device.name}{vendor}" + (f" ({', '.join(facts)})" if facts else "")


def _parse_inputs(specs: Sequence[str]) -> dict[str, np.ndarray]:
    feeds = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise HeteroError(f"-i {spec!r}: expected NAME=FILE.npy")
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise HeteroError(f"-i {name}: cannot read {path!r} as a .npy file: {exc}") from exc
    return feeds


def _random_inputs(session, given: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = dict(given)
    for name in session.input_names:
        if name in feeds:
            continue
        info = session.graph.values[name]
        if info.shape is None:
            raise HeteroError(f"input {name!r} has unknown rank: give it with -i {name}=FILE.npy")
        shape = [d if isinstance(d, int) else 1 for d in info.shape]
        np_dtype = info.dtype.np_dtype
        if np_dtype is None or np_dtype.kind not in "fiub":
            raise HeteroError(f"input {name!r} ({info}): give it with -i {name}=FILE.npy")
        if np_dtype.kind == "f":
            feeds[name] = rng.standard_normal(shape).astype(np_dtype)
        elif np_dtype.kind == "b":
            feeds[name] = rng.integers(0, 2, shape).astype(bool)
        else:
            feeds[name] = rng.integers(0, 10, shape).astype(np_dtype)
    return feeds


def _cmd_run(args: argparse.Namespace) -> int:
    kind = model_kind(args.model)
    if kind in LLM_KINDS:
        from .llm.cli import run_llm

        return run_llm(args)
    if args.prompt is not None:
        raise HeteroError(f"{args.model} is an ONNX model: a prompt ({args.prompt!r}) needs an LLM (a .gguf file or "
                          "a Hugging Face folder); give ONNX inputs with -i NAME=FILE.npy")
    return _run_onnx(args)


def _run_onnx(args: argparse.Namespace) -> int:
    from .runtime.session import Session

    started = time.perf_counter()
    with progress.phase(f"loading {Path(args.model).name}"):
        session = Session(args.model, backends=backends_of(args), on_fallback=args.on_fallback or "warn",
                          threads=args.threads)
    load_ms = (time.perf_counter() - started) * 1e3
    feeds = _parse_inputs(args.input)
    missing = [n for n in session.input_names if n not in feeds]
    if missing and not args.random_inputs:
        raise HeteroError(f"missing input(s) {missing}: give -i NAME=FILE.npy, or --random-inputs")
    feeds = _random_inputs(session, feeds, args.seed or 0)
    times = []
    outputs: dict[str, Any] = {}
    for i in range(max(1, args.repeat)):
        t0 = time.perf_counter()
        if i == 0:
            with progress.phase("first run (planning memory, building device programs)"):
                outputs = session.run(feeds)
        else:
            outputs = session.run(feeds)
        times.append((time.perf_counter() - t0) * 1e3)
    if args.explain:
        print(session.explain())
    np.set_printoptions(precision=5, threshold=12, edgeitems=3)
    for name, value in outputs.items():
        if isinstance(value, list):  # a ZipMap's list of {label: probability} dicts: printed, not saved as .npy
            print(f"{name}: seq(map) of {len(value)} dict(s)\n{value[:3]}{' ...' if len(value) > 3 else ''}")
            continue
        print(f"{name}: {value.dtype}{list(value.shape)}\n{value}")
        if args.save_outputs:
            Path(args.save_outputs).mkdir(parents=True, exist_ok=True)
            np.save(Path(args.save_outputs) / f"{name.replace('/', '_')}.npy", value)
    counts = ", ".join(f"{b}: {n}" for b, n in session.placement.counts().items())
    steady = times[1:] or times
    print(f"load {load_ms:.1f} ms; first run {times[0]:.3f} ms; then median {statistics.median(steady):.3f} ms over "
          f"{len(steady)} run(s); nodes per backend: {counts}")
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    from .info import model_info, render

    facts = model_info(args.model)
    print(json.dumps(facts, indent=2, default=str) if args.json else render(facts))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(batch=args.batch, repeats=args.repeat, backends=backends_of(args))


def _cmd_ops(args: argparse.Namespace) -> int:
    from .coverage import SHIPPED_DOMAINS, coverage, markdown, summary

    cov = coverage()
    cov.rows = [row for row in cov.rows if row[0] in SHIPPED_DOMAINS]
    if args.markdown:
        print(markdown(cov), end="")
        return 0
    for backend in cov.backends:
        print(summary(cov, backend))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="hetero", description="Run ONNX models and LLMs (GGUF files, Hugging Face folders) on CPUs, GPUs and "
        "NPUs.", epilog="HETERO_DEBUG=1 prints the traceback of an error. `hetero COMMAND -h` lists its flags.")
    parser.add_argument("--version", action="version", version=f"hetero {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)

    def command(name: str, help_text: str, func: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
        return add_command(sub, name, help_text, func)

    p = command("backends", "list installed backends: status, devices, reason", _cmd_backends)
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = command("run", "run a model: an ONNX graph (outputs and timing) or an LLM (a .gguf file or Hugging Face "
                "folder: generates from PROMPT, or chats without one, as `ollama run` does)", _cmd_run)
    p.add_argument("model", help="an .onnx file, a .gguf file or a Hugging Face model folder")
    p.add_argument("prompt", nargs="?", help="LLMs: the prompt (default: chat on a terminal, else read stdin)")
    add_backend_option(p)
    p.add_argument("-i", "--input", action="append", default=[], metavar="NAME=FILE.npy",
                   help="ONNX: an input value (repeatable)")
    p.add_argument("--random-inputs", action="store_true", help="ONNX: fill inputs not given with seeded random data")
    p.add_argument("-r", "--repeat", type=int, default=10, help="ONNX: runs to time (the first is reported apart)")
    p.add_argument("--explain", action="store_true", help="ONNX: print the placement of every node")
    p.add_argument("--save-outputs", metavar="DIR", help="ONNX: save each output as DIR/NAME.npy")
    from .llm.cli import add_generation_options

    add_generation_options(p, seed_help="random inputs (ONNX) or sampling (LLMs) seed")

    p = command("info", "what a model holds: ONNX inputs / outputs / opsets / ops; GGUF architecture, "
                "quantization mix, context, tokenizer, chat template; Hugging Face config", _cmd_info)
    p.add_argument("model", help="an .onnx file, a .gguf file or a Hugging Face model folder")
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = command("ops", "op coverage per backend (native kernels vs numpy)", _cmd_ops)
    p.add_argument("--markdown", action="store_true", help="the full table, as in docs/ops.md")

    p = command("demo", "run a built-in CNN on every available backend (placement, timing, accuracy)", _cmd_demo)
    add_backend_option(p)
    p.add_argument("--batch", type=int, default=4, help="images per run (default 4)")
    p.add_argument("-r", "--repeat", type=int, default=20, help="runs to time per backend (default 20)")

    from .llm.cli import add_llm_commands  # generate, chat, bench (light: imports nothing heavy until run)

    add_llm_commands(sub)
    from .llm.needle_cli import add_eval_command  # light: the evaluation's modules load when it runs

    add_eval_command(sub)
    from .serve.cli import add_serve_command  # light: the server's packages are imported when it runs

    add_serve_command(sub)
    for p in sub.choices.values():
        add_output_options(p)
    add_output_options(parser)
    return parser


def _subject(args: argparse.Namespace) -> str:
    return str(getattr(args, "model", None) or getattr(args, "command", "") or "")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.error("a command is required")
    verbose, quiet = getattr(args, "verbose", False), getattr(args, "quiet", False)
    progress.configure(phases=True, quiet=quiet, verbose=verbose)
    with warnings.catch_warnings():
        WarningPrinter(verbose=verbose).install()
        try:
            return int(args.func(args) or 0)
        except KeyboardInterrupt:
            progress.clear_line()
            print(file=sys.stderr)
            return EXIT_INTERRUPTED
        except BrokenPipeError:  # `hetero ... | head`: the reader left; nothing to report, nothing left to flush
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        except Exception as exc:  # every failure is one line; HETERO_DEBUG=1 adds the traceback
            return report_error(exc, _subject(args))
        finally:
            progress.configure(phases=False, quiet=False, verbose=False)


if __name__ == "__main__":
    sys.exit(main())
